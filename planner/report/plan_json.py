"""The versioned JSON of `planner plan` (schema_version 1), its JSON Schema, and the placement of stages on nodes.

The pydantic models below are the contract read by launch scripts; `planner schema plan` prints their JSON Schema.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from planner.cost.estimate import SCHEMA_VERSION, Estimate
from planner.parallel import RANK_ORDER, HeteroDims, ReplicaDims
from planner.search.planner import SearchResult
from planner.spec import Job


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StageOut(_Out):
    layers: int
    recompute_layers: Optional[int] = None
    group: Optional[int] = None   # heterogeneous plans: node group (index into the job's cluster)
    tp: Optional[int] = None      # heterogeneous plans: this stage's TP degree
    gpus: Optional[int] = None    # heterogeneous plans: tp*cp*dp GPUs of the stage (tp*cp*count in a replica)


class ReplicaOut(_Out):
    count: int             # identical replicas of this pipeline
    micro_batches: int     # micro-batches each of them runs per iteration
    stages: list[StageOut]


class LayoutOut(_Out):
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    micro_batch_size: int
    sequence_parallel: bool
    zero_stage: int
    recompute: Literal["none", "selective", "full"]
    tp_comm_overlap: bool
    stages: Optional[list[StageOut]] = None        # absent when replicas differ (then see replicas)
    replicas: Optional[list[ReplicaOut]] = None    # DP replicas that differ in placement and micro-batch count
    num_microbatches: int


class StageEstimateOut(_Out):
    index: int
    layers: int
    microbatch_time_s: float
    peak_memory_gib: float
    group: Optional[int] = None                 # heterogeneous plans
    memory_capacity_gib: Optional[float] = None  # heterogeneous plans: this stage's GPU capacity with the margin
    replica: Optional[int] = None               # plans with replicas: index into layout.replicas


class EstimateOut(_Out):
    schema_version: int
    fits: bool
    iteration_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    mfu_peak_tflops: float
    peak_memory_gib: float
    memory_capacity_gib: float
    peak_memory_stage: int
    peak_memory_replica: Optional[int] = None
    layout: LayoutOut
    time_breakdown_s: dict[str, float]
    memory_breakdown_gib: dict[str, float]
    stages: list[StageEstimateOut]


class Optimality(_Out):
    status: Literal["optimal", "feasible"]
    gap: float


class StagePlacement(_Out):
    stage: int
    replica: Optional[int] = None
    group: int
    gpu: str
    first_rank: int
    last_rank: int
    first_node: int
    last_node: int


class GroupIdle(_Out):
    group: int
    gpu: str
    used_gpus: int
    idle_gpus: int
    idle_reason: Optional[str] = None  # why the idle GPUs are not used


class Placement(_Out):
    rank_order: str
    world_size: int
    idle_gpus: int
    gpus_per_node: int
    stages: list[StagePlacement]
    groups: Optional[list[GroupIdle]] = None  # heterogeneous plans: GPUs used and idle per node group


class PlanOut(_Out):
    rank: int
    layout: LayoutOut
    estimate: EstimateOut
    optimality: Optimality
    placement: Placement


class SearchOut(_Out):
    candidates: int
    pruned: int
    solved: int
    complete: bool
    seconds: Optional[float]
    framework: Optional[str] = None
    unrestricted_best_s: Optional[float] = None  # --framework: best plan without the framework's limits
    single_type_best_s: Optional[float] = None   # heterogeneous search: best plan on one node group alone
    single_type_group: Optional[int] = None
    hetero_vs_single_ratio: Optional[float] = None  # best heterogeneous / best single-type iteration time


class PlanDocument(_Out):
    schema_version: int
    plans: list[PlanOut]
    current: Optional[EstimateOut] = None
    search: SearchOut


def placement(job: Job, est: Estimate) -> dict:
    """Which ranks and nodes host each pipeline stage under Megatron's tp-cp-ep-dp-pp order (PP outermost)."""
    d = est.dims
    if isinstance(d, ReplicaDims):
        return replica_placement(job, d)
    if isinstance(d, HeteroDims):
        return hetero_placement(job, d)
    group = job.cluster[0]
    per_stage = d.tp * d.cp * d.dp
    gpn = group.gpus_per_node
    stages = []
    for s in range(d.pp):
        first, last = s * per_stage, (s + 1) * per_stage - 1
        stages.append({"stage": s, "group": 0, "gpu": group.gpu.name, "first_rank": first, "last_rank": last,
                       "first_node": first // gpn, "last_node": last // gpn})
    return {"rank_order": RANK_ORDER, "world_size": d.world, "idle_gpus": job.num_gpus - d.world,
            "gpus_per_node": gpn, "stages": stages}


def hetero_placement(job: Job, d: HeteroDims) -> dict:
    """Stage s takes the next tp_s*cp*dp GPUs of its node group (groups numbered from their own first node);
    global ranks run over the stages in pipeline order (PP outermost). GPUs a group does not use stay idle."""
    return _placed(job, d, [(None, d)])


def replica_placement(job: Job, d: ReplicaDims) -> dict:
    """As hetero_placement, replica entry after replica entry (each entry's stages in pipeline order)."""
    return _placed(job, d, list(enumerate(d.replicas)))


def _placed(job: Job, d, pipelines) -> dict:
    stages, rank, nxt = [], 0, {}
    for r, pipe in pipelines:
        for s, (g, tp) in enumerate(zip(pipe.stage_groups, pipe.stage_tp)):
            grp = job.cluster[g]
            n = tp * pipe.cp * pipe.dp
            local = nxt.get(g, 0)
            nxt[g] = local + n
            stages.append({"stage": s, **({"replica": r} if r is not None else {}), "group": g, "gpu": grp.gpu.name,
                           "first_rank": rank, "last_rank": rank + n - 1, "first_node": local // grp.gpus_per_node,
                           "last_node": (local + n - 1) // grp.gpus_per_node})
            rank += n
    used = d.gpus_by_group()
    groups = []
    for g, grp in enumerate(job.cluster):
        idle = grp.num_gpus - used[g]
        groups.append({"group": g, "gpu": grp.gpu.name, "used_gpus": used[g], "idle_gpus": idle,
                       **({"idle_reason": idle_reason(d, pipelines, g, idle)} if idle else {})})
    return {"rank_order": RANK_ORDER, "world_size": d.world, "idle_gpus": job.num_gpus - d.world,
            "gpus_per_node": job.cluster[0].gpus_per_node, "stages": stages, "groups": groups}


def idle_reason(d, pipelines, g: int, idle: int) -> str:
    """Why a node group's GPUs stay idle: too few for one more stage (or replica) of the plan's shape, or using
    them would not be faster (the search compared the plans that do)."""
    if not any(g in pipe.stage_groups for _, pipe in pipelines):
        return "the group is left out: no plan that uses it is faster"
    sizes = sorted({tp * pipe.cp * pipe.dp for _, pipe in pipelines
                    for gg, tp in zip(pipe.stage_groups, pipe.stage_tp) if gg == g})
    if isinstance(d, ReplicaDims):
        pipe = next(p for _, p in pipelines if g in p.stage_groups)
        need = sum(tp * pipe.cp for tp in pipe.stage_tp)
        if idle < need:
            return f"one more replica needs {need} GPUs, {idle} are left"
    elif idle < min(sizes):
        return f"one more stage needs {min(sizes)} GPUs (tp*cp*dp), {idle} are left"
    return "a plan that also uses them is not faster (more stages add pipeline sends and fill time)"


def _search_extras(result: SearchResult, framework: str | None) -> dict:
    out = {}
    if framework:
        out["framework"] = framework
    if result.unrestricted_best_s is not None:
        out["unrestricted_best_s"] = round(result.unrestricted_best_s, 6)
    if result.single_type_best_s is not None:
        out["single_type_best_s"] = round(result.single_type_best_s, 6)
        out["single_type_group"] = result.single_type_group
        if result.plans:
            out["hetero_vs_single_ratio"] = round(result.plans[0].time / result.single_type_best_s, 4)
    return out


def plan_document(job: Job, result: SearchResult, current: Estimate | None, timing: bool = True,
                  framework: str | None = None) -> dict:
    plans = []
    for rank, plan in enumerate(result.plans, start=1):
        est = plan.estimate.to_json()
        gap = 0.0 if plan.status == "optimal" else round(result.gap, 6)
        plans.append({
            "rank": rank, "layout": est["layout"], "estimate": est,
            "optimality": {"status": plan.status, "gap": gap},
            "placement": placement(job, plan.estimate),
        })
    doc = {
        "schema_version": SCHEMA_VERSION,
        "plans": plans,
        "search": {"candidates": result.candidates, "pruned": result.pruned, "solved": result.solved,
                   "complete": result.complete, "seconds": round(result.seconds, 3) if timing else None,
                   **_search_extras(result, framework)},
    }
    if current is not None:
        doc["current"] = current.to_json()
    PlanDocument.model_validate(doc)  # the output always matches its published schema
    return doc


def plan_schema() -> dict:
    schema = PlanDocument.model_json_schema()
    schema["$id"] = f"https://planner.dev/schemas/plan-v{SCHEMA_VERSION}.json"
    schema["title"] = f"planner plan output, schema_version {SCHEMA_VERSION}"
    return schema
