"""FLOP and parameter counts: the operations of one transformer layer, and whole-model FLOP conventions.

Per-layer shapes follow Megatron-LM's layer (Shoeybi et al. 2019; Narayanan et al. 2021) generalized to GQA
(K/V are ``kv_heads*head_dim`` wide), SwiGLU (three ffn-wide projections), MoE (top-k routed + shared experts) and
multi-head latent attention (MLA: the mla_* functions below).
A GEMM of [M,K] x [K,N] costs 2*M*K*N FLOPs.

MLA (DeepSeek-V2, arXiv 2405.04434 sec. 2.1, eqs. 9-19; DeepSeek-V3, arXiv 2412.19437 sec. 2.1.1), with n heads,
hidden h, d_c = kv_lora_rank, d_c' = q_lora_rank, d_n = qk_nope_head_dim, d_r = qk_rope_head_dim, d_v = v_head_dim,
as Megatron-Core builds it (megatron/core/transformer/multi_latent_attention.py ``MLASelfAttention.__init__``):
  linear_q_down_proj  h -> d_c'                     (HF q_a_proj)   then RMSNorm(d_c')  (q_a_layernorm)
  linear_q_up_proj    d_c' -> n*(d_n + d_r)         (HF q_b_proj);  without q_lora_rank: linear_q_proj h -> n*(d_n+d_r)
  linear_kv_down_proj h -> d_c + d_r                (HF kv_a_proj_with_mqa; d_r is the shared rotary key) then
                                                    RMSNorm(d_c)    (kv_a_layernorm)
  linear_kv_up_proj   d_c -> n*(d_n + d_v)          (HF kv_b_proj: per-head no-RoPE key and value)
  linear_proj         n*d_v -> h                    (HF o_proj)
  core attention      Q.K^T over d_n + d_r, P.V over d_v, n heads.
Tensor parallelism splits the per-head up-projections and linear_proj by heads; the down-projections and their
norms are replicated on every TP rank (the TE layer spec builds them as ``TELinear(parallel_mode="duplicated")``,
megatron/core/models/gpt/gpt_layer_specs.py; torchtitan models/deepseek_v3/sharding.py keeps wq_a, wkv_a, q_norm
and kv_norm Replicate as well).
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


def mla_projection_gemms(model: ModelSpec, tokens: int, tp: int, latent_rows: int | None = None) -> list[Gemm]:
    """The projections of one MLA layer on one TP rank (forward), in the order the layer calls them: q down and up
    (or the one q projection without q_lora_rank), kv down and up, output. Up-projections and the output
    projection are split by heads over TP; the down-projections are replicated (module docstring) and run on
    ``latent_rows`` tokens: all of them without sequence parallelism (and in torchtitan, which gathers the input
    first), the sequence shard with it in Megatron-Core (multi_latent_attention.py ``_qkv_down_projection``:
    ``q_compressed: [s / TP, b, q_lora_rank]``, then all-gathered into the up-projection). Shapes: arXiv 2405.04434
    eqs. 9-19; Megatron-Core multi_latent_attention.py ``MLASelfAttention.__init__``."""
    m, h, n = model.mla, model.hidden_size, model.num_attention_heads
    rows = tokens if latent_rows is None else latent_rows
    q_width = n * m.qk_head_dim // tp
    if m.q_lora_rank is None:
        ops = [Gemm(tokens, h, q_width)]  # linear_q_proj
    else:
        ops = [Gemm(rows, h, m.q_lora_rank), Gemm(tokens, m.q_lora_rank, q_width)]  # q down, q up
    ops += [
        Gemm(rows, h, m.kv_lora_rank + m.qk_rope_head_dim),  # kv down (latent + shared rotary key)
        Gemm(tokens, m.kv_lora_rank, n * (m.qk_nope_head_dim + m.v_head_dim) // tp),  # kv up (keys, values)
        Gemm(tokens, n * m.v_head_dim // tp, h),  # output projection
    ]
    return ops


def attention_gemms(model: ModelSpec, tokens: int, tp: int, sp: bool = False) -> list[Gemm]:
    """QKV and output projections of one layer on one TP rank (forward). With MLA, the latent down-projections run
    on the sequence shard under sequence parallelism (``sp``; Megatron-Core) and on all tokens otherwise."""
    if model.mla is not None:
        return mla_projection_gemms(model, tokens, tp, latent_rows=-(-tokens // tp) if sp else tokens)
    d, h = model.dim_head, model.hidden_size
    q, kv = model.num_attention_heads * d, 2 * model.kv_heads * d
    return [Gemm(tokens, h, (q + kv) // tp), Gemm(tokens, q // tp, h)]


def mlp_closing(moe: bool) -> tuple[int, ...]:
    """The indices in ``mlp_gemms`` of the projections that close the MLP, whose outputs join the residual stream:
    the down projection; of an MoE layer the routed experts' and the shared experts' (when it has them)."""
    return (2, 4) if moe else (1,)


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


def _op_checkpoint_attention_matmuls(model: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    """The attention matmuls of one block in torchtitan's forward order: wq, wk, wv, wo (models/llama3/model.py
    ``Attention.forward``), or for MLA wq_a, wq_b (or wq), wkv_a, wkv_b, wo (models/deepseek_v3/model.py
    ``Attention.forward``; the low-rank wq_a and wkv_a see the whole gathered sequence, sharding.py)."""
    if model.mla is not None:
        return mla_projection_gemms(model, tokens, tp, latent_rows=tokens)
    d, h = model.dim_head, model.hidden_size
    q_width, k_width = model.num_attention_heads * d // tp, model.kv_heads * d // tp
    return [Gemm(tokens, h, q_width), Gemm(tokens, h, k_width), Gemm(tokens, h, k_width), Gemm(tokens, q_width, h)]


def op_checkpoint_attention_matmul_count(model: ModelSpec) -> int:
    """Matmuls the attention of one block calls before its MLP: 4 (wq, wk, wv, wo); MLA 5, or 4 without
    q_lora_rank. An odd count moves which MLP matmuls per-op checkpointing keeps (op_checkpoint_recomputed_gemms)."""
    if model.mla is not None:
        return 4 if model.mla.q_lora_rank is None else 5
    return 4


def op_checkpoint_recomputed_gemms(model: ModelSpec, tokens: int, tp: int, moe: bool, ep: int) -> list[Gemm]:
    """The forward GEMMs torchtitan's per-op selective checkpointing (``recompute: op``) runs again in backward.

    torchtitan/distributed/activation_checkpoint.py ``_get_custom_policy``: within a block, the outputs of
    matmuls are saved except every second one (a counter over the block's forward mm calls), and the attention
    kernel's output is saved; everything else is recomputed. A Llama block calls wq, wk, wv, wo, w1, w3, w2: the
    outputs of wk, wo and w3 (the second half of the fused gate/up GEMM here) are recomputed; a 2-matrix MLP
    (fc1, fc2) recomputes fc2 instead. An MLA block with q_lora_rank calls five attention matmuls (wq_a, wq_b,
    wkv_a, wkv_b, wo): wq_b and wkv_b are recomputed, and the MLP's count starts odd, so w1 and w2 (fc1) are
    recomputed instead. MoE experts follow the dense rule per expert."""
    h = model.hidden_size
    attention = _op_checkpoint_attention_matmuls(model, tokens, tp)
    ops = [g for i, g in enumerate(attention, 1) if i % 2 == 0]
    first = len(attention) + 1  # the counter value of the MLP's first matmul

    def mlp(rows: int, width: int, count: int = 1) -> list[Gemm]:
        """The MLP's matmuls in call order (w1, w3, w2 or fc1, fc2), those the counter recomputes."""
        up = [Gemm(rows, h, width, count)] * (2 if model.mlp == "swiglu" else 1)
        calls = up + [Gemm(rows, width, h, count)]
        return [g for j, g in enumerate(calls, first) if j % 2 == 0]

    if not moe:
        return ops + mlp(tokens, model.ffn_hidden_size // tp)
    m = model.moe
    fe = m.expert_ffn_hidden_size
    local_experts = max(1, m.num_experts // ep)
    per_expert = max(1, round(tokens * m.top_k / local_experts))
    ops += mlp(per_expert, fe // tp, local_experts)
    if m.shared_experts:
        ops += mlp(tokens, fe * m.shared_experts // tp)
    return ops


def attention_core_flops(model: ModelSpec, tokens: int, seq: int, tp: int, causal: bool) -> float:
    """Q.K^T and P.V for ``tokens`` queries against ``seq`` keys (forward); causal masking halves useful work.
    Q.K^T contracts over the query/key head width, P.V produces the value head width: 2*tokens*seq*heads*(d_qk +
    d_v), 4*tokens*seq*heads*d for MHA/GQA. MLA: d_qk = qk_nope_head_dim + qk_rope_head_dim, d_v = v_head_dim
    (arXiv 2405.04434 eqs. 17-19; Megatron-LM training.py ``num_floating_point_operations``, its MLA
    ``standard_self_attn_core_term``)."""
    if model.mla is not None:
        full = 2.0 * tokens * seq * model.num_attention_heads * (model.mla.qk_head_dim + model.mla.v_head_dim) / tp
    else:
        full = 4.0 * tokens * seq * model.num_attention_heads * model.dim_head / tp
    return full / 2 if causal else full


def attention_kv_bytes(model: ModelSpec, tokens: int, tp: int) -> float:
    """16-bit K and V of ``tokens`` tokens on one TP rank: what a context-parallel ring passes on per step.
    MHA/GQA: kv_heads * head_dim each. MLA: Megatron-Core up-projects the latent before the attention kernel, so
    the ring carries per-head keys (qk_nope + qk_rope wide) and values (v_head_dim wide) of every head
    (multi_latent_attention.py: ``core_attention`` gets key [s, b, n, d_n + d_r] and value [s, b, n, d_v])."""
    if model.mla is not None:
        n, m = model.num_attention_heads, model.mla
        return 2.0 * tokens * n * (m.qk_head_dim + m.v_head_dim) / tp
    return 2.0 * 2.0 * tokens * model.kv_heads * model.dim_head / tp


def logits_gemm(model: ModelSpec, tokens: int, tp: int) -> Gemm:
    return Gemm(tokens, model.hidden_size, -(-model.vocab_size // tp))


# ------------------------------------------------------------------ parameters


def mla_params(model: ModelSpec) -> tuple[int, int]:
    """(split, replicated) parameters of one MLA block's attention under tensor parallelism. Split by heads: q_b_proj
    d_c' x n(d_n + d_r) (or q_proj h x n(d_n + d_r) without q_lora_rank), kv_b_proj d_c x n(d_n + d_v) and o_proj
    n*d_v x h. Replicated: q_a_proj h x d_c', kv_a_proj_with_mqa h x (d_c + d_r), and the two latent RMSNorms
    (q_a_layernorm d_c', kv_a_layernorm d_c). Sources: arXiv 2405.04434 sec. 2.1 (eqs. 9-19), the Hugging Face
    DeepseekV3Attention modules, Megatron-Core multi_latent_attention.py (module docstring)."""
    m, h, n = model.mla, model.hidden_size, model.num_attention_heads
    split = n * m.v_head_dim * h + m.kv_lora_rank * n * (m.qk_nope_head_dim + m.v_head_dim)
    replicated = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
    if m.q_lora_rank is None:
        split += h * n * m.qk_head_dim
    else:
        split += m.q_lora_rank * n * m.qk_head_dim
        replicated += h * m.q_lora_rank + m.q_lora_rank
    return split, replicated


def norm_params(model: ModelSpec) -> int:
    """RMSNorm/LayerNorm weights of one block: the two pre-norms, plus MLA's latent norms (no GEMM FLOPs)."""
    n = 2 * model.hidden_size
    if model.mla is not None:
        n += model.mla.kv_lora_rank + (model.mla.q_lora_rank or 0)
    return n


def attention_params(model: ModelSpec) -> int:
    """Attention weights of one block with its two norms (the convention of every per-layer count here)."""
    h = model.hidden_size
    if model.mla is not None:
        return sum(mla_params(model)) + 2 * h
    d = model.dim_head
    q, kv = model.num_attention_heads * d, 2 * model.kv_heads * d
    return h * (q + kv) + q * h + 2 * h  # projections + two norms


def attention_params_per_tp_rank(model: ModelSpec, tp: int) -> float:
    """Attention parameters one TP rank holds: attention_params / tp, except that MLA's down-projections and latent
    norms are replicated on every rank (mla_params)."""
    if model.mla is not None:
        split, replicated = mla_params(model)
        return (split + 2 * model.hidden_size) / tp + replicated
    return attention_params(model) / tp


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
    gemm = 6.0 * (active_params_per_token(model) - model.num_layers * norm_params(model)) * tokens
    attn = 3.0 * model.num_layers * attention_core_flops(model, tokens, seq, 1, causal=False)
    logits = 6.0 * model.hidden_size * model.vocab_size * tokens
    return gemm + attn + logits


def narayanan_hardware_flops(model: ModelSpec, seq: int, batch: int) -> float:
    """Narayanan et al. 2021, Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)). GPT with MHA, 4h MLP, full
    recompute (4 passes over the layers, 3 over the logits): a hardware-FLOP count."""
    layers, h, v = model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * batch * seq * layers * h * h * (1 + seq / (6.0 * h) + v / (16.0 * layers * h))


def palm_flops_per_token(model: ModelSpec, seq: int) -> float:
    """Chowdhery et al. 2022 (PaLM), App. B: 6*N + 12*L*H*Q*T with N the non-embedding parameters; with separate
    query/key and value head widths (MLA) 2*Q is d_qk + d_v, as in attention_core_flops."""
    n = total_params(model) - embedding_params(model) * (1 if model.tie_embeddings else 2)
    heads = model.num_attention_heads
    if model.mla is not None:
        return 6.0 * n + 6.0 * model.num_layers * heads * (model.mla.qk_head_dim + model.mla.v_head_dim) * seq
    return 6.0 * n + 12.0 * model.num_layers * heads * model.dim_head * seq
