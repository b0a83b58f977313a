"""What every search returns: a plan, the search result, why a top list is not proven, and the top-K list.

Shared by the homogeneous search (homogeneous.py), the mixed-pipeline search (mixed_pipelines.py) and the replica
search (replicas.py). K counts distinct plans: plans the model cannot tell apart (iteration time and peak memory
within quick.RESOLUTION) are one entry that lists the others as ``equivalent`` (keep_top).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.cost.estimate import Estimate
from planner.search import quick
from planner.search.space import Candidate


@dataclass
class Plan:
    candidate: Candidate
    estimate: Estimate
    status: str  # "optimal" | "feasible"
    # plans the model cannot tell apart from this one (_ties), in plan order; only on an entry of the top list
    equivalent: list[Plan] = field(default_factory=list)

    @property
    def time(self) -> float:
        return self.estimate.iteration_time_s

    def order_key(self):
        return (self.time, self.candidate.sort_key())


# Why a search's top K are not proven (SearchResult.stop_reason), most decisive first: the time limit (or a
# phase's share of it) stopped the search with bounds below the K-th best unexplored; a CP-SAT solve stopped at
# its per-solve cap (solve_cap) with its bound below the K-th best; replica shapes (planner/search/replicas.py)
# are evaluated heuristically and their bound is below the K-th best.
STOP_REASONS = ("proven", "time_limit", "solve_cap", "heuristic")


@dataclass
class SearchResult:
    plans: list[Plan]
    candidates: int
    pruned: int
    solved: int
    seconds: float
    complete: bool  # every candidate solved or pruned by its bound
    gap: float  # relative gap of the best plan to the best unexplored lower bound (0 when complete)
    infeasible_reasons: dict = field(default_factory=dict)
    single_type_best_s: float | None = None  # heterogeneous search: best plan on one node group alone
    single_type_group: int | None = None
    # heterogeneous search: no plan on one node group alone is faster than this (the baselines stop at the best
    # mixed plan's time); set when none beats it, and then single_type_best_s is None
    single_type_bound_s: float | None = None
    unrestricted_best_s: float | None = None  # --framework: best plan without the framework's limits
    stop_reason: str = "proven"  # one of STOP_REASONS
    gap_source: str | None = None  # mixed search: "mixed_pipelines" | "replica_shapes", the part of


def stage_recompute(layers, rec, base: str) -> tuple[tuple[int, ...] | None, str]:
    """(per-stage recompute counts, baseline recompute mode) of a layout: None when no layer is recomputed, and
    when every layer is, the baseline "full" instead of counts."""
    rec = tuple(rec) if rec is not None and any(rec) else None
    if rec is not None and all(r == n for r, n in zip(rec, layers)):
        return None, "full"
    return rec, base


def stage_tuple(plans, base: str) -> tuple[tuple[int, ...], tuple[int, ...] | None, str]:
    """Layer counts, per-stage recompute counts and baseline recompute mode of a solved partition."""
    layers = tuple(p.layers for p in plans)
    return (layers, *stage_recompute(layers, [p.recomputed for p in plans], base))


def with_proof(plan: Plan, proven: bool) -> Plan:
    """The plan (and its equivalents) as the search reports it: optimal where the top list it belongs to is proven
    (every part of the space left is bounded at or above the K-th best, so each plan is the k-th best whatever its
    own solve or evaluation said: a replica shape's heuristic plan its bound closes, a solve stopped at its cap
    whose bound reaches it), else feasible."""
    status = "optimal" if proven else "feasible"
    return replace(plan, status=status, equivalent=[replace(e, status=status) for e in plan.equivalent])


# One CP-SAT solve may take at most this share of the search's time limit, so that one hard partition cannot
# starve the rest of the search; a solve stopped early keeps its proven bound (settle_open_solves).
SOLVE_SHARE = 0.1
# Where the cap is counted in CP-SAT's deterministic time (solve_cap: the same stop on any machine), the wall clock
# still stops a solve at this many times its cap: the deterministic clock does not count presolve (a 55-stage
# mixed partition of suite job 43 spent 1.0-1.3 s in presolve at 0.00 deterministic seconds, 0.2 s since the model
# has no prefix-sum chain where it needs none: partition._add_layer_counts), and a solve that ran on would starve
# the rest of the search.
SOLVE_WALL = 5.0


def solve_cap(time_limit_s: float) -> float:
    """Seconds one solve may take: SOLVE_SHARE of the search's time limit, at least 1."""
    return max(1.0, SOLVE_SHARE * time_limit_s)


def solve_limit(remaining: float, time_limit_s: float) -> float:
    return min(remaining, solve_cap(time_limit_s))


def solve_wall(remaining: float, cap: float) -> float:
    """Wall-clock seconds for a solve capped at ``cap`` deterministic seconds: the time left, at most SOLVE_WALL
    times the cap."""
    return min(remaining, SOLVE_WALL * cap)


def kth_time(best: list[Plan], top: int, default: float = float("inf")) -> float:
    """The K-th best time of a top list (keep_top), the cut of a search for the top ``top`` plans; ``default``
    while it holds fewer than K plans."""
    return best[top - 1].time if len(best) >= top else default


def settle_open_solves(complete: bool, open_bounds: list[float], best: list[Plan], top: int) -> tuple[bool, float]:
    """(whether the top list is still proven, smallest open bound). A solve stopped before proving its optimum
    only leaves the result unproven when its bound is below the K-th best time: otherwise nothing it could still
    find would enter the top list."""
    kth = kth_time(best, top)
    low = min(open_bounds, default=float("inf"))
    return complete and low >= kth * (1 - 1e-9), low


def _layout_key(plan: Plan):
    d = plan.estimate.dims
    return d.world, repr(sorted(d.as_dict().items()))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= quick.RESOLUTION * max(abs(a), abs(b))


def _ties(a: Plan, b: Plan) -> bool:
    """The model cannot tell the two plans apart: iteration time and peak memory within quick.RESOLUTION (0.01%),
    the resolution the search proves times to."""
    return _close(a.time, b.time) and _close(a.estimate.peak_memory_gib, b.estimate.peak_memory_gib)


def mixed_order(c, groups: tuple, *rest) -> tuple:
    """The sort key of a mixed candidate of either kind (mixed_pipelines.HeteroCandidate, replicas.ReplicaCandidate
    with its groups as (group, tp, count) triples): one top list orders both, by bound first."""
    return (c.lower_bound_s, c.dp, c.cp, c.ep, c.mbs, c.zero, c.recompute, groups, *rest)


# a layout met again at the same time, now solved to optimality (a replica shape first evaluated heuristically)
PROVEN_AGAIN = ("optimal", "feasible")


def keep_top(best: list[Plan], plan: Plan, top: int) -> None:
    """Insert into the top list, which holds at most ``top`` distinct plans in plan order (time, then candidate).

    A plan that ties an entry (_ties with the entry's plan) joins it: the first of the two in plan order is the
    entry, the other is listed in its ``equivalent``. So K counts distinct plans, and the K-th entry's time stays a
    valid cut for the branch and bound: a candidate whose bound is at or above it can only make a plan that ties an
    entry or is slower than the K-th, never a new distinct entry among the top K (plans that tie are within
    RESOLUTION, the resolution the proof has anyway). Ties found after a candidate was cut are not all listed:
    ``equivalent`` names the equivalent plans the search met, not every one in the space.

    Two candidates can also end in the same layout (e.g. base recompute none and selective when every layer ends
    up fully recomputed): the layout is kept once, with its faster estimate (at the same time, the one solved to
    optimality)."""
    key = _layout_key(plan)
    for i, entry in enumerate(best):
        members = [entry, *entry.equivalent]
        for j, other in enumerate(members):
            if _layout_key(other) != key:
                continue
            if plan.time > other.time or (plan.time == other.time and (plan.status, other.status) != PROVEN_AGAIN):
                return
            del members[j]  # the same layout, now faster: take the old estimate out and insert the new one
            if members:
                best[i] = replace(members[0], equivalent=members[1:])
            else:
                del best[i]
            keep_top(best, plan, top)
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
