"""Compute time of one transformer layer (and of the embedding/logits) on one GPU, per micro-batch.

Roofline per operation (Williams et al. 2009): an op takes max(FLOPs / achieved rate, bytes / achieved HBM
bandwidth). The achieved GEMM rate is the GPU's measured matmul rate (MAMF, stas00/ml-engineering) times a
calibrated efficiency, so small GEMMs (small hidden sizes, high TP, few tokens per expert) fall to the memory
roof on their own. Element-wise kernels (norms, residuals, activations, rotary, softmax) are pure HBM traffic.
Backward costs 2x the forward GEMMs (grad wrt input and weights) and 2.5x the forward flash-attention FLOPs
(FlashAttention-2, Dao 2023: 5 matmuls backward vs 2 forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from planner.cost import flops as F
from planner.cost.calibration import Calibration
from planner.spec import GpuSpec, ModelSpec, Recompute


@dataclass(frozen=True)
class PassTime:
    """Seconds for one micro-batch through one layer."""

    forward: float
    backward: float
    recompute: float  # extra forward work during backward (activation recompute)


def runs_fp8(gpu: GpuSpec, precision: str) -> bool:
    """The GEMMs run in FP8: fp8 training on a GPU with FP8 tensor cores (else fp8 is priced as bf16)."""
    return precision == "fp8" and bool(gpu.peak_tflops_fp8)


def matmul_tflops(gpu: GpuSpec, precision: str) -> float:
    """Achievable dense GEMM TFLOP/s before calibration: measured MAMF where known, else 80% of peak
    (gpus.yaml rules_of_thumb: large well-shaped GEMMs reach ~80% on Ampere/Hopper)."""
    bf16 = gpu.matmul_tflops_bf16 or 0.8 * gpu.peak_tflops_bf16
    if precision == "fp16":
        return bf16 * (gpu.peak_tflops_fp16 or gpu.peak_tflops_bf16) / gpu.peak_tflops_bf16
    if runs_fp8(gpu, precision):
        # FP8 GEMMs reach a lower fraction of their peak (H100: 71% vs 80%, stas00 MAMF table).
        return 0.71 / 0.80 * bf16 * gpu.peak_tflops_fp8 / gpu.peak_tflops_bf16
    return bf16


def peak_tflops(gpu: GpuSpec, precision: str) -> float:
    if precision == "fp16":
        return gpu.peak_tflops_fp16 or gpu.peak_tflops_bf16
    if runs_fp8(gpu, precision):
        return gpu.peak_tflops_fp8
    return gpu.peak_tflops_bf16


def gemm_rate(gpu: GpuSpec, precision: str, cal: Calibration) -> float:
    """Achieved GEMM FLOP/s: the matmul rate (matmul_tflops) times the calibrated GEMM efficiency."""
    return matmul_tflops(gpu, precision) * 1e12 * cal.gemm_efficiency


def attention_rate(gpu: GpuSpec, cal: Calibration, kernel: str = "flash") -> float:
    """Achieved attention-kernel FLOP/s. Attention kernels run in 16-bit even in FP8 recipes (Transformer Engine
    keeps DPA in bf16). Their achievable rate is the GPU's measured rate of the kernel generation -- ``flash``
    (FlashAttention-2 class) or ``flash3`` (FlashAttention-3 / cuDNN fused attention, where the GPU has a figure
    for it, else the flash rate) -- else its GEMM rate, times the calibrated attention efficiency (one efficiency
    for both: it measures the framework around the kernel, not the kernel)."""
    attn = (gpu.attention3_tflops_bf16 if kernel == "flash3" else None) or gpu.attention_tflops_bf16
    return (attn or matmul_tflops(gpu, "bf16")) * 1e12 * cal.attention_efficiency


def hbm_rate(gpu: GpuSpec, cal: Calibration) -> float:
    """Achieved HBM bytes/s of element-wise kernels: the datasheet bandwidth times the calibrated efficiency."""
    return gpu.hbm_tbps * 1e12 * cal.hbm_efficiency


# Achieved fraction of HBM bandwidth of a pointwise kernel streaming over large contiguous tensors (the FP8 casts,
# a materialized attention's scores, the fp32 gradient accumulation): as torchao takes it for H100
# (torchao/testing/training/roofline_utils.py, "pct_achievable_mem_bw": 0.92). Not the calibrated hbm_efficiency,
# which covers every element-wise kernel of a layer, small and unfused ones too.
STREAM_HBM_EFFICIENCY = 0.92


def stream_hbm_rate(gpu: GpuSpec) -> float:
    """Achieved HBM bytes/s of kernels streaming over large tensors: the datasheet bandwidth times
    STREAM_HBM_EFFICIENCY."""
    return gpu.hbm_tbps * 1e12 * STREAM_HBM_EFFICIENCY


# HBM bytes per parameter that folding one micro-batch's gradients into the gradient buffers moves, by
# Training.grad_dtype. "bf16+fp32" (DeepSpeed's BF16_Optimizer): after every micro-batch's backward
# (runtime/pipe/engine.py ``_exec_backward_pass`` calls ``optimizer.update_hp_grads``, as BF16_Optimizer.backward
# does without a pipeline) each parameter's 16-bit gradient is cast and added to its fp32 buffer,
# ``hp_grad.add_(lp.grad.to(fp32))`` (runtime/bf16_optimizer.py ``update_hp_grads``): the cast reads 2 and writes 4
# bytes, the add reads 4 + 4 and writes 4. "fp32" (Megatron's main_grad): the weight-gradient GEMM accumulates
# into it (--gradient-accumulation-fusion, on by default), no pass of its own. "bf16" (PyTorch FSDP/DDP): the
# gradients are reduced every micro-batch and only the DP shard accumulates. Priced at STREAM_HBM_EFFICIENCY, over
# every parameter a GPU holds: the BF16_Optimizer runs with ZeRO 0-1, which leave the gradients whole.
GRAD_ACCUMULATION_BYTES = {"fp32": 0.0, "bf16": 0.0, "bf16+fp32": 18.0}


@dataclass(frozen=True)
class Fp8Casts:
    """HBM bytes per element that an FP8 recipe's casts move for one linear layer, forward and backward.

    torchao's float8 roofline (torchao/testing/training/roofline_utils.py, ``get_tensor_memory_traffic_ovhd_s``,
    with torch.compile fusing the amax of an activation into the op before it), per element of a 16-bit tensor:
    - tensorwise (dynamic per-tensor scale): an activation (the input forward, the output gradient backward) is read
      once and written as FP8 in both layouts, 2 + 1 + 1 = 4 bytes; a weight is read for its amax and cast once for
      the forward and once for the backward, 2 + 3 = 5 forward and 3 backward.
    - rowwise (per-row scales, so each layout needs its own pass): an activation is read and written as FP8 plus a
      16-bit transposed copy, then the copy is read and cast, (2 + 1 + 2) + (2 + 1) = 8 bytes, less the first read,
      fused into the producer: 6; a weight is cast forward (2 + 1 = 3), transposed (2 + 2) and cast (2 + 1)
      backward: 7.
    - delayed (Transformer Engine delayed scaling: the scale comes from the amax history, so no amax pass): the
      casts fuse into the kernels that produce the tensors (LayerNorm, activation, dgelu/dbias with cast-transpose)
      except where no producer kernel is TE's: the attention output before the output projection, and the output
      gradients of the projections that close the attention and the MLP (they arrive from the residual stream,
      flops.mlp_closing). Those take a stand-alone cast-transpose, read 2 + write 1 + 1 = 4 bytes. Weights are
      cast once per iteration (``is_first_microbatch``), not priced per micro-batch.
    """

    activation: float  # bytes per element of each cast activation (input forward, output gradient backward)
    weight_forward: float
    weight_backward: float
    closing_only: bool  # only the attention output and the closing projections' output gradients are cast (delayed)


FP8_CASTS = {
    "tensorwise": Fp8Casts(4.0, 5.0, 3.0, False),
    "rowwise": Fp8Casts(6.0, 3.0, 7.0, False),
    "delayed": Fp8Casts(4.0, 0.0, 0.0, True),
}


@dataclass(frozen=True)
class Roofline:
    """Achieved rates of one GPU type at one precision, as the cost provider (planner/cost/provider.py) gives
    them: GEMM and attention FLOP/s, HBM bytes/s of element-wise kernels, the fixed seconds of one layer pass
    (kernel launches), with FP8 GEMMs the recipe's casts, and the HBM bytes/s of kernels streaming over large
    tensors (STREAM_HBM_EFFICIENCY: the FP8 casts, a materialized attention's scores)."""

    gemm_rate: float
    attn_rate: float
    hbm: float
    overhead: float
    casts: Fp8Casts | None = None
    stream_hbm: float = 0.0

    def gemms(self, ops: list[F.Gemm]) -> float:
        return sum(max(op.flops / self.gemm_rate, op.bytes / self.hbm) for op in ops)

    def traffic(self, nbytes: float) -> float:
        return nbytes / self.hbm

    def streamed(self, nbytes: float) -> float:
        """Seconds of ``nbytes`` moved by kernels streaming over large tensors (at stream_hbm)."""
        return nbytes / self.stream_hbm

    def fp8_casts(self, ops: list[F.Gemm], closing: list[F.Gemm]) -> tuple[float, float]:
        """(forward, backward) seconds of the FP8 casts of the linear layers ``ops`` (Fp8Casts), of which
        ``closing`` close the attention (the first) and the MLP; (0, 0) without FP8 GEMMs."""
        c = self.casts
        if c is None:
            return 0.0, 0.0
        cast_in, cast_grad = (closing[:1], closing) if c.closing_only else (ops, ops)
        inputs = sum(op.m * op.k * op.count for op in cast_in)
        grads = sum(op.m * op.n * op.count for op in cast_grad)
        weights = sum(op.k * op.n * op.count for op in ops)
        forward = c.activation * inputs + c.weight_forward * weights
        backward = c.activation * grads + c.weight_backward * weights
        return self.streamed(forward), self.streamed(backward)


def elementwise_bytes(model: ModelSpec, tokens: int, tp: int, sp: bool, moe: bool) -> float:
    """HBM bytes of a layer's forward element-wise kernels (16-bit tensors, read + write).
    Two norms (read 2, write 2 bytes per element each) and two residual adds (read 4, write 2): 20 bytes per
    hidden element, replicated on every TP rank unless sequence parallelism splits them. The activation
    function reads its input and writes its output (GeLU: f wide; SwiGLU: reads 2f, writes f). Rotary and
    head transposes touch Q, K and V about twice. MLA (Megatron-Core multi_latent_attention.py): Q and K are
    qk_nope + qk_rope wide per head, V v_head_dim, and the two latent RMSNorms read and write the query and kv
    latents (replicated over TP like the layer norms, split by sequence parallelism)."""
    h, d = model.hidden_size, model.dim_head
    rep = 20.0 * tokens * h / (tp if sp else 1)
    if model.mla is not None:
        ml, n = model.mla, model.num_attention_heads
        qkv = 2 * 2.0 * tokens * n * (2 * ml.qk_head_dim + ml.v_head_dim) / tp
        rep += 4.0 * tokens * (ml.kv_lora_rank + (ml.q_lora_rank or 0)) / (tp if sp else 1)
    else:
        qkv = 2 * 2.0 * tokens * (model.num_attention_heads + 2 * model.kv_heads) * d / tp
    if moe:
        m = model.moe
        width = m.expert_ffn_hidden_size * (m.top_k + m.shared_experts)
        permute = 4.0 * tokens * m.top_k * h  # dispatch and combine copies
    else:
        width, permute = model.ffn_hidden_size, 0.0
    act = (6.0 if model.mlp == "swiglu" else 4.0) * tokens * width / tp
    return rep + qkv + act + permute


def layer_time(
    model: ModelSpec,
    roof: Roofline,
    *,
    tokens: int,
    seq: int,
    tp: int,
    sp: bool,
    cp: int,
    ep: int,
    moe: bool,
    flash: bool,
    recompute: str,
) -> PassTime:
    """Forward, backward and recompute seconds of one layer for one micro-batch of ``tokens`` tokens."""
    attn_ops, mlp_ops = F.attention_gemms(model, tokens, tp, sp), F.mlp_gemms(model, tokens, tp, moe, ep)
    closing = attn_ops[-1:] + [mlp_ops[i] for i in F.mlp_closing(moe) if i < len(mlp_ops)]
    gemm_f = roof.gemms(attn_ops + mlp_ops)
    cast_f, cast_b = roof.fp8_casts(attn_ops + mlp_ops, closing)
    elem_f = roof.traffic(elementwise_bytes(model, tokens, tp, sp, moe))
    if flash:
        # Causal flash kernels skip the masked half; with CP the ring still sees every key block.
        core = F.attention_core_flops(model, tokens, seq, tp, causal=True)
        attn_f, attn_b = core / roof.attn_rate, 2.5 * core / roof.attn_rate
    else:
        # Materialized softmax: full s^2 batched GEMMs at the GEMM rate, plus score traffic: write scores (2),
        # softmax read/write (4), dropout mask and output (3), read for P.V (2) bytes per score. The scores are
        # b*a*s^2 elements per layer, GBs at training shapes, which the fused scale-mask-softmax and dropout kernels
        # stream through at the rate of kernels over large tensors, not at the calibrated rate of a layer's small
        # element-wise kernels: at that rate Narayanan et al. 2021's GPT-1.7B/3.6B/7.5B (Table 1, where the scores
        # outweigh the hidden-size GEMMs most) were priced 24/17/10% too slow, and the error fell with model size.
        core = F.attention_core_flops(model, tokens, seq, tp, causal=False)
        scores = tokens * seq * model.num_attention_heads / tp
        attn_f = core / roof.gemm_rate + roof.streamed(11.0 * scores)
        attn_b = 2 * core / roof.gemm_rate + roof.streamed(2 * 11.0 * scores)
    forward = gemm_f + cast_f + elem_f + attn_f + roof.overhead
    backward = 2 * gemm_f + cast_b + 2 * elem_f + attn_b + 2 * roof.overhead
    extra = recompute_from_forward(forward, recompute, flash)
    if extra is None and recompute == "op":
        # per-op selective checkpointing re-runs the element-wise kernels and the matmuls whose outputs it did not
        # keep (F.op_checkpoint_recomputed_gemms), with their FP8 casts; the attention output is kept, so the
        # attention is not re-run
        redo = F.op_checkpoint_recomputed_gemms(model, tokens, tp, moe, ep)
        extra = roof.gemms(redo) + roof.fp8_casts(redo, closing)[0] + elem_f + roof.overhead
    elif extra is None:  # selective without flash attention
        extra = attn_f  # Korthikanti et al. 2022: recompute only the attention core
    return PassTime(forward, backward, extra)


RECOMPUTE_MODES = get_args(Recompute)  # what layer_time prices


def recompute_from_forward(forward: float, recompute: str, flash: bool) -> float | None:
    """A layer's extra recompute seconds where the forward alone gives them: full recompute runs the forward
    again; none adds nothing, and neither does selective recompute under flash attention (the kernel already
    recomputes its scores inside the backward). None for per-op and non-flash selective recompute, whose extra work
    depends on the layer's ops (layer_time). A layer's forward and backward do not depend on the mode, so a
    provider that priced the layer under one mode reads the others from it (AnalyticCosts.layer)."""
    if recompute == "full":
        return forward
    if recompute == "none" or (recompute == "selective" and flash):
        return 0.0
    return None


def tp_paired_gemms(model: ModelSpec, roof: Roofline, tokens: int, tp: int, sp: bool, moe: bool, ep: int) -> tuple:
    """Forward seconds of the GEMMs a layer's 4 TP collectives are pipelined with when TP communication is
    overlapped (all-gather -> attention input projections, output projection -> reduce-scatter, all-gather -> MLP
    input GEMMs, MLP output GEMMs -> reduce-scatter; the router and the shared experts go with the MLP side they
    feed or close)."""
    attn = F.attention_gemms(model, tokens, tp, sp)
    mlp = F.mlp_gemms(model, tokens, tp, moe, ep)
    # dense: [in, out]; MoE: [router, expert in, expert out] + [shared in, shared out]
    closing = set(F.mlp_closing(moe))
    mlp_in = [g for i, g in enumerate(mlp) if i not in closing]
    mlp_out = [g for i, g in enumerate(mlp) if i in closing]
    return (roof.gemms(attn[:-1]), roof.gemms(attn[-1:]), roof.gemms(mlp_in), roof.gemms(mlp_out))


def embedding_time(model: ModelSpec, roof: Roofline, tokens: int, tp: int, sp: bool) -> PassTime:
    """Embedding lookup (write tokens*h) and its gradient scatter-add."""
    nbytes = 2.0 * tokens * model.hidden_size / (tp if sp else 1)
    return PassTime(roof.traffic(nbytes), roof.traffic(3 * nbytes), 0.0)


def logits_time(model: ModelSpec, roof: Roofline, tokens: int, tp: int, cross_entropy: str = "fused") -> PassTime:
    """Output projection plus the fp32 softmax cross-entropy over the vocabulary shard: a fused kernel reads and
    writes the fp32 logits about three times (12 bytes per logit); the unfused loss (memory.logits_bytes) also
    writes and reads the fp32 copy and the log-softmax, and casts the gradient back (28 bytes per logit)."""
    gemm = roof.gemms([F.logits_gemm(model, tokens, tp)])
    per_logit = 12.0 if cross_entropy == "fused" else 28.0
    ce = roof.traffic(per_logit * tokens * model.vocab_size / tp)
    return PassTime(gemm + ce, 2 * gemm + ce, 0.0)
