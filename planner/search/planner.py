"""Branch and bound over the search space with CP-SAT at each node.

Candidates (degrees, micro-batch, interleaving, ZeRO) are visited in order of their lower bound. Each visited
candidate gets its best layer partition and recompute placement from CP-SAT (planner/search/partition.py); the
search stops when the next lower bound cannot beat the K-th best plan found, which proves the top K (one plan per
candidate) optimal within the modeled space. A time limit returns the best so far with the remaining gap.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from planner.cost.estimate import Estimate, evaluate_plans
from planner.cost.provider import AnalyticCosts
from planner.cost.stage import StageModel
from planner.parallel import ParallelDims
from planner.search import quick
from planner.search.partition import solve_partition
from planner.search.space import Candidate, SearchOptions, check_searchable, dims_for, enumerate_candidates
from planner.spec import Job


@dataclass
class Plan:
    candidate: Candidate
    estimate: Estimate
    status: str  # "optimal" | "feasible"

    @property
    def time(self) -> float:
        return self.estimate.iteration_time_s


@dataclass
class SearchResult:
    plans: list[Plan]
    candidates: int
    pruned: int
    solved: int
    seconds: float
    complete: bool       # every candidate solved or pruned by its bound
    gap: float           # relative gap of the best plan to the best unexplored lower bound (0 when complete)
    infeasible_reasons: dict = field(default_factory=dict)
    single_type_best_s: float | None = None    # heterogeneous search: best plan on one node group alone
    single_type_group: int | None = None
    unrestricted_best_s: float | None = None   # --framework: best plan without the framework's limits


def stage_recompute(layers, rec, base: str) -> tuple[tuple[int, ...] | None, str]:
    """(per-stage recompute counts, baseline recompute mode) of a layout: None when no layer is recomputed, and
    when every layer is, the baseline "full" instead of counts."""
    rec = tuple(rec) if rec is not None and any(rec) else None
    if rec is not None and all(r == n for r, n in zip(rec, layers)):
        return None, "full"
    return rec, base


def _stage_tuple(plans, base: str) -> tuple[tuple[int, ...], tuple[int, ...] | None, str]:
    """Layer counts, per-stage recompute counts and baseline recompute mode of a solved partition."""
    layers = tuple(p.layers for p in plans)
    return (layers, *stage_recompute(layers, [p.recomputed for p in plans], base))


def _finalize_dims(job: Job, c: Candidate, plans, tp_overlap: bool = False) -> ParallelDims:
    layers, rec, base = _stage_tuple(plans, c.recompute)
    d = dims_for(job, c, layers, rec, tp_overlap)
    return ParallelDims(**{**d.__dict__, "recompute": base})


def search(job: Job, *, top: int = 5, time_limit_s: float = 60.0, workers: int = 1,
           options: SearchOptions | None = None,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    check_searchable(job)
    opts = options or SearchOptions()
    start = time.monotonic()
    deadline = start + time_limit_s
    costs = AnalyticCosts(job.cluster[0], job.training.precision)
    # Enumeration may take at most half the budget, so that a short limit still leaves time to find plans.
    cands, pruned, enumerated = enumerate_candidates(job, costs, opts, start + time_limit_s / 2)
    capacity = job.cluster[0].gpu.memory_gib * (1 - opts.memory_margin)
    best: list[Plan] = []
    solved = 0
    complete = enumerated
    stopped_at = len(cands)
    infeasible = 0
    open_bounds: list[float] = []  # CP-SAT bounds of solves stopped before proving their optimum
    for idx, c in enumerate(cands):
        if progress is not None and idx % 64 == 0:
            progress(idx, len(cands))
        kth = best[top - 1].time if len(best) >= top else float("inf")
        if c.lower_bound_s >= kth:
            stopped_at = idx
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            complete = False
            stopped_at = idx
            break
        sm = StageModel(job, dims_for(job, c, tp_overlap=opts.tp_comm_overlap), costs)
        if sm.lower_bound() >= kth:
            continue
        lb = quick.lower_bound(sm, capacity, kth)
        if lb == float("inf"):
            infeasible += 1
            continue
        if lb >= kth:
            continue
        greedy = None if opts.even_layers else quick.greedy_partition(sm, capacity)
        if greedy is None and c.recompute != "full" and not opts.even_layers and not opts.uniform_recompute:
            greedy = quick.greedy_recompute_partition(sm, capacity)
        incumbent = None
        if greedy is not None:
            est = evaluate_plans(job, _finalize_dims(job, c, greedy, opts.tp_comm_overlap), sm, greedy, opts.memory_margin)
            if est.iteration_time_s <= lb * (1 + quick.RESOLUTION):
                _keep(best, Plan(c, est, "optimal"), top)  # the greedy split meets the bound: optimal
                continue
            incumbent = Plan(c, est, "feasible")
        cap = min(kth, incumbent.time) if incumbent else kth
        res = solve_partition(sm, capacity, partial_recompute=opts.partial_recompute,
                              time_limit_s=solve_limit(remaining, time_limit_s),
                              workers=workers, objective_cap_s=cap if cap < float("inf") else None,
                              even_layers=opts.even_layers, uniform_recompute=opts.uniform_recompute,
                              hint=greedy)
        solved += 1
        if res.plans is None:
            if res.status == "unknown":
                open_bounds.append(res.bound_s)
            if incumbent is not None:
                # nothing beats the greedy split (proven when CP-SAT reports the capped model infeasible)
                incumbent.status = "optimal" if res.status == "infeasible" else "feasible"
                _keep(best, incumbent, top)
            continue
        if res.status != "optimal":
            open_bounds.append(res.bound_s)
        est = evaluate_plans(job, _finalize_dims(job, c, res.plans, opts.tp_comm_overlap), sm, res.plans, opts.memory_margin)
        plan = Plan(c, est, res.status)
        if incumbent is not None and incumbent.time < plan.time:
            plan = incumbent
        _keep(best, plan, top)
    else:
        stopped_at = len(cands)
    if progress is not None:
        progress(len(cands), len(cands))
    complete, open_bound = settle_open_solves(complete, open_bounds, best, top)
    final = [p if complete else Plan(p.candidate, p.estimate, "feasible") for p in best]
    unexplored = cands[stopped_at].lower_bound_s if stopped_at < len(cands) else float("inf")
    unexplored = min(unexplored, open_bound)
    if not enumerated:
        unexplored = min(unexplored, global_lower_bound(job, costs))
    gap = 0.0
    if not complete and final:
        gap = max(0.0, (final[0].time - min(unexplored, final[0].time)) / final[0].time)
    return SearchResult(final, len(cands), pruned + (len(cands) - stopped_at), solved,
                        time.monotonic() - start, complete, gap, {"infeasible_candidates": infeasible})


# One CP-SAT solve may take at most this share of the search's time limit, so that one hard partition cannot
# starve the rest of the search; a solve stopped early keeps its proven bound (settle_open_solves).
SOLVE_SHARE = 0.1


def solve_limit(remaining: float, time_limit_s: float) -> float:
    return min(remaining, max(1.0, SOLVE_SHARE * time_limit_s))


def settle_open_solves(complete: bool, open_bounds: list[float], best: list[Plan], top: int) -> tuple[bool, float]:
    """(whether the top list is still proven, smallest open bound). A solve stopped before proving its optimum
    only leaves the result unproven when its bound is below the K-th best time: otherwise nothing it could still
    find would enter the top list."""
    kth = best[top - 1].time if len(best) >= top else float("inf")
    low = min(open_bounds, default=float("inf"))
    return complete and low >= kth * (1 - 1e-9), low


def global_lower_bound(job: Job, costs: AnalyticCosts) -> float:
    """Iteration seconds no layout can beat: the model's FLOPs (attention halved by the causal mask) over all GPUs
    at the better of the GPU's achievable GEMM and attention rates."""
    from planner.cost import flops as F

    m, t = job.model, job.training
    total = F.model_flops_per_iteration(m, t.seq_length, t.global_batch_size)
    attn = 3.0 * m.num_layers * F.attention_core_flops(m, t.seq_length * t.global_batch_size, t.seq_length, 1, causal=True)
    rate = max(costs.roof.gemm_rate, costs.roof.attn_rate)
    return (total - attn) / rate / job.num_gpus


def _keep(best: list[Plan], plan: Plan, top: int) -> None:
    """Insert into the top list. Two candidates can end in the same layout (e.g. base recompute none and
    selective when every layer ends up fully recomputed): keep the layout once, with its faster estimate."""
    key = (plan.estimate.dims.world, repr(sorted(plan.estimate.dims.as_dict().items())))
    for i, other in enumerate(best):
        if (other.estimate.dims.world, repr(sorted(other.estimate.dims.as_dict().items()))) == key:
            if plan.time < other.time:
                best[i] = plan
                best.sort(key=lambda p: (p.time, p.candidate.sort_key()))
            return
    best.append(plan)
    best.sort(key=lambda p: (p.time, p.candidate.sort_key()))
    del best[top:]
