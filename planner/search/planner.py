"""Branch and bound over the search space with CP-SAT at each node.

Candidates (degrees, micro-batch, interleaving, ZeRO) are visited in order of their lower bound. Each visited
candidate gets its best layer partition and recompute placement from CP-SAT (planner/search/partition.py); the
search stops when the next lower bound cannot beat the K-th best plan found, which proves the top K optimal within
the modeled space. The top K are K distinct plans: plans the model cannot tell apart (iteration time and peak memory
within quick.RESOLUTION) are one entry that lists the others as equivalent (_keep). A time limit returns the best so
far with the remaining gap, and SearchResult.stop_reason says what left a gap.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from planner.cost.estimate import Estimate, evaluate_plans
from planner.cost.provider import AnalyticCosts, cost_source
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
    # plans the model cannot tell apart from this one (_ties), in plan order; only on an entry of the top list
    equivalent: list["Plan"] = field(default_factory=list)

    @property
    def time(self) -> float:
        return self.estimate.iteration_time_s

    def order_key(self):
        return (self.time, self.candidate.sort_key())


# Why a search's top K are not proven (SearchResult.stop_reason), most decisive first: the time limit (or a
# phase's share of it) stopped the search with bounds below the K-th best unexplored; a CP-SAT solve stopped at
# its per-solve cap (solve_limit) with its bound below the K-th best; replica shapes (planner/search/replicas.py)
# are evaluated heuristically and their bound is below the K-th best.
STOP_REASONS = ("proven", "time_limit", "solve_cap", "heuristic")


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
    stop_reason: str = "proven"                # one of STOP_REASONS
    gap_source: str | None = None              # mixed search: "mixed_pipelines" | "replica_shapes", the part of
    #                                            the space whose bound sets ``gap`` (None when proven, or one group)


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
    costs = cost_source(job)(0)
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
    timed_out = not complete  # only the deadline (of the enumeration or of this loop) clears it before here
    complete, open_bound = settle_open_solves(complete, open_bounds, best, top)
    final = [p if complete else unproven(p) for p in best]
    unexplored = cands[stopped_at].lower_bound_s if stopped_at < len(cands) else float("inf")
    unexplored = min(unexplored, open_bound)
    if not enumerated:
        unexplored = min(unexplored, global_lower_bound(job, costs))
    gap = 0.0
    if not complete and final:
        gap = max(0.0, (final[0].time - min(unexplored, final[0].time)) / final[0].time)
    reason = "proven" if complete else "time_limit" if timed_out else "solve_cap"
    return SearchResult(final, len(cands), pruned + (len(cands) - stopped_at), solved,
                        time.monotonic() - start, complete, gap, {"infeasible_candidates": infeasible},
                        stop_reason=reason)


def unproven(plan: Plan) -> Plan:
    """The plan (and its equivalents) reported as feasible: the top list it belongs to is not proven."""
    return replace(plan, status="feasible", equivalent=[replace(e, status="feasible") for e in plan.equivalent])


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
    rate = costs.best_flop_rate()
    return (total - attn) / rate / job.num_gpus


def _layout_key(plan: Plan):
    d = plan.estimate.dims
    return d.world, repr(sorted(d.as_dict().items()))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= quick.RESOLUTION * max(abs(a), abs(b))


def _ties(a: Plan, b: Plan) -> bool:
    """The model cannot tell the two plans apart: iteration time and peak memory within quick.RESOLUTION (0.01%),
    the resolution the search proves times to."""
    return _close(a.time, b.time) and _close(a.estimate.peak_memory_gib, b.estimate.peak_memory_gib)


def _keep(best: list[Plan], plan: Plan, top: int) -> None:
    """Insert into the top list, which holds at most ``top`` distinct plans in plan order (time, then candidate).

    A plan that ties an entry (_ties with the entry's plan) joins it: the first of the two in plan order is the
    entry, the other is listed in its ``equivalent``. So K counts distinct plans, and the K-th entry's time stays a
    valid cut for the branch and bound: a candidate whose bound is at or above it can only make a plan that ties an
    entry or is slower than the K-th, never a new distinct entry among the top K (plans that tie are within
    RESOLUTION, the resolution the proof has anyway). Ties found after a candidate was cut are not all listed:
    ``equivalent`` names the equivalent plans the search met, not every one in the space.

    Two candidates can also end in the same layout (e.g. base recompute none and selective when every layer ends
    up fully recomputed): the layout is kept once, with its faster estimate."""
    key = _layout_key(plan)
    for i, entry in enumerate(best):
        members = [entry, *entry.equivalent]
        for j, other in enumerate(members):
            if _layout_key(other) != key:
                continue
            if plan.time >= other.time:
                return
            del members[j]  # the same layout, now faster: take the old estimate out and insert the new one
            if members:
                best[i] = replace(members[0], equivalent=members[1:])
            else:
                del best[i]
            _keep(best, plan, top)
            return
    for i, entry in enumerate(best):
        if _ties(plan, entry):
            members = sorted([entry, *entry.equivalent, replace(plan, equivalent=[])], key=Plan.order_key)
            best[i] = replace(members[0], equivalent=[replace(m, equivalent=[]) for m in members[1:]])
            best.sort(key=Plan.order_key)
            return
    best.append(replace(plan, equivalent=[]))
    best.sort(key=Plan.order_key)
    del best[top:]
