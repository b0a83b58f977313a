"""FLOP and parameter counts: the operations of one transformer layer, and whole-model FLOP conventions.

Per-layer shapes follow Megatron-LM's layer (Shoeybi et al. 2019; Narayanan et al. 2021) generalized to GQA
(K/V are ``kv_heads*head_dim`` wide), SwiGLU (three ffn-wide projections) and MoE (top-k routed + shared experts).
A GEMM of [M,K] x [K,N] costs 2*M*K*N FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.spec import ModelSpec


@dataclass(frozen=True)
class Gemm:
    m: int
    k: int
    n: int
    count: int = 1  # identical GEMMs (e.g. one per local expert)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n * self.count

    @property
    def bytes(self) -> float:
        """Minimum HBM traffic in 16-bit: read both operands once, write the output once."""
        return 2.0 * (self.m * self.k + self.k * self.n + self.m * self.n) * self.count


def _mlp_in_width(model: ModelSpec, ffn: int) -> int:
    return 2 * ffn if model.mlp == "swiglu" else ffn


def attention_gemms(model: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    """QKV and output projections of one layer on one TP rank (forward)."""
    d, h = model.dim_head, model.hidden_size
    q, kv = model.num_attention_heads * d, 2 * model.kv_heads * d
    return [Gemm(tokens, h, (q + kv) // tp), Gemm(tokens, q // tp, h)]


def mlp_gemms(model: ModelSpec, tokens: int, tp: int, moe: bool, ep: int) -> list[Gemm]:
    """Dense MLP, or router + routed experts + shared experts of an MoE layer, on one rank (forward)."""
    h = model.hidden_size
    if not moe:
        f = model.ffn_hidden_size
        return [Gemm(tokens, h, _mlp_in_width(model, f) // tp), Gemm(tokens, f // tp, h)]
    m = model.moe
    fe = m.expert_ffn_hidden_size
    local_experts = max(1, m.num_experts // ep)
    # Balanced routing: the EP group's tokens*top_k assignments spread evenly over its experts.
    per_expert = max(1, round(tokens * m.top_k / local_experts))
    ops = [
        Gemm(tokens, h, m.num_experts),  # router
        Gemm(per_expert, h, _mlp_in_width(model, fe) // tp, local_experts),
        Gemm(per_expert, fe // tp, h, local_experts),
    ]
    if m.shared_experts:
        fs = fe * m.shared_experts
        ops += [Gemm(tokens, h, _mlp_in_width(model, fs) // tp), Gemm(tokens, fs // tp, h)]
    return ops


def op_checkpoint_recomputed_gemms(model: ModelSpec, tokens: int, tp: int, moe: bool, ep: int) -> list[Gemm]:
    """The forward GEMMs torchtitan's per-op selective checkpointing (``recompute: op``) runs again in backward.

    torchtitan/distributed/activation_checkpoint.py ``_get_custom_policy``: within a block, the outputs of
    matmuls are saved except every second one (a counter over the block's forward mm calls), and the attention
    kernel's output is saved; everything else is recomputed. A Llama block calls wq, wk, wv, wo, w1, w3, w2: the
    outputs of wk, wo and w3 (the second half of the fused gate/up GEMM here) are recomputed; a 2-matrix MLP
    (fc1, fc2) recomputes fc2 instead. MoE experts follow the dense rule per expert."""
    d, h = model.dim_head, model.hidden_size
    k_width = model.kv_heads * d
    ops = [Gemm(tokens, h, k_width // tp), Gemm(tokens, model.num_attention_heads * d // tp, h)]
    if not moe:
        f = model.ffn_hidden_size
        ops.append(Gemm(tokens, h, f // tp) if model.mlp == "swiglu" else Gemm(tokens, f // tp, h))
        return ops
    m = model.moe
    fe = m.expert_ffn_hidden_size
    local_experts = max(1, m.num_experts // ep)
    per_expert = max(1, round(tokens * m.top_k / local_experts))
    if model.mlp == "swiglu":
        ops.append(Gemm(per_expert, h, fe // tp, local_experts))
    else:
        ops.append(Gemm(per_expert, fe // tp, h, local_experts))
    if m.shared_experts:
        fs = fe * m.shared_experts
        ops.append(Gemm(tokens, h, fs // tp) if model.mlp == "swiglu" else Gemm(tokens, fs // tp, h))
    return ops


def attention_core_flops(model: ModelSpec, tokens: int, seq: int, tp: int, causal: bool) -> float:
    """Q.K^T and P.V for ``tokens`` queries against ``seq`` keys (forward); causal masking halves useful work."""
    full = 4.0 * tokens * seq * model.num_attention_heads * model.dim_head / tp
    return full / 2 if causal else full


def logits_gemm(model: ModelSpec, tokens: int, tp: int) -> Gemm:
    return Gemm(tokens, model.hidden_size, -(-model.vocab_size // tp))


# ------------------------------------------------------------------ parameters


def attention_params(model: ModelSpec) -> int:
    d, h = model.dim_head, model.hidden_size
    q, kv = model.num_attention_heads * d, 2 * model.kv_heads * d
    return h * (q + kv) + q * h + 2 * h  # projections + two norms


def dense_mlp_params(model: ModelSpec) -> int:
    f = model.ffn_hidden_size
    return model.hidden_size * (_mlp_in_width(model, f) + f)


def expert_params(model: ModelSpec) -> int:
    """Parameters of one routed expert."""
    fe = model.moe.expert_ffn_hidden_size
    return model.hidden_size * (_mlp_in_width(model, fe) + fe)


def moe_shared_params(model: ModelSpec) -> int:
    """Router plus shared experts of one MoE layer (replicated like dense weights)."""
    m = model.moe
    return model.hidden_size * m.num_experts + m.shared_experts * expert_params(model)


def embedding_params(model: ModelSpec) -> int:
    return model.vocab_size * model.hidden_size


def total_params(model: ModelSpec) -> int:
    n_moe = model.num_moe_layers
    n = model.num_layers * attention_params(model) + (model.num_layers - n_moe) * dense_mlp_params(model)
    if n_moe:
        n += n_moe * (moe_shared_params(model) + model.moe.num_experts * expert_params(model))
    emb = embedding_params(model)
    return n + emb * (1 if model.tie_embeddings else 2)


def active_params_per_token(model: ModelSpec) -> int:
    """Parameters touched by one token in the layers (MoE: top-k routed + shared experts), no embeddings."""
    n_moe = model.num_moe_layers
    n = model.num_layers * attention_params(model) + (model.num_layers - n_moe) * dense_mlp_params(model)
    if n_moe:
        n += n_moe * (moe_shared_params(model) + model.moe.top_k * expert_params(model))
    return n


# ------------------------------------------------------------------ whole-model FLOP conventions


def model_flops_per_iteration(model: ModelSpec, seq: int, batch: int) -> float:
    """Model FLOPs (forward + backward, no recompute) per iteration, as Megatron-LM's
    ``num_floating_point_operations`` before 2025-03: 6 * active-params * tokens for the GEMMs,
    attention core with the full s^2 (no causal halving), plus the logits GEMM. For a GPT with MHA and a 4h
    MLP it equals Korthikanti et al. 2022 (App. A): 72*B*l*s*h^2*(1 + s/(6h) + V/(12*l*h)).
    The embedding table is a lookup (no FLOPs) and norms are ignored, as in those formulas."""
    tokens = seq * batch
    gemm = 6.0 * (active_params_per_token(model) - model.num_layers * 2 * model.hidden_size) * tokens
    attn = 3.0 * model.num_layers * attention_core_flops(model, tokens, seq, 1, causal=False)
    logits = 6.0 * model.hidden_size * model.vocab_size * tokens
    return gemm + attn + logits


def narayanan_hardware_flops(model: ModelSpec, seq: int, batch: int) -> float:
    """Narayanan et al. 2021, Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)). GPT with MHA, 4h MLP, full
    recompute (4 passes over the layers, 3 over the logits): a hardware-FLOP count."""
    layers, h, v = model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * batch * seq * layers * h * h * (1 + seq / (6.0 * h) + v / (16.0 * layers * h))


def palm_flops_per_token(model: ModelSpec, seq: int) -> float:
    """Chowdhery et al. 2022 (PaLM), App. B: 6*N + 12*L*H*Q*T with N the non-embedding parameters."""
    n = total_params(model) - embedding_params(model) * (1 if model.tie_embeddings else 2)
    return 6.0 * n + 12.0 * model.num_layers * model.num_attention_heads * model.dim_head * seq
