"""The single-type baselines of a mixed cluster: the best plan on one node group alone, and that plan as a plan of
the mixed job.

A plan on one node group is a mixed layout too: a pipeline all of whose stages sit on that group, the other
groups idle (HeteroDims). Where the mixed searches stop short of it (a time limit on a large MoE space), the mixed
job still gets it as its plan, so a mixed plan is never slower than one of its GPU types alone.
"""

from __future__ import annotations

import time
from dataclasses import replace

from planner.cost.estimate import estimate_hetero
from planner.cost.provider import CostSource
from planner.errors import SpecError
from planner.parallel import ParallelDims, group_order
from planner.search.mixed_context import pipeline_dims
from planner.search.result import Plan
from planner.search.space import SearchOptions
from planner.spec import Job


def best_single_type(
    job: Job,
    opts: SearchOptions,
    workers: int,
    time_limit_s: float,
    progress=None,
    beat: float = float("inf"),
    costs: CostSource | None = None,
    part: tuple[int, int] = (0, 1),
) -> tuple[Plan | None, int | None]:
    """(plan, group) of the best homogeneous plan on one node group alone that is faster than ``beat``, or
    (None, None) if none fits or none is faster. Each group's search is capped by ``beat`` and by the best
    single-type plan found before it. ``progress(done, total, what)``: each search's candidates. ``costs``: the
    mixed job's cost source, whose per-group providers (and the per-layer costs memoized on them) the searches
    share: a group alone is priced as the same GPUs, model and training. ``part`` (i, n): of every group's
    candidates only every n-th in bound order from the i-th (two processes each take a part of each group, so
    neither waits for the other's one slow group: better_single_type picks the better of their answers)."""
    from planner.search.homogeneous import search

    out: tuple[Plan | None, int | None] = (None, None)
    groups = group_order(job.cluster)
    for i, g in enumerate(groups):
        sub = job.model_copy(update={"cluster": (job.cluster[g],), "layout": None})
        share = time_limit_s / (len(groups) - i)
        t0 = time.monotonic()
        what = f"candidates, group {g} ({job.cluster[g].gpu.name}) alone"
        each = None if progress is None else (lambda done, total, what=what: progress(done, total, what))
        cap = beat if out[0] is None else min(beat, out[0].time)
        provider = None if costs is None else costs(g)
        res = search(
            sub,
            top=1,
            time_limit_s=share,
            workers=workers,
            options=opts,
            progress=each,
            beat=cap,
            costs=provider,
            part=part,
        )
        time_limit_s -= time.monotonic() - t0
        if res.plans and (out[0] is None or res.plans[0].time < out[0].time):
            out = (res.plans[0], g)
    return out


def better_single_type(job: Job, *answers: tuple[Plan | None, int | None]) -> tuple[Plan | None, int | None]:
    """The better of best_single_type's answers on parts of the candidates: the faster plan, on a tie the group
    first in group_order (the one a search over all groups keeps: a later group must beat the plan before it); of
    one group's plans the first in plan order (Plan.order_key: the faster, then the candidate order), as a search
    over all its candidates keeps (keep_top)."""
    rank = {g: i for i, g in enumerate(group_order(job.cluster))}
    by_group: dict[int, list[Plan]] = {}
    for plan, g in answers:
        if plan is not None:
            by_group.setdefault(g, []).append(plan)
    firsts = {g: plans[0] if len(plans) == 1 else min(plans, key=Plan.order_key) for g, plans in by_group.items()}
    found = [(plan.time, rank[g], plan, g) for g, plan in firsts.items()]
    if not found:
        return None, None
    _, _, plan, g = min(found, key=lambda x: x[:2])
    return plan, g


def as_mixed_plan(job: Job, group: int, plan: Plan, opts: SearchOptions) -> Plan | None:
    """``plan``, found on node group ``group`` alone, as a plan of the mixed job ``job``: every stage on that group
    at the plan's degrees, priced by the mixed estimator (estimate_hetero). None where a mixed layout cannot
    express it (HeteroDims.check names the rule) or it does not fit there."""
    from planner.search.mixed_pipelines import HeteroCandidate

    d: ParallelDims = plan.estimate.dims
    groups = ((group, d.tp, d.pp),)
    cand = HeteroCandidate(d.dp, d.cp, d.micro_batch_size, d.zero_stage, d.recompute, groups, 0.0, d.ep, d.vpp)
    try:
        dims = pipeline_dims(
            job,
            cand.stage_groups,
            cand.stage_tp,
            d.dp,
            d.cp,
            d.micro_batch_size,
            d.zero_stage,
            d.recompute,
            d.stage_layers,
            d.stage_recompute,
            ep=d.ep,
            vpp=d.vpp,
            tp_comm_overlap=d.tp_comm_overlap,
        ).check()
    except SpecError:
        return None
    est = estimate_hetero(job, dims, opts.memory_margin)
    if not est.fits:
        return None
    return Plan(replace(cand, lower_bound_s=est.iteration_time_s), est, plan.status)
