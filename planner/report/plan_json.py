"""The versioned JSON of `planner plan` (schema_version 1), its JSON Schema, and the placement of stages on nodes.

The pydantic models below are the contract read by launch scripts; `planner schema plan` prints their JSON Schema.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from planner.cost.estimate import SCHEMA_VERSION, Estimate
from planner.parallel import RANK_ORDER
from planner.search.planner import SearchResult
from planner.spec import Job


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StageOut(_Out):
    layers: int
    recompute_layers: Optional[int] = None


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
    stages: list[StageOut]
    num_microbatches: int


class StageEstimateOut(_Out):
    index: int
    layers: int
    microbatch_time_s: float
    peak_memory_gib: float


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
    layout: LayoutOut
    time_breakdown_s: dict[str, float]
    memory_breakdown_gib: dict[str, float]
    stages: list[StageEstimateOut]


class Optimality(_Out):
    status: Literal["optimal", "feasible"]
    gap: float


class StagePlacement(_Out):
    stage: int
    group: int
    gpu: str
    first_rank: int
    last_rank: int
    first_node: int
    last_node: int


class Placement(_Out):
    rank_order: str
    world_size: int
    idle_gpus: int
    gpus_per_node: int
    stages: list[StagePlacement]


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


class PlanDocument(_Out):
    schema_version: int
    plans: list[PlanOut]
    current: Optional[EstimateOut] = None
    search: SearchOut


def placement(job: Job, est: Estimate) -> dict:
    """Which ranks and nodes host each pipeline stage under Megatron's tp-cp-ep-dp-pp order (PP outermost)."""
    d = est.dims
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


def plan_document(job: Job, result: SearchResult, current: Estimate | None, timing: bool = True) -> dict:
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
                   "complete": result.complete, "seconds": round(result.seconds, 3) if timing else None},
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
