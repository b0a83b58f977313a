"""When nothing fits: find what would (more nodes of the same GPU, or a GPU with more memory)."""

from __future__ import annotations

import time

from planner.cost.provider import cost_source
from planner.cost.stage import StageModel
from planner.search import quick
from planner.search.partition import solve_partition
from planner.search.space import SearchOptions, dims_for, enumerate_candidates
from planner.spec import Job


def any_fits(job: Job, opts: SearchOptions, budget_s: float) -> bool:
    """True when some candidate of the job has a partition that fits (feasibility only). Memory-lean candidates
    (ZeRO-3, small micro-batches, deep pipelines) are tried first."""
    deadline = time.monotonic() + budget_s
    costs = cost_source(job)(0)
    capacity = job.cluster[0].gpu.memory_gib * (1 - opts.memory_margin)
    cands, _, _ = enumerate_candidates(job, costs, opts)
    cands.sort(key=lambda c: (-c.zero, c.mbs, -c.pp, -c.tp, c.sort_key()))
    for c in cands:
        if time.monotonic() > deadline:
            return False
        sm = StageModel(job, dims_for(job, c), costs)
        if quick.forced_recompute(sm, capacity) is None:
            continue
        if quick.greedy_partition(sm, capacity) is not None:
            return True
        res = solve_partition(
            sm,
            capacity,
            partial_recompute=opts.partial_recompute,
            time_limit_s=max(0.05, min(0.5, deadline - time.monotonic())),
        )
        if res.plans is not None:
            return True
    return False


def suggestions(job: Job, opts: SearchOptions, budget_s: float = 10.0) -> list[str]:
    from planner.catalog import gpu_names, resolve_gpu

    group = job.cluster[0]
    out = []
    for factor in (2, 4, 8, 16, 32):
        bigger = job.model_copy(update={"cluster": (group.model_copy(update={"nodes": group.nodes * factor}),)})
        if bigger.num_gpus <= 1_000_000 and any_fits(bigger, opts, budget_s / 6):
            out.append(
                f"use at least {group.nodes * factor} nodes of {group.gpu.name} "
                f"({bigger.num_gpus} GPUs) instead of {group.nodes}"
            )
            break
    roomier = sorted((resolve_gpu(n) for n in gpu_names()), key=lambda g: g.memory_gib)
    for gpu in roomier:
        if gpu.memory_gib <= group.gpu.memory_gib:
            continue
        other = job.model_copy(update={"cluster": (group.model_copy(update={"gpu": gpu}),)})
        if any_fits(other, opts, budget_s / 10):
            out.append(f"or the same {group.num_gpus} GPUs as {gpu.name} ({gpu.memory_gib:g} GiB each)")
            break
    out.append("the search already tried every micro-batch size, recompute placement and ZeRO stage up to 3")
    if opts.memory_margin > 0:
        out.append(f"a smaller --memory-margin (now {opts.memory_margin:.0%}) leaves more room, at the risk of OOM")
    return out


def hetero_suggestions(job: Job, opts: SearchOptions, budget_s: float = 10.0) -> list[str]:
    """What would make a mixed-GPU job fit: more nodes in every group (the smallest multiple that fits), or the
    roomiest group's GPU type with enough nodes on its own."""
    from planner.parallel import group_order
    from planner.search.mixed_pipelines import search_hetero

    out = []
    for factor in (2, 4, 8, 16, 32):
        bigger = job.model_copy(
            update={"cluster": tuple(g.model_copy(update={"nodes": g.nodes * factor}) for g in job.cluster)}
        )
        if bigger.num_gpus > 1_000_000:
            break
        if search_hetero(
            bigger, top=1, time_limit_s=budget_s / 8, options=opts, single_type=False, replicas=False
        ).plans:
            out.append(
                "use at least "
                + ", ".join(f"{g.nodes} nodes of {g.gpu.name}" for g in bigger.cluster)
                + f" ({factor}x every group)"
            )
            break
    roomy = job.cluster[group_order(job.cluster)[0]]
    alone = job.model_copy(update={"cluster": (roomy,), "layout": None})
    for factor in (1, 2, 4, 8, 16, 32):
        more = alone.model_copy(update={"cluster": (roomy.model_copy(update={"nodes": roomy.nodes * factor}),)})
        if more.num_gpus <= 1_000_000 and any_fits(more, opts, budget_s / 12):
            out.append(f"or {more.cluster[0].nodes} nodes of {roomy.gpu.name} alone")
            break
    out.append(
        "the search already tried every stage placement, micro-batch size, recompute placement and "
        "ZeRO stage 0, 1 and 3"
    )
    if opts.memory_margin > 0:
        out.append(f"a smaller --memory-margin (now {opts.memory_margin:.0%}) leaves more room, at the risk of OOM")
    return out


def nothing_fits_message(job: Job, opts: SearchOptions) -> str:
    """The one line `planner plan` prints (exit 3) when no layout fits: what was tried and what would fit."""
    if len(job.cluster) > 1:
        reasons = "; ".join(hetero_suggestions(job, opts))
        return (
            f"error: nothing fits: no layout of {job.model.name} on these {len(job.cluster)} node groups fits "
            f"with --memory-margin {opts.memory_margin:g}. To make it fit: {reasons}"
        )
    reasons = "; ".join(suggestions(job, opts))
    return (
        f"error: nothing fits: no layout of {job.model.name} on {job.num_gpus} GPUs fits in "
        f"{job.cluster[0].gpu.memory_gib * (1 - opts.memory_margin):.1f} GiB per GPU. To make it fit: {reasons}"
    )
