"""Memory per GPU: model states under ZeRO 0-3 / FSDP / Megatron's distributed optimizer, and activations.

Model states (Rajbhandari et al. 2020, ZeRO, Sec. 3): mixed-precision Adam keeps 16-bit weights (2 bytes), gradients
and 12 bytes of fp32 master weights, momentum and variance. Megatron-LM accumulates gradients in an fp32
``main_grad`` buffer (4 bytes), giving its 18 bytes/param without the distributed optimizer and 6 + 12/DP with
it (megatron/training/theoretical_memory_usage.py). ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients,
ZeRO-3 (= FSDP FULL_SHARD) everything, over the data-parallel group (DP*CP in Megatron; expert-DP for experts).

Activations follow Korthikanti et al. 2022 (Table 2), generalized as listed in activation_bytes_per_layer.
"""

from __future__ import annotations

from planner.cost import flops as F
from planner.spec import ModelSpec

GIB = 1024**3
# The share of each GPU's memory kept free for what the model does not count (allocator spikes, NCCL and
# communication buffers beyond the fitted allowance): one default for `plan` and `estimate` alike, so the two
# commands agree on whether a layout fits.
DEFAULT_MEMORY_MARGIN = 0.05
# bytes per parameter of the gradient buffers; "bf16+fp32" is DeepSpeed's BF16_Optimizer (16-bit .grad plus an
# fp32 accumulation buffer that ZeRO-1 does not shard, bigscience tr11-176B-ml chronicles)
GRAD_BYTES = {"fp32": 4.0, "bf16": 2.0, "bf16+fp32": 6.0}


def grad_wire_bytes(grad_dtype: str) -> float:
    """Bytes per gradient element a data-parallel reduction sends: 2 for bf16 gradients, 4 for any other."""
    return 2.0 if grad_dtype == "bf16" else 4.0


def model_state_bytes(
    params: float, shard: int, zero_stage: int, grad_dtype: str, optimizer: str, fp32_params: bool = False
) -> dict[str, float]:
    """Bytes of weights, gradients and optimizer state for ``params`` parameters held by one GPU before
    ZeRO sharding over ``shard`` data-parallel ranks.

    ``fp32_params`` (PyTorch FSDP / FSDP2 mixed precision: the sharded parameters stay fp32 and are cast to 16 bits
    when gathered, torch.distributed.fsdp MixedPrecision(Policy) ``param_dtype``): the fp32 parameter is the
    optimizer's master copy, so under ZeRO-3 the weights are that fp32 shard (4 bytes) and the optimizer keeps only
    its moments (8 bytes for Adam): 16 bytes per parameter with fp32 gradients, not 18. The 16-bit copy exists only
    while a layer is gathered (the gathered-layer term). Below ZeRO-3 the 16-bit parameters stay resident for the
    forward and backward (FSDP SHARD_GRAD_OP keeps them unsharded; DDP under autocast caches its casts), which the
    16-bit weights plus the fp32 master in the optimizer already count."""
    weights, grads = 2.0, GRAD_BYTES[grad_dtype]
    opt = 12.0 if optimizer in ("adam", "adamw") else 8.0  # fp32 master + (m, v) or (momentum)
    if fp32_params and zero_stage >= 3:
        weights, opt = 4.0, opt - 4.0
    w_div = shard if zero_stage >= 3 else 1
    g_div = shard if zero_stage >= 2 else 1
    o_div = shard if zero_stage >= 1 else 1
    return {
        "weights": params * weights / w_div,
        "gradients": params * grads / g_div,
        "optimizer": params * opt / o_div,
    }


def activation_bytes_per_layer(
    model: ModelSpec,
    *,
    tokens: int,
    seq: int,
    tp: int,
    sp: bool,
    flash: bool,
    recompute: str,
    moe: bool,
    fp8_inputs: bool = False,
) -> float:
    """Activation bytes one layer keeps for the backward pass, per micro-batch of ``tokens`` tokens (CP shard).

    Korthikanti et al. 2022, Sec. 4 (GPT layer, MHA, 4h MLP, bytes with s*b = tokens):
      attention 11sbh + 5as^2b; MLP 19sbh; two LayerNorms 4sbh  ->  sbh(34 + 5as/h).
    Under TP without SP, 10sbh is replicated (norm inputs 4, QKV and fc1 inputs 4, dropout masks 2) and the rest
    is split by t; with SP everything is split by t. Selective recompute drops the 5as^2b softmax term.
    Extensions: GQA (K and V are kv_heads*head_dim wide), SwiGLU (gate and up outputs plus their product:
    3 ffn-wide tensors), flash attention (no s^2 term; keeps its output and the row log-sum-exp), MoE
    (router input, per-token expert inputs and activations times top-k, dispatch buffers), MLA (mla_attention_bytes).
    Full recompute keeps only the layer input, 2sbh (split by t under SP).
    ``fp8_inputs`` (FP8 training whose linear layers save their FP8-cast input for the weight gradient:
    Transformer Engine's Linear / LayerNormLinear / LayerNormMLP keep ``inputmat`` (or its transpose) in FP8 when
    FP8 is on, transformer_engine/pytorch/module/linear.py ``_Linear.forward``; torchao's Float8Linear keeps the
    16-bit input, float8_linear.py ``matmul_with_hp_or_float8_args``): the QKV and fc1 inputs and the fc2
    (expert down-projection) input take 1 byte per element instead of 2. The output projection's input is the
    attention output, which the attention kernel keeps in 16 bits for its own backward anyway."""
    t = tokens
    h, d, a = model.hidden_size, model.dim_head, model.num_attention_heads
    if recompute == "full":
        return 2.0 * t * h / (tp if sp else 1)
    if recompute == "op":
        return op_checkpoint_bytes(model, tokens=t, tp=tp, sp=sp, moe=moe)
    masks = 1.0 if model.dropout else 0.0
    gemm_in = 1.0 if fp8_inputs else 2.0  # bytes per element of a saved linear-layer input
    replicated = (4.0 + 2 * gemm_in + 2 * masks) * t * h  # norm inputs, QKV and fc1 inputs, two dropout masks
    if model.mla is not None:
        latents, attn_split = mla_attention_bytes(model, t)
        replicated += latents
    else:
        q, kv = a * d, model.kv_heads * d
        attn_split = 2.0 * t * q + 4.0 * t * kv + 2.0 * t * q  # Q, K and V, output-projection input
    if moe:
        m = model.moe
        fe = m.expert_ffn_hidden_size
        wide = (2 if model.mlp == "swiglu" else 1) * 2.0 * fe + gemm_in * fe  # activation input(s) + fc2 input
        mlp_split = t * (m.top_k + m.shared_experts) * (gemm_in * h + wide) + 4.0 * t * m.top_k * h
    else:
        f = model.ffn_hidden_size
        # activation input(s) + fc2 input
        mlp_split = ((2 if model.mlp == "swiglu" else 1) * 2.0 + gemm_in) * t * f
    total = replicated / (tp if sp else 1) + (attn_split + mlp_split) / tp
    if flash:
        total += 4.0 * t * a / tp  # fp32 log-sum-exp per head and query
    elif recompute != "selective":
        total += (2.0 + 3.0 * masks) * a * t * seq / tp  # softmax output (2) [+ dropout mask (1) and output (2)]
    return total


def mla_attention_bytes(model: ModelSpec, tokens: int) -> tuple[float, float]:
    """(latents, per-head) 16-bit bytes an MLA attention keeps for backward (Korthikanti's attention terms for the
    shapes of Megatron-Core's multi_latent_attention.py). Latents: each of the query latent (q_lora_rank) and the
    kv latent (kv_lora_rank) is kept twice, as its RMSNorm's input and as the up-projection's input (the norm
    output), as a layer keeps its norm input and QKV input; like those they are whole on every TP rank and split
    only by sequence parallelism. Per head, split by TP: Q and K (qk_nope + qk_rope wide each), V and the output
    projection's input (v_head_dim wide each)."""
    t, n, m = tokens, model.num_attention_heads, model.mla
    latents = 2 * 2.0 * t * (m.kv_lora_rank + (m.q_lora_rank or 0))
    per_head = 2 * 2.0 * t * n * m.qk_head_dim + 2 * 2.0 * t * n * m.v_head_dim
    return latents, per_head


def op_checkpoint_bytes(model: ModelSpec, *, tokens: int, tp: int, sp: bool, moe: bool) -> float:
    """Activation bytes one layer keeps under per-op selective checkpointing (``recompute: op``, torchtitan's
    SAC policy; the GEMMs it recomputes are planner.cost.flops.op_checkpoint_recomputed_gemms): the block input,
    the kept matmul outputs -- Q and V (wq, wv), the first MLP matmul (w1 or fc1) and, for SwiGLU, the MLP output
    (w2, kept as its reduce-scatter under SP) -- and the attention output with its fp32 log-sum-exp. For a Llama
    block that is 4h + 4q + 2kv + 2f bytes per token against Korthikanti's 34h-class count: about half of what
    selective recompute keeps, as torchtitan's memory readings show (measured-runs.md, section 8).
    An MLA block with q_lora_rank calls wq_a, wq_b, wkv_a, wkv_b, wo (torchtitan models/deepseek_v3/model.py): it
    keeps the two latents (wq_a, wkv_a: whole on every TP rank, torchtitan computes them on the gathered sequence),
    the output projection's output (wo, as the MLP output above) and the attention output (v_head_dim per head);
    its odd matmul count moves the MLP's: w3 (or fc2) is kept instead of w1 and w2 (or fc1). Without q_lora_rank
    (wq, wkv_a, wkv_b, wo) it keeps Q and the up-projected keys and values (wq, wkv_b)."""
    t = tokens
    h, d, a = model.hidden_size, model.dim_head, model.num_attention_heads
    seq_split = tp if sp else 1
    # an odd number of attention matmuls gives the MLP's first one an even count (F.op_checkpoint_recomputed_gemms)
    shifted = F.op_checkpoint_attention_matmul_count(model) % 2 == 1
    if model.mla is not None:
        ml = model.mla
        keep = 2.0 * t * h / seq_split + 2.0 * t * a * ml.v_head_dim / tp + 4.0 * t * a / tp
        if ml.q_lora_rank is None:
            keep += 2.0 * t * a * (ml.qk_head_dim + ml.qk_nope_head_dim + ml.v_head_dim) / tp  # wq, wkv_b outputs
        else:
            keep += 2.0 * t * (ml.q_lora_rank + ml.kv_lora_rank + ml.qk_rope_head_dim)  # wq_a, wkv_a outputs
            keep += 2.0 * t * h / seq_split  # wo output
    else:
        q, kv = a * d, model.kv_heads * d
        keep = 2.0 * t * h / seq_split + (2.0 * q + 2.0 * kv + 2.0 * q) * t / tp + 4.0 * t * a / tp
    if moe:
        m = model.moe
        if shifted:  # swiglu keeps w3 (fe wide), a 2-matrix MLP its output (h wide), per routed/shared expert
            width = m.expert_ffn_hidden_size if model.mlp == "swiglu" else h
            keep += t * (m.top_k + m.shared_experts) * 2.0 * width / tp
            return keep
        per_token = (m.top_k + m.shared_experts) * 2.0 * (m.expert_ffn_hidden_size / tp)
        if model.mlp == "swiglu":
            per_token += (m.top_k + m.shared_experts) * 2.0 * h / tp
        keep += t * per_token
    elif shifted:
        keep += 2.0 * t * model.ffn_hidden_size / tp if model.mlp == "swiglu" else 2.0 * t * h / seq_split
    else:
        keep += 2.0 * t * model.ffn_hidden_size / tp
        if model.mlp == "swiglu":
            keep += 2.0 * t * h / seq_split
    return keep


def working_bytes_full_recompute(
    model: ModelSpec,
    *,
    tokens: int,
    seq: int,
    tp: int,
    sp: bool,
    flash: bool,
    moe: bool,
    fp8_inputs: bool = False,
) -> float:
    """Under full recompute one layer's complete activations exist again while its backward runs."""
    return activation_bytes_per_layer(
        model, tokens=tokens, seq=seq, tp=tp, sp=sp, flash=flash, recompute="none", moe=moe, fp8_inputs=fp8_inputs
    )


# Bytes per logit the loss holds at its peak (logits_bytes).
LOSS_BYTES_PER_LOGIT = {"fused": 4.0, "unfused": 10.0}


def logits_bytes(model: ModelSpec, tokens: int, tp: int, cross_entropy: str = "fused") -> float:
    """Logits of the vocabulary shard the loss holds. fused: fp32 logits, 4sbv/t (Korthikanti et al. 2022,
    Sec. 4.3); fused cross-entropy kernels (Megatron vocab-parallel CE, flash-attn's) write the gradient in place.
    unfused: torch.nn.functional.cross_entropy over ``pred.float()`` (torchtitan components/loss.py
    cross_entropy_loss): the bf16 logits (2), their fp32 copy (4) and the fp32 log-softmax saved for backward (4),
    10sbv/t."""
    return LOSS_BYTES_PER_LOGIT[cross_entropy] * tokens * model.vocab_size / tp


def inflight_microbatches(stage: int, pp: int, vpp: int, num_microbatches: int) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the stage's full layer set.
    1F1B (Narayanan et al. 2021): stage i warms up with p - i micro-batches. Interleaved (Megatron-LM
    schedules.py): (p - i - 1)*2 + (v - 1)*p + 1 model chunks of 1/v of the stage each."""
    if vpp == 1:
        return float(min(pp - stage, num_microbatches))
    chunks = min((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, num_microbatches * vpp)
    return chunks / vpp
