"""Put the cost model together: predicted iteration time, throughput, MFU and per-stage memory of a layout."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.cost import flops as F
from planner.cost import memory as M
from planner.cost.calibration import Calibration
from planner.cost.compute import peak_tflops
from planner.cost.provider import AnalyticCosts, CostSource, cost_source
from planner.cost.schedule import pipeline_time
from planner.cost.stage import StageModel, StagePlan, split_kinds
from planner.errors import SpecError
from planner.parallel import HeteroDims, ParallelDims, ReplicaDims, dims_from_layout
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
    replica: int | None = None  # plans with layout.replicas: which replica entry
    layer_times_s: dict[str, dict[str, float]] | None = None  # per layer kind: forward, backward of one layer


@dataclass
class Estimate:
    dims: ParallelDims  # or HeteroDims (same duck-typed fields: training, world, pp, as_dict, ...)
    capacity_gib: float
    iteration_time_s: float
    time_breakdown_s: dict[str, float]
    stages: list[StageEstimate]
    model_flops: float
    peak_tflops_per_gpu: float
    stage_capacity_gib: list[float] | None = None  # heterogeneous plans: each stage's own GPU capacity
    calibration: Calibration | None = None  # the cost model's efficiencies this estimate was priced with
    cost_sources: dict[int, dict[str, str]] | None = None  # node groups priced from a profile: component -> source

    def capacity_of(self, position: int) -> float:
        """Capacity of ``stages[position]``'s GPU."""
        return self.stage_capacity_gib[position] if self.stage_capacity_gib else self.capacity_gib

    @property
    def peak_position(self) -> int:
        return max(range(len(self.stages)), key=lambda i: (self.stages[i].peak_bytes, -i))

    @property
    def peak_stage(self) -> StageEstimate:
        return self.stages[self.peak_position]

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_stage.peak_bytes / M.GIB

    @property
    def fits(self) -> bool:
        """Every stage fits its own GPU (one capacity for homogeneous plans)."""
        return all(st.peak_bytes / M.GIB <= self.capacity_of(i) for i, st in enumerate(self.stages))

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
        """The estimate as JSON (planner.report.plan_json.EstimateOut); `planner estimate --json` adds the job echo
        (planner.report.plan_json.estimate_document)."""
        r = lambda x, n=6: float(round(x, n))  # noqa: E731 - fixed rounding keeps JSON byte-stable
        out = {
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
            **({"peak_memory_replica": self.peak_stage.replica} if self.peak_stage.replica is not None else {}),
            "layout": layout_json(self.dims),
            "time_breakdown_s": {k: r(v) for k, v in self.time_breakdown_s.items()},
            "memory_breakdown_gib": {k: r(v / M.GIB, 3) for k, v in self.peak_stage.memory_bytes.items()},
            "stages": [self._stage_json(i, r) for i in range(len(self.stages))],
            "cost_sources": {str(g): v for g, v in sorted((self.cost_sources or {}).items())},
        }
        return out

    def _stage_json(self, i: int, r) -> dict:
        s = self.stages[i]
        out = {
            "index": s.index,
            "layers": s.layers,
            "microbatch_time_s": r(s.microbatch_time_s),
            "peak_memory_gib": r(s.peak_bytes / M.GIB, 3),
            "layer_times_s": {
                kind: {k: r(v, 9) for k, v in times.items()} for kind, times in (s.layer_times_s or {}).items()
            },
        }
        if s.replica is not None:
            out["replica"] = s.replica
            out["group"] = self.dims.replicas[s.replica].stage_groups[s.index]
            out["memory_capacity_gib"] = r(self.stage_capacity_gib[i], 3)
        elif self.stage_capacity_gib:
            out["group"] = self.dims.stage_groups[s.index]
            out["memory_capacity_gib"] = r(self.stage_capacity_gib[i], 3)
        return out


def layout_json(dims) -> dict:
    """``dims.as_dict()`` with no top-level value that a stage or replica entry contradicts: in mixed layouts
    (stages on node groups) ``tp`` is the stages' common TP degree and null when they differ (each stage's own
    ``tp`` holds), ``sequence_parallel`` (on exactly in the stages with tp > 1) null when only some stages have
    tp > 1, and with replicas ``num_microbatches`` null when the replicas run different counts."""
    out = dims.as_dict()
    pipes = dims.replicas if isinstance(dims, ReplicaDims) else (dims,) if isinstance(dims, HeteroDims) else ()
    if pipes:
        tps = {tp for p in pipes for tp in p.stage_tp}
        out["tp"] = next(iter(tps)) if len(tps) == 1 else None
        sp = {tp > 1 for tp in tps}
        out["sequence_parallel"] = next(iter(sp)) if len(sp) == 1 else None
        counts = {p.num_microbatches for p in pipes}
        out["num_microbatches"] = next(iter(counts)) if len(counts) == 1 else None
    return out


def estimate(
    job: Job, layout: Layout | None = None, cal: Calibration | None = None, capacity_margin: float = 0.0
) -> Estimate:
    """Evaluate one layout of ``job`` (default: the job's own layout): homogeneous on a one-group cluster, or
    heterogeneous (stages placed on node groups) on any cluster."""
    layout = layout or job.layout
    if layout is None:
        raise SpecError("layout", "the job has no layout to evaluate; add one or run `planner plan`")
    dims = dims_from_layout(layout, job).check()
    if isinstance(dims, ReplicaDims):
        return estimate_replicas(job, dims, capacity_margin, cal)
    if isinstance(dims, HeteroDims):
        return estimate_hetero(job, dims, capacity_margin, cal)
    if len(job.cluster) != 1:
        raise SpecError(
            "cluster",
            "a single-degree layout needs one node group; on mixed clusters place each "
            "stage with layout.stages[].group, tp and gpus",
        )
    return estimate_dims(job, dims, cost_source(job, cal)(0), capacity_margin)


def estimate_dims(
    job: Job, dims: ParallelDims, costs: AnalyticCosts, capacity_margin: float = 0.0, model: StageModel | None = None
) -> Estimate:
    """Evaluate a fully specified layout (degrees, partition, recompute) with the stage cost model."""
    model = model or StageModel(job, dims, costs)
    plans = split_kinds(job, dims.stage_layers, dims.stage_recompute, dims.recompute == "full")
    return evaluate_plans(job, dims, model, plans, capacity_margin)


def hetero_stage_models(job: Job, dims: HeteroDims, costs_for) -> list[StageModel]:
    """One StageModel per stage, priced on the stage's own node group (``costs_for(group) -> AnalyticCosts``)."""
    by_kind: dict = {}  # stages on the same group with the same TP share one model
    for s, g in enumerate(dims.stage_groups):
        if (g, dims.stage_tp[s]) not in by_kind:
            by_kind[g, dims.stage_tp[s]] = StageModel(job, dims.stage_dims(s), costs_for(g))
    sms = [by_kind[g, tp] for g, tp in zip(dims.stage_groups, dims.stage_tp)]
    return with_group_sends(job, dims.stage_groups, sms)


def with_group_sends(job: Job, stage_groups, sms: list[StageModel]) -> list[StageModel]:
    """Stage models whose pipeline sends to a neighbour on another node group go over the network between the
    two groups (Job.link_gbps) instead of the stage's own links."""
    return [
        sm if links == (None, None) else sm.with_neighbour_links(*links)
        for sm, links in zip(sms, neighbour_links(job, stage_groups, sms))
    ]


def neighbour_links(job: Job, stage_groups, sms: list[StageModel]) -> list[tuple]:
    """Per stage, the links to its previous and next stage where those sit on another node group (else None).
    With interleaving (vpp > 1) the pipeline is a ring: the last stage's chunks feed the first stage's next
    chunks (and take their gradients back), so the first and last stages are neighbours too."""
    p = len(stage_groups)
    out = [(None, None)] * p
    ring = p > 1 and sms[0].dims.vpp > 1
    for s in range(p if ring else p - 1):
        t = (s + 1) % p
        a, b = stage_groups[s], stage_groups[t]
        if a != b:
            out[s] = (out[s][0], sms[s].costs.source.between(a, b))
            out[t] = (sms[t].costs.source.between(b, a), out[t][1])
    return out


def costs_by_group(job: Job, cal: Calibration | None = None) -> CostSource:
    """The job's cost source (planner/cost/provider.cost_source): ``group index -> AnalyticCosts``, memoized."""
    return cost_source(job, cal)


def estimate_hetero(
    job: Job,
    dims: HeteroDims,
    capacity_margin: float = 0.0,
    cal: Calibration | None = None,
    models: list[StageModel] | None = None,
) -> Estimate:
    """Evaluate a heterogeneous layout: every stage priced and memory-checked on its own GPU type."""
    models = models or hetero_stage_models(job, dims, costs_by_group(job, cal))
    plans = split_kinds(job, dims.stage_layers, dims.stage_recompute, dims.recompute == "full")
    return evaluate_stages(job, dims, models, plans, capacity_margin)


def evaluate_plans(
    job: Job, dims: ParallelDims, model: StageModel, plans: list[StagePlan], capacity_margin: float = 0.0
) -> Estimate:
    """Evaluate a homogeneous partition: the same StageModel prices every stage."""
    return evaluate_stages(job, dims, [model] * len(plans), plans, capacity_margin)


def evaluate_stages(
    job: Job, dims, models: list[StageModel], plans: list[StagePlan], capacity_margin: float = 0.0
) -> Estimate:
    """Stage s is priced by ``models[s]``; the pipeline schedule runs over all stage times, the DP tail is the
    slowest stage's, and each stage's memory is held against its own GPU's capacity."""
    t = job.training
    stages: list[StageEstimate] = []
    tails = []
    for s, (model, sp) in enumerate(zip(models, plans)):
        mt = model.microbatch_time(s, sp)
        comp = {
            "compute": mt["compute"],
            "tp_comm": mt["tp_comm"],
            "cp_comm": mt["cp_comm"],
            "ep_comm": mt["ep_comm"],
            "pp_comm": mt["pp_comm"],
            "zero_comm": mt["zero_comm"],
        }
        mem = model.memory(s, sp)
        stages.append(
            StageEstimate(s, sp.layers, mt["total"], comp, mem, sum(mem.values()), layer_times_s=layer_times(model))
        )
        tails.append(model.iteration_tail(s, sp))
    mb = dims.num_microbatches
    steady, bubble = pipeline_time([st.microbatch_time_s for st in stages], dims.vpp, mb)
    slow = max(stages, key=lambda st: (st.microbatch_time_s, -st.index))
    dp_exposed = max(d for d, _ in tails)
    opt = max(o for _, o in tails)
    breakdown = {k: mb * v for k, v in slow.time_s.items()}
    breakdown["pipeline_bubble"] = bubble
    breakdown["dp_comm"] = dp_exposed
    breakdown["optimizer"] = opt
    gpus = [m.costs.group.gpu for m in models]
    caps = [g.memory_gib * (1 - capacity_margin) for g in gpus]
    hetero = isinstance(dims, HeteroDims)
    weights = [m.dims.tp * m.dims.dp for m in models] if hetero else [1] * len(models)
    peak = mean_peak_tflops(gpus, weights, t.precision)
    return Estimate(
        dims=dims,
        capacity_gib=caps[max(stages, key=lambda s: (s.peak_bytes, -s.index)).index],
        iteration_time_s=steady + bubble + dp_exposed + opt,
        time_breakdown_s=breakdown,
        stages=stages,
        model_flops=F.model_flops_per_iteration(job.model, t.seq_length, t.global_batch_size),
        peak_tflops_per_gpu=peak,
        stage_capacity_gib=caps if hetero else None,
        calibration=models[0].cal,
        cost_sources=measured_sources(models),
    )


def layer_times(model: StageModel) -> dict[str, dict[str, float]]:
    """Forward and backward seconds of one layer of each kind (dense, moe) of a stage, one micro-batch."""
    return {kind: {"forward": k.forward, "backward": k.backward} for kind, k in model.kinds.items()}


def measured_sources(models: list[StageModel]) -> dict[int, dict[str, str]]:
    """Per node group priced from a measured profile, which components came from it (CostSource.measured_sources)."""
    out: dict[int, dict[str, str]] = {}
    for source in {id(m.costs.source): m.costs.source for m in models if m.costs.source is not None}.values():
        out.update(source.measured_sources())
    return out


def mean_peak_tflops(gpus, weights, precision: str) -> float:
    """The MFU denominator of a mixed plan: the used GPUs' peaks, as a mean per GPU (``weights``: GPUs of each
    entry of ``gpus``)."""
    return sum(w * peak_tflops(g, precision) for w, g in zip(weights, gpus)) / sum(weights)


def replica_stage_models(job: Job, dims: ReplicaDims, costs_for, stages=None) -> list[list[StageModel]]:
    """Stage models of every replica (of the stages in ``stages`` only, default all); stage s's DP ring runs over
    the stage-s GPUs of all replicas, so where those sit on several node groups its collectives use the slowest
    NVLink, NIC and inter-group link on the ring. With EP the expert parameters' ring (expert-DP: dp*cp/ep ranks
    of every replica) spans the groups too, at its own size."""
    per = [hetero_stage_models(job, r, costs_for) for r in dims.replicas]
    stages = range(dims.pp) if stages is None else stages
    ringed: dict = {}  # stages whose replicas share their models (same group and TP) share the ring's models
    for s in stages:
        groups = sorted({r.stage_groups[s] for r in dims.replicas})
        if len(groups) == 1:
            continue
        sms = [models[s] for models in per]
        key = tuple(map(id, sms))
        if key not in ringed:
            link = _spanning_ring(costs_for, groups, sms[0].shard, sms, [sm.shard_per_node for sm in sms], "shard_link")
            exp_link = None
            if sms[0].exp_shard != sms[0].shard:  # ep > 1: a smaller ring of its own
                per_node = [sm.exp_shard_per_node for sm in sms]
                exp_link = _spanning_ring(costs_for, groups, sms[0].exp_shard, sms, per_node, "exp_link")
            ringed[key] = [sm.with_dp_link(link, exp_link) for sm in sms]
        for models, ringed_sm in zip(per, ringed[key]):
            models[s] = ringed_sm
    return [[models[s] for s in stages] for models in per]


def _spanning_ring(costs_for, groups, size: int, sms: list[StageModel], per_node: list[int], own: str):
    """A ring of ``size`` ranks over the node groups: CostSource.spanning at the fewest ranks per node, and no
    faster than the slowest of the stages' own links (attribute ``own``) for that ring."""
    link = costs_for.spanning(groups, size, min(per_node))
    slowest = min(getattr(sm, own).busbw for sm in sms)
    return dataclasses.replace(link, busbw=slowest) if slowest < link.busbw else link


def estimate_replicas(
    job: Job, dims: ReplicaDims, capacity_margin: float = 0.0, cal: Calibration | None = None
) -> Estimate:
    """Evaluate replicas that differ in placement and micro-batch count. Each replica runs its own pipeline
    schedule; the gradient synchronization waits for the slowest, so the iteration is the slowest replica's
    (schedule + exposed DP tail + optimizer step, planner/cost/estimate.evaluate_stages)."""
    per = replica_stage_models(job, dims, costs_by_group(job, cal))
    ests = []
    for r, models in zip(dims.replicas, per):
        plans = split_kinds(job, r.stage_layers, r.stage_recompute, r.recompute == "full")
        ests.append(evaluate_stages(job, r, models, plans, capacity_margin))
    slow = max(range(len(ests)), key=lambda i: (ests[i].iteration_time_s, -i))
    stages, caps = [], []
    for i, e in enumerate(ests):
        for st, cap in zip(e.stages, e.stage_capacity_gib):
            st.replica = i
            stages.append(st)
            caps.append(cap)
    gpus = [job.cluster[g].gpu for r in dims.replicas for g in r.stage_groups]
    weights = [tp * r.cp * r.dp for r in dims.replicas for tp in r.stage_tp]
    peak = mean_peak_tflops(gpus, weights, job.training.precision)
    top = max(range(len(stages)), key=lambda i: (stages[i].peak_bytes, -i))
    return Estimate(
        dims=dims,
        capacity_gib=caps[top],
        iteration_time_s=ests[slow].iteration_time_s,
        time_breakdown_s=ests[slow].time_breakdown_s,
        stages=stages,
        model_flops=ests[slow].model_flops,
        peak_tflops_per_gpu=peak,
        stage_capacity_gib=caps,
        calibration=ests[slow].calibration,
        cost_sources={g: v for e in ests for g, v in (e.cost_sources or {}).items()},
    )
