"""Branch and bound over the search space with CP-SAT at each node.

Candidates (degrees, micro-batch, interleaving, ZeRO) are visited in order of their lower bound. Each visited
candidate gets its best layer partition and recompute placement from CP-SAT (planner/search/partition.py); the
search stops when the next lower bound cannot beat the K-th best plan found, which proves the top K optimal within
the modeled space. The top K are K distinct plans: plans the model cannot tell apart (iteration time and peak memory
within quick.RESOLUTION) are one entry that lists the others as equivalent (result.keep_top). A time limit
returns the best so far with the remaining gap, and SearchResult.stop_reason says what left a gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from planner.cost.estimate import evaluate_plans
from planner.cost.provider import AnalyticCosts, cost_source
from planner.cost.stage import StageModel
from planner.parallel import ParallelDims
from planner.search import quick
from planner.search.partition import solve_partition
from planner.search.result import (
    Plan,
    SearchResult,
    keep_top,
    kth_time,
    settle_open_solves,
    solve_cap,
    solve_wall,
    stage_tuple,
    with_proof,
)
from planner.search.space import Candidate, SearchOptions, check_searchable, dims_for, enumerate_candidates
from planner.spec import Job

#                                            the space whose bound sets ``gap`` (None when proven, or one group)


def _finalize_dims(job: Job, c: Candidate, plans, tp_overlap: bool = False) -> ParallelDims:
    layers, rec, base = stage_tuple(plans, c.recompute)
    d = dims_for(job, c, layers, rec, tp_overlap)
    return ParallelDims(**{**d.__dict__, "recompute": base})


def search(
    job: Job,
    *,
    top: int = 5,
    time_limit_s: float = 60.0,
    workers: int = 1,
    options: SearchOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
    beat: float = float("inf"),
    costs: AnalyticCosts | None = None,
    part: tuple[int, int] = (0, 1),
) -> SearchResult:
    """The top plans of a one-group job. ``beat``: only plans faster than it are of interest (the mixed search's
    best plan, which a single-type baseline need not re-find): candidates whose bound reaches it are pruned, and no
    plan in the result means none is faster. ``costs``: the group's cost provider where a search of the same model
    and training on these GPUs already has one (the mixed search's, for a single-type baseline), so the per-layer
    costs it priced are not priced again; by default the job's own. ``part`` (i, n): only every n-th candidate in
    bound order from the i-th (two processes each search a part; the better of their plans is the search's)."""
    check_searchable(job)
    opts = (options or SearchOptions()).for_job(job)
    start = time.monotonic()
    deadline = start + time_limit_s
    costs = costs or cost_source(job)(0)
    # Enumeration may take at most half the budget, so that a short limit still leaves time to find plans.
    cands, pruned, enumerated = enumerate_candidates(job, costs, opts, start + time_limit_s / 2, cap=beat)
    cands = cands[part[0] :: part[1]]
    capacity = job.cluster[0].gpu.memory_gib * (1 - opts.memory_margin)
    best: list[Plan] = []
    solved = 0
    complete = enumerated
    stopped_at = len(cands)
    infeasible = 0
    open_bounds: list[float] = []  # CP-SAT bounds of solves stopped before proving their optimum
    # Candidates that differ only in pipeline depth, interleaving or the ZeRO-free choices share their stage forms
    # (StageModel.form_key), as the mixed searches' candidates do: built once, not once per candidate.
    form_caches: dict = {}
    for idx, c in enumerate(cands):
        if progress is not None and idx % 64 == 0:
            progress(idx, len(cands))
        kth = min(beat, kth_time(best, top))
        if c.lower_bound_s >= kth:
            stopped_at = idx
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            complete = False
            stopped_at = idx
            break
        sm = StageModel(job, dims_for(job, c, tp_overlap=opts.tp_comm_overlap), costs, form_caches)
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
            est = evaluate_plans(
                job, _finalize_dims(job, c, greedy, opts.tp_comm_overlap), sm, greedy, opts.memory_margin
            )
            if est.iteration_time_s <= lb * (1 + quick.RESOLUTION):
                keep_top(best, Plan(c, est, "optimal"), top)  # the greedy split meets the bound: optimal
                continue
            incumbent = Plan(c, est, "feasible")
        cap = min(kth, incumbent.time) if incumbent else kth
        work = solve_cap(time_limit_s)  # (CP-SAT's deterministic time: the same stop on any machine)
        res = solve_partition(
            sm,
            capacity,
            partial_recompute=opts.partial_recompute,
            time_limit_s=solve_wall(remaining, work),
            work_limit=work,
            workers=workers,
            objective_cap_s=cap if cap < float("inf") else None,
            even_layers=opts.even_layers,
            uniform_recompute=opts.uniform_recompute,
            hint=greedy,
            recompute_step=sm.dims.vpp if opts.recompute_in_chunks else 1,
        )
        solved += 1
        if res.plans is None:
            if res.status == "unknown":
                open_bounds.append(res.bound_s)
            if incumbent is not None:
                # nothing beats the greedy split (proven when CP-SAT reports the capped model infeasible)
                incumbent.status = "optimal" if res.status == "infeasible" else "feasible"
                keep_top(best, incumbent, top)
            continue
        if res.status != "optimal":
            open_bounds.append(res.bound_s)
        est = evaluate_plans(
            job, _finalize_dims(job, c, res.plans, opts.tp_comm_overlap), sm, res.plans, opts.memory_margin
        )
        plan = Plan(c, est, res.status)
        if incumbent is not None and incumbent.time < plan.time:
            plan = incumbent
        keep_top(best, plan, top)
    else:
        stopped_at = len(cands)
    if progress is not None:
        progress(len(cands), len(cands))
    timed_out = not complete  # only the deadline (of the enumeration or of this loop) clears it before here
    complete, open_bound = settle_open_solves(complete, open_bounds, best, top)
    final = [with_proof(p, complete) for p in best]
    unexplored = cands[stopped_at].lower_bound_s if stopped_at < len(cands) else float("inf")
    unexplored = min(unexplored, open_bound)
    if not enumerated:
        unexplored = min(unexplored, global_lower_bound(job, costs))
    gap = 0.0
    if not complete and final:
        gap = max(0.0, (final[0].time - min(unexplored, final[0].time)) / final[0].time)
    reason = "proven" if complete else "time_limit" if timed_out else "solve_cap"
    return SearchResult(
        final,
        len(cands),
        pruned + (len(cands) - stopped_at),
        solved,
        time.monotonic() - start,
        complete,
        gap,
        {"infeasible_candidates": infeasible},
        stop_reason=reason,
    )


def global_lower_bound(job: Job, costs: AnalyticCosts) -> float:
    """Iteration seconds no layout can beat: the model's FLOPs (attention halved by the causal mask) over all GPUs
    at the better of the GPU's achievable GEMM and attention rates."""
    from planner.cost import flops as F

    m, t = job.model, job.training
    total = F.model_flops_per_iteration(m, t.seq_length, t.global_batch_size)
    attn = (
        3.0 * m.num_layers * F.attention_core_flops(m, t.seq_length * t.global_batch_size, t.seq_length, 1, causal=True)
    )
    rate = costs.best_flop_rate()
    return (total - attn) / rate / job.num_gpus
