"""Lower bounds of the mixed-pipeline search (planner/search/mixed_pipelines.py): box_bound for a box of stage
counts per node group, and for one candidate a group-level bound (_group_bound, a few stages per group) and the refined
bound (refined_bound: every stage's memory cap, sends, ZeRO-2/3 traffic, the layer kinds of its run of layers and
its DP tail), with the bottlenecks they read (in whole chunks, by layer kind, by memory with recompute, by DP tail:
tail_bottleneck, kind_memory_floor). Each is valid for every plan of what it bounds, so the search may drop anything
whose bound reaches the K-th best time."""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from planner.cost.estimate import neighbour_links
from planner.cost.stage import StageModel, heavy_kind, layer_counts
from planner.search.mixed_context import (
    BlockTerms,
    LayerRuns,
    MixedContext,
    TailProfile,
    block_terms,
    kind_memory_times,
    moe_windows,
    window_start,
)
from planner.search.quick import fill_cheapest, layer_slack, whole_layer_slack

# Relative width at which the bottleneck bisections stop. Their lower end is a valid bound at every step, so a
# coarser width only weakens the bound (by at most this share) and saves iterations; 1e-5 is a tenth of the
# resolution at which plans count as equal (quick.RESOLUTION).
BISECTION = 1e-5

if TYPE_CHECKING:
    from planner.search.mixed_pipelines import HeteroCandidate, _Family


class Ends(NamedTuple):
    """The embedding (first stage) and logits (last stage) terms of a bound, per micro-batch: their seconds, their
    seconds over the per-layer time of the stage that runs them, and that stage's one-layer time plus them. For
    a family whose group order is still open each term is its minimum over the possible first / last groups. (A
    named tuple, like KindMix: the bounds build one per box, and a tuple is built in a fraction of a frozen
    dataclass's time.)"""

    emb: float
    logits: float
    emb_per_a: float
    logits_per_a: float
    first_top: float
    last_top: float
    ordered: bool = True  # the embedding is on the first group's first stage, the logits on the last group's last
    # unordered: the groups known to lead the pipeline order, in that order (the first one's first stage holds
    # the embedding), and the group known to come last (its last stage holds the logits); first_positions
    leading: tuple[int, ...] = ()
    last: int | None = None

    @property
    def placed(self) -> bool:
        """Unordered ends that know where some groups sit (leading or last)."""
        return bool(self.leading) or self.last is not None

    @classmethod
    def of(cls, a, ends, first: int, last: int) -> Ends:
        (ef, _), (_, ll) = ends[first], ends[last]
        return cls.at(ef, ll, a[first], a[last])

    @classmethod
    def at(cls, emb: float, logits: float, a_first: float, a_last: float) -> Ends:
        """The ordered terms of an embedding and a logits on stages of a_first and a_last seconds per layer."""
        return cls(emb, logits, emb / a_first, logits / a_last, a_first + emb, a_last + logits)

    @classmethod
    def any_order(cls, a, ends) -> Ends:
        """The terms at their least over the groups (per-layer seconds ``a``, (embedding, logits) seconds ``ends``):
        the group order still open."""
        return cls.least([cls.row(x, end) for x, end in zip(a, ends)])

    @classmethod
    def partial(cls, a, ends, firsts, lasts, leading: tuple[int, ...] = (), last: int | None = None) -> Ends:
        """The terms of the group orders that start on one of the groups ``firsts`` and end on one of ``lasts``:
        the embedding terms at their least over ``firsts``, the logits terms over ``lasts`` (unordered: each a lower
        bound; any_order where both are every group), with the groups known to lead the order and to end it."""
        rows = [cls.row(x, end) for x, end in zip(a, ends)]
        first, end = cls.least([rows[g] for g in firsts]), cls.least([rows[g] for g in lasts])
        return first._replace(
            logits=end.logits, logits_per_a=end.logits_per_a, last_top=end.last_top, leading=leading, last=last
        )

    @staticmethod
    def row(a: float, end: tuple[float, float]) -> tuple[float, ...]:
        """One group's terms (its per-layer seconds ``a`` and (embedding, logits) seconds ``end``), for least."""
        emb, logits = end
        return emb, logits, emb / a, logits / a, a + emb, a + logits

    @classmethod
    def least(cls, rows) -> Ends:
        """any_order from the groups' row terms (a caller that keeps them per group builds no other)."""
        return cls(*map(min, zip(*rows)), ordered=False)


class KindMix(NamedTuple):
    """A model with dense and MoE layers in a box bound. A stage holding d dense and e MoE layers on group g takes
    at least d*x_g + e*y_g + c seconds (x_g, y_g: each kind's least seconds per layer there, with what the caller
    adds per layer), and y_g >= rho*x_g with rho the least y_g/x_g over the groups, so d + rho*e <= (T - c)/x_g:
    the stages hold ``layers`` = D + rho*E dense-layer units within T (box_bound's bottleneck at x_g per layer,
    with ``ends`` over x). ``work``: D*min x + E*min y, the least sum of every layer's seconds."""

    dense: tuple[float, ...]
    ends: Ends
    layers: float
    work: float
    moe: tuple[float, ...] = ()  # each group's least seconds per MoE layer (y_g)
    moe_layers: int = 0  # E
    moe_from: int = 0  # the first layer index from which every layer is MoE (ModelSpec.all_moe_from)
    # in any group order: the stages at positions below it are the only ones that may hold a dense layer (moe_from
    # of the model whatever the order; None where no position holds MoE layers only)
    lead: int | None = None
    # a TP-choice node's rows: each row's least seconds per MoE layer of any of its choices (open_lead_schedule_time)
    moe_least: tuple[float, ...] = ()

    @classmethod
    def of(
        cls,
        kinds,
        lift,
        ends,
        counts: tuple[int, int],
        ordered: bool,
        moe_lift=None,
        moe_from: int | None = None,
        lead: int | None = None,
    ) -> KindMix:
        """``kinds``: (dense, MoE) least seconds per layer of each used group, ``lift`` what the caller adds to
        every layer there (ZeRO-2/3 traffic), ``moe_lift`` to every MoE layer instead where given; ``ends``:
        (embedding, logits) seconds per group; ``counts``: (D, E); ``ordered``: the groups are in pipeline order
        (else each end term at its least over the groups); ``moe_from``: ModelSpec.all_moe_from (None: no
        position holds only MoE layers); ``lead``: ModelSpec.all_moe_from whatever the order (KindMix.lead)."""
        dense = tuple(x + z for (x, _), z in zip(kinds, lift))
        moe = tuple(y + z for (_, y), z in zip(kinds, moe_lift if moe_lift is not None else lift))
        D, E = counts
        rho = min(y / x for x, y in zip(dense, moe))
        at_ends = Ends.of(dense, ends, 0, len(dense) - 1) if ordered else Ends.any_order(dense, ends)
        far = D + E if moe_from is None else moe_from
        layers, work = D + rho * E, D * min(dense) + E * min(moe)
        return cls(tuple(dense), at_ends, layers, work, moe=moe, moe_layers=E, moe_from=far, lead=lead)


def schedule_bound(bottleneck: float, total: float, m: int, v: int = 1) -> float:
    """The iteration seconds of planner/cost/schedule.pipeline_time (m max_s t_s + (sum_s t_s - max_s t_s)/v, the
    1F1B schedule at v = 1, interleaved with v model chunks per stage) written as (m - 1/v) max + sum/v: a lower
    bound on it from ``bottleneck`` <= max_s t_s and ``total`` <= sum_s t_s (both coefficients are >= 0). At
    v = 1 it is (m - 1) max + sum."""
    return (m - 1 / v) * bottleneck + total / v


def schedule_probe(target: float, rest: float, m: int, v: int = 1) -> float:
    """The bottleneck T at which schedule_bound's (m - 1/v) T plus ``rest`` (its sum term total / v, with whatever
    else the caller adds, such as the largest DP tail) comes to ``target``: a candidate whose slowest stage cannot be
    within it cannot beat the target (m - 1/v > 0)."""
    return (target - rest) / (m - 1 / v)


def box_bound(*args, **kwargs) -> float:
    """box_bound_reach's bound, without its reach."""
    return box_bound_reach(*args, **kwargs)[0]


def box_bound_reach(
    a,
    lo: tuple[int, ...],
    hi: tuple[int, ...],
    ends: Ends,
    L: int,
    m: int,
    send=None,
    v: int = 1,
    floor: float = 0.0,
    mix: KindMix | None = None,
    whole: bool = False,
    relaxed: tuple = (),
    max_stages: int | None = None,
    target: float = float("inf"),
    tails: Callable[[], BoxTails] | None = None,
) -> tuple[float, float]:
    """Iteration seconds no candidate with lo_g <= k_g <= hi_g stages per used group g beats (lo = hi: one
    candidate). Each stage of group g takes at least a_g seconds per layer and, when there are >= 2 stages (with
    lo adding up to 2 or more, or v > 1: interleaving needs a pipeline), send_g seconds of pipeline sends per
    micro-batch (on its own links: a neighbour on another group is no
    faster; the caller counts a stage's v model chunks in it); the first stage adds the embedding and the last
    the logits (``ends``). With stage times t_s >= n_s a_s + c_s the schedule of v model chunks per stage takes
    (m - 1/v) max_s t_s + sum_s t_s / v (schedule_bound, planner/cost/schedule.py):
      - max_s t_s >= the smallest T with sum_s (T - c_s)/a_s >= L, since every n_s <= (T - c_s)/a_s and the n_s
        sum to L (and T >= c_s + a_s, every stage holding a layer). Adding a stage of g moves T towards send_g,
        so while every send_g <= T more stages only lower it and k = hi bounds the box (else sends are dropped);
      - sum_s t_s >= emb + logits + sum_s send_s + the least work: one chunk of v layers per stage, the rest at
        the fastest a_g, which is L*min(a) + sum_g k_g v (a_g - min(a)), smallest at k = lo.
    Communication beyond TP, CP and pipeline sends, the DP tail and the optimizer step are >= 0 and left out.
    ``floor``: a bound on max_s t_s known otherwise (memory_floor). ``mix``: the model's two layer kinds (KindMix),
    for a second bottleneck in dense-layer units and a second least work (a = the faster kind's seconds).
    ``whole``: the stage counts are real, at least one stage per group (a family's box, not a relaxed group), so
    the bottleneck is raised to where the stages hold the layers in whole chunks (whole_chunk_bottleneck; the ends
    only where ``ends`` are ordered). ``relaxed``: per group, True where its row stands for several choices (a
    group whose TP is still open: hi/a its best throughput), which holds a continuous share instead, or those
    choices themselves (whole_chunk_bottleneck: the group holds what its best choice holds in whole chunks).
    ``max_stages``: the most stages a candidate has (default L // v: one chunk of v layers each; fewer where the
    interleaved schedule runs only at some depths).
    ``target``: where the bound with the continuous bottleneck already reaches it, that bound is returned (the
    whole-chunk steps only raise it): a caller that only asks whether a box reaches its target (the K-th best) is told
    at half the cost.
    ``tails``: what gives the groups' DP tails (BoxTails; called only where the bound without them is below
    ``target``), for a box of two or more stages: the bound then includes the largest tail of the stages, in whole
    chunks (``whole``, no relaxed group) bounded together with the schedule (box_schedule_with_tail).
    Returned with its reach: any floor below it gives the same bound, so a caller with a floor (memory_floor) only
    works the bound out again above it. The reach is the bottleneck the bound settled on (a floor below it leaves
    every step the same: the whole-chunk walks return the first bottleneck at or above where they start at which
    the stages hold the layers), and below the largest send where the sends were dropped (a floor above it would
    keep them)."""
    # a box of real stage counts in pipeline order knows which of its stages sit past the model's leading dense
    # layers; one whose order is open only where its ends place some groups (Ends.placed)
    placed = mix is not None and mix.moe and whole and not any(relaxed)
    moe_positions = placed and ends.ordered
    if moe_positions:
        positions = first_positions(lo, lo)
        rates = moe_only_rates(a, mix, positions, mix.moe_from)
        if rates is not a:  # (the ordered ends at the new seconds)
            a, ends = rates, Ends.at(ends.emb, ends.logits, rates[0], rates[-1])
    sends = send is not None and pipeline_sends(lo, v)
    ys = send if sends else (0.0,) * len(a)  # each group's sends (none for fewer than two stages)
    stages = sum(hi)
    single = stages == 1  # one stage holds both ends
    top = max(ends.first_top + (ends.logits if single else 0.0), ends.last_top)
    fast = min(a)
    inv = over = most = 0.0
    work = L * fast
    for x, k_lo, k_hi, y in zip(a, lo, hi, ys):  # one loop: called very often
        inv += k_hi / x
        over += k_hi * y / x
        most = max(most, y)
        if k_lo:
            top = max(top, v * x + y)  # a stage of this group surely holds a layer (a chunk of v layers)
            work += k_lo * (v * (x - fast) + y)
    if moe_positions:
        top = max(top, moe_only_top(mix, lo, ys, v, positions, mix.moe_from))
    elif placed and ends.placed and mix.lead is not None:
        top = max(top, moe_only_top(mix, lo, ys, v, first_positions(lo, lo, ends.leading, ends.last), mix.lead))
    T = max(top, (L + ends.emb_per_a + ends.logits_per_a + over) / inv, floor)
    cap = L // v if max_stages is None else min(max_stages, L // v)
    if stages > cap:  # the box's candidates have fewer stages than its groups allow together
        T = max(T, (L + ends.emb_per_a + ends.logits_per_a) / capped_rate(a, hi, cap))
    if mix is not None:
        inv_d = over_d = lo_sends = 0.0
        for k, y, x, k_lo in zip(hi, ys, mix.dense, lo):
            inv_d += k / x
            over_d += k * y / x
            lo_sends += k_lo * y
        T = max(T, (mix.layers + mix.ends.emb_per_a + mix.ends.logits_per_a + over_d) / inv_d)
        if stages > cap:
            T = max(T, (mix.layers + mix.ends.emb_per_a + mix.ends.logits_per_a) / capped_rate(mix.dense, hi, cap))
        work = max(work, mix.work + lo_sends)
    if most > T:  # the monotonicity above fails: drop the sends
        value, reach = box_bound_reach(
            a, lo, hi, ends, L, m, None, v, floor, mix, whole, relaxed, max_stages, target, tails
        )
        return value, min(reach, most)
    total = ends.emb + ends.logits + work
    if whole and target < float("inf"):
        early = schedule_bound(T, total, m, v)
        if early >= target:
            return early, T
    if whole:
        # (cap: whole_chunk_bottleneck reads it where the stages exceed it)
        T = whole_chunk_bottleneck(a, hi, ends, L, send if sends else None, v, T, relaxed, cap)
        if mix is not None and mix.moe:
            # the MoE layers in whole layers: a stage holding e of them takes at least e y_g + its constant (its
            # dense layers only add), so the stages hold them only where sum floor((T - c) / y_g) reaches E
            # (a relaxed group's choices carry their seconds per layer of any kind: here its MoE row stands for them)
            moe_sends, shares = send if sends else None, tuple(bool(r) for r in relaxed)
            T = whole_chunk_bottleneck(mix.moe, hi, mix.ends, mix.moe_layers, moe_sends, 1, T, shares, cap)
        fixed = ends.emb + ends.logits + sum(k * y for k, y in zip(lo, ys))  # (the ends and the lo stages' sends)
    if whole and not any(relaxed):
        split = moe_split(a, lo, hi, ys, ends, mix) if mix is not None and mix.moe and mix.lead else None
        if split is None:
            return _box_schedule((a, lo, hi, ys, L, T, m - 1 / v, v, fixed, total, None), tails, target), T
        # each group's stages before the leading dense layers' end apart from those past it; where the rows hold
        # more stages than the groups (an unordered box: any group may come first), the bound by groups too
        plain = 0.0
        if sum(split[2]) > sum(hi):
            plain = _box_schedule((a, lo, hi, ys, L, T, m - 1 / v, v, fixed, total, None), tails, target)
            if plain >= target:
                return plain, T
        priced = _priced(a, mix, split[-1], L, not ends.ordered and not ends.placed)  # (from the groups' a)
        a, lo, hi, ys, ends, rows = split
        at = whole_chunk_bottleneck(a, hi, ends, L, ys if sends else None, v, T, most=cap)
        tails = _split_tails(tails, rows) if tails is not None else None
        value = _box_schedule((a, lo, hi, ys, L, at, m - 1 / v, v, fixed, total, priced), tails, target)
        return (value, at) if value >= plain else (plain, T)
    value = schedule_bound(T, total, m, v)
    if whole and value < target and mix is not None and mix.lead is not None and mix.moe_least and True not in relaxed:
        # groups whose TP is still open (a TP-choice node): the stages past the leading dense layers at MoE seconds
        picks = tuple(tuple((k, x, y if sends else 0.0) for k, x, y in r) if r else None for r in relaxed)
        value = max(value, open_lead_schedule_time(a, hi, ys, picks, mix, L, T, m - 1 / v, v, fixed, total))
    return value + (tails().least if tails is not None else 0.0), T


def open_lead_schedule_time(
    a, hi, ys, picks, mix: KindMix, L: int, T: float, k: float, v: int, fixed: float, work_floor: float
) -> float:
    """box_schedule_time's least schedule for a box whose groups' TP may still be open (``picks``: per group None,
    or its choices as (stages, seconds per layer, sends)) in any group order, of a model with leading dense
    layers (mix.lead: only the stages at positions below it may hold a dense layer; moe_split for a box whose
    every TP is fixed). Every other stage holds MoE layers only, each at least max(a_g, y_g) seconds (y_g:
    mix.moe_least, the least MoE-layer seconds of any of the group's choices; a_g the least of either kind), so at
    bottleneck M group g's stages past that end hold at most hi_g floor((M - s_g) / (v max(a_g, y_g))) chunks of v
    layers (a group whose TP is open: the most any one of its choices' stages hold, each choice at its own seconds
    and sends), and the at most mix.lead stages before it at most floor((M - least send) / (v min a)) each, at
    min a per layer. The least work W(M) fills those rooms cheapest first (every layer alike in size, so the
    greedy fill is the least); the schedule takes at least k M + max(work_floor, fixed + W(M)) / v, its least
    over M >= T walked over the steps where a room grows (box_schedule_time's walk). On seed-5 suite job 13
    (GLM-4.5-Air, one dense layer, on four types) the nodes with a group open lacked this term: their children
    with every TP fixed were all cut in 1,162 of their 2,192 steps below 0.9 of the best plan's time."""
    most = L // v
    rows = []  # (price per layer, ((stages, seconds per chunk, sends) of each choice))
    for g, choices in enumerate(picks):
        y_least = mix.moe_least[g]
        price = max(a[g], y_least)
        if choices is None:
            options = ((hi[g], v * max(a[g], mix.moe[g]), ys[g]),)  # (its one choice's MoE seconds)
        else:
            options = tuple((count, v * max(x, y_least), y) for count, x, y in choices)
        rows.append((price, options))
    rows.append((min(a), ((mix.lead, v * min(a), min(ys)),)))  # the stages before the dense layers' end
    rows.sort(key=lambda r: r[0])

    def at(M: float) -> float:
        left, work = L, fixed
        for price, options in rows:
            room = 0
            for count, u, y in options:
                q = min(most, math.floor((M - y) / u + 1e-9))
                if q >= 1 and count * q > room:
                    room = count * q
            take = min(left, v * room)
            work += take * price
            left -= take
            if left <= 0:
                break
        if left > 0:
            return float("inf")
        return k * M + max(work_floor, work) / v

    floor = k * T + work_floor / v  # schedule_bound(T, work_floor, m, v)
    steps = [(u, y, most) for _, options in rows for _, u, y in options]
    return max(floor, _least_over_steps(at, T, _linear_steps(T, steps), k, v, work_floor))


def _priced(a, mix: KindMix, rows, L: int, unplaced: bool) -> tuple | None:
    """box_schedule_time's ``priced`` for moe_split's rows (group, MoE only) of groups at per-layer seconds ``a``
    (the least of either kind): every row's layers at its group's MoE-layer seconds y_g = max(a_g, MoE seconds),
    less D (y_g - a_g) for the model's D dense layers at the largest such gap of a row that may hold them. A row
    before the leading dense layers' end holds them, and MoE layers after them: priced at a_g, each of its
    stages took every layer it holds at the cheaper kind. ``unplaced``: an unordered box whose first group is not
    known, where every group has such a row besides its MoE-only row of all its stages: each such row's partner
    (that MoE-only row) is given, and mix.lead, the most stages that sit before that end. None where no row may
    hold a dense layer."""
    gaps = [max(a[g], mix.moe[g]) - a[g] for g, only in rows if not only]
    if not gaps:
        return None
    dense = L - mix.moe_layers
    prices = tuple(max(a[g], mix.moe[g]) for g, _ in rows)
    partners = None
    if unplaced:  # every group has both rows, its MoE row all its stages
        partners = tuple(None if only else rows.index((g, True)) if (g, True) in rows else None for g, only in rows)
    return prices, dense * max(gaps), partners, mix.lead


def _box_schedule(sched: tuple, tails: Callable[[], BoxTails] | None, target: float) -> float:
    """box_schedule_time of ``sched``, with the DP tails where there are (box_schedule_with_tail)."""
    if tails is not None:
        return box_schedule_with_tail(sched, tails, target)
    return box_schedule_time(*sched)


def pipeline_sends(lo, v: int) -> bool:
    """Whether every candidate of a box with at least lo_g stages per group sends between its stages: two stages or
    more (lo adding up to 2, or v > 1: an interleaved pipeline has two stages or more)."""
    return sum(lo) >= 2 or v > 1


def least_line_sum(rows, need: int) -> float:
    """The least sum of per-layer seconds when ``need`` layers go to rows of (seconds per layer, most layers): the
    cheapest rows filled first (a fractional knapsack; integral here, as every row's most is whole). inf where
    the rows cannot hold them. The ZeRO-2/3 traffic lines of a TP-choice node (_TpChoiceNode._lines_at): each
    group's layers at its own slope, at most what its memory holds (ZeroTerms.room), instead of every layer at
    the least slope of any group."""
    total, left = fill_cheapest(rows, need)
    return total if left <= 0 else float("inf")


def capped_rate(a, hi, most: int) -> float:
    """The most layers per second at most ``most`` stages take together, at most hi_g of them on group g at a_g
    seconds per layer each: the fastest stages first. A pipeline of v model chunks per stage has at most L // v
    stages (one chunk of v layers each), so box_bound's bottleneck, sum_s (T - c_s)/a_s >= L, with c_s >= 0 and
    at most that many stages, needs T >= L / this rate. A relaxed row (hi/a its best throughput over its choices, a
    its fastest per-stage time) gives at most min(q, hi)/a for q of its stages."""
    return _fastest_first(zip(a, hi), most)


def _fastest_first(rows, most: int) -> float:
    """The layers per second of at most ``most`` stages, ``rows`` as (seconds per layer, stages), the fastest
    taken first."""
    rate, left = 0.0, most
    for x, k in sorted(rows):
        take = min(k, left)
        rate += take / x
        left -= take
        if left <= 0:
            break
    return rate


def choice_capped_rate(rows, most: int) -> float:
    """The most layers per second at most ``most`` stages take together, each group at one of its choices: ``rows``
    per group its choices as (stages k, seconds per layer x). q stages of a group take at most max over its
    choices of min(q, k)/x layers per second, at most the least concave function above the points (0, 0) and
    (k, k/x) (_rate_hull), so the steepest segments of all groups first bound the total (capped_rate where a
    group's TP is still open: each choice at its own stage count and seconds)."""
    return _fastest_first([seg for choices in rows for seg in _rate_hull(tuple(choices))], most)


@functools.lru_cache(maxsize=1 << 14)
def _rate_hull(choices: tuple[tuple[int, float], ...]) -> tuple[tuple[float, int], ...]:
    """The segments of the least concave function above the points (0, 0) and (k, k/x) of a group's choices (k
    stages of x seconds per layer), their upper hull, steepest first: each as (seconds per layer, stages), the
    stages it spans and the inverse of its slope (what one of them adds per layer per second)."""
    rising: list[tuple[int, float]] = []  # the points above every one with fewer stages (the function never falls)
    for p in sorted({(0, 0.0), *((k, k / x) for k, x in choices if k > 0)}):
        if not rising or p[1] > rising[-1][1]:
            rising.append(p)
    hull: list[tuple[int, float]] = []
    for p in rising:
        # drop the last point while it lies on or below the chord from the one before it to p
        while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) <= (p[1] - hull[-2][1]) * (
            hull[-1][0] - hull[-2][0]
        ):
            hull.pop()
        hull.append(p)
    return tuple(((x2 - x1) / (y2 - y1), x2 - x1) for (x1, y1), (x2, y2) in zip(hull, hull[1:]))


def moe_only_rates(a, mix: KindMix, positions, moe_from: int) -> tuple[float, ...]:
    """A box's per-layer seconds ``a`` with each group whose stages all sit past the model's leading dense layers
    taken at its MoE layer's seconds (mix.moe): group g's first stage sits at position >= the least of
    ``positions[g]`` (first_positions), and a stage at position s >= ``moe_from`` holds MoE layers only
    (moe_only_top). ``a`` itself where no group's seconds change (the caller's end terms then stand)."""
    out = tuple(max(x, y) if least >= moe_from else x for x, y, (least, _) in zip(a, mix.moe, positions))
    return a if out == a else out


def first_positions(
    lo, hi, leading: tuple[int, ...] | None = None, last: int | None = None
) -> tuple[tuple[int, int], ...]:
    """Per group of a box, the (least, most) position of its first stage: group g, led by the groups before it
    in ``leading`` (default: every group, in pipeline order), sits between their lo's sum and their hi's; where
    only the groups ``leading`` are known to lead the order (in that order) and the group ``last`` to end it, the
    last after every other group, and any other group after the leading ones, at most after every other group but
    the last."""
    if leading is None:
        leading = range(len(lo))
    before_lo = before_hi = 0
    at = {}
    for g in leading:
        at[g] = (before_lo, before_hi)
        before_lo += lo[g]
        before_hi += hi[g]
    total = sum(hi)
    if last is not None:
        at[last] = (sum(lo) - lo[last], total - hi[last])
        total -= hi[last]
    return tuple(at.get(g, (before_lo, total - k_hi)) for g, k_hi in enumerate(hi))


def dense_capable(lo, hi, moe_from: int, positions=None) -> tuple[tuple[int, int], ...]:
    """Per group of a box, (fewest, most) of its stages that sit before position ``moe_from``
    (ModelSpec.all_moe_from: a stage from there on holds MoE layers only, moe_only_top): group g's first stage
    sits at a position between ``positions[g]`` (first_positions; default: in pipeline order)."""
    out = []
    for k_lo, k_hi, (least, most) in zip(lo, hi, positions or first_positions(lo, hi)):
        out.append((max(0, min(k_lo, moe_from - most)), max(0, min(k_hi, moe_from - least))))
    return tuple(out)


def split_rows(lo, hi, moe_from: int | None, ordered: bool = True, leading: tuple[int, ...] = (), last=None):
    """(rows, lo, hi) of a box with each group's stages that may sit before position ``moe_from``
    (ModelSpec.all_moe_from) apart from those past it, which hold MoE layers only: ``rows`` names each row's
    (group, MoE only). A candidate with k_g stages from position p has c = min(k_g, max(0, moe_from - p)) before,
    within the first row's counts, and k_g - c past, within the second's: in pipeline order (``ordered``) the
    counts of dense_capable, with the groups ``leading`` known to lead the order (``last`` to end it)
    dense_capable at their first_positions, else between 0 and min(hi_g, moe_from) for every group (any group
    may come first).
    None where there is no such position (moe_from None or < 1) or, in pipeline order, the box's last stage may
    sit before it (sum lo <= moe_from: moe_split's logits stage is then not known to be past it)."""
    if moe_from is None or moe_from < 1 or (ordered and sum(lo) <= moe_from):
        return None
    if ordered:
        before = dense_capable(lo, hi, moe_from)
    elif leading or last is not None:
        before = dense_capable(lo, hi, moe_from, first_positions(lo, hi, leading, last))
    else:
        before = tuple((0, min(k_hi, moe_from)) for k_hi in hi)
    out = []  # (row, lo, hi)
    for g, ((few, most), k_lo, k_hi) in enumerate(zip(before, lo, hi)):
        if most:
            out.append(((g, False), few, most))
        if k_hi - few:
            out.append(((g, True), max(0, k_lo - most), k_hi - few))
    rows, out_lo, out_hi = zip(*out)
    return rows, out_lo, out_hi


def moe_split(a, lo, hi, ys, ends: Ends, mix: KindMix):
    """box_bound's rows of a box, split_rows apart (at mix.lead): (a, lo, hi, sends, ends, rows), a row before the
    leading dense layers' end at its group's per-layer seconds a_g, one past it at max(a_g, y_g) (y_g its MoE
    layer's seconds). In pipeline order the embedding stays on the first row (the first group's first stage,
    position 0) and the logits go to the last (the last group's last stage, past them). Unordered ends that
    know the first group (Ends.leading) keep the embedding on its row before that end (position 0 is before
    it), and those that know the last group (Ends.last) the logits on its row past it where the box's last stage
    surely sits past it (sum lo - 1 >= mix.lead); other end terms are not placed on rows (the whole-chunk and
    schedule steps that read the rows take no end terms from them). None where split_rows is."""
    split = split_rows(lo, hi, mix.lead, ends.ordered, ends.leading, ends.last)
    if split is None:
        return None
    past = sum(lo) - 1 >= mix.lead
    rows, lo, hi = split
    a = tuple(max(a[g], mix.moe[g]) if only else a[g] for g, only in rows)
    ys = tuple(ys[g] for g, _ in rows)
    if ends.ordered:
        ends = Ends.at(ends.emb, ends.logits, a[0], a[-1])
    elif ends.placed:  # (the rows are numbered anew)
        first = (ends.leading[0], False) if ends.leading else None
        last = (ends.last, True) if ends.last is not None and past else None
        ends = ends._replace(
            leading=(rows.index(first),) if first in rows else (), last=rows.index(last) if last in rows else None
        )
    return a, lo, hi, ys, ends, rows


def _split_tails(tails: Callable[[], BoxTails], rows) -> Callable[[], BoxTails]:
    """``tails`` for the rows of moe_split: an MoE-only row reads its group's MoE-only reaches (BoxTails
    .moe_reaches, where there are; its least tail is the caller's, worked out over the same rows)."""

    def split() -> BoxTails:
        t = tails()
        return t._replace(reaches=row_reaches(t.reaches, t.moe_reaches, rows))

    return split


def row_reaches(reaches, moe_reaches, rows) -> tuple:
    """The DP tail reaches of split_rows' rows: a row past the leading dense layers its group's MoE-only reaches
    (``moe_reaches``, where the group has them), any other its group's ``reaches``."""
    moe = moe_reaches or (None,) * len(reaches)
    return tuple(moe[g] if only and moe[g] is not None else reaches[g] for g, only in rows)


def moe_only_top(mix: KindMix, lo, ys, v: int, positions, moe_from: int) -> float:
    """The least time of a stage that holds only MoE layers, where a box's stages in pipeline order surely have one:
    a stage's layers come after one layer of each stage before it (planner/cost/stage.split_kinds: consecutive
    layers), so a stage at position s >= ``moe_from`` holds only MoE layers, at least v of them (one per chunk).
    Group g's lo_g-th stage sits at position >= the least of ``positions[g]`` (first_positions) + lo_g - 1; 0
    where no group has one there."""
    top = 0.0
    for y_moe, k_lo, y, (least, _) in zip(mix.moe, lo, ys, positions):
        if k_lo and least + k_lo - 1 >= moe_from:
            top = max(top, v * y_moe + y)
    return top


def box_schedule_time(
    a, lo, hi, ys, L: int, T: float, k: float, v: int, fixed: float, work_floor: float, priced=None, caps=None
) -> float:
    """least_schedule_time for a box of stage counts: at bottleneck M a stage of group g holds at most
    floor((M - y_g) / (v a_g)) chunks of v layers (its sends y_g; the ends only take room), there are at most hi_g
    of them and lo_g at least, each holding a chunk, so the least work W(M) is one chunk on each of the lo_g
    stages and the rest on the fastest groups first, up to their stages' room. The schedule takes at least
    k M + max(work_floor, fixed + W(M)) / v (``fixed``: the ends and the lo stages' sends); its least over M >= T,
    walked over the steps where a group's room grows as least_schedule_time does. At least schedule_bound(T,
    work_floor). ``caps``: per group, the most chunks a stage of it holds at any bottleneck (default: L // v).
    ``priced`` (moe_split's rows: _priced): (seconds per layer of each group's layers in the work, less in all,
    each group's partner or None, the most stages of the rows with a partner): where given, the work W(M) prices
    the layers so (the room still at a_g) and takes that much off, and a row with a partner holds only the chunks
    beyond the partner's, those rows together at most that many stages' worth of the most any of them adds."""
    most = L // v
    caps = (most,) * len(a) if caps is None else caps
    prices, credit, partners, lead = (a, 0.0, None, 0) if priced is None else priced
    order = sorted(range(len(a)), key=lambda i: (prices[i], a[i], lo[i], hi[i], ys[i], caps[i]))
    base = fixed + v * sum(p * kl for p, kl in zip(prices, lo)) - credit
    rest = L - v * sum(lo)
    if rest < 0:
        return float("inf")  # more stages than chunks: no candidate

    rows = [(i, v * a[i], ys[i], caps[i], lo[i], hi[i], prices[i]) for i in order]  # (one pass per M: very often)

    def at(M: float) -> float:
        left, work = rest, base
        pool = 0  # (partners: the chunks the stages before the leading dense layers' end hold beyond their partners')
        if partners is not None:
            # every group's chunks first (the loop below works out the same in the rows' order, apart: 25% faster)
            qs = [min(cap, math.floor((M - y) / (v * x) + 1e-9)) for x, y, cap in zip(a, ys, caps)]
            extra = [max(0, qs[i] - max(qs[j], 0)) for i, j in enumerate(partners) if j is not None]
            pool = lead * max(extra, default=0)
        for i, u, y, cap, k_lo, k_hi, price in rows:
            q = math.floor((M - y) / u + 1e-9)
            if q > cap:
                q = cap
            if q < 1:
                if k_lo:
                    return float("inf")
                continue
            take = v * (k_hi * q - k_lo)
            if take > left:
                take = left
            if partners is not None and partners[i] is not None:
                # such a row's stages are its group's (its partner row's hi counts them all): it adds only the
                # chunks they hold beyond a stage past that end, and all such rows together at most lead stages'
                # worth of the most any of them adds
                more = min(k_hi * max(0, q - max(qs[partners[i]], 0)), pool)
                pool -= more
                take = min(left, v * more)
            work += take * price
            left -= take
        if left > 0:
            return float("inf")
        return k * M + max(work_floor, work) / v

    floor = k * T + work_floor / v  # schedule_bound(T, work_floor, m, v)
    steps = [(u, y, min(most, cap)) for _, u, y, cap, *_ in rows]  # room grows by a chunk per v a_g seconds
    return max(floor, _least_over_steps(at, T, _linear_steps(T, steps), k, v, work_floor))


class BoxTails(NamedTuple):
    """The used groups' DP tails for a box bound (box_schedule_with_tail): per group, the least tail of a stage of
    it holding n or more layers (``reaches``, index n - 1: ZeroTerms.reach), their values sorted (``levels``:
    merged_levels) and the least largest tail any split of the box has (``least``: its stages hold the layers)."""

    reaches: tuple
    levels: list
    least: float
    moe_reaches: tuple | None = None  # per group, a stage's past the leading dense layers (ZeroTerms.moe_reach)


def box_schedule_with_tail(sched: tuple, get_tails: Callable[[], BoxTails], target: float = float("inf")) -> float:
    """box_schedule_time (its arguments ``sched``) plus the largest DP tail of the stages, bounded together, as
    least_schedule_with_tail bounds a candidate's: with the largest tail at most tau a stage of group g holds at
    most the layers whose reach is within tau, in whole chunks, so the schedule under those caps, S(tau), plus tau
    bounds every split of the box whose largest tail is tau. The caps only step up at the levels, so the least
    over tau lies at one of them, from ``tails.least`` on. Apart, the least schedule and the least tail add up to
    less where the split with the least schedule puts more layers on a stage than a small tail lets it hold
    (measured on suite job 19's 1,279 leaf candidates: the bound with the two apart cut 147 of them, bounded
    together 954, the candidates' own refined bounds 1,042).
    Levels are taken a run at a time: over a run of them S is at least its value at the run's last level (the
    most caps) and tau at least the run's first, so that pair bounds the run; S there is first taken at its floor
    (_capped_schedule_floor) and worked out in full only for a run of one level. The run with the least bound is
    halved, best first, until the least is one level's own value, or reaches ``target`` (the box is cut), or
    TAIL_FLOORS floors or TAIL_FULL full schedules have been worked out (then that least stands). Levels at which
    the schedule without caps plus tau reaches the target are left out; so is the walk where the schedule and the
    least tail apart already reach the target (or there is none yet), or the caps at the least tail do not bind
    (then none do), or the two apart stay more than TAIL_REACH below the target and so does the first level's own
    value (the least over every level is at most it; walking the others too took seed-5 suite job 10, whose DP
    tails are far above its schedule, from a 13.9% to a 5.1% gap in 60 s, and job 13 from 76,402 steps to 57,741).
    ``get_tails`` gives the tails (BoxTails) where the schedule alone is below the target."""
    v = sched[7]  # (box_schedule_time's arguments: the chunk size)
    free = box_schedule_time(*sched)
    if free >= target:
        return free
    tails = get_tails()
    least = free + tails.least
    levels, reaches = tails.levels, tails.reaches
    first = bisect.bisect_left(levels, tails.least)
    last = bisect.bisect_left(levels, target - free, first) if target < float("inf") else len(levels)
    beyond = free + levels[last] if last < len(levels) else float("inf")  # the levels left out
    floors: dict[tuple, float] = {}

    def caps_at(i: int) -> tuple:
        return tuple(bisect.bisect_right(reach, levels[i]) // v for reach in reaches)

    def floor_at(i: int) -> float:
        caps = caps_at(i)
        hit = floors.get(caps)
        if hit is None:
            hit = floors[caps] = _capped_schedule_floor(sched, caps)
        return hit

    if least >= target or target == float("inf") or first >= last:
        return least
    at_first = box_schedule_time(*sched, caps=caps_at(first))
    if at_first <= free:
        return least  # the caps at the least tail do not bind: nor do those above it
    if least < target * (1 - TAIL_REACH) and at_first + levels[first] < target:
        return least  # far below the target, and the walk's least lies below it too (at most its first level's)
    runs = [(at_first + levels[first], first, first + 1, True)]  # (bound, first level, one past, in full)
    if first + 1 < last:
        heapq.heappush(runs, (floor_at(last - 1) + levels[first + 1], first + 1, last, False))
    fulls = 1
    while True:  # (every pass returns or puts a run back in line)
        bound, i, j, full = heapq.heappop(runs)
        one = j - i == 1
        if bound >= min(target, beyond) or full or len(floors) >= TAIL_FLOORS or (one and fulls >= TAIL_FULL):
            return max(least, min(bound, beyond))
        if one:
            fulls += 1
            heapq.heappush(runs, (box_schedule_time(*sched, caps=caps_at(i)) + levels[i], i, j, True))
            continue
        mid = (i + j) // 2
        heapq.heappush(runs, (floor_at(mid - 1) + levels[i], i, mid, False))
        heapq.heappush(runs, (bound - levels[i] + levels[mid], mid, j, False))


def _capped_schedule_floor(sched: tuple, caps) -> float:
    """A floor under box_schedule_time(*sched, caps=caps): k M + W / v at the least bottleneck M >= T at which hi_g
    stages per group, each holding at most floor((M - y_g) / (v a_g)) chunks and at most caps[g], hold the layers,
    W the least work under the caps at any bottleneck (inf where the caps cannot hold the layers at all):
    box_schedule_time's at(M) is at least that at every M it takes, and inf below it."""
    a, lo, hi, ys, L, T, k, v, fixed, work_floor, priced = sched
    if any(k_lo and cap < 1 for k_lo, cap in zip(lo, caps)):
        return float("inf")  # a stage the box surely has holds no chunk
    prices, credit = (a, 0.0) if priced is None else priced[:2]
    # the least work under the caps alone (at any bottleneck): lo chunks on the lo stages, the rest on the fastest
    left, work = L - v * sum(lo), fixed + v * sum(p * k_lo for p, k_lo in zip(prices, lo)) - credit
    for p, k_lo, k_hi, cap in sorted(zip(prices, lo, hi, caps)):
        take = min(left, v * (k_hi * cap - k_lo))  # (>= 0: a group with lo stages has cap >= 1)
        work += take * p
        left -= take
    if left > 0:
        return float("inf")
    work_floor = max(work_floor, work)
    need = -(-L // v)
    M = T
    while True:
        held, step = 0, float("inf")
        for x, count, y, cap in zip(a, hi, ys, caps):
            u = v * x
            q = math.floor((M - y) / u + 1e-9)  # (rounding as box_schedule_time's)
            if q >= cap:
                held += count * cap
                continue
            if q > 0:
                held += count * q
            nxt = y + (max(q, 0) + 1) * u
            if nxt < step:
                step = nxt
        if held >= need:
            return k * M + work_floor / v
        if step == float("inf"):
            return float("inf")
        M = step


def whole_chunk_bottleneck(
    a, hi, ends: Ends, L: int, send, v: int, start: float, relaxed=(), most: int | None = None
) -> float:
    """Smallest bottleneck T >= ``start`` (a valid bound on it) at which hi_g stages per group hold the L layers in
    whole chunks of v: a stage of group g with constant seconds c (its sends, and with ordered ``ends`` the
    embedding on the first group's first stage and the logits on the last group's last; unordered, the embedding on
    one stage of the group known to come first (Ends.leading) and the logits on one of the group known to come last
    (Ends.last), where no group is relaxed; no other end term, which only adds room) holds at most floor((T - c) /
    (v a_g)) chunks, and a box's candidates have no more stages than hi (so no more room at T). box_bound's
    continuous bottleneck lets every stage hold a fraction of a chunk; with a few layers per stage that is worth
    several percent. The held chunks step up at c + q v a_g: the search walks those steps from ``start``. A
    ``relaxed`` group (see box_bound; its ends unordered) holds its continuous share k (T - c) / (v a_g), so between
    two steps the held chunks grow linearly: solved there. A relaxed group given as its choices instead (a tuple of
    (stages, seconds per layer, sends) per TP choice, the group's TP still open) holds what its best choice holds in
    whole chunks: it runs at one of them (or none), whose at most k stages hold at most k floor((T - c) / (v a))
    chunks, which is at most the continuous share of its best throughput. ``most``: where no group is relaxed, the
    most stages a candidate has (box_bound's max_stages): where the groups' hi add up to more, at most that many of
    the stages hold the chunks, the roomiest at each T (an interleaved family at mb = 16 runs at 16 stages only, so
    its 20-stage boxes held 60 layers in 3-layer chunks at one chunk per stage, its candidates needing two on some
    stages)."""
    ys = send or (0.0,) * len(a)
    picks = []  # per relaxed group given as its choices: (stages, constant s, s per chunk) per choice
    if any(relaxed):
        free = [(k, y, v * x) for x, k, y, r in zip(a, hi, ys, relaxed) if r is True]  # (stages, constant s, s/chunk)
        fixed = [(x, k, y) for x, k, y, r in zip(a, hi, ys, relaxed) if not r]
        for r in relaxed:
            if r and r is not True:
                picks.append(tuple((k, y if send else 0.0, v * x) for k, x, y in r))
    else:
        free, fixed = (), list(zip(a, hi, ys))
    if not ends.ordered:
        stages = [(k, y, v * x) for x, k, y in fixed]
        if ends.placed and not free and not picks:  # the first group's first stage: the embedding; the last's: logits
            for g, extra in ((ends.leading[0] if ends.leading else None, ends.emb), (ends.last, ends.logits)):
                if g is not None:
                    k, y, u = stages[g]
                    stages[g] = (k - 1, y, u)
                    stages.append((1, y + extra, u))
    elif sum(k for _, k, _ in fixed) == 1:
        stages = [(1, ends.emb + ends.logits, v * fixed[0][0])]
    else:
        stages = []
        for g, (x, k, y) in enumerate(fixed):
            if g == 0:
                stages.append((1, y + ends.emb, v * x))
                k -= 1
            if g == len(fixed) - 1:
                stages.append((1, y + ends.logits, v * x))
                k -= 1
            if k > 0:
                stages.append((k, y, v * x))
    need = L // v
    # (a relaxed group given as its choices: at most its most stages, of any of its choices' rooms)
    limits = [max(k for k, _, _ in options) for options in picks]
    capped = most is not None and not free and sum(k for k, _, _ in stages) + sum(limits) > most
    enough = need * (1 - 1e-12)  # (float rounding)
    T = start
    while True:
        held, step = 0, float("inf")
        counts = []
        for k, c, u in stages:
            q = math.floor((T - c) / u + 1e-9)  # (rounding: a chunk that just fits is held)
            if q > 0:
                held += k * q
                nxt = c + (q + 1) * u
                if capped:
                    counts.append((q, k, None))
            else:
                nxt = c + u
            if nxt < step:
                step = nxt
        for g, options in enumerate(picks):  # a relaxed group at its best choice
            best = 0
            for k, c, u in options:
                q = math.floor((T - c) / u + 1e-9)
                if q > 0:
                    if k * q > best:
                        best = k * q
                    nxt = c + (q + 1) * u
                    if capped:
                        counts.append((q, k, g))
                else:
                    nxt = c + u
                if nxt < step:
                    step = nxt
            held += best
        if capped and held >= enough:  # (capped: no free group, so only whether they hold it matters)
            held = min(held, _roomiest(counts, most, limits))
        rate = 0.0  # chunks per second the relaxed groups add from T on (each from its own c)
        for k, c, u in free:
            if T >= c:
                held += k * (T - c) / u
                rate += k / u
            else:
                step = min(step, c)
        if held >= enough:
            return T
        if rate > 0 and T + (need - held) / rate <= step:
            return T + (need - held) / rate
        T = step


def _roomiest(counts, most: int, limits=()) -> int:
    """The most chunks ``most`` stages hold, ``counts`` as (chunks a stage holds, stages, relaxed group or None)
    rows, a relaxed group g's rows together at most limits[g] stages: the roomiest first (greedy is exact for a
    total limit over per-group limits)."""
    held, left = 0, most
    left_of = list(limits)
    for q, k, g in sorted(counts, key=lambda r: r[0], reverse=True):
        take = min(k, left) if g is None else min(k, left, left_of[g])
        if g is not None:
            left_of[g] -= take
        held += take * q
        left -= take
        if not left:
            break
    return held


def tail_bottleneck(
    reaches, his, L: int, levels: list[float] | None = None, v: int = 1, most: int | None = None
) -> float:
    """The least DP tail the largest stage tail can have when at most his[g] stages of group g hold the L layers,
    a stage of group g holding n layers with tail at least reaches[g][n - 1] (ZeroTerms.reach: grows with n): the
    smallest tau at which sum_g his[g] * (the most layers a stage of g holds within tau) >= L. (A plan whose
    largest tail is below it holds fewer than L layers.) 0 with no reaches. ``levels``: merged_levels(reaches),
    where the caller keeps it; ``v``: a stage holds whole chunks of v layers; ``most``: the most stages a plan has
    (least_level's)."""
    if not reaches or any(not r for r in reaches):
        return 0.0
    return least_level(tuple(zip(his, reaches)), L, levels, v, most)


def stages_tail_bottleneck(reaches, L: int, v: int = 1) -> float:
    """The least largest DP tail of a candidate's stages: stage s holding n layers has a tail of at least
    reaches[s][n] (TailProfile.reach, growing with n), and the stages hold the L layers in whole chunks of v, so
    below the smallest tau at which sum_s (the most layers stage s holds in whole chunks within tau) >= L some
    stage holds more than it can within tau (tail_bottleneck, one stage per row)."""
    rows = tuple((1, reach[1:]) for reach in reaches)
    return least_level(rows, L, chunk=v)


def merged_levels(value_lists) -> list[float]:
    """The finite values of several lists, sorted without repeats: the levels least_level searches."""
    levels = sorted(set().union(*value_lists))  # (one C-level pass: called very often)
    while levels and levels[-1] == float("inf"):
        levels.pop()
    return levels


def least_level(rows, L: int, levels: list[float] | None = None, chunk: int = 1, most: int | None = None) -> float:
    """The smallest level x at which the stages hold L layers, ``rows`` (stages, values) per group: each of its at
    most ``stages`` stages holds n layers only where values[n - 1] <= x (values grow with n). It is one of the
    values (where the layers held step up), found by bisection over them; inf where even the largest does not
    reach L. ``levels``: merged_levels of the values of these rows (or of more rows: the least level holding L
    layers is still the first of them that does), else worked out here. ``chunk``: a stage holds whole chunks of
    that many layers. ``most``: where the rows' stages add up to more, at most that many of them hold the layers,
    the roomiest at each level (_roomiest, as whole_chunk_bottleneck's cap)."""
    rows = [(k, values) for k, values in rows if k > 0]
    capped = most is not None and sum(k for k, _ in rows) > most

    def held(x: float) -> int:
        if capped:  # at most ``most`` stages: the roomiest at x
            return _roomiest([(bisect.bisect_right(values, x) // chunk * chunk, k, None) for k, values in rows], most)
        if chunk > 1:
            return sum(k * (bisect.bisect_right(values, x) // chunk * chunk) for k, values in rows)
        return sum(k * bisect.bisect_right(values, x) for k, values in rows)

    if levels is None:
        levels = _all_levels(values for _, values in rows)
    return _first_level(held, levels, L)


def _all_levels(value_lists) -> list[float]:
    """The finite values of several sorted lists, sorted, repeats kept (least_level's bisection finds the same first
    level through them): a sort of the lists one after the other merges their runs, about 4 times as fast as
    merged_levels' set on four reaches of 94 values (least_level's own levels, worked out at each call)."""
    levels = sorted(itertools.chain.from_iterable(value_lists))
    del levels[bisect.bisect_left(levels, float("inf")) :]
    return levels


def _first_level(held, levels: list[float], L: int) -> float:
    """The first of the sorted ``levels`` at which the increasing ``held`` reaches L (bisection), inf if none."""
    Meter.levels += 1
    if not levels or held(levels[-1]) < L:
        return float("inf")
    lo, hi = 0, len(levels) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if held(levels[mid]) >= L else (mid + 1, hi)
    return levels[lo]


def memory_floor(groups, need: int) -> float:
    """Smallest bottleneck T (seconds per micro-batch of the slowest stage) at which stages can hold ``need``
    layers of the heavy kind (the other layers only add time and memory), each stage recomputing just enough of
    them to fit (constants per stage left out). ``groups``: per node group, its choices (TP degree) as (stages,
    terms), terms the (room, alpha, beta, a, rc) of its roomiest stage; a group whose choice is still open holds
    at T the most any one choice holds (its stages at that choice), never one choice's stage count with another's
    room. A stage holds a whole number of layers, at most quick.relaxed_layers(T, ...) (the count with the
    recompute count relaxed to no ceiling), so it holds n of them only from the slack that count needs for n
    (quick.layer_slack): T is where the layers held reach ``need`` as the choices' next layers are taken cheapest
    first (a choice's in a run while they come before every other choice's next). inf when even full recompute
    cannot hold them."""
    streams = [(g, k, t) for g, choices in enumerate(groups) for k, t in choices if k > 0 and t[0] > 0]
    heap = [(layer_slack(1, *t), 1, i) for i, (_, _, t) in enumerate(streams)]
    heapq.heapify(heap)
    held_by = [0] * len(groups)  # stages x layers of each group's best choice there
    held = 0
    inf = float("inf")
    while heap:
        T, n, i = heapq.heappop(heap)
        g, k, t = streams[i]
        # this choice's next layers, as long as none of another choice comes before them (the same order as one
        # at a time through the heap: where the layers held reach ``need`` at T, no layer below T is left out)
        nxt = heap[0][0] if heap else inf
        while True:
            if T == inf:
                return inf
            if k * n > held_by[g]:  # each of the choice's k stages holds its n-th layer from T on
                held += k * n - held_by[g]
                held_by[g] = k * n
                if held >= need:
                    return T
            n += 1
            T = layer_slack(n, *t)
            if T > nxt:
                break
        heapq.heappush(heap, (T, n, i))
    return inf


def least_time(held, points, need: float) -> float:
    """Smallest T with held(T) >= need, for an increasing held(T) that is 0 at 0 or at the first of the sorted
    breakpoints ``points``, linear between them and beyond the last one: the first breakpoint where need is
    reached, then linear interpolation from the one before. The caller makes sure need is reached."""
    lo = 0.0
    for T in points:
        if held(T) >= need:
            break
        lo = T
    else:
        T = lo + 1.0
        while held(T) < need:  # beyond the last breakpoint held grows linearly: bracket the answer
            T = lo + 2 * (T - lo)
    h0, h1 = held(lo), held(T)  # held is linear on [lo, T]: interpolate
    return lo + (need - h0) * (T - lo) / (h1 - h0) if h1 > h0 else T


def min_work(a: list[float], L: int, caps: list[int] | None = None) -> float:
    """Smallest sum_s n_s a_s with 1 <= n_s (<= caps_s) and sum n_s = L: one layer each, the rest on the fastest
    stages first."""
    order = sorted(range(len(a)), key=lambda s: a[s])
    work, left = sum(a), L - len(a)
    for s in order:
        take = left if caps is None else min(left, caps[s] - 1)
        work += take * a[s]
        left -= take
        if left <= 0:
            break
    return work if left <= 0 else float("inf")


# Most bottleneck values least_schedule_time tries above the bottleneck bound before it settles for the valid floor
# of what it has not tried (each try is one min_work): with many micro-batches it stops after a few.
SCHEDULE_STEPS = 64
# box_schedule_with_tail, for one box: the most schedule floors and full capped schedules it works out, and how far
# below its target the schedule and the least tail apart may stay for it to walk at all (not before the first plan).
# Measured in one process: walking every box took suite job 19's mixed tree from 20,751 steps to 8,542, but cost jobs
# 13 and 46 10-15% more time for almost no cut (the boxes it walked mostly stayed below their target); within 5% of
# the target, job 19's family steps fell from 16,700 to 11,450 (CLI wall -16%), jobs 13 and 46 within the noise.
TAIL_FLOORS = 12
TAIL_FULL = 2
TAIL_REACH = 0.05


def least_schedule_time(a, c, caps, L: int, T: float, k: float, v: int, work_floor: float = 0.0) -> float:
    """A lower bound on k * max_s t_s + sum_s t_s / v (the schedule: schedule_bound's k = m - 1/v) over the splits
    of L layers (chunks) with 1 <= n_s <= caps_s and t_s >= c_s + n_s a_s, given T <= max_s t_s: the bottleneck
    and the work bounded together. With max_s t_s <= M, stage s holds at most floor((M - c_s) / a_s) layers, so
    sum_s t_s >= sum c + W(M), W the least work (min_work) under those caps, and the schedule takes at least
    f(M) = k M + max(work_floor, sum c + W(M)) / v. Bounded apart, the two terms give only k T + (sum c +
    W(inf)) / v, as if the split that puts the most layers on the fastest stages (least work) were also the one
    with the least bottleneck; on a mix of fast and slow GPUs with many micro-batches that misses a good part of
    the pipeline bubble. W only falls where a cap steps up (M = c_s + q a_s), and f grows between those steps, so
    its least over M >= T lies at T or at a step: the steps are walked upwards while k M plus the least work
    (f's floor at M) is below the least f found, at most SCHEDULE_STEPS of them (then that floor at the next step
    stands for the rest). ``work_floor``: a bound on sum_s t_s known otherwise (the layer kinds')."""
    base = sum(c)
    floor = max(work_floor, base + min_work(a, L, caps))

    def at(M: float) -> float:
        held = [min(kk, math.floor((M - ci) / x + 1e-9)) for x, ci, kk in zip(a, c, caps)]
        if min(held) < 1 or sum(held) < L:
            return float("inf")
        return k * M + max(work_floor, base + min_work(a, L, held)) / v

    return _least_over_steps(at, T, _linear_steps(T, zip(a, c, caps)), k, v, floor)


class Meter:
    """Counts of the costliest bounds' work, the same on any machine, which the mixed search reads before and after
    each of its steps to count its work for lockstep (mixed_pipelines.WORK): ``rows``, the stage rows read by
    least_schedule_of_times (refined_bound's walk over DP tails: most of the time of a refined bound that gets that
    far); ``levels``, the bisections over levels (least_level: the DP-tail bottlenecks of the TP-choice nodes' and
    the families' bounds)."""

    rows = 0
    levels = 0


def least_schedule_with_tail(
    times, L: int, T: float, k: float, v: int, work_floor: float, reaches, target: float | None = None
) -> float:
    """A lower bound on k * max_s t_s + sum_s t_s / v + max_s tail_s (the schedule, as least_schedule_time, plus
    the largest tail of the stages, their exposed DP communication and optimizer step, which the iteration adds:
    planner.cost.estimate.evaluate_stages and mixed_context.tail_lines) over the
    splits of L layers (chunks of v: ``times`` and ``L`` count chunks, ``reaches`` layers) with the bottleneck,
    the stage times and the tails bounded together. ``times[s][q - 1]``: a floor on stage s's seconds per
    micro-batch with q chunks (growing with q; inf where it cannot hold them), so with max_s t_s <= M it holds at
    most the q with times[s][q - 1] <= M (least_schedule_of_times). Stage s holding n layers has a tail of at
    least reaches[s][n] (TailProfile.reach, growing with n), so with the largest tail at most tau it holds at most
    the chunks whose tail is within tau, and the schedule under those caps, plus tau, bounds every split whose
    tail is tau. Bounded apart, the least tail of any split and the least schedule of any split add up to less
    where the split with the least schedule puts the most layers on stages with large tails (GPUs whose DP rings
    differ) or where memory forces recompute on the stages that would take the most layers. The least over tau
    lies at one of the reach values (the caps only step up there); they are walked upwards from the least tail
    at which every stage holds a chunk until tau plus the schedule with no tail cap reaches the least found. With
    ``target`` only whether the bound reaches it is decided: where some level is below it, the walk stops there
    and the bound returned is that first floor (the schedule with no tail cap plus the least level), valid but
    weaker; the walk also stops where tau plus the schedule with no tail cap reaches it, and each level's schedule
    is only worked out as far as it takes to tell whether it is below target - tau (least_schedule_of_times'
    ``below``), so a bound that reaches target is returned as a valid one at or above it, not the least."""
    hulls = [_hull_increments(t) for t in times]
    full = [len(t) for t in times]
    free = least_schedule_of_times(times, hulls, full, L, T, k, v, work_floor)
    tails = [reach[1:] for reach in reaches]
    first = max(values[v - 1] for values in tails)  # every stage holds at least one chunk
    levels = [x for x in merged_levels(tails) if x >= first]
    stop = float("inf") if target is None else target
    best = float("inf")
    for tau in levels:
        if tau + free >= min(best, stop):
            return min(best, tau + free)  # every level from here on is at least that
        held = [min(most, bisect.bisect_right(values, tau) // v) for most, values in zip(full, tails)]
        if min(held) < 1 or sum(held) < L:
            continue
        below = None if target is None else target - tau
        value = least_schedule_of_times(times, hulls, held, L, T, k, v, work_floor, below) + tau
        if target is not None and value < target:
            return free + first
        best = min(best, value)
    return best


def least_schedule_of_times(
    times, hulls, most, L: int, T: float, k: float, v: int, work_floor: float, below: float | None = None
) -> float:
    """least_schedule_time for stage times given as floors by count: stage s takes at least times[s][q - 1] with
    q chunks (growing with q), holds at most most[s] of them, and T <= max_s t_s. With max_s t_s <= M it holds at
    most the q with times[s][q - 1] <= M, and sum_s t_s is at least W(M), the least sum over the splits under
    those caps, taken on each stage's lower convex envelope (``hulls``: _hull_increments) so that the cheapest
    next chunk of any stage first gives it (at most the least over the true times). W only falls where a cap
    steps up (M at one of the times), and k M + W(M) / v grows between those steps, so the least lies at T or at
    a step: walked upwards as _least_over_steps does (``below``: only as far as it takes to tell whether the least
    is below it)."""
    S = len(times)
    if S > L:
        return float("inf")
    base = sum(t[0] for t in times)

    def work(held) -> float:
        extra = L - S
        if not extra:
            return base
        rest = sorted(itertools.chain.from_iterable(h[: n - 1] for h, n in zip(hulls, held)))
        return base + sum(rest[:extra]) if len(rest) >= extra else float("inf")

    def at(M: float) -> float:
        Meter.rows += S
        held = [min(n, bisect.bisect_right(t, M * (1 + 1e-12))) for t, n in zip(times, most)]
        if min(held) < 1 or sum(held) < L:
            return float("inf")
        return k * M + max(work_floor, work(held)) / v

    steps = sorted({x for t, n in zip(times, most) for x in t[:n] if T < x < float("inf")})
    return _least_over_steps(at, T, steps, k, v, max(work_floor, work(most)), below)


def _hull_increments(values) -> list[float]:
    """The increments q -> q + 1 of the lower convex envelope of q -> values[q - 1] (q = 1.. up to the first inf):
    growing, and values[0] plus the first q - 1 of them is at most values[q - 1]."""
    pts: list[tuple[int, float]] = []
    for q, y in enumerate(values, 1):
        if y == float("inf"):
            break
        while len(pts) >= 2 and (pts[-1][1] - pts[-2][1]) * (q - pts[-1][0]) >= (y - pts[-1][1]) * (
            pts[-1][0] - pts[-2][0]
        ):
            pts.pop()
        pts.append((q, y))
    out: list[float] = []
    for (q0, y0), (q1, y1) in zip(pts, pts[1:]):
        out += [(y1 - y0) / (q1 - q0)] * (q1 - q0)
    return out


def _least_over_steps(at, T: float, steps, k: float, v: int, work: float, below: float | None = None) -> float:
    """The least of at(M) over M >= T for least_schedule_time, least_schedule_of_times and box_schedule_time:
    at(M) = k M + (a least work that only falls where some room steps up) / v, ``steps`` the values M > T where
    one does, ascending. Between steps at(M) grows, so its least lies at T or at a step; the steps are walked
    upwards while k M + work / v (at's floor at M, ``work`` the least work with no bottleneck) is below the least
    found, at most SCHEDULE_STEPS of them (then that floor at the next step stands for the rest). With ``below``,
    only whether the least is below it is decided: the first at(M) below it is returned (not the least), else a
    valid bound at or above it."""
    best = at(T)
    for i, M in enumerate(steps):
        if below is not None and best < below:
            return best
        floor = k * M + work / v
        if i >= SCHEDULE_STEPS or floor >= best or (below is not None and floor >= below):
            return min(best, floor)
        best = min(best, at(M))
    return best


def _linear_steps(T: float, rows):
    """The values M > T at which the room of some row (u, c, most) steps up, M = c + q u for q = 1..most,
    ascending and without repeats (generated as the walk asks for them)."""
    line = []  # the next step of each row above T: (M, q, u, c, most)
    for u, c, most in rows:
        q = max(1, math.floor((T - c) / u + 1e-9) + 1)
        if q <= most:
            line.append((c + q * u, q, u, c, most))
    heapq.heapify(line)
    while line:
        M = line[0][0]
        while line and line[0][0] <= M:
            _, q, u, c, most = heapq.heappop(line)
            if q < most:
                heapq.heappush(line, (c + (q + 1) * u, q + 1, u, c, most))
        yield M


def kind_bottleneck(xs, ys, c, caps, D: int, E: int) -> float:
    """Smallest T at which stages hold D dense and E MoE layers, stage s taking at least d*xs_s + e*ys_s + c_s
    seconds for d + e <= caps_s layers (KindMix's argument, stage by stage): with rho the least ys_s/xs_s, stage s
    holds at most min(max(1, rho)*caps_s, (T - c_s)/xs_s) dense-layer units, and the stages must hold D + rho*E
    of them. The units held grow piecewise linearly with T; solved exactly between the breakpoints (least_time:
    a stage starts holding at c_s and is full at c_s + its cap in units times xs_s)."""
    rho = min(y / x for x, y in zip(xs, ys))
    need = D + rho * E
    full = [k * max(1.0, rho) for k in caps]
    stages = list(zip(xs, c, full))

    def held(T: float) -> float:
        return sum(min(u, max(0.0, (T - ci) / x)) for x, ci, u in stages)

    points = sorted({ci for _, ci, _ in stages} | {ci + u * x for x, ci, u in stages})
    most = held(points[-1])  # every stage full: held stays there
    if most < need * (1 - 1e-12):
        return float("inf")
    return least_time(held, points, min(need, most))


def _sends(ctx: MixedContext, c: HeteroCandidate, sms: list[StageModel]) -> list[float]:
    """Each stage's pipeline-send seconds per micro-batch, a send to a neighbour on another group over the link
    between the groups (planner.cost.estimate.with_group_sends)."""
    links = neighbour_links(ctx.job, c.stage_groups, sms)
    return [sm.pp_time if pair == (None, None) else sm.neighbour_pp_time(*pair) for sm, pair in zip(sms, links)]


class StageRow(NamedTuple):
    """One stage's terms of the refined bound (_stage_bound)."""

    cap: int  # the most layers it can hold (memory)
    a: float  # its least seconds per layer
    const: float  # its constant seconds per micro-batch without sends (embedding, logits, ZeRO-2/3 traffic)
    tail: float  # its least DP tail (MixedContext.tail_floor)
    tail_profile: TailProfile  # that tail's floor by layer count (mixed_context.tail_profile)


def _stage_bound(ctx: MixedContext, sm: StageModel, g: int, s: int) -> StageRow:
    """Stage s's StageRow."""
    p = sm.dims.pp
    cap = ctx.stage_terms(sm, g, s)[3]
    z, z0 = ctx.sharded_line(sm, s)
    const = sm.compute_form(s == 0, s == p - 1).const + z0  # embedding, logits
    return StageRow(cap, sm.layer_floor() + z, const, ctx.tail_floor(sm, s, cap), ctx.tail_profile(sm, s))


def _stage_row(ctx: MixedContext, c: HeteroCandidate, sms: list[StageModel], g: int, i: int) -> StageRow:
    """_stage_bound of stage i, memoized per position and across depths (as MixedContext.stage_terms: the terms
    depend on the depth only through the in-flight count and the ends, and on the position through the first layer
    the stage may hold, mixed_context.window_start, which its DP tail's layer mixes start from)."""
    sm = sms[i]
    key = (sm.form_cache, sm.inflight(i), i == 0, i == c.pp - 1, c.vpp, window_start(ctx.job.model, i))
    row = ctx.caches.stage_bound.get(key)
    if row is None:
        row = ctx.caches.stage_bound[key] = _stage_bound(ctx, sm, g, i)
    return row


def _recomputes_every_layer(ctx: MixedContext, c: HeteroCandidate, sms: list[StageModel]) -> bool:
    """Whether every layer of the candidate is recomputed: under a framework whose stages recompute all their layers
    or none, every stage alike (SearchOptions.all_or_none_recompute), where the stages cannot hold the layers
    without recompute (even the most each holds without it, StageModel.most_layers at its room and in-flight
    micro-batches, fall short of them in all)."""
    if not ctx.opts.all_or_none_recompute or c.recompute == "full":
        return False
    held = 0
    for s, (sm, g) in enumerate(zip(sms, c.stage_groups)):
        held += sm.most_layers(ctx.stage_terms(sm, g, s)[0], sm.inflight(s), recompute=False)
    return held < ctx.job.model.num_layers


def _recompute_floors(sm: StageModel) -> tuple[float, float]:
    """(dense, MoE) least seconds full recompute adds to a layer of each kind (KindCoeffs.recompute_floor); a model
    with one kind has that kind's twice."""
    count = layer_counts(sm.job.model)
    floors = [sm.kinds[k].recompute_floor() for k in ("dense", "moe") if count[k]]
    return floors[0], floors[-1]


def _stage_bounds(ctx: MixedContext, c: HeteroCandidate, sms: list[StageModel]) -> list[StageRow]:
    """_stage_row of every stage."""
    out = []
    s = 0
    for g, _, k in c.groups:
        out += [_stage_row(ctx, c, sms, g, i) for i in range(s, s + k)]
        s += k
    return out


def _group_bound(ctx: MixedContext, fam: _Family, c: HeteroCandidate, sms: list[StageModel]) -> float:
    """A first bound on the candidate from a few stages per group (cheap: no per-stage pass): the family's box
    bound at its stage counts with each group's per-layer time raised by its ZeRO-2/3 traffic, plus the largest
    DP tail floor seen; inf when even each group's roomiest stage cannot hold the layers. Along a group's run of
    stages the in-flight micro-batches fall, so its roomiest stage is its last (or, at the pipeline's end, the
    one before, as the last also holds the logits); a run's first, last and (at the end) next-to-last stages
    cover every kind of position (first, middle, last) it has."""
    L = ctx.job.model.num_layers
    P = c.pp
    a, slopes, moe_slopes, room, tail = [], [], [], 0, 0.0
    s = 0
    for j, (g, _, k) in enumerate(c.groups):
        end = s + k - 1
        seen = sorted({s, end, max(s, end - 1) if end == P - 1 else end})
        rows = [_stage_row(ctx, c, sms, g, i) for i in seen]
        room += k * max(r.cap for r in rows)
        lines = [ctx.sharded_line(sms[i], i) for i in seen]
        slope = min(z for z, _ in lines) if min(z0 for _, z0 in lines) >= 0 else 0.0
        kinds = [ctx.sharded_kinds(sms[i], i) for i in seen] if fam.kinds is not None else [None]
        a.append(fam.a[j] + slope)
        slopes.append(slope if None in kinds else min(d for d, _ in kinds))
        moe_slopes.append(slope if None in kinds else min(e for _, e in kinds))
        tail = max(tail, max(r.tail for r in rows))
        s = end + 1
    if room < L:
        return float("inf")
    ks = tuple(k for _, _, k in c.groups)
    mix = None
    if fam.kinds is not None:
        moe_from = ctx.job.model.all_moe_from
        mix = KindMix.of(fam.kinds, slopes, fam.ends, fam.kind_counts, True, moe_slopes, moe_from)
    ends = Ends.of(a, fam.ends, 0, len(a) - 1)
    return box_bound(a, ks, ks, ends, L, fam.mb, fam.send, fam.vpp, mix=mix, whole=True) + tail


def refined_bound(
    ctx: MixedContext, fam: _Family, c: HeteroCandidate, sms: list[StageModel], target: float = float("inf")
) -> float:
    """The candidate bound with each stage's pipeline sends, ZeRO-2/3 traffic (MixedContext.sharded_line), its
    memory cap on layers and the least DP tail of any stage (MixedContext.tail_floor); inf if the layers cannot
    fit at all. With interleaving the schedule is the interleaved one (schedule_bound) and the layers are counted
    in whole chunks of vpp per stage (a split that is not in whole chunks is not a plan). Only whether it reaches
    ``target`` is decided exactly (the bottleneck terms are probed at the value that would reach it, and where
    they do not reach it, the schedule, memory and DP tail of the splits that hold the layers together:
    least_schedule_with_tail), which is all pruning needs. _group_bound decides first where it can."""
    quick = _group_bound(ctx, fam, c, sms)
    if quick >= target:
        return quick
    v = c.vpp
    L = layers = ctx.job.model.num_layers
    rows = _stage_bounds(ctx, c, sms)
    caps, a, const = [r.cap for r in rows], [r.a for r in rows], [r.const for r in rows]
    xs = ys = a  # per layer, by kind (one kind: windows None)
    lift = [r.a - sm.layer_floor() for r, sm in zip(rows, sms)]  # what the stage adds per layer (ZeRO-2/3 line)
    kind_lift = None  # per stage, its ZeRO-2/3 slope of each kind where it has them
    if fam.kinds is not None:  # dense and MoE layers counted apart (KindMix), stage by stage, in layers
        # each kind its own ZeRO-2/3 slope where the stage has one (MixedContext.sharded_kinds)
        kind_lift = [ctx.sharded_kinds(sm, s) for s, sm in enumerate(sms)]
        xs = [(k[0] if k else z) + sm.kinds["dense"].layer_floor() for k, z, sm in zip(kind_lift, lift, sms)]
        ys = [(k[1] if k else z) + sm.kinds["moe"].layer_floor() for k, z, sm in zip(kind_lift, lift, sms)]
        # a stage past the leading dense layers holds MoE layers only (ModelSpec.all_moe_from; its layers come after
        # one layer of each stage before it: split_kinds), each at least y seconds
        moe_from = ctx.job.model.all_moe_from
        a = [max(x, y) if s >= moe_from else x for s, (x, y) in enumerate(zip(a, ys))]
    plain_ys = ys  # (the memory work reads the seconds without recompute: it adds what the memory forces)
    if _recomputes_every_layer(ctx, c, sms):  # every layer adds its recompute seconds
        floors = [_recompute_floors(sm) for sm in sms]
        a = [x + min(f) for x, f in zip(a, floors)]
        if fam.kinds is None:
            xs = ys = a
        else:
            xs, ys = [x + f[0] for x, f in zip(xs, floors)], [y + f[1] for y, f in zip(ys, floors)]
    layer_caps = caps
    if v > 1:  # counted in model chunks of v layers: every stage holds whole chunks (planner.parallel.vpp_error)
        caps, a, L = [k // v for k in caps], [x * v for x in a], L // v
    if min(caps) < 1 or sum(caps) < L:
        return float("inf")
    cst = [x + send for x, send in zip(const, _sends(ctx, c, sms))]
    work = sum(cst) + min_work(a, L, caps)  # <= sum_s t_s
    by_kind = 0.0
    windows = kind_memory = None
    if fam.kinds is not None:
        D, E = fam.kind_counts
        work = max(work, sum(cst) + D * min(xs) + E * min(ys))
        by_kind = kind_bottleneck(xs, ys, cst, layer_caps, D, E)  # (whole chunks of v relaxed)
        windows = moe_windows(ctx)  # a stage's layers are consecutive ones (split_kinds), at any vpp
        moe_from = ctx.job.model.all_moe_from
        # the memory bottleneck with the dense layers counted too
        kind_memory = [
            _kind_memory_times(ctx, sm, g, s, z) for s, (sm, g, z) in enumerate(zip(sms, c.stage_groups, lift))
        ]
    # the recompute each stage's memory forces on its share of the heavy layers counts in the work too
    # (one kind: ys are the stages' per-layer seconds and kind_counts (0, 0))
    light = fam.kind_counts[0] * min(xs)
    heavy = _heavy_memory(ctx, c, sms)  # what the memory bounds below read of each stage
    need = heavy_kind(ctx.job.model)[1]
    # the memory bottleneck's heavy layers with what their stage's ZeRO-2/3 line adds per layer (as rows' a)
    lifted = _lifted(heavy, lift, kind_lift)
    work = max(work, sum(cst) + light + memory_work(heavy, plain_ys, need, fam.kinds is None))
    # the largest DP tail: at least each stage's least, and the layers must sit somewhere (stages_tail_bottleneck)
    reaches = [r.tail_profile.reach for r in rows]
    tail = max(max(r.tail for r in rows), stages_tail_bottleneck(reaches, layers, v))
    mb = sms[0].mb
    rest = work / v + tail  # schedule_bound at T = 0, plus the tail; each second of T adds mb - 1/v
    probe = schedule_probe(target, rest, mb, v) if mb - 1 / v > 0 and target < float("inf") else None
    if windows is not None:
        by_kind = max(by_kind, block_bottleneck(xs, ys, windows, cst, layer_caps, layers, probe, moe_from))
    T = max(_capped_bottleneck(a, cst, caps, L, probe), by_kind)
    if kind_memory is not None and (probe is None or T < probe):
        T = max(T, _kind_memory_bottleneck(kind_memory, cst, layers, probe))
    if probe is None or T < probe:
        T = max(T, _memory_bottleneck(lifted, need, cst, ctx.job.model, probe, v))
    interleaved = windows is not None and ctx.job.model.all_moe_from == layers  # (else moe_from places the kinds)

    @functools.cache  # (built once: sequence_holds and block_schedule_bound may both read it)
    def blocks():  # each stage's floor on a run of layers in its place
        return [
            (ci, k, _block_terms(ctx, sm, g, s, z))
            for s, (ci, k, sm, g, z) in enumerate(zip(cst, layer_caps, sms, c.stage_groups, lift))
        ]

    if interleaved and v == 1 and probe is not None and T < probe:
        # the runs of layers in their places: the stages cannot hold them within the probe, so T is above it
        if not sequence_holds(blocks(), ctx.moe_before, probe):
            T = probe
    if T == float("inf"):
        return T  # the layers cannot fit (and with one micro-batch (mb - 1) * T would be nan)
    if probe is not None and T >= probe:
        return max(target, (mb - 1 / v) * T + rest)  # the bound reaches target (float rounding aside)
    if probe is not None:  # not cut by the bottleneck alone: its exact value, for the DP tail's turn below
        if windows is not None:
            by_kind = max(by_kind, block_bottleneck(xs, ys, windows, cst, layer_caps, layers, None, moe_from))
        by_memory = _memory_bottleneck(lifted, need, cst, ctx.job.model, None, v)
        T = max(_capped_bottleneck(a, cst, caps, L), by_kind, by_memory)
        if kind_memory is not None:
            T = max(T, _kind_memory_bottleneck(kind_memory, cst, layers))
    # schedule_bound(T, work, mb, v) + tail, with the bottleneck and the work bounded together
    bound = max((mb - 1 / v) * T + rest, least_schedule_time(a, cst, caps, L, T, mb - 1 / v, v, work) + tail)
    if bound >= target:
        return bound
    if target < float("inf"):
        floors = _stage_time_floors(heavy, rows, (a, xs, ys, windows), cst, caps, kind_memory, v)
        joint = least_schedule_with_tail(floors, L, T, mb - 1 / v, v, work, reaches, target)
        if joint >= target:
            return joint  # the schedule, the memory and the DP tail of the splits that hold the layers reach it
        if windows is not None and v == 1:
            # the bottleneck and the sum of one split of the layers in their places
            split = block_schedule_bound(blocks(), ctx.moe_before, mb, work, tail, target)
            if split >= target:
                return split
    return bound


def _stage_time_floors(heavy, rows, per_layer, cst, caps, kind_memory, v: int):
    """Per stage, floors on its seconds per micro-batch holding q = 1..caps_s chunks of v layers (growing with q;
    inf where it cannot hold them) for least_schedule_with_tail: the largest of cst_s + q a_s (``per_layer``'s a:
    seconds per chunk), _layer_time at q v layers (the fewest MoE layers any q v consecutive ones have) and the
    recompute its memory forces: kind_memory (dense and MoE layers, _kind_memory_times) or, with one kind,
    quick.whole_layer_slack over the stage's memory terms (``heavy``: _heavy_memory)."""
    a, xs, ys, windows = per_layer
    out = []
    for s, (room, alpha, beta, _, rc, _) in enumerate(heavy):
        floors = []
        for q in range(1, caps[s] + 1):
            n = q * v
            t = max(cst[s] + q * a[s], _layer_time(xs[s], ys[s], windows, cst[s], n))
            if kind_memory is not None:
                t = max(t, cst[s] + kind_memory[s][n - 1]) if n <= len(kind_memory[s]) else float("inf")
            elif beta <= alpha:  # (a recomputed layer frees at most what it keeps: as least_forced_work)
                t = max(t, cst[s] + whole_layer_slack(n, room, alpha, beta, rows[s].a, rc))
            floors.append(t)
        out.append(floors)
    return out


def _layer_time(x: float, y: float, windows, const: float, n: int) -> float:
    """Least seconds a stage takes per micro-batch with n consecutive layers: ``const`` plus its dense layers at x
    and MoE layers at y each, its MoE count the fewest any n consecutive layers have (the most, where an MoE layer
    is the cheaper one: ``windows``, moe_windows; None: one kind, x = y)."""
    if windows is None:
        return const + n * x
    e = (windows[0] if y >= x else windows[1])[n]
    return const + (n - e) * x + e * y


def block_bottleneck(
    xs, ys, windows, c, caps, L: int, probe: float | None = None, moe_from: int | None = None
) -> float:
    """Smallest T at which the stages hold the L layers as blocks of consecutive layers: stage s holding n of them
    takes at least (n - e) xs_s + e ys_s + c_s seconds with e the MoE layers in the block, at least the fewest any
    n consecutive layers have (the most, where an MoE layer is the cheaper one: ``windows``); that time grows with
    n, so a stage holds at most the largest n (<= caps_s) within T. kind_bottleneck lets a stage take any mix of
    the kinds; with the kinds interleaved (an MoE layer every other one) blocks of a few layers cannot skip them.
    ``moe_from`` (ModelSpec.all_moe_from): stage s's block starts at layer s or later (every stage before it holds
    a layer), so from that position on a stage holds only MoE layers. With ``probe``: ``probe`` when T is above
    it, else a weaker valid bound (bisection otherwise)."""
    far = len(xs) if moe_from is None else moe_from
    stages = [
        (functools.partial(_layer_time, y if s >= far else x, y, None if s >= far else windows, ci), min(k, L))
        for s, (x, y, ci, k) in enumerate(zip(xs, ys, c, caps))
    ]

    def held(T: float) -> int:
        limit = T * (1 + 1e-12)
        return sum(_largest_within(time, 0, k, limit) for time, k in stages)

    lo = max(time(1) for time, _ in stages)  # every stage holds a layer
    hi = max(time(k) for time, k in stages)
    if held(hi) < L:
        return lo  # (not enough room at all: the caller's capped bottleneck says so)
    return _least_holding(held, lo, hi, L, probe)


def _largest_within(value, lo: int, hi: int, limit: float) -> int:
    """The largest n in lo..hi with value(n) <= limit, for a value that grows with n there (bisection); lo when
    none is."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if value(mid) <= limit else (lo, mid - 1)
    return lo


def _least_holding(holds, lo: float, hi: float, need: float, probe: float | None = None) -> float:
    """The smallest bottleneck T in lo..hi at which holds(T) >= need, for holds growing with T and reaching need at
    hi: lo where it already does, else bisection down to a width of BISECTION (its lower end is a valid bound).
    With ``probe``: ``probe`` when T is above it, else lo (a weaker valid bound), which is all pruning needs."""
    if holds(lo) >= need:
        return lo
    if probe is not None:
        return probe if lo < probe < hi and holds(probe) < need else lo
    while hi - lo > BISECTION * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if holds(mid) >= need else (mid, hi)
    return lo


def memory_work(heavy, per_layer, need: int, one_each: bool) -> float:
    """least_forced_work of the ``need`` heavy layers over the candidate's stages: each stage's per-layer seconds
    of the heavy layers (the MoE layers of an MoE model, else all) and, from ``heavy`` (_heavy_memory), its memory
    terms at its in-flight count (quick.stage_memory_term), its recompute seconds per layer and its layer cap.
    ``one_each``: every stage holds at least one (one kind)."""
    stages = [(h, room, alpha, beta, rc, cap) for h, (room, alpha, beta, _, rc, cap) in zip(per_layer, heavy)]
    return least_forced_work(stages, need, one_each)


def _heavy_memory(ctx: MixedContext, c: HeteroCandidate, sms: list[StageModel]) -> list[tuple]:
    """Per stage of the candidate, (room, alpha, beta, a, rc, cap): its memory terms at its in-flight count and its
    layer cap (MixedContext.stage_terms), and one heavy layer's least seconds and recompute seconds (heavy_kind:
    the MoE layer of an MoE model). What the memory bounds of a candidate's stages read."""
    heavy = heavy_kind(ctx.job.model)[0]
    out = []
    for s, (sm, g) in enumerate(zip(sms, c.stage_groups)):
        room, alpha, beta, cap = ctx.stage_terms(sm, g, s)
        kind = sm.kinds[heavy]
        out.append((room, alpha, beta, kind.layer_floor(), kind.recompute_floor(), cap))
    return out


def _lifted(heavy, lift, kind_lift=None) -> list[tuple]:
    """``heavy`` (_heavy_memory) with each stage's heavy layer taking what its ZeRO-2/3 traffic line adds per layer
    too (MixedContext.sharded_line: valid at every layer and recompute count, as the stage rows' per-layer
    seconds read it): ``lift``, or the MoE slope of ``kind_lift`` (MixedContext.sharded_kinds) where the stage
    has one."""
    out = []
    for s, (room, alpha, beta, a, rc, cap) in enumerate(heavy):
        extra = kind_lift[s][1] if kind_lift is not None and kind_lift[s] else lift[s]
        out.append((room, alpha, beta, a + extra, rc, cap))
    return out


def least_forced_work(stages, need: int, one_each: bool) -> float:
    """The least seconds stages spend on ``need`` heavy layers when each recomputes what its memory forces: stage
    (h, room, alpha, beta, rc, cap) holding n of them takes n h plus rc per recomputed layer, at least
    (n alpha - room) / beta of them (the ceiling relaxed; at most n), and holds at most cap, so its f(n) is
    convex in n and the least sum over the splits is taken greedily, the cheapest next layer of any stage first.
    ``one_each``: every stage holds at least one. A bound on the sum of the stage times' layer terms, which
    min_work takes without the recompute; inf when the stages cannot hold the layers. (A recomputed layer frees
    at most what it keeps, beta <= alpha, so a stage's feasible counts run from 0 up; 0 otherwise.)"""
    inf = float("inf")
    if any(beta > alpha for _, _, alpha, beta, _, _ in stages):
        return 0.0
    costs, total, held, heap = [], 0.0, 0, []
    for s, (h, room, alpha, beta, rc, cap) in enumerate(stages):

        def f(n, h=h, room=room, alpha=alpha, beta=beta, rc=rc, cap=cap):
            # n h plus the relaxed recompute seconds: the slack relaxed_layers needs for n (quick.layer_slack)
            return layer_slack(n, room, alpha, beta, h, rc) if n <= cap else inf

        start = 1 if one_each else 0
        total += f(start)
        held += start
        costs.append(f)
        heapq.heappush(heap, (_increment(f, start), s, start + 1))
    if total == inf:
        return inf
    while held < need and heap:
        step, s, n = heapq.heappop(heap)
        if step == inf:
            return inf
        total += step
        held += 1
        heapq.heappush(heap, (_increment(costs[s], n), s, n + 1))
    return total if held >= need else inf


def _increment(f, n: int) -> float:
    """f(n + 1) - f(n), inf where f(n + 1) is (f grows with n)."""
    nxt = f(n + 1)
    return nxt if nxt == float("inf") else nxt - f(n)


def _memory_bottleneck(heavy, need: int, cst: list[float], m, probe: float | None = None, v=1) -> float:
    """Smallest bottleneck T at which the stages hold the layers of the heaviest kind when each stage recomputes
    just enough whole layers to fit its own GPU (the per-stage form of quick.memory_bottleneck): stage s holds n
    layers in n*a_s + r_s(n)*rc_s + c_s with r_s(n) = ceil((n*alpha_s - room_s)/beta_s). Valid for every plan of
    the candidate, since other layers only add time and memory. With ``probe``: ``probe`` when the bottleneck is
    above it, else a weaker valid bound. ``heavy``: _heavy_memory; ``need``: the heavy layers of the model ``m``,
    whose layers, dense, come in whole chunks of ``v`` per stage."""
    chunk = v if m.moe is None else 1  # an MoE model's heavy layers are only some of a stage's chunks
    stages = [(room, alpha, beta, a, rc, const) for (room, alpha, beta, a, rc, _), const in zip(heavy, cst)]

    def held(T: float) -> int:
        total = 0
        for room, alpha, beta, a, rc, const in stages:
            x = T - const
            n = int(x / a) if x > 0 else 0
            if room <= 0:
                n = 0
            elif n * alpha > room:
                if beta > 0:  # r(n) without the ceiling: an upper bound, made exact by the loop below
                    n = min(n, int((x + room * rc / beta) / (a + alpha * rc / beta)))
                else:
                    n = int(room / alpha)
                if alpha > beta:
                    n = min(n, int(room / (alpha - beta)))  # even with every layer recomputed
            while n > 0 and whole_layer_slack(n, room, alpha, beta, a, rc) + const > T * (1 + 1e-12):
                n -= 1
            total += n - n % chunk  # fewer layers only take less time and memory
        return total

    lo = max(const for *_, const in stages)
    hi = lo + m.num_layers * max(a + rc for *_, a, rc, _c in stages)
    if held(hi) < need:
        return float("inf")
    return _least_holding(held, lo, hi, need, probe)


def _kind_memory_times(ctx: MixedContext, sm: StageModel, g: int, s: int, lift: float) -> tuple:
    """mixed_context.kind_memory_times of stage s on group g's GPU (its _block_terms), memoized. Its layers start at
    layer s or later (every stage before it holds one), so their mixes are counted from there on
    (mixed_context.window_start): past a model's leading dense layers the stage holds MoE layers only, and the
    memory its MoE layers take cannot be traded for the cheaper dense ones."""
    terms = _block_terms(ctx, sm, g, s, lift)
    start = window_start(ctx.job.model, s)
    key = (terms, start)
    hit = ctx.caches.kind_memory.get(key)
    if hit is None:
        hit = ctx.caches.kind_memory[key] = kind_memory_times(terms, moe_windows(ctx, start))
    return hit


def _block_terms(ctx: MixedContext, sm: StageModel, g: int, s: int, lift: float) -> BlockTerms:
    """mixed_context.block_terms of stage s on group g's GPU, memoized."""
    first, last, inflight = s == 0, s == sm.dims.pp - 1, sm.inflight(s)
    key = (sm.form_cache, inflight, first, last, g, lift)
    hit = ctx.caches.block_terms.get(key)
    if hit is None:
        room = sm.allocatable(ctx.capacity(g)) - sm.allocated_memory(first, last).const(inflight)
        hit = ctx.caches.block_terms[key] = block_terms(sm, room, inflight, first, last, lift)
    return hit


def sequence_holds(blocks, before: list[int], T: float) -> bool:
    """Whether the stages, in pipeline order, can hold the model's layers as consecutive runs (stage s the run
    after stage s - 1's, at least one layer each, as planner/cost/stage.split_kinds lays them out at vpp 1) with
    every stage within T seconds per micro-batch: stage s (cst, cap, BlockTerms) on its run of n layers from layer
    q takes at least cst + BlockTerms.time(n, e), e = before[q + n] - before[q] its MoE layers (``before``:
    ModelSpec.moe_layers_before of 0..L). The bottlenecks above let each stage take its cheapest run of n layers
    anywhere (moe_windows); with the kinds interleaved that run's position is set by the stages before it, and a
    stage of an odd count shifts every run after it. The run ends a stage can reach form a set of positions,
    grown stage by stage (a run's time grows with its length, so from each start the reachable ends are an
    interval); T holds where the last stage can end at layer L."""
    L = len(before) - 1
    P = len(blocks)
    starts = [(0, 0)]  # the positions the next stage may start at, as sorted disjoint intervals
    limit = T * (1 + 1e-12)
    for s, (cst, cap, terms) in enumerate(blocks):
        room = limit - cst
        last_end = L - (P - 1 - s)  # every later stage holds a layer

        def fits(q: int, n: int, terms=terms, room=room) -> bool:
            return terms.time(n, before[q + n] - before[q]) <= room

        ends = []  # the union of the intervals q + 1 .. q + n(q), n(q) the longest run from q within T, built
        for lo, hi in reversed(starts):  # from the last start down: a start whose run ends no further than the
            for q in range(hi, lo - 1, -1):  # ends already reached only extends them down to q + 1
                most = min(cap, last_end - q)
                if most < 1 or not fits(q, 1):
                    continue
                if ends and ends[-1][0] == q + 2:  # q + 1 was a start (touching): only a longer run adds
                    a = ends[-1][1] - q
                    if a >= most or not fits(q, a + 1):
                        ends[-1] = (q + 1, ends[-1][1])
                        continue
                else:
                    a = 1
                b = most  # the longest run from q within T: bisection (its time grows with its length)
                while a < b:
                    mid = (a + b + 1) // 2
                    if fits(q, mid):
                        a = mid
                    else:
                        b = mid - 1
                if ends and q + a >= ends[-1][0] - 1:
                    ends[-1] = (q + 1, max(ends[-1][1], q + a))
                else:
                    ends.append((q + 1, q + a))
        if not ends:
            return False
        starts = ends[::-1]
    return starts[-1][1] >= L


def box_sequence_holds(runs: LayerRuns, x, y, c, lo, hi, emb: float, logits: float, T: float) -> bool:
    """sequence_holds for a box of stage counts of an ordered family (group g with lo_g..hi_g stages, lo_g >= 1, in
    pipeline order): whether some candidate's stages can hold the layers as consecutive runs (planner/cost/stage.
    split_kinds at vpp 1) with every stage within T seconds per micro-batch, a stage of group g on a run of n layers
    holding e MoE layers taking at least c_g + (n - e) x_g + e y_g (KindMix's rule: x_g, y_g each kind's least
    seconds per layer there, c_g its sends), the first stage adding the embedding and the last the logits. The
    positions a stage may end at form a set (a bit mask over 0..L), grown a stage at a time from the run lengths
    each start allows within T (a run's time grows with its length: no start that holds d layers holds none of
    d - 1); a group's set is the union over its lo_g..hi_g stages, and T holds where the last group's last stage can
    end at L. The bounds of a box let each stage take any share of either kind (KindMix); with the kinds interleaved
    (Llama 4 Maverick: every other layer MoE) a stage of an odd count shifts every run after it, which only the
    sequence sees: on seed-1 suite job 40 (Maverick on four types) it cut 844 of the 1,102 candidates the box bounds
    left, on group terms alone (sequence_holds, with each stage's memory: 977)."""
    limit = T * (1 + 1e-12)
    L = runs.layers

    def fits(g: int, extra: float) -> list[int]:  # index d - 1: the starts from which a stage holds d layers
        room = limit - c[g] - extra
        slope = y[g] - x[g]
        out = []
        for d in range(1, L + 1):
            base = d * x[g]
            held = 0
            for e, starts in runs.by_length[d]:
                if base + e * slope <= room:
                    held |= starts
            if not held:
                break  # (a longer run from any start takes no less)
            out.append(held)
        return out

    def to_end(g: int, extra: float) -> int:  # the starts from which a stage holds every layer left, with the logits
        room = limit - c[g] - extra - logits
        held = 0
        for q in range(L):
            e = runs.to_end[q]
            if (L - q - e) * x[g] + e * y[g] <= room:
                held |= 1 << q
        return held

    def advance(starts: int, masks: list[int]) -> int:
        ends = 0
        for d, held in enumerate(masks, 1):
            hit = starts & held
            if hit:
                ends |= hit << d
        return ends

    starts = 1  # where the next stage may start (bit q: layer q)
    last = len(x) - 1
    for g in range(last + 1):
        plain = fits(g, 0.0)
        first = fits(g, emb) if g == 0 else plain
        if g == last:
            finish = to_end(g, 0.0)
            finish_first = to_end(g, emb) if g == 0 else finish
        reached = 0
        for j in range(1, hi[g] + 1):  # starts: where the group's j-th stage may start
            if g == last:
                if j >= lo[g] and starts & (finish_first if j == 1 else finish):
                    return True
                if j == hi[g]:
                    break
            starts = advance(starts, first if j == 1 else plain)
            if not starts:
                break
            if j >= lo[g]:
                reached |= starts
        if g == last:
            return False
        starts = reached
        if not starts:
            return False
    return True


# The most bottleneck values block_schedule_bound works out the least sum at (one pass over the splits each); where
# more floors lie between the least bottleneck and what the target leaves, it bounds the sum at that many of them.
BLOCK_LEVELS = 6


def block_schedule_bound(blocks, before: list[int], mb: int, work: float, tail: float, target: float) -> float:
    """A lower bound on (mb - 1) max_s t_s + sum_s t_s + tail (the iteration at vpp 1: schedule_bound, plus the
    largest DP tail and optimizer step ``tail``) over the splits of the layers into consecutive runs, stage s on
    its run of n layers from layer q at its floor f_s(q, n) = cst + BlockTerms.time(n, e) (e its MoE layers, as
    sequence_holds: ``blocks``, ``before``), the sum at least ``work``. The bounds above take the least bottleneck
    of any split and the least sum of any split apart; with few layers per stage and a layer kind that alternates
    (Llama 4's MoE every other layer) the split with the least bottleneck holds a larger sum, and the candidates
    whose plans lie within 1% of the best all went to CP-SAT to be proven no better (seed-1 suite job 40, one
    process: 31 solves, 11 with this bound).

    Exact in the floors: a split whose slowest floor is M takes at least (mb - 1) M + S(M) + tail, S(M) the least
    sum of any split whose floors are all at most M (least_block_sum, falling as M grows and stepping down only at
    floor values); so the least over the floor values M from the least bottleneck T* (least_block_bottleneck) up is
    the bound, and past M_hi = (target - tail - S(inf)) / (mb - 1) every split reaches ``target``. Between two of
    the floor values worked out, a and b, the splits take at least (mb - 1) a + S(below b): exact where they are
    consecutive floors, else valid (at most BLOCK_LEVELS of them, spread over the window). Only whether the bound
    reaches ``target`` matters to the caller: the value returned is at most ``target``."""
    L = len(before) - 1
    rows = _block_floors(blocks, before)
    least = least_block_bottleneck(rows, L)
    if least == float("inf"):
        return least
    k = mb - 1
    floor_sum = max(work, least_block_sum(rows, L, float("inf")))
    if k * least + floor_sum + tail >= target or k <= 0:
        return k * least + floor_sum + tail
    top = (target - tail - floor_sum) / k
    # every floor (rows: per stage, per start; the starts of one stage share their runs' lists)
    values = sorted({t for starts in rows for run in {id(run): run for run in starts}.values() for t in run})
    window = values[bisect.bisect_left(values, least) : bisect.bisect_left(values, top)]
    if len(window) > BLOCK_LEVELS:
        step = len(window) / BLOCK_LEVELS
        window = [window[int(i * step)] for i in range(BLOCK_LEVELS)]
    bound = target
    for i, low in enumerate(window):
        high = window[i + 1] if i + 1 < len(window) else top
        below = values[bisect.bisect_left(values, high) - 1]  # the largest floor under ``high`` (>= low)
        bound = min(bound, k * low + max(work, least_block_sum(rows, L, below)) + tail)
    return bound


def _block_floors(blocks, before: list[int]) -> list[list[list[float]]]:
    """rows[s][q][n - 1]: stage s's floor (cst + BlockTerms.time) on the n layers from layer q, for the starts q
    it can have (every earlier stage holds a layer: q >= s; every later one too) and the runs within its cap, up to
    the first that cannot fit (the floor grows with n)."""
    L, P = len(before) - 1, len(blocks)
    inf = float("inf")
    kinds = bytes(before[i + 1] - before[i] for i in range(L))  # 1 where layer i is an MoE layer
    rows = []
    for s, (cst, cap, terms) in enumerate(blocks):
        # a run's floors depend only on the kinds of its layers, which repeat from start to start (past a model's
        # leading dense layers, or every other layer): each sequence of kinds worked out once per stage, its list
        # shared by the starts that have it (read only), and each (length, MoE layers) once
        runs: dict[bytes, list[float]] = {}
        time = functools.cache(terms.time)
        starts: list[list[float]] = [[] for _ in range(min(s, L))]
        for q in range(s, L):
            mix = kinds[q : q + min(cap, L - q - (P - 1 - s))]
            run = runs.get(mix)
            if run is None:
                run = runs[mix] = []
                e = 0
                for n, moe in enumerate(mix, 1):
                    e += moe
                    t = cst + time(n, e)
                    if t == inf:
                        break
                    run.append(t)
            starts.append(run)
        rows.append(starts)
    return rows


def least_block_bottleneck(rows, L: int) -> float:
    """The least slowest floor of any split (_block_floors' rows), inf where none holds the layers."""
    inf = float("inf")
    after = [inf] * L + [0.0]  # after[q]: the least slowest floor of the later stages from layer q on
    for starts in reversed(rows):
        here = [inf] * (L + 1)
        for q, run in enumerate(starts):
            best = inf
            for n, t in enumerate(run, 1):
                if t >= best:
                    break  # (the floors grow with n)
                rest = after[q + n]
                best = min(best, t if t > rest else rest)
            here[q] = best
        after = here
    return after[0]


def least_block_sum(rows, L: int, most: float) -> float:
    """The least sum of the floors of any split whose floors are all at most ``most`` (inf where none is)."""
    inf = float("inf")
    limit = most * (1 + 1e-12)
    after = [inf] * L + [0.0]
    for starts in reversed(rows):
        here = [inf] * (L + 1)
        for q, run in enumerate(starts):
            best = inf
            for n, t in enumerate(run, 1):
                if t > limit:
                    break
                rest = after[q + n] + t
                if rest < best:
                    best = rest
            here[q] = best
        after = here
    return after[0]


def _kind_memory_bottleneck(stage_times, cst, L: int, probe: float | None = None) -> float:
    """Smallest bottleneck T at which the stages hold the L layers, stage s holding n of them in at least
    cst_s + stage_times[s][n - 1] seconds (kind_memory_times, growing with n); inf where they cannot hold them."""
    finite = [sum(1 for t in times if t < float("inf")) for times in stage_times]
    if sum(finite) < L or min(finite) < 1:
        return float("inf")

    def holds(T: float) -> int:
        return sum(bisect.bisect_right(times, T - c + 1e-12 * T) for times, c in zip(stage_times, cst))

    lo = max(c + times[0] for times, c in zip(stage_times, cst))
    hi = max(c + times[k - 1] for times, c, k in zip(stage_times, cst, finite))
    return _least_holding(holds, lo, hi * (1 + 1e-9), L, probe)


def kind_memory_floor(groups, L: int) -> float:
    """The box form of _kind_memory_bottleneck: ``groups`` per node group, its choices (TP degree) as (stages,
    times) or (stages, times, const), each of its at most ``stages`` stages holding n layers in at least
    const + times[n - 1] seconds (its roomiest stage's kind_memory_times, and what its stages surely add: their
    pipeline sends, the logits on the last stage; default 0); a group whose choice is still open holds the most
    any one choice holds. The smallest T at which they hold the L layers, inf where they cannot: the times of every
    choice walked in ascending order (a merge of the sorted lists), each taken as one more layer its stages hold,
    until the groups hold L. (It is one of the times; the walk reads only those up to it.)"""
    rows = []  # (group, stages, times, constant) per choice
    for g, choices in enumerate(groups):
        for k, values, *const in choices:
            if k > 0:
                rows.append((g, k, values, const[0] if const else 0.0))
    heap = [(values[0] + c, i) for i, (_, _, values, c) in enumerate(rows) if values and values[0] < math.inf]
    heapq.heapify(heap)
    counts = [0] * len(rows)  # times taken of each choice
    most = [0] * len(groups)  # the layers each group holds: the most any one of its choices holds
    held = 0
    while heap:
        x = heap[0][0]
        while heap and heap[0][0] == x:  # every time equal to x, then whether they hold L at x
            _, i = heapq.heappop(heap)
            g, k, values, c = rows[i]
            n = counts[i] = counts[i] + 1
            if n < len(values) and values[n] < math.inf:
                heapq.heappush(heap, (values[n] + c, i))
            if k * n > most[g]:
                held += k * n - most[g]
                most[g] = k * n
        if held >= L:
            return x
    return math.inf


def _capped_bottleneck(a, c, caps, L, probe: float | None = None) -> float:
    """Smallest T (bisection) with sum_s min(caps_s, floor((T - c_s)/a_s)) >= L and every stage >= 1 layer.
    With ``probe``: ``probe`` when T is above it, else a weaker valid bound."""

    def holds(T):
        return sum(min(k, int((T - ci) / ai + 1e-9)) for ai, ci, k in zip(a, c, caps) if T > ci)

    return _least_holding(holds, max(ci + ai for ai, ci in zip(a, c)), max(c) + L * max(a), L, probe)
