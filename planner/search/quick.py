"""Fast bounds around the CP-SAT partition model: an integer-aware lower bound and a greedy balanced partition.

For fixed degrees a stage with n layers takes about n*a + c_i per micro-batch (c_i: embedding on the first stage,
logits on the last, pipeline sends). With a bottleneck T every stage holds at most floor((T - c_i)/a) layers
(in multiples of v), so the smallest T for which these capacities add up to L bounds the bottleneck from below
for every partition, and the iteration from below through m*T + (sum(t) - T)/v. When the greedy partition at
that T fits in memory and evaluates to within RESOLUTION of the bound, it is optimal and CP-SAT is not needed.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from functools import lru_cache

from planner.cost import memory as M
from planner.cost.stage import StageModel, StagePlan, heavy_kind, layer_counts, moe_flags, split_kinds

RESOLUTION = 1e-4  # plans closer than 0.01% are treated as equal in time


def _per_stage(p: int, of_end) -> list:
    """``of_end(first, last)`` for every stage of a p-stage pipeline, computed once per kind of end position."""
    if p == 1:
        return [of_end(True, True)]
    middle = [of_end(False, False)] * (p - 2) if p > 2 else []
    return [of_end(True, False), *middle, of_end(False, True)]


def _stage_consts(sm: StageModel) -> list[float]:
    """Seconds of each stage's micro-batch besides its layers: embedding, logits (the compute form's constant)
    and pipeline sends."""
    return _per_stage(sm.dims.pp, lambda first, last: sm.compute_form(first, last).const + sm.pp_time)


def _capacity(T: float, a: float, c: float, v: int) -> int:
    return max(0, int((T - c) / a / v + 1e-12)) * v


def integer_bottleneck(sm: StageModel, consts: list[float] | None = None) -> float:
    """Smallest T with sum_i floor_v((T - c_i)/a) >= L and every stage holding at least v layers (``consts``:
    _stage_consts(sm) when the caller has them)."""
    d = sm.dims
    L, p, v = sm.job.model.num_layers, d.pp, d.vpp
    a = sm.layer_floor()
    groups: dict[float, int] = {}
    for c in consts if consts is not None else _stage_consts(sm):
        groups[c] = groups.get(c, 0) + 1

    def holds(T: float) -> int:
        return sum(k * _capacity(T, a, c, v) for c, k in groups.items())

    # holds(T) >= (p*T - sum c)/a - p*v, so the answer lies in [T0, T0 + a*v] with T0 the fractional balance;
    # it is a breakpoint c_g + j*a*v of some group, and each group has at most two in that interval.
    floor_t = max(c + v * a for c in groups)
    t0 = max(floor_t, (L * a + sum(c * k for c, k in groups.items())) / p)
    points = {floor_t}
    for c in groups:
        j = max(0, int((t0 - c) / (a * v)))
        points.update(c + (j + step) * a * v for step in range(3))
    for T in sorted(x for x in points if x >= floor_t * (1 - 1e-12)):
        if holds(T) >= L:
            return T * (1 - 1e-12)
    return floor_t + L * a  # unreachable: L layers always fit one per v-chunk at T = max c + L*a


def ordered_bottleneck(sm: StageModel, consts: list[float] | None = None, floor: float = 0.0) -> float:
    """integer_bottleneck with every layer at the floor of its own kind, in the model's layer order: the smallest T
    at which contiguous stages, stage i holding at least one layer, its layers' floors plus c_i within T, hold all
    L layers. A model with dense and MoE layers: integer_bottleneck counts every layer at the cheaper dense floor,
    so a last stage holding one MoE layer and the logits (a pipeline as deep as the model) was bounded at the dense
    layer and the logits, 26% under (suite seed 5, job 10). Without interleaving only (a chunk of an interleaved
    stage is not contiguous with the next); otherwise, and for a model of one kind, integer_bottleneck. At least
    ``floor``, a bound known otherwise (lower_bound_terms: the stages' floors over p)."""
    d, m = sm.dims, sm.job.model
    consts = consts if consts is not None else _stage_consts(sm)
    count = layer_counts(m)
    if d.vpp != 1 or not count["dense"] or not count["moe"]:
        return max(integer_bottleneck(sm, consts), floor)
    floors = (sm.kinds["dense"].layer_floor(), sm.kinds["moe"].layer_floor())
    # (at least integer_bottleneck, which takes every layer at the lesser of the two floors)
    return max(floor, _ordered_bottleneck(tuple(consts), floors, moe_flags(m)))


@lru_cache(maxsize=4096)
def _ordered_bottleneck(consts: tuple[float, ...], floors: tuple[float, float], order: tuple[bool, ...]) -> float:
    L, p = len(order), len(consts)
    cost = [floors[1] if moe else floors[0] for moe in order]
    prefix = list(itertools.accumulate(cost, initial=0.0))
    low, high = min(floors), max(floors)

    def runs(lo: int, hi: int, room: float):
        """The runs (first, last) of starts lo..hi whose first layer fits ``room``."""
        if room >= high:  # (every layer fits: one run)
            yield lo, hi
            return
        e = lo
        while e <= hi:
            if cost[e] <= room:
                start = e
                while e < hi and cost[e + 1] <= room:
                    e += 1
                yield start, e
            e += 1

    def furthest(e: int, room: float, last: int) -> int:
        """The furthest end of a stage whose run starts at or before ``e``: its layers from e within ``room``, at
        most ``last``."""
        return min(bisect.bisect_right(prefix, prefix[e] + room) - 1, last)

    def fits(T: float) -> bool:
        """Whether stages 0..p-1 can end exactly at layer L: the positions each stage can end at, as intervals
        (a run of starts whose first layer fits reaches one interval: the furthest end grows with the start; each
        later stage keeps one layer, so a stage before the last ends at most at L - 1)."""
        reach = [(0, 0)]  # positions the next stage may start at
        for i, c in enumerate(consts):
            room, last = T - c + 1e-12 * T, L - (p - 1 - i)  # (float rounding)
            if room < low:
                return False  # (no layer fits the stage)
            if room >= high and len(reach) == 1:  # (one interval whose every start fits: one run, as below)
                start, e = reach[0]
                top = furthest(e, room, last)
                if top <= start:
                    return False
                reach = [(start + 1, top)]
                continue
            ends = []
            for lo, hi in reach:
                for start, e in runs(lo, hi, room):
                    top = furthest(e, room, last)
                    if top <= start:
                        continue
                    if ends and ends[-1][1] >= start:  # (adjacent or overlapping: one interval)
                        ends[-1] = (ends[-1][0], max(ends[-1][1], top))
                    else:
                        ends.append((start + 1, top))
            if not ends:
                return False
            reach = ends
        return any(lo <= L <= hi for lo, hi in reach)

    # the least bottleneck is the time of some stage: a constant plus a run of at most L - p + 1 layers
    values = sorted({c + d * floors[0] + e * floors[1] for c in set(consts) for d, e in _run_mixes(order, L - p + 1)})
    # the slowest stage is at least the mean of the stages (the least over the values) and, in a split found by
    # fits, seldom more than a layer and the constants' spread above it (tried first; the last value, a stage's
    # most, every split of the layers reaches)
    mean = (sum(consts) + prefix[L]) / p
    lo = max(0, bisect.bisect_left(values, mean) - 1)
    hi = min(len(values) - 1, bisect.bisect_right(values, mean + high + max(consts) - min(consts)))
    if not fits(values[hi]):
        lo, hi = hi + 1, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(values[mid]) else (mid + 1, hi)
    return values[lo]


@lru_cache(maxsize=256)
def _run_mixes(order: tuple[bool, ...], longest: int) -> frozenset[tuple[int, int]]:
    """(dense, MoE) layer counts of every run of 1..``longest`` consecutive layers of ``order``."""
    moe = list(itertools.accumulate(order, initial=0))
    L = len(order)
    return frozenset(
        (n - moe[a + n] + moe[a], moe[a + n] - moe[a]) for a in range(L) for n in range(1, min(longest, L - a) + 1)
    )


def _effective_layers(sm: StageModel) -> float:
    """Layers counted in units of the heaviest kind: a dense layer of an MoE model counts as the largest
    fraction of an MoE layer's memory it can be on any stage (with or without recompute)."""
    m = sm.job.model
    L = m.num_layers
    n_dense = L - m.num_moe_layers
    if not sm.has_moe or not n_dense:
        return float(L)

    # per-layer coefficients of the allocated memory do not depend on the position, only on the in-flight count
    lines = sm.allocated_memory(False, False).layer_lines(("dense", "moe"))
    ratio = 0.0
    for n in set(sm.inflight_counts()):  # (the ratio is a max: each in-flight count once)
        (dense, dense_rc), (moe, moe_rc) = ((s + (m * n + e), sr + (mr * n + er)) for s, m, e, sr, mr, er in lines)
        ratio = max(ratio, dense / moe, (dense + dense_rc) / (moe + moe_rc))
    return L - n_dense * (1 - min(1.0, ratio))


def forced_recompute(sm: StageModel, capacity_gib: float) -> float | None:
    """Fewest layers that must be fully recomputed for L layers to fit in memory (fractional, a lower bound), or
    None when even full recompute everywhere cannot fit them. Per stage, memory is base_i + n*alpha_i - r*beta_i
    (layers counted in units of the heaviest kind, _effective_layers; the largest saving for beta), so n layers
    need r >= (n*alpha_i - room_i)/beta_i: each stage holds room_i/alpha_i layers (fractional) without recompute,
    and every layer beyond costs alpha_i/beta_i recomputed layers, cheapest stages first."""
    cap = sm.allocatable(capacity_gib)
    kinds = tuple(sm.kinds)
    heavy = kinds.index(heavy_kind(sm.job.model)[0])
    free_total, extra = 0.0, []
    full_total = 0
    positions = sm.positions()
    lines = sm.allocated_memory(positions[0].first, positions[0].last).layer_lines(kinds)  # the same at every position
    holds = {pos: _stage_holds(sm, pos, lines, heavy, cap) for pos in set(positions)}  # (stages at one position alike)
    for pos in positions:
        if holds[pos] is None:
            return None
        free, full, item = holds[pos]
        free_total += free
        full_total += full
        if item is not None:
            extra.append(item)
    effective = _effective_layers(sm)
    if full_total < effective:
        return None
    return fill_cheapest(extra, effective - free_total)[0]


def fill_cheapest(rows, need: float) -> tuple[float, float]:
    """(cost, left): ``need`` units put into rows of (cost per unit, most units), the cheapest rows first (a
    fractional knapsack's greedy: the least cost of any way to put them there), and what the rows could not
    hold."""
    total, left = 0.0, need
    for price, most in sorted(rows):
        if left <= 0:
            break
        take = min(left, most)
        total += take * price
        left -= take
    return total, left


def _stage_holds(sm: StageModel, pos, lines, heavy: int, cap: float) -> tuple | None:
    """forced_recompute's terms of a stage at position ``pos`` (StageModel.position): (layers it holds without
    recompute, layers it holds with every one recomputed, (recomputed layers per layer beyond the first count, how
    many) or None), or None where not even a chunk of vpp layers fits recomputed."""
    n = pos.inflight
    rows = [(s + (m * n + e), sr + (mr * n + er)) for s, m, e, sr, mr, er in lines]  # per layer, recomputed
    alpha, saved = rows[heavy]
    lean = alpha + saved
    if len(rows) == 1:
        beta, lightest = -saved, lean
    else:
        beta = max(-rc for _, rc in rows)
        lightest = min(layer + rc for layer, rc in rows)
    room = cap - sm.allocated_memory(pos.first, pos.last).const(n)
    if room < lightest * sm.dims.vpp:
        return None
    L = sm.job.model.num_layers
    full = int(room / lean) if lean > 0 else L
    free = min(room / alpha, full) if alpha > 0 else L
    return free, full, ((alpha / beta, full - free) if full > free and beta > 0 else None)


def _stage_memory_terms(sm: StageModel, capacity_gib: float):
    """Per stage (room, alpha, beta): allocatable bytes left after the stage's fixed items, bytes per layer of the
    heaviest kind, and bytes saved per fully recomputed layer (once per position: stages at one position alike)."""
    positions = sm.positions()
    terms = {pos: memory_term(sm, capacity_gib, *pos) for pos in set(positions)}
    return [terms[pos] for pos in positions]


def stage_memory_term(sm: StageModel, capacity_gib: float, i: int) -> tuple[float, float, float]:
    """(room, alpha, beta) of stage i (see _stage_memory_terms), read off its allocated-memory form."""
    return memory_term(sm, capacity_gib, *sm.position(i))


def memory_term(sm: StageModel, capacity_gib: float, first: bool, last: bool, inflight: float):
    """(room, alpha, beta) of a stage at this position holding ``inflight`` micro-batches: allocatable bytes left
    after its fixed items, bytes per layer of the heaviest kind, bytes saved per fully recomputed layer."""
    memory = sm.allocated_memory(first, last)
    heavy = heavy_kind(sm.job.model)[0]
    return (
        sm.allocatable(capacity_gib) - memory.const(inflight),
        memory.per_layer(heavy, inflight),
        -memory.per_recomputed(heavy, inflight),
    )


def relaxed_layers(slack: float, room: float, alpha: float, beta: float, a: float, rc: float) -> float:
    """Most heavy layers (fractional) a stage holds within ``slack`` seconds and ``room`` bytes when it recomputes
    just enough of them to fit, relaxing the recomputed count r(n) = ceil((n*alpha - room)/beta) to no ceiling: n*a
    seconds up to room/alpha layers, then (slack + room*rc/beta)/(a + alpha*rc/beta), up to room/(alpha - beta)
    with every layer recomputed. ``a``, ``rc``: a layer's seconds and its recompute's."""
    if slack <= 0 or room <= 0:
        return 0.0
    n = min(slack / a, room / alpha)  # no recompute
    if beta > 0 and rc > 0:
        with_rc = (slack + room * rc / beta) / (a + alpha * rc / beta)
        lean = alpha - beta
        full = room / lean if lean > 0 else float("inf")
        if with_rc > room / alpha:
            n = max(n, min(with_rc, full))
    return n


def layer_slack(n: int, room: float, alpha: float, beta: float, a: float, rc: float) -> float:
    """The least seconds at which relaxed_layers reaches n layers (its inverse): n a while the n layers fit
    without recompute (n alpha <= room), then n (a + alpha rc / beta) - room rc / beta with just enough of them
    recomputed, up to room / (alpha - beta) layers with every one recomputed; inf beyond."""
    if n * alpha <= room:
        return n * a
    if beta > 0 and rc > 0 and (alpha <= beta or n <= room / (alpha - beta)):
        return n * (a + alpha * rc / beta) - room * rc / beta
    return float("inf")


def whole_layer_slack(n: int, room: float, alpha: float, beta: float, a: float, rc: float) -> float:
    """The least seconds a stage spends on n layers when it recomputes just enough whole layers to fit: n a plus
    rc per recomputed layer, r(n) = ceil((n alpha - room) / beta) of them; inf where even every layer recomputed
    does not fit. layer_slack is the same with the ceiling relaxed (convex in n, for greedy sums over stages); a
    stage's time at one count needs no convexity, and with a few layers per stage the ceiling is worth a whole
    layer's recompute (seed-4 suite job 26, Llama 3 405B on 49 stages of L40S and A10: 4.5% of its mixed-pipeline
    refined bound). The per-stage rule of memory_bottleneck and of the mixed searches' memory bounds."""
    over = n * alpha - room
    if over <= 0:
        return n * a
    if beta <= 0:
        return float("inf")
    r = -(-over // beta)
    return n * a + r * rc if r <= n else float("inf")


def memory_bottleneck(sm: StageModel, capacity_gib: float, effective_layers: float) -> float:
    """Smallest bottleneck T at which the stages can hold ``effective_layers`` layers of the heaviest kind (the
    other layers only add time and memory) when each stage recomputes just enough
    layers (whole layers) to fit in memory: stage i holds n layers in n*a + r_i(n)*rc + c_i seconds with
    r_i(n) = ceil((n*alpha_i - room_i)/beta_i). A lower bound on max_i t_i for every feasible plan.

    A stage's time grows with its layer count (its recompute count never falls), so the stages hold E layers
    within T exactly when E layers' worth of the cheapest chunks of v layers fit under T: T is the time of the
    last chunk taken when the stages' next chunks are taken cheapest first (a k-way merge of increasing
    sequences), starting from what each holds at the least T (its constant)."""
    counts, lo, chunk_time = _memory_counts(sm, capacity_gib)
    held = counts(lo)
    v = sm.dims.vpp
    short = effective_layers - 1e-9 - sum(held)
    if short <= 0:
        return lo
    chunks = [n // v for n in held]
    line = [(chunk_time(i, k + 1), i) for i, k in enumerate(chunks)]
    heapq.heapify(line)
    T = lo
    for _ in range(math.ceil(short / v)):
        T, i = line[0]
        if T == float("inf"):
            return T  # every stage is full: the layers do not fit
        chunks[i] += 1
        heapq.heapreplace(line, (chunk_time(i, chunks[i] + 1), i))
    return T


def _memory_counts(sm: StageModel, capacity_gib: float):
    """(counts, lo, chunk_time): counts(T) gives, per stage, the most heavy layers (multiples of v) it holds within
    a bottleneck T when it recomputes just enough whole layers to fit; lo is the least bottleneck (the largest
    stage constant); chunk_time(i, k) is stage i's time with k chunks of v heavy layers."""
    d = sm.dims
    v = d.vpp
    heavy = sm.kinds[heavy_kind(sm.job.model)[0]]
    a = heavy.layer_floor()
    rc = heavy.recompute_floor()
    terms = _stage_memory_terms(sm, capacity_gib)
    consts = _stage_consts(sm)

    def capacity(i: int, T: float) -> float:
        """Most layers stage i holds within T, relaxing r_i(n) to (n*alpha - room)/beta (no ceiling)."""
        return relaxed_layers(T - consts[i], *terms[i], a, rc)

    def stage_time(i: int, n: int) -> float:
        """Exact time of n heavy layers on stage i with the fewest whole recomputed layers that fit."""
        return whole_layer_slack(n, *terms[i], a, rc) + consts[i]

    def counts(T: float) -> list[int]:
        out = []
        for i in range(d.pp):
            k = int(capacity(i, T) / v + 1e-9)  # relaxed capacity, then whole recomputed layers
            while k > 0 and stage_time(i, k * v) > T * (1 + 1e-12):
                k -= 1
            out.append(k * v)
        return out

    def chunk_time(i: int, k: int) -> float:
        """Time of stage i holding k chunks of v layers (inf where they do not fit)."""
        return stage_time(i, k * v)

    lo = max(consts) if consts else 0.0
    return counts, lo, chunk_time


def lower_bound(sm: StageModel, capacity_gib: float | None = None, cutoff: float = float("inf")) -> float:
    """Valid for every partition and recompute placement of these degrees. Beyond the integer bottleneck it
    keeps the convex overlap terms in aggregate: sum_i max(0, x_i) >= max(0, sum_i x_i), and collective costs are
    affine with non-negative latency, so f(a) + f(b) >= f(a + b). The memory bottleneck is only worked out when
    the bound without it is below ``cutoff`` (the K-th best plan)."""
    T, rest = lower_bound_terms(sm, capacity_gib, cutoff)
    return T if T == float("inf") else (sm.mb - 1 / sm.dims.vpp) * T + rest


def lower_bound_terms(
    sm: StageModel, capacity_gib: float | None = None, cutoff: float = float("inf")
) -> tuple[float, float]:
    """lower_bound as (T, rest): the bound is (micro-batches - 1/vpp) * T + rest, with T the least bottleneck (the
    slowest stage's seconds per micro-batch) and rest the schedule's fill, DP tail and optimizer step."""
    d, m = sm.dims, sm.job.model
    p, v = d.pp, d.vpp
    consts = _stage_consts(sm)
    total = sm.layers_floor() + sum(consts)
    # the whole model as one stage that is first and last: the aggregate of every stage's forms
    whole = sm.whole_model()
    time, tail = sm.time_forms(True, True), sm.tail_forms(True, True)
    comp, fwd = time.compute.at(whole), time.forward.at(whole)
    if capacity_gib is not None:
        forced = forced_recompute(sm, capacity_gib)
        if forced is None:
            return float("inf"), float("inf")
        if forced > 0:
            total += forced * min(k.recompute_floor() for k in sm.kinds.values())
            comp += forced * min(k.recompute_extra for k in sm.kinds.values())
    if time.zero is not None:
        total += time.zero.exposed(time.zero.traffic.at(whole), comp)
    T = ordered_bottleneck(sm, consts, total / p)
    rest = total / v + tail.exposed(whole, comp, fwd) / p + tail.optimizer.at(whole) / p
    slope = sm.mb - 1 / v
    if capacity_gib is not None and slope * T + rest < cutoff:
        # the heaviest kind alone must fit: all layers of a dense model, the MoE layers of an MoE model
        T = max(T, memory_bottleneck(sm, capacity_gib, heavy_kind(m)[1]))
    return T, rest


def _trim_surplus(sm: StageModel, counts: list[int], L: int) -> bool:
    """Remove layers (v at a time) from the slowest stages, last stages first on ties, until the counts add up
    to L. False when that would leave a stage empty."""
    v = sm.dims.vpp
    a = sm.layer_floor()
    consts = _stage_consts(sm)
    surplus = sum(counts) - L
    while surplus > 0:
        order = sorted(range(len(counts)), key=lambda i: (-(counts[i] * a + consts[i]), -i))
        for i in order:
            if counts[i] > v:
                counts[i] -= v
                surplus -= v
                break
        else:
            return False
    return True


def greedy_partition(sm: StageModel, capacity_gib: float) -> list[StagePlan] | None:
    """Balanced partition at the integer bottleneck, without recompute beyond the baseline; None when memory
    forces recompute or the layers do not fit."""
    d = sm.dims
    L, p, v = sm.job.model.num_layers, d.pp, d.vpp
    a = sm.layer_floor()
    T = integer_bottleneck(sm) * (1 + 1e-9)
    counts = [_capacity(T, a, c, v) for c in _stage_consts(sm)]
    cap = capacity_gib * M.GIB
    # memory cap per stage (no recompute): the memory of a stage grows with its layers
    for i in range(p):
        while counts[i] >= v:
            plans = split_kinds(sm.job, tuple(counts), None, d.recompute == "full")
            if sm.peak_memory(i, plans[i]) <= cap:
                break
            counts[i] -= v
        if counts[i] < v:
            return None
    if sum(counts) < L or not _trim_surplus(sm, counts, L):
        return None
    plans = split_kinds(sm.job, tuple(counts), None, d.recompute == "full")
    if any(sm.peak_memory(i, pl) > cap for i, pl in enumerate(plans)):
        return None
    return plans


def greedy_recompute_partition(sm: StageModel, capacity_gib: float) -> list[StagePlan] | None:
    """A feasible plan when memory forces recompute: stage capacities at the memory bottleneck (heaviest kind),
    the surplus trimmed from the slowest stages, then on each stage the fewest recomputed layers that fit."""
    d = sm.dims
    m = sm.job.model
    L, p, v = m.num_layers, d.pp, d.vpp
    T = memory_bottleneck(sm, capacity_gib, heavy_kind(m)[1])
    if T == float("inf"):
        return None
    stage_counts, _, _ = _memory_counts(sm, capacity_gib)
    counts = stage_counts(T * (1 + 1e-9))
    if sum(counts) < L or min(counts) < v:
        bump = 1.0
        while (sum(counts) < L or min(counts) < v) and bump < 4:
            bump *= 1.05
            counts = stage_counts(T * bump)
        if sum(counts) < L or min(counts) < v:
            return None
    if not _trim_surplus(sm, counts, L):
        return None
    cap = capacity_gib * M.GIB
    recompute = [0] * p
    for i in range(p):
        while True:
            plan = split_kinds(sm.job, tuple(counts), tuple(recompute), False)[i]
            if sm.peak_memory(i, plan) <= cap:
                break
            if recompute[i] >= counts[i]:
                return None
            recompute[i] += 1
    return split_kinds(sm.job, tuple(counts), tuple(recompute), False)
