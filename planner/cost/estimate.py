"""Put the cost model together: predicted iteration time, throughput, MFU and per-stage memory of a layout."""
from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost import flops as F
from planner.cost import memory as M
from planner.cost.calibration import Calibration
from planner.cost.compute import peak_tflops
from planner.cost.provider import AnalyticCosts
from planner.cost.schedule import pipeline_time
from planner.errors import SpecError
from planner.parallel import ParallelDims
from planner.spec import Job, Layout

SCHEMA_VERSION = 1


@dataclass
class StageEstimate:
    index: int
    layers: int
    microbatch_time_s: float
    time_s: dict[str, float]  # per micro-batch components
    memory_bytes: dict[str, float]
    peak_bytes: float


@dataclass
class Estimate:
    dims: ParallelDims
    capacity_gib: float
    iteration_time_s: float
    time_breakdown_s: dict[str, float]
    stages: list[StageEstimate]
    model_flops: float
    peak_tflops_per_gpu: float
    extra: dict = field(default_factory=dict)

    @property
    def peak_stage(self) -> StageEstimate:
        return max(self.stages, key=lambda s: (s.peak_bytes, -s.index))

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_stage.peak_bytes / M.GIB

    @property
    def fits(self) -> bool:
        return self.peak_memory_gib <= self.capacity_gib

    @property
    def tokens_per_s(self) -> float:
        t = self.dims.training
        return t.global_batch_size * t.seq_length / self.iteration_time_s

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / self.iteration_time_s / self.dims.world / 1e12

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_gpu / self.peak_tflops_per_gpu

    def to_json(self) -> dict:
        r = lambda x, n=6: float(round(x, n))  # noqa: E731 - fixed rounding keeps JSON byte-stable
        return {
            "schema_version": SCHEMA_VERSION,
            "fits": self.fits,
            "iteration_time_s": r(self.iteration_time_s),
            "tokens_per_s": r(self.tokens_per_s, 1),
            "tokens_per_s_per_gpu": r(self.tokens_per_s / self.dims.world, 2),
            "model_tflops_per_gpu": r(self.model_tflops_per_gpu, 2),
            "mfu": r(self.mfu, 4),
            "mfu_peak_tflops": r(self.peak_tflops_per_gpu, 1),
            "peak_memory_gib": r(self.peak_memory_gib, 3),
            "memory_capacity_gib": r(self.capacity_gib, 3),
            "peak_memory_stage": self.peak_stage.index,
            "layout": self.dims.as_dict(),
            "time_breakdown_s": {k: r(v) for k, v in self.time_breakdown_s.items()},
            "memory_breakdown_gib": {k: r(v / M.GIB, 3) for k, v in self.peak_stage.memory_bytes.items()},
            "stages": [
                {
                    "index": s.index, "layers": s.layers, "microbatch_time_s": r(s.microbatch_time_s),
                    "peak_memory_gib": r(s.peak_bytes / M.GIB, 3),
                }
                for s in self.stages
            ],
        }


def _stage_params(job: Job, dims: ParallelDims, first_layer: int, n_layers: int, stage: int) -> tuple[float, float, float]:
    """(dense params, expert params, params of the largest layer) held by one GPU of a stage (after TP/EP)."""
    m = job.model
    dense = expert = 0.0
    biggest = 0.0
    for i in range(first_layer, first_layer + n_layers):
        layer_dense = F.attention_params(m)
        layer_exp = 0.0
        if m.is_moe_layer(i):
            layer_dense += F.moe_shared_params(m)
            layer_exp = m.moe.num_experts / dims.ep * F.expert_params(m)
        else:
            layer_dense += F.dense_mlp_params(m)
        dense += layer_dense / dims.tp
        expert += layer_exp / dims.tp
        biggest = max(biggest, (layer_dense + layer_exp) / dims.tp)
    emb = F.embedding_params(m) / dims.tp
    if stage == 0:
        dense += emb
    if stage == dims.pp - 1 and (not m.tie_embeddings or dims.pp > 1):
        dense += emb  # output layer (a tied copy still lives on the last stage when pp > 1)
    return dense, expert, biggest


def estimate(job: Job, layout: Layout | None = None, cal: Calibration | None = None,
             capacity_margin: float = 0.0) -> Estimate:
    """Evaluate one homogeneous layout of ``job`` (default: the job's own layout)."""
    layout = layout or job.layout
    if layout is None:
        raise SpecError("layout", "the job has no layout to evaluate; add one or run `planner plan`")
    if len(job.cluster) != 1:
        raise SpecError("cluster", "estimating a single-degree layout needs one node group; mixed clusters need per-stage placement")
    dims = ParallelDims.from_layout(layout, job).check()
    group = job.cluster[0]
    return estimate_dims(job, dims, AnalyticCosts(group, job.training.precision, cal), capacity_margin)


def estimate_dims(job: Job, dims: ParallelDims, costs: AnalyticCosts, capacity_margin: float = 0.0) -> Estimate:
    m, t = job.model, job.training
    group, cal = costs.group, costs.cal
    gpn = group.gpus_per_node
    flash = t.attention == "flash"
    tokens = dims.tokens_per_microbatch
    seq = t.seq_length
    mb = dims.num_microbatches

    tp_link = costs.link(*dims.group_span("tp", gpn))
    cp_link = costs.link(*dims.group_span("cp", gpn))
    ep_link = costs.link(*dims.group_span("ep", gpn))
    _, dp_per_node = dims.group_span("dp", gpn)
    shard_dense = dims.dp * dims.cp
    shard_link = costs.link(shard_dense, min(shard_dense, dp_per_node * dims.group_span("cp", gpn)[1]))
    exp_shard = dims.expert_dp
    exp_link = costs.link(exp_shard, min(exp_shard, dp_per_node))
    pp_cross = dims.tp * dims.cp * dims.dp >= gpn
    p2p = costs.p2p(pp_cross)

    act_bytes_tok = 2.0 * tokens * m.hidden_size  # one full activation of the micro-batch, 16-bit

    stages: list[StageEstimate] = []
    first = 0
    for s, n_layers in enumerate(dims.stage_layers):
        comp = {"forward": 0.0, "backward": 0.0, "recompute": 0.0, "tp_comm": 0.0, "cp_comm": 0.0,
                "ep_comm": 0.0, "pp_comm": 0.0, "fsdp_comm": 0.0}
        act = 0.0
        working = 0.0
        n_moe = 0
        for i in range(first, first + n_layers):
            moe = m.is_moe_layer(i)
            n_moe += moe
            lt = costs.layer(m, tokens, seq, dims.tp, dims.sequence_parallel, dims.cp, dims.ep, moe, flash, dims.recompute)
            comp["forward"] += lt.forward
            comp["backward"] += lt.backward
            comp["recompute"] += lt.recompute
            act += M.activation_bytes_per_layer(m, tokens=tokens, seq=seq, tp=dims.tp, sp=dims.sequence_parallel,
                                                flash=flash, recompute=dims.recompute, moe=moe)
            if dims.recompute == "full":
                working = max(working, M.working_bytes_full_recompute(
                    m, tokens=tokens, seq=seq, tp=dims.tp, sp=dims.sequence_parallel, flash=flash, moe=moe))
        # TP: 2 all-reduces (or all-gather + reduce-scatter with SP: same bytes) per layer forward, 2 backward,
        # 2 more when the forward is recomputed (Narayanan et al. 2021, Sec. 3.3; Korthikanti et al. 2022).
        passes = 4 + (2 if dims.recompute == "full" else 0)
        comp["tp_comm"] = n_layers * (passes / 2) * tp_link.all_reduce(act_bytes_tok) if dims.tp > 1 else 0.0
        if dims.tp_comm_overlap:
            # Pipelined with the adjacent GEMMs (Transformer Engine userbuffers, Megatron --tp-comm-overlap):
            # only the part longer than the layers' compute stays on the critical path.
            busy = comp["forward"] + comp["backward"] + comp["recompute"]
            comp["tp_comm"] = max(0.0, comp["tp_comm"] - busy)
        if dims.cp > 1:
            # Ring attention: each step passes this rank's K,V block on; overlapped with the attention kernel.
            kv_bytes = 2.0 * 2.0 * tokens * m.kv_heads * m.dim_head / dims.tp
            ring = cp_link.all_gather(kv_bytes * dims.cp)
            attn = F.attention_core_flops(m, tokens, seq, dims.tp, causal=flash) / costs.roof.attn_rate
            # forward passes K,V once; backward passes K,V and their gradients (3x the forward traffic)
            comp["cp_comm"] = n_layers * 3 * max(0.0, ring - attn)
        if n_moe and dims.ep > 1:
            # Dispatch + combine all-to-all of top_k copies of each token, forward and backward.
            a2a = ep_link.all_to_all(act_bytes_tok * m.moe.top_k)
            comp["ep_comm"] = n_moe * (4 + (2 if dims.recompute == "full" else 0)) * a2a
        if dims.pp > 1:
            comp["pp_comm"] = 2 * dims.vpp * p2p.p2p(act_bytes_tok / dims.tp)
        if s == 0:
            et = costs.embedding(m, tokens, dims.tp, dims.sequence_parallel)
            comp["forward"] += et.forward
            comp["backward"] += et.backward
        if s == dims.pp - 1:
            lg = costs.logits(m, tokens, dims.tp)
            comp["forward"] += lg.forward
            comp["backward"] += lg.backward

        dense, expert, biggest = _stage_params(job, dims, first, n_layers, s)
        if dims.zero_stage >= 3:
            # FSDP: gather weights for forward and again for backward, reduce-scatter gradients, every
            # micro-batch; prefetching overlaps them with compute (Zhao et al. 2023, PyTorch FSDP, Sec. 3.3).
            gb = 2.0 if t.grad_dtype == "bf16" else 4.0
            per_mb = 2 * shard_link.all_gather(2.0 * dense) + shard_link.reduce_scatter(gb * dense)
            if expert:
                per_mb += 2 * exp_link.all_gather(2.0 * expert) + exp_link.reduce_scatter(gb * expert)
            compute_mb = comp["forward"] + comp["backward"] + comp["recompute"]
            comp["fsdp_comm"] = max(0.0, per_mb - cal.fsdp_overlap * compute_mb) + 2 * n_layers * shard_link.latency

        mem = {}
        states_d = M.model_state_bytes(dense, shard_dense, dims.zero_stage, t.grad_dtype, t.optimizer)
        states_e = M.model_state_bytes(expert, exp_shard, dims.zero_stage, t.grad_dtype, t.optimizer)
        for k in states_d:
            mem[k] = states_d[k] + states_e[k]
        if dims.zero_stage >= 3:
            mem["weights"] += 2 * 2.0 * biggest  # the gathered layer and the prefetched next one
        inflight = M.inflight_microbatches(s, dims.pp, dims.vpp, mb)
        mem["activations"] = inflight * act + working
        if s == 0:
            mem["activations"] += inflight * act_bytes_tok / (dims.tp if dims.sequence_parallel else 1)
        if s == dims.pp - 1:
            mem["activations"] += M.logits_bytes(m, tokens, dims.tp)
        allocated = sum(mem.values())
        mem["overhead"] = allocated * cal.memory_fragmentation + cal.memory_fixed_gib * M.GIB
        peak = sum(mem.values())
        mb_time = sum(comp.values())
        stages.append(StageEstimate(s, n_layers, mb_time, comp, mem, peak))
        first += n_layers

    steady, bubble = pipeline_time([st.microbatch_time_s for st in stages], dims.vpp, mb)
    slow = max(stages, key=lambda st: (st.microbatch_time_s, -st.index))

    # DP gradient reduction (ZeRO 0: all-reduce; 1-2: reduce-scatter, then all-gather of updated weights) overlaps
    # the last micro-batch's backward (Megatron --overlap-grad-reduce / PyTorch DDP buckets) and the next forward.
    dense, expert, _ = _stage_params(job, dims, sum(dims.stage_layers[: slow.index]), slow.layers, slow.index)
    gb = 2.0 if t.grad_dtype == "bf16" else 4.0  # bytes per gradient element on the wire
    dp_exposed = 0.0
    if dims.zero_stage < 3:
        if dims.zero_stage == 0:
            red = shard_link.all_reduce(gb * dense) + exp_link.all_reduce(gb * expert)
            gather = 0.0
        else:
            red = shard_link.reduce_scatter(gb * dense) + exp_link.reduce_scatter(gb * expert)
            gather = shard_link.all_gather(2.0 * dense) + exp_link.all_gather(2.0 * expert)
        bwd = slow.time_s["backward"] + slow.time_s["recompute"]
        dp_exposed = max(0.0, red - cal.dp_overlap * bwd) + max(0.0, gather - cal.dp_overlap * slow.time_s["forward"])
    sharded = dims.zero_stage >= 1
    local_update = dense / (shard_dense if sharded else 1) + expert / (exp_shard if sharded else 1)
    opt = costs.optimizer_step(local_update)

    breakdown = {k: mb * v for k, v in slow.time_s.items()}
    breakdown["pipeline_bubble"] = bubble
    breakdown["dp_comm"] = dp_exposed
    breakdown["optimizer"] = opt
    total = steady + bubble + dp_exposed + opt

    capacity = group.gpu.memory_gib * (1 - capacity_margin)
    return Estimate(
        dims=dims, capacity_gib=capacity, iteration_time_s=total, time_breakdown_s=breakdown, stages=stages,
        model_flops=F.model_flops_per_iteration(m, seq, t.global_batch_size),
        peak_tflops_per_gpu=peak_tflops(group.gpu, t.precision),
    )
