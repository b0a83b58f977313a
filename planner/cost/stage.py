"""Per-stage costs as affine forms (planner/cost/forms.py) in a stage's decision variables: the single source of
truth shared by the estimator (which evaluates the forms at one partition), the CP-SAT model (which turns them into
linear expressions, planner/search/partition.py) and the bounds (which read their coefficients,
planner/search/quick.py, mixed_context.py, mixed_pipeline_bounds.py).

For fixed parallel degrees every layer of a kind (dense or MoE) costs the same on every stage, so a stage with
``n`` layers of a kind, ``r`` of them fully recomputed, costs ``n*per_layer + r*per_recomputed + constant``, plus
two 0/1 terms: the latency of collectives over expert parameters (present when the stage holds an MoE layer) and
the working activations of a recomputed layer (present when it recomputes one). Each such quantity is written
once, here. Everything is per GPU and per micro-batch unless the name says per iteration.

Where each quantity is written: per-layer coefficients in ``kind_coeffs``; compute per micro-batch in
``StageModel.compute_form``, the rest of the time in ``StageModel._layer_time`` and ``_time_forms``; memory in
``StageModel.states``, ``states_total``, ``activations_per_microbatch`` and ``allocated_memory``; the DP tail and
optimizer step in ``StageModel._tail_forms``; the collectives over a stage's parameters per ZeRO stage in
``StageModel._collectives_of``; the per-layer time floor of the bounds in ``KindCoeffs.layer_floor``.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field

from planner.cost import flops as F
from planner.cost import memory as M
from planner.cost.comm import Link
from planner.cost.compute import runs_fp8
from planner.cost.forms import (
    Affine,
    Collective,
    InflightAffine,
    MemoryForms,
    Overlap,
    Position,
    StageForms,
    StagePlan,
    States,
    TailForms,
    TimeForms,
    Traffic,
    collective_line,
)
from planner.cost.provider import AnalyticCosts
from planner.parallel import ParallelDims
from planner.spec import Job

__all__ = [
    "KINDS",
    "Affine",
    "FormCache",
    "KindCoeffs",
    "LayerKinds",
    "MemoryForms",
    "Position",
    "StageForms",
    "StageModel",
    "StagePlan",
    "TailForms",
    "TimeForms",
    "Traffic",
    "embedding_seconds",
    "fastest_layer",
    "kind_coeffs",
    "logits_seconds",
    "pipeline_send",
    "split_kinds",
]

KINDS = ("dense", "moe")


@dataclass(frozen=True)
class KindCoeffs:
    """What one layer of a kind adds to a stage."""

    compute: float  # forward + backward (+ baseline recompute) seconds
    forward: float  # forward part of compute
    backward: float  # backward part of compute (without recompute), with the gradients' accumulation
    recompute_extra: float  # extra seconds when the layer is fully recomputed
    tp: float  # exposed TP collective seconds (overlapped with GEMMs where the layout says so)
    tp_recompute: float  # extra exposed TP seconds when fully recomputed
    cp: float  # exposed CP ring seconds
    ep: float  # EP all-to-all seconds
    ep_recompute: float
    params_dense: float  # parameters on this GPU replicated over DP*CP
    params_expert: float  # parameters on this GPU replicated over expert-DP
    act: float  # stored activation bytes (baseline recompute mode)
    act_recomputed: float  # stored activation bytes when fully recomputed
    act_working: float  # full activations of one layer, present while a recomputed layer runs backward

    def layer_floor(self) -> float:
        """The least seconds one layer of this kind adds to a stage's micro-batch: its compute and the exposed TP,
        CP and EP communication it cannot avoid. Every per-layer time bound of the searches starts here."""
        return self.compute + self.tp + self.cp + self.ep

    def recompute_floor(self) -> float:
        """The least seconds full recompute adds to one layer: its forward again, with its TP and EP
        collectives."""
        return self.recompute_extra + self.tp_recompute + self.ep_recompute


def layer_counts(model) -> dict[str, int]:
    """How many layers of each kind ("dense", "moe") the model has (read-only: the last model's counts are kept,
    the bounds ask for them in their inner loops)."""
    last = _LAST_LAYERS
    return (last if last[0] is model else _layers_of(model))[1]


def moe_flags(model) -> tuple[bool, ...]:
    """Per layer, in the model's order, whether it is an MoE layer (ModelSpec.is_moe_layer); kept with
    layer_counts."""
    last = _LAST_LAYERS
    return (last if last[0] is model else _layers_of(model))[2]


def _layers_of(model) -> tuple:
    global _LAST_LAYERS
    moe = model.num_moe_layers
    flags = tuple(model.is_moe_layer(j) for j in range(model.num_layers))
    _LAST_LAYERS = (model, {"dense": model.num_layers - moe, "moe": moe}, flags)
    return _LAST_LAYERS


_LAST_LAYERS: tuple = (None, None, None)  # (model, its layer_counts, its moe_flags), replaced whole


def end_params(model, tp: int, first: bool, last: bool, deep: bool) -> float:
    """Embedding (first stage) and output-layer (last stage) parameters on one GPU of a TP group; a tied output
    layer still keeps a copy on the last stage when the pipeline has more than one stage (``deep``)."""
    n = F.embedding_params(model) / tp if first else 0.0
    if last and (not model.tie_embeddings or deep):
        n += F.embedding_params(model) / tp
    return n


def embedding_seconds(costs: AnalyticCosts, model, tokens: int, tp: int, sp: bool, grad_dtype: str):
    """(seconds, forward seconds) the embedding adds to a first stage's micro-batch: its forward and backward and
    the accumulation of its gradients (AnalyticCosts.grad_accumulation)."""
    e = costs.embedding(model, tokens, tp, sp)
    accumulate = costs.grad_accumulation(end_params(model, tp, True, False, False), grad_dtype)
    return e.forward + e.backward + accumulate, e.forward


def logits_seconds(costs: AnalyticCosts, model, tokens: int, tp: int, grad_dtype: str, deep: bool):
    """(seconds, forward seconds) the output layer and loss add to a last stage's micro-batch: forward, backward and
    the accumulation of the output layer's gradients (none for a tied one on a one-stage pipeline: end_params)."""
    lg = costs.logits(model, tokens, tp)
    accumulate = costs.grad_accumulation(end_params(model, tp, False, True, deep), grad_dtype)
    return lg.forward + lg.backward + accumulate, lg.forward


def heavy_kind(model) -> tuple[str, int]:
    """The layer kind the memory bounds count, and how many layers of it the model has: the MoE layers of an MoE
    model (the most bytes per layer), every layer of a dense one. The other layers only add time and memory."""
    kind = "moe" if model.moe is not None else "dense"
    return kind, layer_counts(model)[kind]


def fastest_layer(kinds: dict[str, KindCoeffs], model) -> float:
    """The least seconds one layer of ``model`` adds to a stage's micro-batch: the cheapest of the layer kinds the
    model has (a model whose every layer is an MoE layer has no cheaper dense layer; its floor pays the EP
    all-to-all)."""
    count = layer_counts(model)
    return min(k.layer_floor() for kind, k in kinds.items() if count.get(kind))


def layers_floor(kinds: dict[str, KindCoeffs], model) -> float:
    """The least seconds all of ``model``'s layers add to a micro-batch: each layer at the floor of its own kind
    (an MoE model's few dense layers do not stand for its MoE layers, as L * fastest_layer would let them)."""
    return sum(n * kinds[kind].layer_floor() for kind, n in layer_counts(model).items() if n)


@dataclass(slots=True)
class LayerEnds:
    """The forms of a stage end position (first stage or not, last stage or not, in a pipeline of more than one
    stage or not) that depend on the per-layer coefficients alone, each built when first asked for."""

    params: tuple[Affine, Affine | None] | None = None
    compute: Affine | None = None
    time: tuple[Affine, Affine, Affine, Affine] | None = None  # forward, tp, cp, ep
    activations: Affine | None = None  # per in-flight micro-batch


class LayerKinds(dict):
    """KindCoeffs by layer kind ("dense", "moe"), memoized per micro-batch and TP/CP/EP degrees (kind_coeffs), with
    the forms built from them alone (LayerEnds) and the memory forms, keyed by the bytes per parameter they also
    depend on: shared by every stage model of these degrees."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: dict[tuple[bool, bool, bool], LayerEnds] = {}  # by (first, last, deeper than one stage)
        # model states and allocated memory by end and bytes per parameter (few values per search)
        self.states: dict[tuple, States] = {}  # by StageModel._state_key
        self.memory: dict[tuple, InflightAffine] = {}  # by StageModel._state_key

    def end(self, first: bool, last: bool, deep: bool) -> LayerEnds:
        hit = self.ends.get((first, last, deep))
        if hit is None:
            hit = self.ends[first, last, deep] = LayerEnds()
        return hit


def kind_coeffs(
    job: Job,
    costs: AnalyticCosts,
    tokens: int,
    tp: int,
    cp: int,
    ep: int,
    sp: bool,
    base_rc: str,
    tp_overlap: bool = False,
) -> LayerKinds:
    """Per-layer coefficients of each layer kind. They depend only on TP (and whether its collectives overlap
    GEMMs, ``tp_overlap``), CP, EP, the micro-batch and the model, so they are memoized on the costs object and
    shared by every pipeline/DP/ZeRO choice."""
    m, t = job.model, job.training
    tp_overlap = tp_overlap and tp > 1
    fp8_inputs = t.fp8_saved_inputs and runs_fp8(costs.group.gpu, t.precision)
    # what the coefficients read besides EP, which a dense layer's do not read (flops.mlp_gemms, ParallelDims.spans)
    shared = (
        id(m),
        tokens,
        t.seq_length,
        tp,
        cp,
        sp,
        t.fused_attention,
        base_rc,
        t.tp_backward_overlap,
        tp_overlap,
        fp8_inputs,
        t.grad_dtype,
    )
    hit = costs.kind_coeffs.get((*shared, ep))
    if hit is not None:
        return hit
    costs.keep(m)
    kinds = LayerKinds()
    for kind in KINDS:
        if kind == "moe" and m.moe is None:
            continue
        kind_ep = ep if kind == "moe" else 1  # (one dense entry serves every EP degree)
        kind_key = (kind, *shared, kind_ep)
        if kind_key not in costs.kind_coeffs:
            costs.kind_coeffs[kind_key] = _kind_coeffs(
                job, costs, kind, tokens, tp, cp, kind_ep, sp, base_rc, tp_overlap, fp8_inputs
            )
        kinds[kind] = costs.kind_coeffs[kind_key]
    costs.kind_coeffs[(*shared, ep)] = kinds
    return kinds


def _kind_coeffs(
    job: Job,
    costs: AnalyticCosts,
    kind: str,
    tokens: int,
    tp: int,
    cp: int,
    ep: int,
    sp: bool,
    base_rc: str,
    tp_overlap: bool,
    fp8_inputs: bool,
) -> KindCoeffs:
    """kind_coeffs of one layer kind."""
    m, t = job.model, job.training
    seq = t.seq_length
    flash = t.fused_attention
    spans = ParallelDims.spans(tp, cp, ep, costs.group.gpus_per_node)
    tp_link, cp_link, ep_link = (costs.link(*spans[k]) for k in ("tp", "cp", "ep"))
    act_tok = 2.0 * tokens * m.hidden_size  # one 16-bit activation of the micro-batch
    moe = kind == "moe"
    lt = costs.layer(m, tokens, seq, tp, sp, cp, ep, moe, flash, base_rc)
    full = costs.layer(m, tokens, seq, tp, sp, cp, ep, moe, flash, "full")
    ar = tp_link.all_reduce(act_tok) if tp > 1 else 0.0
    share = None
    if tp_overlap:
        share = tp_overlap_share(tp_link.all_gather(act_tok), costs.tp_gemms(m, tokens, tp, sp, moe, ep), tp)
    tp_s, tp_recompute_s = tp_exposed(ar, base_rc, t.tp_backward_overlap, share)
    ring_exposed = 0.0
    if cp > 1:
        ring_exposed = ring_attention_exposed(
            cp_link,
            kv_bytes=F.attention_kv_bytes(m, tokens, tp),
            attention_s=F.attention_core_flops(m, tokens, seq, tp, causal=flash) / costs.attention_rate(),
            cp=cp,
        )
    a2a = ep_link.all_to_all(act_tok * m.moe.top_k) if (moe and ep > 1) else 0.0
    if moe:
        pd = F.attention_params_per_tp_rank(m, tp) + F.moe_shared_params(m) / tp
        pe = m.moe.num_experts / ep * F.expert_params(m) / tp
    else:
        pd, pe = F.attention_params_per_tp_rank(m, tp) + F.dense_mlp_params(m) / tp, 0.0
    act_kw = {
        "tokens": tokens,
        "seq": seq,
        "tp": tp,
        "sp": sp,
        "flash": flash,
        "moe": moe,
        "fp8_inputs": fp8_inputs,
    }
    accumulate = costs.grad_accumulation(pd + pe, t.grad_dtype)  # after each micro-batch's backward
    return KindCoeffs(
        compute=lt.forward + lt.backward + lt.recompute + accumulate,
        forward=lt.forward,
        backward=lt.backward + accumulate,
        recompute_extra=full.recompute - lt.recompute,
        tp=tp_s,
        tp_recompute=tp_recompute_s,
        cp=ring_exposed,
        ep=4 * a2a,
        ep_recompute=2 * a2a,
        params_dense=pd,
        params_expert=pe,
        act=M.activation_bytes_per_layer(m, recompute=base_rc, **act_kw),
        act_recomputed=M.activation_bytes_per_layer(m, recompute="full", **act_kw),
        act_working=M.working_bytes_full_recompute(m, **act_kw),
    )


def tp_exposed(
    all_reduce_s: float, base_rc: str, backward_overlap: bool, overlap_share: float | None = None
) -> tuple[float, float]:
    """(per-layer TP seconds on the critical path, extra TP seconds when the layer is fully recomputed), given one
    all-reduce of the layer's activation (``all_reduce_s``; with sequence parallelism an all-gather plus a
    reduce-scatter, the same bytes).

    A layer runs 2 such all-reduces forward and 2 backward (Narayanan et al. 2021, Sec. 3.3; Korthikanti et al.
    2022, Sec. 4.2.2). Megatron's linear layers (``backward_overlap``) launch the backward's input-gradient
    all-reduce / reduce-scatter asynchronously under the weight-gradient GEMM (Megatron-LM
    tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication); the forward's 2 stay exposed and a
    full recompute adds 1 more (the calibrated reading of Megatron's cost, fitted with it on
    ../shared/reference/measured-runs.yaml). PyTorch DTensor TP (torchtitan parallelize.py ColwiseParallel /
    RowwiseParallel) issues every collective on the critical path: 2 forward and 2 backward, and a full recompute
    reruns the forward's 2; so do Megatron's layers of 2021-22, before the asynchronous all-reduce
    (planner/runs.py synchronous_tp). Per-op selective checkpointing keeps the reduce-scatter outputs but not the
    all-gather outputs (torchtitan activation_checkpoint.py ``_save_list``), so it reruns the forward's 2
    all-gathers: one all-reduce's bytes.

    ``overlap_share`` (tp_overlap_share: what pipelining a collective with its GEMM leaves exposed), where the
    collectives overlap GEMMs. Megatron with Transformer Engine's userbuffers (--tp-comm-overlap) pipelines every
    one. PyTorch's async TP (torch/_inductor/fx_passes/micro_pipeline_tp.py, torchtitan
    enable_async_tensor_parallel) fuses only all-gather -> matmul and matmul -> reduce-scatter patterns: the
    forward's 2 all-reduces' worth and the backward's all-gathers of the output gradients (half an all-reduce each,
    into the input-gradient matmuls), but not the backward's reduce-scatters, whose input is a sum of several
    matmuls ("only valid scaled_mm-reduce-scatter patterns in the forward graph, but not in the backward graph",
    pytorch/pytorch#149946, 2025-03-28), nor per-op checkpointing's re-gathered inputs, which feed only the
    weight-gradient matmuls (gathered along their contraction). A full recompute's forward is fused as the
    forward."""
    base, rerun = (2 * all_reduce_s, all_reduce_s) if backward_overlap else (4 * all_reduce_s, 2 * all_reduce_s)
    gathers = min(all_reduce_s, rerun) if base_rc == "op" else 0.0
    if overlap_share is None:
        return base + gathers, rerun - gathers
    if backward_overlap:
        return overlap_share * (base + gathers), overlap_share * (rerun - gathers)
    # async TP: the forward (2) and the backward's gathers (1) fused, the backward's reduce-scatters (1) and the
    # re-gathered inputs not
    return overlap_share * 3 * all_reduce_s + all_reduce_s + gathers, overlap_share * (rerun - gathers)


def tp_overlap_share(collective_s: float, gemms_s: tuple, tp: int) -> float:
    """The share of a layer's TP collective seconds left exposed when each collective is pipelined with the GEMM
    it feeds or closes (Megatron --tp-comm-overlap with Transformer Engine userbuffers; torchtitan async TP,
    torch.distributed._symmetric_memory): both are split into ``tp`` chunks and each chunk's transfer runs under
    the GEMM of the chunk before it (Wang et al. 2023, "Overlap Communication with Dependent Computation via
    Decomposition in Large Deep Learning Models", ASPLOS '23, Sec. 3). The local chunk's GEMM needs no transfer
    and the last chunk's GEMM follows the last transfer, so the transfers hide under (tp - 1)/tp of the GEMM:
    exposed = max(0, c - g * (tp - 1)/tp) per collective of ``collective_s`` (c) and GEMM of g seconds.
    Backward collectives pair with GEMMs of the same shapes (the input-gradient GEMMs), so one share serves
    every pass."""
    if collective_s <= 0 or not gemms_s:
        return 1.0
    exposed = sum(max(0.0, collective_s - g * (tp - 1) / tp) for g in gemms_s)
    return min(1.0, exposed / (collective_s * len(gemms_s)))


def ring_attention_exposed(cp_link, *, kv_bytes: float, attention_s: float, cp: int) -> float:
    """Seconds of one layer's context-parallel ring (forward + backward) that the attention kernel does not hide.

    Ring attention with point-to-point KV exchange (Liu et al. 2023, Ring Attention, arXiv 2310.01889;
    Transformer Engine's AttnFuncWithCPAndKVP2P, Megatron-Core's default cp_comm_type "p2p") runs ``cp`` steps:
    step 0 on the local K,V block, each later step on the block received while the previous step computed.
    A step is as long as the longer of its block transfer (one send: bytes / bus bandwidth + latency) and its
    share of the attention (the causal load-balanced split gives every step the same work). Backward moves the
    K,V blocks and their gradients (2x the bytes) against 2.5x the forward work (FlashAttention-2 backward), and
    the last dK,dV block goes back to its owner after the last step, with nothing left to hide it. So short
    chunks, whose attention per step is shorter than a send, pay for their ring."""
    step_f = attention_s / cp
    step_b = 2.5 * attention_s / cp
    forward = (cp - 1) * max(0.0, cp_link.p2p(kv_bytes) - step_f)
    backward = (cp - 1) * max(0.0, cp_link.p2p(2 * kv_bytes) - step_b) + cp_link.p2p(kv_bytes)
    return forward + backward


def pipeline_send(costs: AnalyticCosts, model, tokens: int, tp: int, cp: int, dp: int) -> tuple[Link, float]:
    """The link a stage sends its activations (and receives gradients) on, and the bytes per GPU per
    micro-batch: NVLink while one stage's tp*cp*dp GPUs share a node, else the GPU's own NIC; the activation is
    split over TP (Megatron's scatter-gather sends)."""
    link = costs.p2p(tp * cp * dp >= costs.group.gpus_per_node)
    return link, 2.0 * tokens * model.hidden_size / tp


@dataclass(slots=True)
class _Collectives:
    """The collectives over a stage's parameters under its ZeRO stage (StageModel._collectives)."""

    per_microbatch: tuple[Collective, ...]  # ZeRO-2/3, every micro-batch
    reduction: tuple[Collective, ...]  # after the last backward
    gather: tuple[Collective, ...]  # after the optimizer step


@dataclass(slots=True, eq=False)
class FormCache:
    """The forms of a stage model that depend on its DP sharding, ZeRO stage or links too (LayerKinds holds those
    of the per-layer coefficients alone), by end position (first, last) or by position. Shared by the models that
    differ at most in pipeline depth (a StageModel ``caches`` registry, keyed by StageModel.form_key); hashed by
    identity, so the searches can key their own per-position bounds by it."""

    collectives: _Collectives | None = None
    time: dict[tuple[bool, bool], TimeForms] = field(default_factory=dict)
    tail: dict[tuple[bool, bool], TailForms] = field(default_factory=dict)
    positions: dict[Position, MemoryForms] = field(default_factory=dict)

    def without_links(self) -> FormCache:
        """A cache sharing only what does not depend on the DP*CP links (memory)."""
        return FormCache(None, {}, {}, self.positions)


def _registered(caches: dict[tuple, FormCache], key: tuple) -> FormCache:
    hit = caches.get(key)
    if hit is None:
        hit = caches[key] = FormCache()
    return hit


@functools.lru_cache(maxsize=256)
def _state_bytes_per_param(
    shard: int, zero_stage: int, grad_dtype: str, optimizer: str, fp32_params: bool
) -> dict[str, float]:
    """memory.model_state_bytes of one parameter (memoized: a handful of values per search; not to be mutated)."""
    return M.model_state_bytes(1.0, shard, zero_stage, grad_dtype, optimizer, fp32_params)


@functools.lru_cache(maxsize=4096)
def _inflight_counts(pp: int, vpp: int, microbatches: int) -> tuple[float, ...]:
    return tuple(M.inflight_microbatches(i, pp, vpp, microbatches) for i in range(pp))


class StageModel:
    """The forms of every stage for one choice of parallel degrees (the partition left open). Models built with
    the same ``caches`` registry share their forms with every model of the same form_key."""

    def __init__(
        self, job: Job, dims: ParallelDims, costs: AnalyticCosts, caches: dict[tuple, FormCache] | None = None
    ):
        self.job, self.dims, self.costs = job, dims, costs
        m, t = job.model, job.training
        cal = costs.cal
        self.cal = cal
        gpn = costs.group.gpus_per_node
        self.flash = t.fused_attention
        base_rc = dims.recompute if dims.recompute in ("selective", "op") else "none"
        tokens = dims.tokens_per_microbatch
        self.mb = dims.num_microbatches
        self.grad_wire = M.grad_wire_bytes(t.grad_dtype)

        _, dp_per_node = dims.group_span("dp", gpn)
        self.shard = dims.dp * dims.cp
        self.shard_per_node = min(self.shard, dp_per_node * dims.group_span("cp", gpn)[1])
        self.shard_link = costs.link(self.shard, self.shard_per_node)
        self.exp_shard = dims.expert_dp
        self.exp_shard_per_node = min(self.exp_shard, dp_per_node)
        self.exp_link = costs.link(self.exp_shard, self.exp_shard_per_node)

        act_tok = 2.0 * tokens * m.hidden_size  # one 16-bit activation of the micro-batch
        self.kinds = kind_coeffs(
            job, costs, tokens, dims.tp, dims.cp, dims.ep, dims.sequence_parallel, base_rc, dims.tp_comm_overlap
        )
        self.has_moe = "moe" in self.kinds
        # Per-position constants: embedding on the first stage, logits on the last, pipeline sends in between.
        self.emb_time, self.emb_fwd = embedding_seconds(costs, m, tokens, dims.tp, dims.sequence_parallel, t.grad_dtype)
        self.logits_time, self.logits_fwd = logits_seconds(costs, m, tokens, dims.tp, t.grad_dtype, dims.pp > 1)
        self.own_p2p, self.send_bytes = pipeline_send(costs, m, tokens, dims.tp, dims.cp, dims.dp)
        self.pp_time = self.neighbour_pp_time(None, None) if dims.pp > 1 else 0.0
        self.emb_act = act_tok / (dims.tp if dims.sequence_parallel else 1)
        self.logits_act = M.logits_bytes(m, tokens, dims.tp, job.training.cross_entropy)
        self.largest_layer = max(k.params_dense + k.params_expert for k in self.kinds.values())
        self.working = max(k.act_working for k in self.kinds.values())
        self.states_per_param = {
            "dense": _state_bytes_per_param(self.shard, dims.zero_stage, t.grad_dtype, t.optimizer, t.fp32_params),
            "expert": _state_bytes_per_param(self.exp_shard, dims.zero_stage, t.grad_dtype, t.optimizer, t.fp32_params),
        }
        self.bytes_per_param = {group: sum(per.values()) for group, per in self.states_per_param.items()}
        # ZeRO-3 (FSDP) holds the gathered layer and the prefetched next one, 16-bit (Zhao et al. 2023, Sec. 3.3)
        self.gathered_layers = 2 * 2.0 * self.largest_layer if dims.zero_stage >= 3 else 0.0
        self._layer_floor = fastest_layer(self.kinds, m)
        self._deep = dims.pp > 1
        self.form_cache = FormCache() if caches is None else _registered(caches, self.form_key())

    def _state_key(self, first: bool, last: bool) -> tuple:
        """What the memory forms depend on besides the per-layer coefficients (LayerKinds.states, memory)."""
        per_param = self.bytes_per_param
        return first, last, self._deep, per_param["dense"], per_param["expert"], self.gathered_layers

    def form_key(self) -> tuple:
        """Everything the forms depend on: the cost provider, the model, the degrees and whether the pipeline has
        more than one stage (not its depth, interleaving or micro-batch count: Position carries the in-flight
        micro-batches, and the sends are not part of the forms)."""
        d = self.dims
        return (
            id(self.costs),
            id(self.job.model),
            id(self.job.training),
            d.tokens_per_microbatch,
            d.tp,
            d.cp,
            d.ep,
            d.dp,
            d.sequence_parallel,
            d.recompute,
            d.zero_stage,
            d.tp_comm_overlap,
            d.pp > 1,
        )

    def with_neighbour_links(self, prev: Link | None, nxt: Link | None) -> StageModel:
        """This model for a stage whose pipeline neighbours sit on other node groups: the activation send to the
        next stage and the gradient send to the previous one go over those links (None: a neighbour on this
        stage's own group, or none). A shallow copy; every form is shared (sends are not part of them)."""
        out = copy.copy(self)
        out.pp_time = self.neighbour_pp_time(prev, nxt)
        return out

    def neighbour_pp_time(self, prev: Link | None, nxt: Link | None) -> float:
        """Pipeline-send seconds per micro-batch with the given links to the neighbours (None: own links, which is
        pp_time): one send each way for each of the stage's vpp model chunks."""
        one = (prev or self.own_p2p).p2p(self.send_bytes) + (nxt or self.own_p2p).p2p(self.send_bytes)
        return self.dims.vpp * one

    def with_dp_link(self, link: Link, expert_link: Link | None = None) -> StageModel:
        """This model with its DP*CP gradient/parameter collectives on ``link`` (a ring that spans node groups,
        planner/cost/comm.spanning_link) and the expert parameters' on ``expert_link`` (the expert-DP ring, its own
        with EP; default ``link``). A shallow copy; memory and compute are shared."""
        out = copy.copy(self)
        out.shard_link = link
        out.exp_link = expert_link or link
        out.form_cache = self.form_cache.without_links()
        return out

    # ------------------------------------------------------------------ positions and forms
    def position(self, stage: int) -> Position:
        return Position(stage == 0, stage == self.dims.pp - 1, self.inflight(stage))

    def positions(self) -> list[Position]:
        """The position of every stage, in pipeline order (stages at one position are alike)."""
        return [self.position(i) for i in range(self.dims.pp)]

    def inflight(self, stage: int) -> float:
        return self.inflight_counts()[stage]

    def inflight_counts(self) -> tuple[float, ...]:
        """memory.inflight_microbatches of every stage."""
        d = self.dims
        return _inflight_counts(d.pp, d.vpp, self.mb)

    def forms(self, stage: int) -> StageForms:
        """The forms of pipeline stage ``stage``."""
        pos = self.position(stage)
        return StageForms(
            self.time_forms(pos.first, pos.last), self.memory_forms(pos), self.tail_forms(pos.first, pos.last)
        )

    def time_forms(self, first: bool, last: bool) -> TimeForms:
        cache = self.form_cache.time
        hit = cache.get((first, last))
        if hit is None:
            hit = cache[first, last] = self._time_forms(first, last)
        return hit

    def compute_form(self, first: bool, last: bool) -> Affine:
        """Compute seconds of one micro-batch (TimeForms.compute): forward, backward and recompute of the layers,
        the embedding on the first stage and the logits on the last (embedding_seconds, logits_seconds)."""
        end = self.kinds.end(first, last, self._deep)
        if end.compute is None:
            kd, km = self.kinds["dense"], self._moe_kind()
            ends = (self.emb_time if first else 0.0) + (self.logits_time if last else 0.0)
            end.compute = Affine(ends, kd.compute, km.compute, kd.recompute_extra, km.recompute_extra)
        return end.compute

    def forward_form(self, first: bool, last: bool) -> Affine:
        """Forward seconds of one micro-batch (TimeForms.forward)."""
        return self._layer_time(first, last)[0]

    def _layer_time(self, first: bool, last: bool) -> tuple[Affine, Affine, Affine, Affine]:
        """(forward, tp, cp, ep) forms of TimeForms: per-layer coefficients (and the ends' forward)."""
        end = self.kinds.end(first, last, self._deep)
        if end.time is None:
            kd, km = self.kinds["dense"], self._moe_kind()
            ends_fwd = (self.emb_fwd if first else 0.0) + (self.logits_fwd if last else 0.0)
            end.time = (
                Affine(ends_fwd, kd.forward, km.forward),
                Affine(0.0, kd.tp, km.tp, kd.tp_recompute, km.tp_recompute),
                Affine(0.0, kd.cp, km.cp),
                Affine(0.0, kd.ep, km.ep, kd.ep_recompute, km.ep_recompute),
            )
        return end.time

    def allocated_memory(self, first: bool, last: bool) -> InflightAffine:
        """The bytes a stage allocates at any in-flight count: model states (states), activations per in-flight
        micro-batch (activations_per_microbatch), and the logits of the last stage and, under full recompute, one
        layer's complete activations while it runs backward (memory.working_bytes_full_recompute)."""
        key = self._state_key(first, last)
        hit = self.kinds.memory.get(key)
        if hit is None:
            fixed = Affine(const=self.logits_act if last else 0.0, any_recomputed=self.working)
            hit = InflightAffine(self.states_total(first, last), self.activations_per_microbatch(first), fixed)
            self.kinds.memory[key] = hit
        return hit

    def memory_forms(self, pos: Position) -> MemoryForms:
        cache = self.form_cache.positions
        hit = cache.get(pos)
        if hit is None:
            hit = cache[pos] = self._memory_forms(pos)
        return hit

    def tail_forms(self, first: bool, last: bool) -> TailForms:
        cache = self.form_cache.tail
        hit = cache.get((first, last))
        if hit is None:
            hit = cache[first, last] = self._tail_forms(first, last)
        return hit

    def position_params(self, stage: int) -> float:
        """Embedding (first stage) and output-layer (last stage) parameters, replicated like dense weights."""
        return self._end_params(stage == 0, stage == self.dims.pp - 1)

    def _end_params(self, first: bool, last: bool) -> float:
        return end_params(self.job.model, self.dims.tp, first, last, self._deep)

    def _moe_kind(self) -> KindCoeffs:
        return self.kinds.get("moe", self.kinds["dense"])

    def params(self, first: bool, last: bool) -> tuple[Affine, Affine | None]:
        """(dense, expert) parameters on this GPU: dense ones (attention, dense MLP, shared experts, embedding and
        output layer) are replicated over DP*CP, expert ones over expert-DP (None: the model has no experts)."""
        end = self.kinds.end(first, last, self._deep)
        if end.params is None:
            kd, km = self.kinds["dense"], self._moe_kind()
            dense = Affine(self._end_params(first, last), kd.params_dense, km.params_dense)
            end.params = dense, (Affine(0.0, 0.0, km.params_expert) if self.has_moe else None)
        return end.params

    def _collectives(self) -> _Collectives:
        """The collectives over the stage's parameters under its ZeRO stage, on the DP*CP links.
        ZeRO 0: all-reduce gradients after the last backward; 1: reduce-scatter them there and all-gather the
        updated 16-bit weights; 2: reduce-scatter gradients every micro-batch (DeepSpeed reduces during each
        backward with gradient accumulation) and gather after the step; 3: every micro-batch, gather weights for
        forward and backward and reduce-scatter gradients (PyTorch FSDP, Zhao et al. 2023, Sec. 3.3)."""
        cache = self.form_cache
        if cache.collectives is None:
            cache.collectives = self._collectives_of(
                self.shard_link, self.exp_link, self.shard, self.exp_shard, self.grad_wire, self.dims.zero_stage
            )
        return cache.collectives

    @staticmethod
    def _collectives_of(sh: Link, ex: Link, shard: int, exp_shard: int, g: float, z: int) -> _Collectives:
        def over_both(op: str, bytes_per_param: float) -> Collective:
            return Collective(1, collective_line(sh, op, bytes_per_param), collective_line(ex, op, bytes_per_param))

        if z == 0:
            return _Collectives((), (over_both("all_reduce", g),), ())
        reduce = over_both("reduce_scatter", g)
        gather = over_both("all_gather", 2.0)  # the updated 16-bit weights
        if z == 1:
            return _Collectives((), (reduce,), (gather,))
        if z == 2:
            return _Collectives((reduce,), (), (gather,))
        return _Collectives((reduce, Collective(2, gather.dense, gather.expert)), (), ())

    def per_microbatch_traffic(self, dense: float, expert: float) -> float:
        """Seconds of the ZeRO-2/3 collectives of one micro-batch over the given parameter counts."""
        return sum((c.at(dense, expert) for c in self._collectives().per_microbatch), 0.0)

    def _time_forms(self, first: bool, last: bool) -> TimeForms:
        forward, tp, cp, ep = self._layer_time(first, last)
        zero = None
        if self.dims.zero_stage >= 2:
            # FSDP overlaps the per-micro-batch gathers and reductions with compute, fsdp_overlap of it.
            zero = Overlap(
                Traffic.of(self._collectives().per_microbatch, *self.params(first, last)),
                "compute",
                self.cal.fsdp_overlap,
            )
        return TimeForms(self.compute_form(first, last), forward, tp, cp, ep, zero)

    def _tail_forms(self, first: bool, last: bool) -> TailForms:
        """Overlapped with the last backward (Megatron --overlap-grad-reduce, PyTorch DDP buckets) and the next
        forward (--overlap-param-gather), dp_overlap of each. The optimizer step updates the local shard
        (AnalyticCosts.optimizer_step per parameter)."""
        dense, expert = self.params(first, last)
        lines, ov = self._collectives(), self.cal.dp_overlap
        reduction = gather = None
        if self.dims.zero_stage < 3:
            reduction = Overlap(Traffic.of(lines.reduction, dense, expert), "backward", ov)
            gather = Overlap(Traffic.of(lines.gather, dense, expert), "forward", ov)
        sharded = self.dims.zero_stage >= 1
        local_d = 1.0 / (self.shard if sharded else 1)
        local_e = 1.0 / (self.exp_shard if sharded else 1)
        step = self.costs.optimizer_step(1.0)
        expert_moe = expert.moe if expert is not None else 0.0
        optimizer = Affine(
            const=step * dense.const * local_d,
            dense=step * dense.dense * local_d,
            moe=step * (dense.moe * local_d + expert_moe * local_e),
        )
        return TailForms(reduction, gather, optimizer)

    def _memory_forms(self, pos: Position) -> MemoryForms:
        """Model states and activations, and the allocator's allowance on their sum."""
        return MemoryForms(
            self.states(pos.first, pos.last),
            self._activations(pos),
            self.allocated_memory(pos.first, pos.last).at(pos.inflight),
            self.cal.memory_fragmentation,
            self.cal.memory_fixed_gib * M.GIB,
        )

    def _activations(self, pos: Position) -> Affine:
        """The activations part of allocated_memory at the stage's in-flight count."""
        memory = self.allocated_memory(pos.first, pos.last)
        return memory.per_microbatch.scaled(pos.inflight, memory.end)

    def states(self, first: bool, last: bool) -> States:
        """Model states: each parameter group times its bytes per parameter of each kind of state
        (planner/cost/memory.model_state_bytes); the weights also hold ZeRO-3's gathered layers."""
        key = self._state_key(first, last)
        hit = self.kinds.states.get(key)
        if hit is None:
            dense, expert = self.params(first, last)
            parts = {}
            for state in ("weights", "gradients", "optimizer"):
                parts[state] = dense * self.states_per_param["dense"][state]
                if expert is not None:
                    parts[state] = parts[state] + expert * self.states_per_param["expert"][state]
            parts["weights"] = parts["weights"] + Affine(const=self.gathered_layers)
            hit = States(parts["weights"], parts["gradients"], parts["optimizer"], self.states_total(first, last))
            self.kinds.states[key] = hit
        return hit

    def states_total(self, first: bool, last: bool) -> Affine:
        """All model-state bytes (States.total): each parameter group times its bytes per parameter summed over
        the kinds of state, plus ZeRO-3's gathered layers. The sum of the parts of ``states`` up to rounding."""
        dense, expert = self.params(first, last)
        total = dense * self.bytes_per_param["dense"]
        if expert is not None:
            total = total + expert * self.bytes_per_param["expert"]
        return total + Affine(const=self.gathered_layers)

    def activations_per_microbatch(self, first: bool) -> Affine:
        """Activation bytes one in-flight micro-batch leaves on the stage (memory.activation_bytes_per_layer per
        layer, less when the layer is fully recomputed; the first stage also keeps the embedding output)."""
        end = self.kinds.end(first, False, self._deep)
        if end.activations is None:
            kd, km = self.kinds["dense"], self._moe_kind()
            end.activations = Affine(
                self.emb_act if first else 0.0, kd.act, km.act, kd.act_recomputed - kd.act, km.act_recomputed - km.act
            )
        return end.activations

    def most_layers(self, room: float, inflight: float, recompute: bool = True) -> int:
        """The most layers a stage holding ``inflight`` micro-batches can fit in ``room`` allocatable bytes: each
        layer at its fewest bytes (fully recomputed where that saves memory; with ``recompute`` False, none is),
        the lighter kind first and at most as many of each kind as the model has. An upper bound on the stage's
        layer count for any recompute placement (or without recompute), as per-layer coefficients of
        allocated_memory do not depend on the stage's position."""
        return self.most_layers_each(room, (inflight,), recompute)[0]

    def most_layers_each(self, room: float, inflights, recompute: bool = True) -> list[int]:
        """most_layers at each of several in-flight counts (the per-layer lines read once)."""
        if room <= 0:
            return [0] * len(inflights)
        count = layer_counts(self.job.model)
        kinds = [k for k in self.kinds if count.get(k)]
        lines = [(line, count[k]) for line, k in zip(self.allocated_memory(False, False).layer_lines(kinds), kinds)]
        out = []
        for n in inflights:
            leans = sorted(
                (s + (m * n + e) + (min(0.0, rs + (rm * n + re)) if recompute else 0.0), c)
                for (s, m, e, rs, rm, re), c in lines
            )
            left, held = room, 0
            for lean, available in leans:
                take = available if lean <= 0 else min(available, int(left / lean))
                held += take
                left -= take * lean
                if take < available:
                    break
            out.append(held)
        return out

    def allocatable(self, capacity_gib: float) -> float:
        """The most bytes a stage may allocate on a GPU of ``capacity_gib``: MemoryForms.overhead solved for the
        allocated bytes."""
        cal = self.cal
        return (capacity_gib * M.GIB - cal.memory_fixed_gib * M.GIB) / (1 + cal.memory_fragmentation)

    # ------------------------------------------------------------------ the estimator's view of one stage
    def microbatch_time(self, stage: int, sp: StagePlan) -> dict[str, float]:
        pos = self.position(stage)
        return self.time_forms(pos.first, pos.last).at(sp, self.pp_time)

    def iteration_tail(self, stage: int, sp: StagePlan) -> tuple[float, float]:
        """(exposed DP communication, optimizer step) seconds after the stage's last backward."""
        first, last = stage == 0, stage == self.dims.pp - 1
        time, tail = self.time_forms(first, last), self.tail_forms(first, last)
        return tail.exposed(sp, time.compute.at(sp), time.forward.at(sp)), tail.optimizer.at(sp)

    def memory(self, stage: int, sp: StagePlan) -> dict[str, float]:
        return self.memory_forms(self.position(stage)).at(sp)

    def peak_memory(self, stage: int, sp: StagePlan) -> float:
        """Bytes at the stage's peak: the sum of ``memory`` (MemoryForms.peak)."""
        return self.memory_forms(self.position(stage)).peak(sp)

    # ------------------------------------------------------------------ bounds
    def layer_floor(self) -> float:
        """The least seconds any one layer adds to a stage's micro-batch (fastest_layer)."""
        return self._layer_floor

    def layers_floor(self) -> float:
        """The least seconds all the model's layers add to a micro-batch (layers_floor)."""
        return layers_floor(self.kinds, self.job.model)

    def lower_bound(self) -> float:
        """Iteration seconds no partition can beat: every layer's compute and unavoidable communication (TP
        unless overlapped, CP, EP), embedding, logits and pipeline sends, spread evenly over the stages, in the
        schedule m*max(t) + (sum(t) - max(t))/v >= sum(t)/p * (m + (p-1)/v); plus the smallest optimizer step."""
        d, m = self.dims, self.job.model
        total = self.emb_time + self.logits_time + d.pp * self.pp_time + self.layers_floor()
        params = self.position_params(0) + (self.position_params(d.pp - 1) if d.pp > 1 else 0.0)
        for kind, count in layer_counts(m).items():
            if count:
                k = self.kinds[kind]
                params += count * (k.params_dense + k.params_expert)
        sched = total / d.pp * (self.mb + (d.pp - 1) / d.vpp)
        sharded = d.zero_stage >= 1
        return sched + self.costs.optimizer_step(params / d.pp / (self.shard if sharded else 1))

    def whole_model(self) -> StagePlan:
        """Every layer of the model on one stage (aggregate bounds)."""
        m = self.job.model
        return StagePlan(dense=m.num_layers - m.num_moe_layers, moe=m.num_moe_layers)


def split_kinds(
    job: Job, stage_layers: tuple[int, ...], recompute_layers: tuple[int, ...] | None, full: bool
) -> list[StagePlan]:
    """StagePlans for contiguous stages (recomputed layers placed by StagePlan.with_recompute)."""
    plans, first = [], 0
    for i, n in enumerate(stage_layers):
        moe = job.model.moe_layers_before(first + n) - job.model.moe_layers_before(first)
        r = n if full else (recompute_layers[i] if recompute_layers else 0)
        plans.append(StagePlan(dense=n - moe, moe=moe).with_recompute(r))
        first += n
    return plans
