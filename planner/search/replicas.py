"""Heterogeneous data parallelism: DP replicas on different GPU types, each running its own number of
micro-batches so that they finish together (layout.replicas, planner.parallel.ReplicaDims).

A shape fixes tp, cp, pp, micro-batch, ZeRO stage and baseline recompute, and a set of >= 2 node groups; group g
then runs d_g = GPUs_g // (tp*cp*pp) replicas of a pipeline placed entirely on g; and an EP degree shared by all
replicas, which carves its groups out of each replica entry's own d_g*cp ranks (planner.parallel.ep_error, the
rule of the homogeneous search; ReplicaDims). The replicas share the layer split and TP (their gradients are
reduced stage by stage over a ring that spans the groups); recompute counts and micro-batch counts are per
replica. For a shape:
  1. each group's balanced split on its own GPUs (the homogeneous search's greedy splits, planner/search/quick.py,
     else CP-SAT);
  2. every group's split is tried for all replicas, each replica recomputing the fewest layers that fit its GPUs;
  3. the micro-batch counts m_g (sum_g d_g m_g = global batch / micro-batch) are chosen to minimize the slowest
     replica's time, and the plan is evaluated exactly (planner/cost/estimate.estimate_replicas).
With pipelines (pp > 1) steps 1-2 fix a layer split the model does not prove optimal, so those shapes stay open
(their bound sets the reported gap); with one stage the evaluation is exact (_heuristic_shape) and closes the
shape. Shapes are visited best-first by a throughput bound (the M micro-batches and each replica's pipeline fill
over the groups' fastest possible micro-batch rates; a shape's ZeRO stage goes back in line at its replicas'
throughput floor, then at their pipeline floor, as it comes out below each) and the search stops when the bound
reaches the best plan already known.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass
from typing import Protocol

from planner.cost import flops as F
from planner.cost.estimate import estimate_replicas, evaluate_stages, replica_stage_models
from planner.cost.memory import GIB, grad_wire_bytes, model_state_bytes
from planner.cost.stage import StageModel, split_kinds
from planner.parallel import (
    ReplicaDims,
    baseline_recompute_modes,
    cp_options,
    ep_error,
    ep_options,
    micro_batch_options,
    node_group_tp_options,
    seq_shard_error,
)
from planner.search import quick
from planner.search.mixed_context import end_costs, model_layers_bound, pipeline_dims
from planner.search.mixed_pipeline_bounds import stages_tail_bottleneck
from planner.search.partition import solve_partition
from planner.search.quick import RESOLUTION
from planner.search.replica_partition import exact_splits
from planner.search.result import Plan, keep_top, kth_time, mixed_order, stage_recompute

REPLICA_ZERO = (1, 0, 3)


@dataclass(frozen=True)
class ReplicaCandidate:
    """A shape (see the module docstring) and the replica counts per used group."""

    tp: int
    cp: int
    pp: int
    mbs: int
    zero: int
    recompute: str
    counts: tuple[tuple[int, int], ...]  # (group, replicas) per used group
    lower_bound_s: float
    ep: int = 1  # expert-parallel degree of every replica

    @property
    def dp(self) -> int:
        return sum(d for _, d in self.counts)

    @property
    def key(self) -> tuple:
        """The shape and ZeRO stage without the bound: what the memoized floors and exact results are kept by."""
        return self.tp, self.cp, self.pp, self.mbs, self.zero, self.recompute, self.counts, self.ep

    def sort_key(self):
        return mixed_order(self, tuple((g, self.tp, d) for g, d in self.counts))


def _ep_superset(model) -> list[int]:
    """Every EP degree planner.parallel.ep_error accepts at some dp*cp: those it accepts at dp*cp = the expert count
    (any degree it accepts divides the expert count); [1] for a dense model."""
    return ep_options(model, model.moe.num_experts if model.moe is not None else 1, 1)


def replica_ep_options(ctx, counts, cp: int, eps: list[int] | None = None) -> list[int]:
    """EP degrees (of ``eps``, default every one) that every replica entry accepts: ep_error with the entry's own
    count as its dp (its EP groups run in step with its own micro-batches, planner.parallel.ReplicaDims)."""
    m, ok = ctx.job.model, ctx.caches.ep_ok
    out = []
    for ep in eps or _ep_superset(m):
        for _, d in counts:
            key = (ep, d, cp)
            hit = ok.get(key)
            if hit is None:
                hit = ok[key] = ep_error(m, ep, d, cp) is None
            if not hit:
                break
        else:
            out.append(ep)
    return out


def shapes(ctx, deadline: float, beat: float, keep: int | None = None):
    """_shapes, kept for the whole search: an enumeration the deadline did not cut short holds every shape below its
    bound, so a later call below the same or a lower bound only filters it. ``keep``: only the ``keep`` first
    shapes in the order (bound, shape); those hold every shape below the keep-th one's bound (_shapes drops only
    shapes at or above it), so a later call below that bound filters them too: the replica search proper below the
    first look's incumbent (1.1 s of seed-1 suite job 31's 9 s, enumerating again what the look had kept)."""
    for cut, found in ctx.caches.replica_shapes.items():
        if beat <= cut:
            found = [x for x in found if x[0] < beat]
            return (found if keep is None else _first(found, keep)), False
    found, cut_short = _shapes(ctx, deadline, beat, keep)
    if not cut_short:
        ctx.caches.replica_shapes[beat if keep is None or len(found) < keep else found[-1][0]] = found
    return found, cut_short


def _ep_reachable(ep: int, cp: int, most_d: int) -> bool:
    """Whether ``ep`` divides d * cp (planner.parallel.ep_error) for some replica count 1 <= d <= most_d: the least
    such d is ep / gcd(ep, cp)."""
    return ep // math.gcd(ep, cp) <= most_d


def micro_batch_work(ctx, g: int, tp: int, cp: int, mbs: int, base: str, ep: int = 1) -> float:
    """Least seconds one micro-batch takes through a whole pipeline on group g (all its stages' work): every layer
    at the floor of its kind (mixed_context.model_layers_bound), the embedding and the logits."""
    return model_layers_bound(ctx, g, tp, cp, mbs, base, ep) + sum(end_costs(ctx, (g, tp), (g, tp), cp, mbs))


def _shapes(ctx, deadline: float, beat: float, keep: int | None = None):
    """((bound, shape, work) for every tp, cp, pp, micro-batch, baseline recompute, set of >= 2 used groups and EP
    degree whose bound is below ``beat``, whether the deadline cut the enumeration short). ``keep``: only the
    ``keep`` first of them in the order (bound, shape), the enumeration skipping what lies above the keep-th bound
    found so far (a look of that many steps pops no other: the suite's first looks, of 1,000 steps, kept 1,000 of
    up to 111,428 shapes)."""
    job = ctx.job
    m, t = job.model, job.training
    L = m.num_layers
    groups = ctx.order
    bases = baseline_recompute_modes(t, ctx.opts.op_recompute)
    cps = [
        cp
        for cp in cp_options(t, max(job.cluster[g].num_gpus for g in groups))
        if ctx.fw is None or ctx.fw.allows(cp=cp)
    ]
    subsets = [s for k in range(2, len(groups) + 1) for s in itertools.combinations(groups, k)]
    gpus = {g: job.cluster[g].num_gpus for g in groups}
    out = []
    limit = float("inf")  # with keep: the keep-th least bound kept so far (anything above it is not kept)

    def over(x: float) -> bool:
        return x >= beat or x > limit

    for tp in node_group_tp_options(m, (job.cluster[g].gpus_per_node for g in groups)):
        for cp in cps:
            if seq_shard_error(t, cp, tp):
                continue
            # only EP degrees some replica count can take (the others' per-layer costs are not worked out)
            most_d = max(gpus.values()) // (tp * cp)  # the most replicas any group fits (pp = 1)
            eps = [
                ep
                for ep in _ep_superset(m)
                if (ctx.fw is None or ctx.fw.allows(cp=cp, ep=ep)) and _ep_reachable(ep, cp, most_d)
            ]
            if not eps:
                continue  # (no group fits a replica at this TP and CP)
            ep_allowed = {}  # replica_ep_options by the replica counts (the same at every micro-batch and mode)
            depths: dict = {}  # the subsets' replica counts at each depth (the same at every micro-batch and mode)
            for mbs in micro_batch_options(t, 1, ctx.opts.max_micro_batch):  # replicas run their own counts
                M = t.global_batch_size // mbs
                for base in bases:
                    hit = ctx.caches.replica_blocks.get((tp, cp, mbs, base))  # (a later enumeration reads them)
                    if hit is None:
                        per_mb = {
                            ep: {g: micro_batch_work(ctx, g, tp, cp, mbs, base, ep) for g in groups} for ep in eps
                        }
                        least = {g: min(per_mb[ep][g] for ep in eps) for g in groups}  # valid at every EP degree
                        # every depth: d_g <= GPUs_g/(tp*cp*pp), so the rate below is at most the groups' GPU rate,
                        # and with >= 2 replicas the bound is at least (M + 2(pp - 1)) over it, growing with pp
                        most = sum(gpus[g] / (tp * cp * least[g]) for g in groups)
                        hit = ctx.caches.replica_blocks[tp, cp, mbs, base] = per_mb, least, most
                    per_mb, least, most = hit
                    if over(M / most):
                        continue
                    # per subset, its groups' least work (valid at every EP degree) and their work at each degree
                    least_of = [tuple(least[g] for g in used) for used in subsets]
                    work_of = {ep: [tuple(per_mb[ep][g] for g in used) for used in subsets] for ep in eps}
                    for pp in range(1, L + 1):
                        if over((M + 2 * (pp - 1)) / most):
                            break
                        if ctx.opts.even_layers and L % pp:
                            continue
                        if time.monotonic() > deadline:
                            return (out if keep is None else _first(out, keep)), True
                        depth = depths.get(pp)
                        if depth is None:
                            depth = depths[pp] = _subset_counts(gpus, groups, subsets, tp * cp * pp)
                        fit, used_counts = depth
                        if not used_counts:
                            break  # fewer than two groups fit a replica; deeper pipelines fit even fewer
                        if over(M / sum(fit[g] * pp / least[g] for g in groups)):
                            continue  # the bound below, even with every group's replicas
                        for i, counts, replicas in used_counts:
                            if replicas > M:
                                continue
                            # the bound at every EP degree: each per_mb[ep][g] >= least[g] (the same sums)
                            if over(_shape_bound(M, pp, counts, least_of[i])):
                                continue
                            key = tuple(d for _, d in counts)
                            allowed = ep_allowed.get(key)
                            if allowed is None:
                                allowed = ep_allowed[key] = replica_ep_options(ctx, counts, cp, eps)
                            for ep in allowed:
                                work = work_of[ep][i]
                                bound = _shape_bound(M, pp, counts, work)
                                if not over(bound):
                                    out.append((bound, (tp, cp, pp, mbs, base, counts, ep), work))
                                    if keep is not None and len(out) >= 2 * keep:
                                        out = _first(out, keep)
                                        limit = out[-1][0]
    return (out if keep is None else _first(out, keep)), False


def _subset_counts(gpus: dict, groups, subsets, per_replica: int) -> tuple[dict, list]:
    """(whole replicas per group of ``per_replica`` GPUs each, [(index in ``subsets``, (group, replicas) per group,
    replicas in all)] for each subset of groups every one of which fits one or more: none where fewer than two groups
    fit one, every subset having two or more)."""
    fit = {g: gpus[g] // per_replica for g in groups}
    out = []
    for i, used in enumerate(subsets):
        counts = tuple((g, fit[g]) for g in used)
        if all(d >= 1 for _, d in counts):
            out.append((i, counts, sum(d for _, d in counts)))
    return fit, out


def _shape_bound(M: int, pp: int, counts, work) -> float:
    """Least iteration seconds of a replica shape: ``counts`` (group, replicas) of pp stages each, a micro-batch
    taking at least work[i] seconds through a whole pipeline of the i-th group. A replica of g running m
    micro-batches takes >= (m + pp - 1) W_g / pp (1F1B with the per-micro-batch work W_g spread evenly over its
    stages), and sum_g d_g m_g = M; every replica runs at least one micro-batch: >= W_g."""
    rate = replicas = 0
    for (_, d), w in zip(counts, work):
        rate += d * pp / w
        replicas += d
    return max((M + (pp - 1) * replicas) / rate, max(work))


def _first(found, keep: int) -> list:
    """The ``keep`` first shapes of ``found`` in the order (bound, shape)."""
    return sorted(found, key=lambda x: (x[0], x[1]))[:keep]


def _min_recompute(job, sms: list[StageModel], layers, caps: list[float], base_full: bool):
    """Per stage, the fewest fully recomputed layers that fit the stage's GPU (None if even all do not)."""
    if base_full:
        return tuple(layers)
    rec = []
    bare = split_kinds(job, layers, None, False)
    for s, (sm, n) in enumerate(zip(sms, layers)):
        for r in range(n + 1):
            if sm.peak_memory(s, bare[s].with_recompute(r)) / GIB <= caps[s]:
                rec.append(r)
                break
        else:
            return None
    return tuple(rec)


MAX_BALANCE_CHOICES = 1_000_000  # integer micro-batch choices one widening may try (4 groups: a window of 49)


def _balance(M: int, counts, slopes: list[float], offsets: list[float]):
    """Micro-batch counts m_g >= 1 with sum d_g m_g = M minimizing max_g (slope_g m_g + offset_g): the continuous
    optimum, then every integer choice near it for all groups but the last (which is implied), widening the
    neighbourhood until one splits the batch exactly; None when none can (every replica runs >= 1 micro-batch, and
    sum d_g m_g is a multiple of the counts' gcd), or when the neighbourhood that would have to be tried grows past
    MAX_BALANCE_CHOICES (with four or more groups the choices grow as window^(groups-1): unbounded, one call ran for
    minutes past the search's time limit)."""
    d = [c for _, c in counts]
    if M < sum(d) or M % math.gcd(*d):
        return None
    window = 4
    while (2 * window + 1) ** (len(d) - 1) <= MAX_BALANCE_CHOICES:
        best = _balance_within(M, counts, slopes, offsets, window)
        if best is not None or window > M:
            return best
        window *= 4
    return None


def _balance_within(M: int, counts, slopes: list[float], offsets: list[float], window: int):
    d = [c for _, c in counts]
    X = (M + sum(di * b / a for di, a, b in zip(d, slopes, offsets))) / sum(di / a for di, a in zip(d, slopes))
    centre = [(X - b) / a for a, b in zip(slopes, offsets)]
    ranges = [range(max(1, int(c) - window), max(1, int(c) + window) + 1) for c in centre[:-1]]
    best = None
    for ms in itertools.product(*ranges):
        rest = M - sum(di * mi for di, mi in zip(d, ms))
        if rest < d[-1] or rest % d[-1]:
            continue
        full = ms + (rest // d[-1],)
        t = max(a * mi + b for a, b, mi in zip(slopes, offsets, full))
        if best is None or t < best[0]:
            best = (t, full)
    return best[1] if best else None


def _replica_dims(job, shape, zero, counts, layers, recs, ms, base, ep: int = 1) -> ReplicaDims:
    tp, cp, pp, mbs = shape[:4]
    total = sum(d for _, d in counts)
    reps = []
    for (g, d), rec, mi in zip(counts, recs, ms):
        rec, mode = stage_recompute(layers, rec, base)
        reps.append(
            pipeline_dims(
                job,
                (g,) * pp,
                (tp,) * pp,
                d,
                cp,
                mbs,
                zero,
                mode,
                tuple(layers),
                rec,
                ep=ep,
                micro_batches=mi,
                dp_total=total,
            )
        )
    return ReplicaDims(tuple(reps))


def _probe_models(ctx, cand: ReplicaCandidate, ms, stages=None) -> list[list[StageModel]]:
    """Stage models of every replica entry of the shape (of ``stages`` only, default all), entry i running ms[i]
    micro-batches, at an even split without recompute (the models' forms do not depend on the split)."""
    job, pp = ctx.job, cand.pp
    even = [job.model.num_layers // pp] * pp
    zeros = [(0,) * pp] * len(cand.counts)
    shape = (cand.tp, cand.cp, pp, cand.mbs)
    probe = _replica_dims(job, shape, cand.zero, cand.counts, even, zeros, list(ms), cand.recompute, cand.ep)
    return replica_stage_models(job, probe, ctx.costs, stages)


def _tail_floors(ctx, cand: ReplicaCandidate, per: list[list[StageModel]]) -> list[float]:
    """Per replica group of the shape (``per``: its stage models), a floor under its D_g + O_g (replica_partition's
    model: the largest exposed DP tail and optimizer step of its stages, at least their sum on any one stage): each
    stage's TailProfile, every layer recomputed (the longest window hides the most: valid at any recompute;
    MixedContext.tail_floor), at the least largest tail of any split (stages_tail_bottleneck: the stages hold all L
    layers) and at one layer a stage (every stage holds one, at or after its position). A stage of MoE layers
    exposes more than one holding the leading dense layer: seed-5 suite job 10's 60- and 34-stage shapes took the
    first stage's tail for every stage's (0.012 s for 0.057-0.063 s at one layer a stage, 0.071 s for 0.117-0.123 s
    at two), and their micro-batch choices were bounded 11-13% under their plans."""
    L = ctx.job.model.num_layers
    floors = []
    for sms in per:
        reaches = [ctx.tail_profile(sm, s, math.inf).reach for s, sm in enumerate(sms)]
        floors.append(max(max(r[1] for r in reaches), stages_tail_bottleneck(reaches, L)))
    return floors


def choice_floor_terms(ctx, cand: ReplicaCandidate, work) -> tuple[list[float], list[float], list[float]]:
    """What replica_partition.micro_batch_choices bounds each micro-batch choice of a pipelined shape with, per
    replica group: its least sum of stage times (``work``, micro_batch_work, plus its stages' pipeline sends,
    StageModel.pp_time, which every stage's time adds in replica_partition's model as in planner/search/partition.py),
    its least D_g + O_g (_tail_floors) and its least slowest stage (quick.ordered_bottleneck: its layers alone, at any
    split). None of them depends on the counts (the stage models at pp in flight stand for all)."""
    per = _probe_models(ctx, cand, [cand.pp] * len(cand.counts))
    sums = [w + sum(sm.pp_time for sm in sms) for w, sms in zip(work, per)]
    return sums, _tail_floors(ctx, cand, per), [quick.ordered_bottleneck(sms[0]) for sms in per]


def _exact_shape(ctx, cand: ReplicaCandidate, best, remaining: float, workers: int, beat: float, work):
    """A pipelined shape's plans from the exact split of each micro-batch choice (planner/search/replica_partition
    .py) below ``beat`` (_exact_once: at most ``best``'s time): (the better of them and ``best``, whether that is
    the shape's optimum among plans faster than ``beat``, the least time an unproven part of the shape could
    reach)."""
    job = ctx.job
    shape = (cand.tp, cand.cp, cand.pp, cand.mbs)
    counts = cand.counts
    work, tails, bottlenecks = choice_floor_terms(ctx, cand, work)
    found = exact_splits(
        lambda ms: _probe_models(ctx, cand, ms),
        [ctx.capacity(g) for g, _ in counts],
        job.training.global_batch_size // cand.mbs,
        counts,
        work,
        cand.pp,
        beat * (1 + RESOLUTION),
        time.monotonic() + remaining,
        partial_recompute=ctx.opts.partial_recompute,
        even_layers=ctx.opts.even_layers,
        uniform_recompute=ctx.opts.uniform_recompute,
        workers=workers,
        tails=tails,
        bottlenecks=bottlenecks,
        settled=ctx.caches.replica_choices.setdefault(cand.key, {}),
    )
    for split in found.splits:
        dims = _replica_dims(
            job, shape, cand.zero, counts, split.layers, split.recompute, split.ms, cand.recompute, cand.ep
        )
        est = estimate_replicas(job, dims, ctx.opts.memory_margin)
        if est.fits and (best is None or est.iteration_time_s < best.iteration_time_s):
            best = est
    return best, found.proven, found.open_bound_s


def _exact_once(ctx, cand: ReplicaCandidate, est, remaining: float, workers: int, beat: float, work):
    """_exact_shape, memoized where it proved the shape: its best plan below a cut (or that there is none) holds
    below any lower cut, which a later pass of the replica search, cut by a better plan, asks about again."""
    cut = min(beat, est.iteration_time_s) if est is not None else beat  # the heuristic plan is beaten or kept
    hit = ctx.caches.replica_exact.get(cand.key)
    if hit is not None and cut <= hit[0]:
        plan = hit[1] if hit[1] is not None and hit[1].iteration_time_s < cut * (1 + RESOLUTION) else None
        if plan is None or (est is not None and est.iteration_time_s <= plan.iteration_time_s):
            plan = est
        return plan, True, float("inf")
    better, proven, open_s = _exact_shape(ctx, cand, est, remaining, workers, cut, work)
    if proven:
        ctx.caches.replica_exact[cand.key] = (cut, None if better is est else better)
    return better, proven, open_s


def pipeline_floor(ctx, cand: ReplicaCandidate) -> float:
    """Iteration seconds no plan of the shape beats, from each replica's pipeline alone (quick.lower_bound_terms,
    the homogeneous search's bound of one pipeline: its per-layer floor, the bottleneck of holding its layers in
    memory with just enough recompute, its DP tail): a replica of group g running m micro-batches takes at least
    (m - 1) T_g + rest_g. Its memory, and so T_g, grows with the micro-batches it keeps in flight (1F1B: at most
    min(pp, m)), so the terms are taken at one micro-batch (valid for every m) and at pp (valid from m = pp on).
    The counts m_g of the replicas sum to M = global batch / micro-batch, so the least X at which the replicas
    can run M micro-batches within X (by bisection, m_g continuous) bounds the shape; inf when a replica's layers
    cannot fit its GPUs."""
    hit = ctx.caches.replica_floor.get(cand.key)
    if hit is None:
        hit = ctx.caches.replica_floor[cand.key] = _pipeline_floor(ctx, cand)
    return hit


def throughput_floor(ctx, cand: ReplicaCandidate) -> float:
    """A cheaper, weaker pipeline_floor, worked out first: each replica's terms at one micro-batch without its
    memory (quick.lower_bound_terms without a capacity: no forced recompute, no memory bottleneck), which hold for
    every micro-batch count m, so a replica of group g runs at most 1 + (X - rest_g) / T_g micro-batches within X
    and the counts reach M at the X of a linear equation (each replica still runs one). Suite job 43 of
    scripts/bench_hetero.py: it alone cuts 588 of the 681 candidates whose pipeline floor was worked out, at a
    sixth of the cost. Memoized by ReplicaCandidate.key."""
    hit = ctx.caches.replica_throughput.get(cand.key)
    if hit is None:
        M = ctx.job.training.global_batch_size // cand.mbs
        per = _probe_models(ctx, cand, [1] * len(cand.counts), stages=(0,))
        terms = [(d, *quick.lower_bound_terms(sms[0])) for (_, d), sms in zip(cand.counts, per)]
        hit = ctx.caches.replica_throughput[cand.key] = integer_reach(M, terms)
    return hit


def integer_reach(M: int, terms) -> float:
    """The least X at which replicas can run M micro-batches in all, ``terms`` (d, T, rest) per group: d replicas
    each running m >= 1 micro-batches in at least (m - 1) T + rest seconds, so at most 1 + floor((X - rest) / T)
    within X, and the groups' counts are whole: the continuous reach of the linear equation, then up the groups'
    next micro-batch steps (a group's replicas share their count m_g, replicas.py) until the counts reach M. The
    continuous reach alone left seed-5 suite job 10's deepest shapes (one layer a stage) 2.5% under their best
    plans, whose replicas' micro-batches take 5-6 ms."""
    rate = sum(d / T for d, T, _ in terms)
    x = max(
        [(M - sum(d for d, _, _ in terms) + sum(d * rest / T for d, T, rest in terms)) / rate]
        + [r for _, _, r in terms]
    )
    runs = [1 + math.floor((x - rest) / T * (1 + 1e-12)) for _, T, rest in terms]
    steps = [(rest + m * T, g) for g, ((_, T, rest), m) in enumerate(zip(terms, runs))]
    heapq.heapify(steps)
    total = sum(d * m for (d, _, _), m in zip(terms, runs))
    while total < M:
        x, g = heapq.heappop(steps)
        d, T, rest = terms[g]
        runs[g] += 1
        total += d
        heapq.heappush(steps, (rest + runs[g] * T, g))
    return x


def _floored(ctx, cand: ReplicaCandidate, key: float, best: float, next_key: float) -> float:
    """``key`` raised by the candidate's throughput floor, then by its pipeline floor only where the cheap one leaves
    it below both ``best`` (which would cut it) and ``next_key`` (the next bound in line, behind which it waits)."""
    for floor_of in (throughput_floor, pipeline_floor):
        key = max(key, floor_of(ctx, cand))
        if key >= best or key > next_key:
            break
    return key


def _pipeline_floor(ctx, cand: ReplicaCandidate) -> float:
    pp = cand.pp
    M = ctx.job.training.global_batch_size // cand.mbs
    at = {}  # micro-batches -> per replica entry (T, rest)
    for m in sorted({1, pp}):
        per = _probe_models(ctx, cand, [m] * len(cand.counts), stages=(0,))  # the terms read the first stage's
        at[m] = [None] * len(per)
        # the smallest GPUs first: where a replica's layers do not fit (most shapes of a tight job), they end it
        for i in sorted(range(len(per)), key=lambda i: ctx.capacity(cand.counts[i][0])):
            at[m][i] = quick.lower_bound_terms(per[i][0], ctx.capacity(cand.counts[i][0]))
            if m == 1 and at[m][i][0] == float("inf"):
                return float("inf")
    entries = [(d, one, full) for (_, d), one, full in zip(cand.counts, at[1], at[pp])]

    def runs(x: float) -> float:
        """Micro-batches the replicas can run within x seconds (whole ones, integer_reach; each runs at least one)."""
        total = 0.0
        for d, (t1, r1), (tf, rf) in entries:
            if x < r1:
                return 0.0  # this replica's first micro-batch alone does not finish
            if tf < float("inf") and x >= (pp - 1) * tf + rf:
                total += d * (1 + math.floor((x - rf) / tf) if tf > 0 else float("inf"))
            else:
                total += d * (min(pp, 1 + math.floor((x - r1) / t1)) if t1 > 0 else pp)
        return total

    lo = max(r1 for _, (_, r1), _ in entries)
    if runs(lo) >= M:
        return lo
    hi = max(r1 + M * t1 for _, (t1, r1), _ in entries)  # every replica at its one-micro-batch terms...
    hi = max([hi] + [rf + M * tf for _, _, (tf, rf) in entries if tf < float("inf")])  # ... and at pp
    if runs(hi) < M:
        return float("inf")  # every replica runs all it can and M is not reached: no plan of the shape fits
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if runs(mid) >= M else (mid, hi)
    return lo


def _heuristic_shape(ctx, cand: ReplicaCandidate, remaining: float, workers: int, greedy_only: bool = False):
    """(the best replica plan of one shape and ZeRO stage or None, whether the shape is proven infeasible, whether
    the plan is the shape's optimum). Module docstring, steps 1-3. With one stage the split is forced, each
    replica's fewest recomputed layers that fit is its fastest choice (a replica's time grows with its recompute
    count and the others do not depend on it), and the micro-batch counts are the integer optimum of the
    replicas' linear times (_balance): the evaluation is exact, and a replica that cannot fit proves the shape
    infeasible. ``greedy_only``: a replica whose greedy splits fit nothing gets no CP-SAT split (whose result
    would depend on the time it is given) and adds no split."""
    job = ctx.job
    shape = (cand.tp, cand.cp, cand.pp, cand.mbs)
    M = job.training.global_batch_size // cand.mbs
    total = cand.dp
    guess = max(1, M // total)
    splits = []
    even = [job.model.num_layers // cand.pp] * cand.pp
    first = _replica_dims(
        job,
        shape,
        cand.zero,
        cand.counts,
        even,
        [(0,) * cand.pp] * len(cand.counts),
        [guess] * len(cand.counts),
        cand.recompute,
        cand.ep,
    )
    for (g, _), replica in zip(cand.counts, first.replicas):
        sm = StageModel(job, replica.stage_dims(0), ctx.costs(g))
        plans = None
        if not ctx.opts.even_layers:  # the balanced splits of the homogeneous search, then CP-SAT
            plans = quick.greedy_partition(sm, ctx.capacity(g)) or quick.greedy_recompute_partition(sm, ctx.capacity(g))
        if plans is None and not greedy_only:
            plans = solve_partition(
                sm,
                ctx.capacity(g),
                partial_recompute=ctx.opts.partial_recompute,
                time_limit_s=max(0.05, remaining / 4),
                workers=workers,
                even_layers=ctx.opts.even_layers,
                uniform_recompute=ctx.opts.uniform_recompute,
            ).plans
        if plans is not None:
            layers = tuple(p.layers for p in plans)
            if layers not in splits:
                splits.append(layers)
    best = None
    for layers in splits:
        probe = _replica_dims(
            job,
            shape,
            cand.zero,
            cand.counts,
            layers,
            [(0,) * cand.pp] * len(cand.counts),
            [guess] * len(cand.counts),
            cand.recompute,
            cand.ep,
        )
        per = replica_stage_models(job, probe, ctx.costs)
        recs = []
        for (g, _), sms in zip(cand.counts, per):
            rec = _min_recompute(job, sms, layers, [ctx.capacity(g)] * cand.pp, cand.recompute == "full")
            if rec is None and cand.pp == 1 and cand.recompute != "full":
                return None, True, True
            if rec is None or (ctx.opts.uniform_recompute and len(set(rec)) > 1):
                break
            recs.append(rec)
        else:
            slopes, offsets = [], []
            for r, sms, rec in zip(probe.replicas, per, recs):
                plans = split_kinds(job, layers, rec, cand.recompute == "full")
                est = evaluate_stages(job, r, sms, plans)
                slow = max(st.microbatch_time_s for st in est.stages)
                slopes.append(slow)
                offsets.append(est.iteration_time_s - guess * slow)
            ms = _balance(M, cand.counts, slopes, offsets)
            if ms is None:
                continue
            dims = _replica_dims(job, shape, cand.zero, cand.counts, layers, recs, ms, cand.recompute, cand.ep)
            est = estimate_replicas(job, dims, ctx.opts.memory_margin)
            if est.fits and (best is None or est.iteration_time_s < best.iteration_time_s):
                best = est
    return best, False, cand.pp == 1 and bool(splits)


def _param_groups(model, ep: int) -> tuple[float, float, int]:
    """(dense, routed-expert) parameters of the model on one TP rank's share of all stages before ZeRO sharding,
    the experts split over ``ep`` ranks (planner/cost/stage.kind_coeffs: num_experts / ep experts per GPU), and the
    divisor of the expert parameters' DP*CP ring (its expert-DP ranks are 1/ep of them)."""
    routed = model.num_moe_layers * model.moe.num_experts * F.expert_params(model) if model.moe is not None else 0
    return F.total_params(model) - routed, routed / ep, ep


def _states_fit(ctx, tp: int, cp: int, pp: int, zero: int, counts, ep: int = 1) -> bool:
    """A necessary memory condition: some stage holds at least the average 1/pp of the model, so its weights,
    gradients and optimizer states (planner/cost/memory.model_state_bytes, sharded over all replicas' DP*CP
    under ZeRO; the routed experts split over EP and sharded over the expert-DP ranks, dp*cp/ep) must fit the
    smallest used GPU."""
    t = ctx.job.training
    shard = cp * sum(d for _, d in counts)
    dense, expert, ep_div = _param_groups(ctx.job.model, ep)

    def per_param(n: int) -> float:
        return sum(model_state_bytes(1.0, n, zero, t.grad_dtype, t.optimizer, t.fp32_params).values())

    need = (dense * per_param(shard) + expert * per_param(shard // ep_div)) / (tp * pp)
    return need <= min(ctx.capacity(g) for g, _ in counts) * GIB


def _sharded_bound(ctx, zero: int, tp: int, cp: int, pp: int, mbs: int, counts, work, ep: int = 1) -> float:
    """The shape bound with ZeRO-2/3's per-micro-batch traffic (planner/cost/stage.StageModel._collectives_of):
    each stage reduce-scatters its gradients (ZeRO-3 also all-gathers its 16-bit weights twice) over all
    replicas' DP*CP ranks, the routed experts' over the expert-DP ranks (dp*cp/ep; each GPU holds 1/ep of them),
    at best at the ring's fastest possible bus bandwidth, and only fsdp_overlap of the stage's compute hides it.
    A stage holds >= 1/pp of the parameters on average, and its time is compute + exposed."""
    t = ctx.job.training
    M = t.global_batch_size // mbs
    n = cp * sum(d for _, d in counts)
    # the ring spans the groups' nodes: no faster than the best NVLink, nor than a full node of GPUs sending at the
    # slowest NIC or inter-group rate on the ring (planner/cost/provider.CostSource.spanning_ceiling)
    fastest = ctx.costs.spanning_ceiling([g for g, _ in counts])
    dense, expert, ep_div = _param_groups(ctx.job.model, ep)
    ne = n // ep_div
    wire = (grad_wire_bytes(t.grad_dtype) + (4.0 if zero >= 3 else 0.0)) / (tp * pp)
    comm = ((n - 1) / n * dense + (ne - 1) / ne * expert) * wire / fastest
    rate, single = 0.0, 0.0
    for (g, d), w in zip(counts, work):
        stage = w / pp
        step = stage + max(0.0, comm - ctx.costs(g).cal.fsdp_overlap * stage)
        rate += d / step
        single = max(single, pp * step)  # one micro-batch through the pipeline
    return max((M + (pp - 1) * sum(d for _, d in counts)) / rate, single)


@dataclass
class ReplicaSearch:
    """What search_replicas found: (candidate, estimate, exact) triples (exact: the shape's optimum), the least
    bound of an evaluated (shape, ZeRO) neither proven infeasible nor evaluated exactly (``low``: the heuristic
    evaluation does not close it) and the least bound of the shapes the deadline left unexplored (``unexplored``);
    inf where there is none."""

    found: list
    low: float
    unexplored: float

    def open_parts(self, kth: float) -> list[tuple[float, str, str]]:
        """(bound, stop reason, part of the space) of what keeps the replica shapes from closing below ``kth``."""
        parts = [(self.unexplored, "time_limit"), (self.low, "heuristic")]
        return [(bound, reason, "replica_shapes") for bound, reason in parts if bound < kth]


class ExactShare(Protocol):
    """The other side of search_replicas' exact pass (in the other process, planner/search/lockstep.py): start
    solves a part of its pipelined shapes there (mixed_pipelines._exact_part), finish waits for exact_shapes'
    answer there and the memo of what it proved (exact_memo)."""

    def start(self, items: list, shadow: list, top: int, best: float, deadline: float, workers: int) -> None: ...

    def finish(self) -> tuple[list, float, dict]: ...


class LookAhead(Protocol):
    """The other side of a first look (in the other process, planner/search/lockstep.py), which works out the
    throughput floors of the look's ZeRO stages ahead of it (look_ahead): start hands it the look's shapes, front
    tells it how far the look has come (the bound of the ZeRO stage whose floors it works out next), take_in puts
    what it sent so far in ``ctx``'s memo (without waiting). The caller stops it after the look."""

    def start(self, found_shapes: list) -> None: ...

    def front(self, key: float) -> None: ...

    def take_in(self, ctx) -> None: ...


# look_ahead's number on its board (planner/search/lockstep.Board): where the look has come
AHEAD_FRONT = 2
# look_ahead works out the ZeRO stages more than this many past the look's front (those nearer are the look's own: a
# floor sent takes a while to come in, and the look works one out in 0.3-0.6 ms), jumping ahead again where the look
# has caught up. The look's own floors, of the 1,277-2,708 it needs (seed-5 suite job 13, seed-1 job 43, seed-4 job
# 26, one run each): 2,090 / 668 / 658 at 16, 1,625 / 573 / 613 at 128.
AHEAD_LEAD = 128


def _zero_stages(ctx, key: float, shape: tuple, work) -> list[tuple[float, ReplicaCandidate]]:
    """(bound, candidate) of each ZeRO stage a shape of bound ``key`` opens into (search_replicas): those the options
    and the framework allow and whose model states can fit (_states_fit), ZeRO-2/3 at their sharded traffic
    (_sharded_bound)."""
    tp, cp, pp, mbs, base, counts, ep = shape
    out = []
    for zero in REPLICA_ZERO:
        degrees = {"pp": pp, "zero": zero, "cp": cp, "ep": ep, "tp": tp, "dp": sum(d for _, d in counts)}
        if zero not in ctx.opts.zero_stages or (ctx.fw is not None and not ctx.fw.allows(**degrees)):
            continue
        if not _states_fit(ctx, tp, cp, pp, zero, counts, ep):
            continue  # proven: the model states alone do not fit
        zbound = key if zero < 2 else _sharded_bound(ctx, zero, tp, cp, pp, mbs, counts, work, ep)
        out.append((zbound, ReplicaCandidate(tp, cp, pp, mbs, zero, base, counts, key, ep)))
    return out


def look_ahead(share, board):
    """The throughput floors a first look of search_replicas will work out, worked out ahead of it in the other
    process (Lockstep.start_help; ``share.ctx`` is its context there), each sent as [(key, floor)]. The look works
    out a ZeRO stage's throughput floor the first time it comes out of line, so in the order of the ZeRO stages'
    bounds (a best-first search: the keys it pops only grow); this goes through them in that order (the shapes in
    theirs, each opened as the look opens it: LookAhead.start hands them over sorted), those more than AHEAD_LEAD
    past the look's front (board[AHEAD_FRONT]: the bound of the one the look is at), until told to stop. The floors
    are the look's own (throughput_floor), so it finds what it would alone, sooner: on seed-5 suite job 13 its
    child, idle through the look once its roots are bounded, worked out about 1,300 of the 2,708 the look needs."""
    found_shapes = board.receive() or []  # (the look's, sorted: LookAhead.start)
    ctx = share.ctx
    memo = ctx.caches.replica_throughput
    line: list = []  # ZeRO stages of the shapes opened so far: (bound, order, candidate)
    tie = itertools.count()
    shapes_in = iter(found_shapes)
    nxt = next(shapes_in, None)
    skip = 0  # ZeRO stages still to pass over (the look's own, just past its front)
    while not board.stopped():
        while nxt is not None and (not line or nxt[0] <= line[0][0]):  # (a shape's stages are at or above its bound)
            key, shape, work = nxt
            for zbound, cand in _zero_stages(ctx, key, shape, work):
                heapq.heappush(line, (zbound, next(tie), cand))
            nxt = next(shapes_in, None)
        if not line:
            break
        zbound, _, cand = heapq.heappop(line)
        if zbound < board[AHEAD_FRONT]:
            skip = AHEAD_LEAD  # (the look has passed it, or caught up)
            continue
        if skip:
            skip -= 1
            continue
        if cand.key not in memo:
            yield [(cand.key, throughput_floor(ctx, cand))]


def _below(bound: float, best: float) -> bool:
    """Whether a pipelined shape of this bound could still beat ``best`` by more than RESOLUTION (the exact pass
    solves it); shapes in bound order from the first that cannot are closed by their bounds."""
    return bound < best * (1 - RESOLUTION)


def exact_shapes(ctx, items, shadow, top: int, best: float, deadline: float, workers: int):
    """The exact pass of search_replicas over ``items`` (bound, candidate, work, heuristic plan), best bound first,
    while ``deadline`` lasts: each pipelined shape whose bound is below the K-th best (``best``, then the K-th of
    ``shadow``, the caller's top list, with each exact plan found) solved exactly (_exact_once). (done: (index in
    items, plan, whether it is the shape's optimum) per shape with a plan, the least bound left open)."""
    shadow = list(shadow)
    done, low = [], float("inf")
    for i, (zbound, cand, work, est) in enumerate(items):
        remaining = deadline - time.monotonic()
        if not _below(zbound, best):
            break  # this shape and all after it are closed by their bounds
        if remaining <= 0:
            low = min(low, zbound)
            break
        better, proven, open_s = _exact_once(ctx, cand, est, remaining, workers, best, work)
        if not proven:
            low = min(low, max(zbound, open_s))
        if better is None:
            continue
        done.append((i, better, proven))
        best = min(best, _offer(shadow, Plan(cand, better, "feasible"), top, best))
    return done, low


def _offer(shadow: list, plan: Plan, top: int, default: float) -> float:
    """``plan`` into the top list ``shadow`` (keep_top); its K-th best time after, or ``default`` while it holds
    fewer than K plans: the cut of the replica shapes after it."""
    keep_top(shadow, plan, top)
    return kth_time(shadow, top, default)


def exact_memo(ctx, cands) -> dict:
    """What the exact pass proved about ``cands``' shapes (MixedContext.caches: replica_exact, replica_choices), for
    the other process to absorb (absorb_exact): a later pass there then reads it instead of solving again."""
    caches = ctx.caches
    keys = [c.key for c in cands]
    return {
        "exact": {k: caches.replica_exact[k] for k in keys if k in caches.replica_exact},
        "choices": {k: caches.replica_choices[k] for k in keys if k in caches.replica_choices},
    }


def absorb_exact(ctx, memo: dict) -> None:
    """The other process's exact_memo, into this one's caches (what it proved holds here too)."""
    ctx.caches.replica_exact.update(memo["exact"])
    for key, settled in memo["choices"].items():
        ctx.caches.replica_choices.setdefault(key, {}).update(settled)


def global_floor(ctx) -> float:
    """Iteration seconds no plan on the cluster can beat: the model's FLOPs (attention halved by the causal mask)
    over every GPU of every group at the better of its GEMM and attention rates (planner.search.homogeneous
    .global_lower_bound, summed over the groups)."""
    job = ctx.job
    m, t = job.model, job.training
    total = F.model_flops_per_iteration(m, t.seq_length, t.global_batch_size)
    attn = (
        3.0 * m.num_layers * F.attention_core_flops(m, t.seq_length * t.global_batch_size, t.seq_length, 1, causal=True)
    )
    rate = sum(grp.num_gpus * ctx.costs(g).best_flop_rate() for g, grp in enumerate(job.cluster))
    return (total - attn) / rate


def search_replicas(
    ctx,
    incumbent_s: float,
    deadline: float,
    workers: int,
    progress=None,
    top_plans=(),
    top: int = 1,
    exact_pass: bool = True,
    look: int | None = None,
    share: ExactShare | None = None,
    ahead: LookAhead | None = None,
) -> ReplicaSearch:
    """Replica plans faster than ``incumbent_s``, best-first until the bound reaches the K-th best time known or
    the deadline passes, and the smallest bounds of the replica shapes that could beat ``incumbent_s``: no replica
    plan is faster than them, which is all these heuristic plans prove. ``top_plans``: the caller's top list (of at
    most ``top`` distinct plans, planner.search.result.keep_top); the K-th best is read from a copy of it with the
    replica plans found so far. ``exact_pass`` False: no exact pass over the pipelined shapes (a quick look for a
    first plan; what it leaves open is in ``low``). ``progress(done, total, what)``: shapes evaluated or ruled
    out. ``look``: a first look of at most this many steps (a shape opened into its ZeRO stages, a candidate's
    throughput or pipeline floor worked out, or a candidate evaluated), each candidate from its greedy splits only
    (_heuristic_shape's greedy_only): a count of work, not seconds, so that what it finds is the same on any
    machine (the deadline aside). ``share``: the other process's side (ExactShare), which solves every other
    pipelined shape of the exact pass where two or more are to be solved (exact_shapes on each side). ``ahead``:
    with a look, the other process's side (LookAhead), which works out throughput floors ahead of it
    (look_ahead; the caller stops it)."""
    found_shapes, cut_short = shapes(ctx, deadline, incumbent_s, look)  # (a look pops at most ``look`` of them)
    found_shapes.sort(key=lambda x: (x[0], x[1]))
    ahead = ahead if look is not None else None
    if ahead is not None:
        ahead.start(found_shapes)
    found = []
    shadow = list(top_plans)  # the top list with the replica plans found so far: its K-th time is the cut

    best = incumbent_s
    low = float("inf")  # no replica plan beats this: the least bound of a (shape, ZeRO) not proven infeasible
    # shapes the enumeration did not reach have no bound of their own: the floor of every plan stands for them
    unexplored = global_floor(ctx) if cut_short else float("inf")
    what = "replica shapes" if exact_pass else "replica shapes, first look"  # evaluated, or ruled out by a bound
    # pipelined shapes the heuristic evaluation leaves open: (bound, order, candidate, work, plan, its index in found)
    pending = []
    # Best-first over (bound, order, shape, ZeRO stage or None): a shape opens into its ZeRO stages, each back in
    # line at its own bound (the sharded traffic), and a ZeRO stage back in line at the replicas' throughput floor,
    # then at their pipeline floor (both memoized), as it comes out below each, so shapes are evaluated in the order
    # of those bounds and the first bound that reaches the best plan ends the search.
    heap = [(bound, i, shape, work, None) for i, (bound, shape, work) in enumerate(found_shapes)]
    heapq.heapify(heap)
    tie = itertools.count(len(heap))
    opened = steps = 0
    while heap:
        key, _, shape, work, cand = heapq.heappop(heap)
        if key >= best:
            low = min(low, key)  # this one and all left in line cannot beat the best plan
            break
        steps += 1
        if time.monotonic() > deadline or (look is not None and steps > look):
            unexplored = min(unexplored, key)  # this one and all left in line are unexplored
            break
        if cand is None:
            opened += 1
            if progress is not None:
                progress(opened, len(found_shapes), what)
            for zbound, z_cand in _zero_stages(ctx, key, shape, work):
                if zbound >= best:
                    low = min(low, zbound)
                    continue
                heapq.heappush(heap, (zbound, next(tie), shape, work, z_cand))
            continue
        if ahead is not None and cand.key not in ctx.caches.replica_throughput:
            ahead.front(key)  # (every ZeRO stage below it has come out of line: the keys it pops only grow)
            ahead.take_in(ctx)
        key = _floored(ctx, cand, key, best, heap[0][0] if heap else float("inf"))
        if key >= best:
            low = min(low, key)
            continue
        if heap and key > heap[0][0]:
            heapq.heappush(heap, (key, next(tie), shape, work, cand))
            continue
        est, infeasible, exact = _heuristic_shape(ctx, cand, deadline - time.monotonic(), workers, look is not None)
        if not infeasible and not exact:  # a pipelined shape: the exact pass below may close it
            pending.append((key, len(pending), cand, work, est, len(found) if est is not None else None))
        if est is not None:
            found.append((cand, est, exact))
            best = min(best, _offer(shadow, Plan(cand, est, "feasible"), top, incumbent_s))
    # The exact pass: pipelined shapes that could still beat the best plan, best bound first, while the time lasts;
    # where ``share`` is given and two or more of them could, every other one on the other side (ExactShare)
    pending.sort(key=lambda x: x[:2])
    if not exact_pass and pending:
        low = min(low, pending[0][0])
        pending = []
    items = [(zbound, cand, work, est) for zbound, _, cand, work, est, _ in pending]
    split = share is not None and sum(1 for zbound, *_ in items if _below(zbound, best)) >= 2
    if split:
        share.start(items[1::2], shadow, top, best, deadline, workers)
    done, open_low = exact_shapes(ctx, items[0::2] if split else items, shadow, top, best, deadline, workers)
    done = [(2 * i if split else i, better, proven) for i, better, proven in done]
    if split:
        there, open_there, memo = share.finish()
        absorb_exact(ctx, memo)
        done += [(2 * i + 1, better, proven) for i, better, proven in there]
        open_low = min(open_low, open_there)
    low = min(low, open_low)
    for i, better, proven in sorted(done, key=lambda x: x[0]):
        cand, at = pending[i][2], pending[i][5]
        if at is not None:
            found[at] = (cand, better, proven)  # the shape's plan: the exact one where it is better
        else:
            found.append((cand, better, proven))
    if progress is not None:
        progress(len(found_shapes), len(found_shapes), what)
    return ReplicaSearch(found, low, unexplored)
