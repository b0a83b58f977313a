"""Mixed-pipeline search: one pipeline template whose stages run on different node groups (GPU types).

A candidate fixes dp, cp, ep (one EP degree for all stages: each stage's EP groups are carved out of its own dp*cp
ranks, planner.parallel.ep_options, as in the homogeneous search), micro-batch, ZeRO stage, the baseline recompute
mode, the order of the used node groups along the pipeline and, per used group g, the TP degree tp_g of its stages
and their number k_g >= 1, with k_g*tp_g*cp*dp <= GPUs of g and P = sum k_g <= num_layers, and the interleaving
degree vpp shared by all stages (the homogeneous rule, planner.parallel.vpp_options at depth P: every stage holds
vpp model chunks, so a multiple of vpp layers, and the micro-batch count is a multiple of P). CP-SAT
(planner/search/partition.py) then chooses each stage's layers (in whole chunks) and recomputed layers with one
StageModel per stage, priced on that stage's own GPUs (with EP: its all-to-all on the stage's own links and 1/ep of
the experts per GPU; with vpp: the interleaved schedule's bubble, in-flight micro-batches and per-chunk sends).

Candidates are reached through a best-first search over bounds: a _TpChoiceNode (dp, cp, ep, micro-batch, recompute,
vpp)
fixes the TP choice of one node group at a time down to _Family objects (per-group TP; group order and ZeRO stage
still open), which open into one family per ZeRO stage, then (more than OPEN_ALL groups) one per first group and
one per last group, then one per group order, whose boxes of stage counts are halved down
to single candidates; every level's bound holds for all it stands for. A candidate's refined bound
(mixed_pipeline_bounds.refined_bound: its stages' memory, sends, ZeRO traffic and DP tail) puts it back in line, so
CP-SAT solves candidates in the order of those bounds. The search stops when no remaining bound beats the K-th best
plan (by more than quick.RESOLUTION), which proves the top K (K distinct plans, planner.search.result.keep_top)
optimal within this space, as planner/search/homogeneous.py does. The roots are dealt to two shares that search
side by side in two processes, trading the plans they find in lock step (planner/search/lockstep.py: the same
answer and counts in one process or two). A short first look at the replica plans
(planner/search/replicas.py, heuristic evaluation of the best-bound shapes) gives the search its first cut; the
replica search proper follows, cut by the best plan of either kind, and the single-type baselines
(planner/search/single_type.py, below the best plan found before them, their groups shared by the two processes;
their plan is a mixed layout and a cut too). What the mixed pipelines' deadline left
in line, the solves stopped by their cap and the replica shapes still below the K-th best then get the time those
phases left. SearchResult.stop_reason and gap_source say what leaves a gap, and in which part of the space.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import io
import itertools
import math
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from planner.cost.estimate import evaluate_stages, hetero_stage_models, with_group_sends
from planner.cost.provider import cost_source
from planner.cost.stage import StageModel, heavy_kind, layer_counts
from planner.parallel import HeteroDims, baseline_recompute_modes, dp_options, group_order, micro_batch_options
from planner.parallel import vpp_options as depth_vpp_options
from planner.search.lockstep import EPOCH, Lockstep, Meet, Peer, Snapshot, boundary, processes_available
from planner.search.mixed_context import (
    LayerRuns,
    MixedContext,
    WayMeter,
    ZeroTerms,
    cp_options,
    end_costs,
    ep_options,
    kind_layer_bounds,
    moe_lead,
    per_layer_bound,
    pipeline_dims,
    send_bound,
    tp_options,
    uncovered,
    vpp_options,
    zero_terms,
)
from planner.search.mixed_pipeline_bounds import (
    BoxTails,
    Ends,
    KindMix,
    Meter,
    box_bound,
    box_bound_reach,
    box_sequence_holds,
    choice_capped_rate,
    first_positions,
    kind_memory_floor,
    least_line_sum,
    memory_floor,
    merged_levels,
    moe_only_rates,
    pipeline_sends,
    refined_bound,
    row_reaches,
    schedule_bound,
    schedule_probe,
    split_rows,
    tail_bottleneck,
)
from planner.search.partition import PRECISION, cp_sat, solve_partition
from planner.search.quick import RESOLUTION
from planner.search.replicas import AHEAD_FRONT, exact_memo, exact_shapes, look_ahead, search_replicas
from planner.search.result import (
    STOP_REASONS,
    Plan,
    SearchResult,
    keep_top,
    kth_time,
    mixed_order,
    settle_open_solves,
    solve_cap,
    solve_limit,
    solve_wall,
    stage_tuple,
    with_proof,
)
from planner.search.single_type import as_mixed_plan, best_single_type, better_single_type
from planner.search.space import SearchOptions
from planner.spec import Job

# ZeRO stages of mixed plans, in the order they are tried where their bounds tie: ZeRO-1 first, the usual winner
# with pipelines, so that its time caps the harder ZeRO-3 model.
HETERO_ZERO = (1, 0, 3)
# While no plan is known, or the K-th best is more than this share above a candidate's refined bound, a candidate
# whose refined bound is within this share of the search frontier is solved at once (to start or sharpen the cut);
# every other candidate waits in line for its refined bound. Changes only the order.
DIVE = 0.05
# The first look at the replica plans (before the mixed pipelines) takes at most this many steps of their
# best-first search (search_replicas' ``look``), its candidates split greedily: a count, not seconds, so that the
# first cut of the mixed pipelines, and with it their solve and prune counts, is the same on any machine. A cut
# saves the mixed pipelines more than the look costs where a replica plan is the best or close to it: on the suite
# (bench_hetero --suite, seeds 0-3) 5,000 steps instead of 1,000 took seed-1 job 31 (a replica plan is the best, its
# first after 3,197 steps) from 24.7 to 15.5 s and seed-2 jobs 16 and 40 (first plans 6% and 10% above the best)
# from 8.5 and 5.8 s to 4.3 and 1.9 s; where the replica plans are far from the best, the longer look costs up to
# 1.2 s (seed-3 job 10: 1.0 -> 2.2 s, its look's plan 44% above the best).
# The look is the one phase the child (lockstep) sits idle through (0.6-2.8 s on the slow jobs of seeds 1, 4, 5 and
# 7). No look at all (one step) moved those jobs by -1.9 to +9.1 s (seed-1 job 37 5.0 -> 3.2 s, its look's plans 61%
# above the best; seed-5 job 10 11.9 -> 21.0 s and seed-1 job 31 5.9 -> 9.0 s, a replica plan the best). Run inside
# the first share's explore as work of its own, the other share exploring meanwhile, it was slower on 5 of 7 of them
# (seed-5 job 10 +2.5 s, seed-1 job 43 +0.9 s; lock step through the look, or publishing only, or the other share
# solving nothing while no plan is known): the other share's work without the look's cut, and the waits where the
# look's work and the other share's units run at different speeds, cost more than the idle child. Nor did a look in two
# parts, one per process, pay (every other shape of the look's enumeration each, 2,500 steps each, the child's part
# first thing after the fork; medians of 3 alternating runs at 0254b19): seed-4 job 26 -10%, seed-1 job 43 -6%, but
# seed-7 job 37 +14% and seed-1 job 31 +7% (what a part finds is not what the whole look finds) and seed-5 job 10 the
# same (its 1.3 s enumeration on both sides); each part took about 70% of the whole look's time, side by side.
REPLICA_LOOK = 5000
# While no plan is known, a candidate is solved capped at this share above its refined bound (solve_capped): CP-SAT
# finds a split under a cap close to the bound, or proves there is none, sooner than it finds a first split with no
# cap (seed-1 suite job 40's first two solves, uncapped, took 1.6 s each: about 0.7 deterministic seconds to a first
# split). Through the CLI (medians of 2-3 alternating runs against 1f2b647, the same plans): seed-1 job 40 11.3 ->
# 9.8 s, seed-4 job 26 5.9 -> 5.5 s, seed-7 jobs 37 and 16 6.3 -> 6.0 s and 11.0 -> 10.7 s; seed-1 jobs 31 and 43,
# seed-4 jobs 4 and 25, seed-5 jobs 10 and 13, seed-7 job 10 within 3.3%. At 5% the capped solves of job 40 found
# nothing below their caps and it gained nothing; at 20%, one process, seed-4 job 26 and seed-1 job 43 took 6% and 9%
# longer. Capped so also once a plan is known, where the K-th best is more than the cap above (the dives and the
# candidates out of line alike): seed-7 job 16 10.7 -> 14.0 s through the CLI, the others within the noise.
FIRST_CAP = 0.10
# Work units of the mixed search's steps, for lockstep's epochs, each about 60-120 microseconds on the slow suite
# jobs (measured by kind of step on jobs 4, 13, 19 and 46): a node out of line, a bound worked out for a node put in
# line, and on top of that a TP-choice node's memory terms and an open family's bound (per ZeRO stage), a
# candidate's refined bound (plus one per 8 chunks and stages: _PipelineSearch.refined_work) and a CP-SAT solve. The
# closer they follow time, the less the two shares wait for each other. Counts, not seconds: the same on any machine.
# A solve counts WORK["solve"] (its model built and presolved) plus SOLVE_UNITS per CP-SAT deterministic second it
# used (with one worker: the same on any machine and in every run). Over 168 solves of six slow suite jobs (seed-7
# jobs 10, 16, 23, 37; seed-1 jobs 40, 43) a least-squares fit of their wall seconds gave 0.038 s + 1.24 s per
# deterministic second, the stage and layer count adding nothing (4.7 microseconds per stage and layer). Counted as
# 100 units plus one per stage and layer before, the solves of seed-7 job 23 came to 12.4 s of units for 1.5 s of
# solving and those of seed-1 job 40 to 2.2 s for 5.8 s: the share with the longer solves fell behind the other's
# count and the other waited for it (seed-7 job 37: 2.0 of its 5.7 s; 0.2-0.6 with the solves counted by their
# time). The other steps' units were fitted by kind too (a family box's bound 2.4 units, a TP-choice node's 0.5, a
# family built 8: 0.07-0.11 ms a unit for every kind, 0.05-0.56 before), but the jobs ran slower with them (seed-7
# jobs 16 and 37 7.56 -> 7.79 and 4.53 -> 4.87 s, seed-1 job 43 4.84 -> 4.94 s): the epochs came closer together
# where the family bounds are many. Of that fit only the TP-choice node's memory terms stayed (1 unit, 4 before: that
# step, out of line and back in, took 0.22 ms).
# A tail way (mixed_context.ZeroTails.at) a share reads for the first time counts WORK["way"] too (WayMeter): it is
# worked out then (0.3-0.5 ms), and on seed-1 suite job 37, whose TP-choice nodes read 3,659 of them, those nodes took
# 0.32-0.36 ms a unit against 0.05-0.07 for the roots the first share bounds meanwhile, which then waited 1.3 s for
# the other. With 3 units a way, the two shares' waits there came from 2.0-2.3 s to 0.8-0.9 s, its explore from 3.6-4.0
# s to 3.0-3.3 s; seed-4 job 25 4.9-5.1 -> 4.7-4.9 s; seed-1 job 43 and seed-7 jobs 16, 23 and 37 the same; seed-4
# job 26 3.5 -> 3.7 s. (6 units: job 37 2.9 s, but seed-7 job 37 4.6 -> 5.1 s.)
# The roots' bounds count no work. The second share's are worked out in the child while the parent takes
# the first replica look (prepare); the first share's after it, before its explore goes on, by the parent from its
# first root on and by the child, done with its own, from the last back, until the two meet (prepare_for). Counted
# (2 units a root before), the first share's roots went in step with the child's line, so neither could work them
# out ahead (seed-1 suite job 43: 0.5 s for its 4,445 roots after the look, while the child had been idle for 0.6 s
# during it).
# Two more counts (fitted one process, per share: its step seconds over its units): a bisection over DP-tail
# levels (Meter.levels: least_level, the tail term of the TP-choice nodes with every TP fixed) counts WORK["level"],
# and a solve's model counts one unit per WORK["chunks"] stage chunks (stages times chunks: its variables). Seed-5
# job 10's shares ran at 0.108 and 0.088 ms a unit (the one with more tail terms behind: the other waited 1.6-2.4 s
# of a 12.6 s explore), at 0.051 and 0.050 with the levels counted; seed-1 job 43 8% -> 4% apart. A least-squares fit
# of 209 solves of eight suite jobs gave 21 ms + 1.63 s per deterministic second + 15 microseconds per stage chunk
# (seed-4 job 26's 50-stage, 126-layer solves took 80-130 ms each, counted as 43-64 ms before).
# A share out of work, or low on it, is given every other one of the best GIFT nodes of the other's line
# (_PipelineSearch.give; lockstep.LOW).
GIFT = 256
WORK = {
    "pop": 1,
    "bound": 1,
    "memory": 1,
    "open": 1,
    "refined": 2,
    "rows": 256,
    "level": 2,
    "solve": 210,
    "chunks": 7,
    "way": 3,
}
# an open family of at most this many group orders is cut where in none of them its stages hold the layers in their
# places (_Family._holds_in_place; ordered families always)
SEQUENCE_ORDERS = 2
# an open family of more groups than this opens its first group, then its last, before the orders between them
# (open_ends), one of this many or fewer every order at once (expand)
OPEN_ALL = 3
SOLVE_UNITS = 16_000  # work units per CP-SAT deterministic second (a unit: about 0.1 ms)


class _Memo(dict):
    """What the nodes of one root (_TpChoiceNode.memo) or the boxes of one family (_Family._box_memo) share of
    their bounds' terms. Given to the other share without its contents (_NodePickler): the nodes of a gift that
    shared one share a new, empty one there, which works out again what they read. (Pickled whole, the memos were
    most of a gift: seed-5 suite job 10's 16 gifts of 128 nodes came to 33 MB and 2.8 s of pickling and taking in,
    and the family memos' keys hold object identities, which mean nothing in another process.)"""


@dataclass(frozen=True)
class HeteroCandidate:
    dp: int
    cp: int
    mbs: int
    zero: int
    recompute: str
    groups: tuple[tuple[int, int, int], ...]  # (group, tp, stages) in pipeline order, stages >= 1
    lower_bound_s: float
    ep: int = 1  # expert-parallel degree of every stage
    vpp: int = 1  # model chunks per stage (interleaved schedule): every stage holds a multiple of vpp layers

    @functools.cached_property
    def pp(self) -> int:
        return sum(k for _, _, k in self.groups)

    @functools.cached_property
    def stage_groups(self) -> tuple[int, ...]:
        return tuple(g for g, _, k in self.groups for _ in range(k))

    @functools.cached_property
    def stage_tp(self) -> tuple[int, ...]:
        return tuple(tp for _, tp, k in self.groups for _ in range(k))

    def sort_key(self):
        return mixed_order(self, self.groups, self.vpp)

    def dims(
        self, job: Job, layers: tuple[int, ...] | None = None, recompute=None, base: str | None = None
    ) -> HeteroDims:
        return pipeline_dims(
            job,
            self.stage_groups,
            self.stage_tp,
            self.dp,
            self.cp,
            self.mbs,
            self.zero,
            base or self.recompute,
            layers,
            recompute,
            ep=self.ep,
            vpp=self.vpp,
        )


# ----------------------------------------------------------------------------------------------- search
def _roots(ctx: MixedContext) -> list[tuple[_TpChoiceNode, int]]:
    """(group of families, candidates in it) for every dp, cp, ep, micro-batch, baseline recompute and
    interleaving degree; each group stands for its families (one per per-group TP choice, None = unused), opened
    as it is visited (its bound is worked out by the share that searches it: _PipelineSearch.prepare). With vpp
    model chunks per stage a pipeline has at most num_layers/vpp stages."""
    job, opts = ctx.job, ctx.opts
    m, t = job.model, job.training
    L = m.num_layers
    bases = baseline_recompute_modes(t, opts.op_recompute)
    cps = [cp for cp in cp_options(ctx) if ctx.fw is None or ctx.fw.allows(cp=cp)]
    out = []
    for dp, cp in itertools.product(dp_options(t), cps):
        kmax_of = {
            g: {tp: min(L, job.cluster[g].num_gpus // (tp * cp * dp)) for tp in tp_options(ctx, g, cp)}
            for g in ctx.order
        }
        tp_opts = tuple((None,) + tuple(tp for tp, k in kmax_of[g].items() if k >= 1) for g in ctx.order)
        if all(len(v) == 1 for v in tp_opts):
            continue
        per_replica = t.global_batch_size // dp
        max_pp = sum(max(kmax_of[g].values(), default=0) for g in ctx.order)
        per_vpp = {}  # vpp -> (stage limits, candidates): the same for every ep, micro-batch and recompute mode
        for ep in ep_options(ctx, dp, cp):
            zeros = _zero_options(ctx, cp, ep)
            if not zeros:
                continue
            for mbs in micro_batch_options(t, dp, opts.max_micro_batch):
                mb = per_replica // mbs
                vpps = vpp_options(ctx, mb, max_pp)
                for base in bases:
                    for vpp in vpps:
                        if vpp not in per_vpp:
                            kmax = {g: {tp: min(k, L // vpp) for tp, k in kmax_of[g].items()} for g in ctx.order}
                            per_vpp[vpp] = kmax, _space_size(ctx, tp_opts, kmax, L // vpp)
                        kmax, size = per_vpp[vpp]
                        grp = _TpChoiceNode(dp, cp, mbs, base, zeros, mb, tp_opts, kmax, ep=ep, vpp=vpp, rough=True)
                        out.append((grp, size * len(zeros)))
    return out


def _zero_options(ctx: MixedContext, cp: int, ep: int) -> tuple[int, ...]:
    """The ZeRO stages of mixed plans at these degrees, in HETERO_ZERO's order: the job's (SearchOptions
    .zero_stages) that the framework runs with them in a pipeline of one stage or of more (Framework.rejects:
    torchtitan runs ZeRO-0 and 3 only, and with CP ZeRO-3 only). The stage counts and TP come later: the rest of
    the rule is asked of each candidate (_Family.candidates)."""
    fw = ctx.fw
    return tuple(
        z
        for z in HETERO_ZERO
        if z in ctx.opts.zero_stages and (fw is None or any(fw.allows(pp=pp, zero=z, cp=cp, ep=ep) for pp in (1, 2)))
    )


def _space_size(ctx: MixedContext, tp_opts, kmax_of, max_pp: int) -> int:
    """Candidates of one dp and cp, without ZeRO: every per-group TP choice, stage counts (at most ``max_pp`` in
    all) and group order (the same for every dp and cp with the same stage-count limits)."""
    key = (tp_opts, tuple(tuple(sorted(kmax_of[g].items())) for g in ctx.order), max_pp)
    if key not in ctx.caches.space_size:
        ctx.caches.space_size[key] = _count_choices(ctx, tp_opts, kmax_of, max_pp)
    return ctx.caches.space_size[key]


def _group_size(ctx: MixedContext, grp: _TpChoiceNode) -> int:
    """Candidates a _TpChoiceNode stands for (every ZeRO stage): as _space_size, with its fixed choices
    (memoized per root, and across roots with the same stage-count limits)."""
    hit = grp.memo.get(("size", grp.fixed))
    if hit is not None:
        return hit
    L = grp.max_pp(ctx)
    key = (grp.fixed, grp.tp_opts, tuple(tuple(sorted(grp.kmax_of[g].items())) for g in ctx.order), L)
    if key not in ctx.caches.group_space_size:
        options = tuple((tp,) for tp in grp.fixed) + grp.tp_opts[len(grp.fixed) :]
        ctx.caches.group_space_size[key] = _count_choices(ctx, options, grp.kmax_of, L)
    hit = grp.memo["size", grp.fixed] = ctx.caches.group_space_size[key] * len(grp.zeros)
    return hit


def _count_choices(ctx: MixedContext, options, kmax_of, L: int) -> int:
    """Candidates of the TP ``options`` of each group of ctx.order (None: unused), without ZeRO: every choice of
    one option per group that _uniform_ok takes, with 1..kmax_of[g][tp] stages on each used group, at most L in
    all, in every order of the used groups. With one TP for all (a framework without per-stage TP): the choices
    of each TP apart."""
    if ctx.fw is None or ctx.fw.per_stage_tp:
        return _count_limits([[kmax_of[g][tp] for tp in opts if tp] for g, opts in zip(ctx.order, options)], L)
    tps = sorted({tp for opts in options for tp in opts if tp})
    return sum(
        _count_limits([[kmax_of[g][tp] for tp in opts if tp == one] for g, opts in zip(ctx.order, options)], L)
        for one in tps
    )


def _count_limits(limits: list[list[int]], L: int) -> int:
    """Sum over the choices of one stage limit k or none (unused) per group, at least one group used, of the
    stage-count vectors 1 <= n_g <= k_g (used groups) with at most L stages in all, times the orders of the used
    groups (u! for u used): what summing _box_size over the choices gives (tests/test_hetero.py checks the
    two agree), as a count by number of used groups and stages so far (a polynomial product: each k adds
    x + ... + x^k), in O(groups^2 * limits * L) instead of one _box_size per choice."""
    # ways[u][s]: the choices of the groups so far with u of them used and s stages in all (s <= L)
    ways = [[1] + [0] * L]
    for ks in limits:
        new = [row[:] for row in ways] + [[0] * (L + 1)]
        for u, row in enumerate(ways):
            pre = list(itertools.accumulate(row, initial=0))  # pre[s] = row[0] + ... + row[s - 1]
            out = new[u + 1]
            for k in ks:  # 1..k stages on this group: out[s] += pre[s] - pre[max(0, s - k)], s = 1..L
                k = min(k, L)
                out[1:] = [o + p - q for o, p, q in zip(out[1:], pre[1 : L + 1], [0] * k + pre[1 : L + 1 - k])]
        ways = new
    return sum(math.factorial(u) * sum(row) for u, row in enumerate(ways) if u)


def _node_size(ctx: MixedContext, node, box) -> int:
    """Candidates a node of the best-first search stands for (for progress: they are settled when it is cut)."""
    if isinstance(node, _TpChoiceNode):
        return _group_size(ctx, node)
    if isinstance(node, HeteroCandidate):
        return 1
    lo, hi = box
    n = _box_size(lo, hi, ctx.job.model.num_layers // node.vpp)
    return n if node.ordered else n * math.factorial(len(node.free)) * len(node.zeros)


def _uniform_ok(ctx: MixedContext, used) -> bool:
    """A used-group choice is in the space: at least one group, and one TP for all when the framework needs it."""
    return bool(used) and (ctx.fw is None or ctx.fw.per_stage_tp or len({tp for _, tp in used}) <= 1)


@dataclass(frozen=True)
class _TpChoiceNode:
    """The families of one dp, cp, ep, micro-batch, baseline recompute and vpp whose TP choices (None: group
    unused) start with ``fixed`` for the first groups of ctx.order, the others ranging over ``tp_opts``. Opening it
    fixes the next group's choice (with all fixed: the family), so only choices whose bounds the search reaches are
    made. ``kmax_of``: the most stages of each group at each TP (GPUs, and at most num_layers/vpp)."""

    dp: int
    cp: int
    mbs: int
    base: str
    zeros: tuple[int, ...]
    mb: int
    tp_opts: tuple[tuple[int | None, ...], ...]  # per group of ctx.order: None (unused) and its TP degrees
    kmax_of: dict
    fixed: tuple[int | None, ...] = ()
    ep: int = 1
    vpp: int = 1
    # put in line at its bound without the memory terms (cheap); a node with every TP choice made goes back in line
    # at its bound with them (bound(memory=True), which builds the groups' models) the first time it comes out of
    # line, before it builds its family. (Above the leaves they cut many nodes, 55% of job 46's roots in the seed-0
    # suite, but build the models of every choice at every ZeRO stage: jobs 4, 13 and 49 took longer with them.
    # Again at 0254b19, only while no plan is known, each open group at any of its choices, one process: with one
    # group open, seed-1 job 43 19,116 -> 18,210 steps, seed-4 job 26 16,833 -> 14,936, seed-7 job 10 9,172 -> 8,351,
    # but seed-1 job 7 9,062 -> 11,053, 97% of those bounds up 1% or less; by a trial on the bound's rise (TailTrial's
    # rule, a rise over 1% told as a cut), medians of alternating two-process runs 0.91-1.02 of before, at every open
    # level 0.88-1.15 (seed-7 job 10 1.10 with 12% fewer steps: the memory steps cost more than those they save);
    # with the roots too, the seed-1 suite's small jobs took 0.2-0.3 s more each.)
    memory: bool = False
    # a root (_roots), put in line at its rough_bound, which goes back in line at its bound (without the memory
    # terms) the first time it comes out of line
    rough: bool = False
    # the row terms of the nodes of one root, which share its degrees (memoized per root: cheap keys): (group, TP)
    # -> _terms, ("free", i) -> _free, ("row", i, TP or "free") -> _row, ("size", fixed) -> _group_size, and the
    # DP-tail terms: ("choices", fixed) -> _choices, ("flat", fixed) -> _flat_choices, ("tail row", i, zero) ->
    # _tail_row of an open group
    memo: dict = field(default_factory=_Memo, compare=False, repr=False)
    # every group's _row (None: no row), handed down from the parent with the newly fixed group's row swapped in
    # (so a bound reads one new row, not every group's); None until first read
    rows: tuple | None = field(default=None, compare=False, repr=False)

    def max_pp(self, ctx: MixedContext) -> int:
        """The most stages a pipeline of vpp model chunks per stage can have: one chunk of vpp layers each."""
        return ctx.job.model.num_layers // self.vpp

    def _terms(self, ctx: MixedContext, u) -> tuple[float, tuple[float, float], float]:
        """(per-layer seconds, (embedding, logits) seconds, pipeline-send seconds) bounds of group u[0] at TP u[1]
        (the sends of all vpp model chunks of a stage)."""
        hit = self.memo.get(u)
        if hit is None:
            g, tp = u
            hit = self.memo[u] = (
                per_layer_bound(ctx, g, tp, self.cp, self.mbs, self.base, self.ep),
                end_costs(ctx, u, u, self.cp, self.mbs),
                self.vpp * send_bound(ctx, g, tp, self.cp, self.dp, self.mbs),
            )
        return hit

    def _free(self, ctx: MixedContext, i: int) -> tuple | None:
        """box_bound terms (a, (emb, logits), send, lo, hi) valid for group i at any of its choices: not required
        (lo = 0), the ends at their least, sends left out (_row puts in the least of its choices'), and its layer
        throughput (box_bound's k_g/a_g) at its
        best TP: passed as its fastest per-layer time a with hi stages, hi/a being that best throughput."""
        key = ("free", i)
        if key not in self.memo:
            g = ctx.order[i]
            terms = [(self._terms(ctx, (g, tp)), self.kmax_of[g][tp]) for tp in self.tp_opts[i] if tp]
            fast = min(x[0] for x, _ in terms) if terms else 0.0
            self.memo[key] = (
                (
                    fast,
                    (min(x[1][0] for x, _ in terms), min(x[1][1] for x, _ in terms)),
                    0.0,
                    0,
                    fast * max(k / x[0] for x, k in terms),
                )
                if terms
                else None
            )
        return self.memo[key]

    def bound(
        self,
        ctx: MixedContext,
        target: float = float("inf"),
        memory: bool = True,
        tails: tuple[TailTrial, ...] | None = None,
        traffic: bool = True,
    ) -> float:
        """Valid for every family of the group: fixed used groups exactly (at least one stage), free ones relaxed
        (_free); a model with dense and MoE layers counts the two kinds apart (_kind_mix). With ``memory``, where
        that is below ``target``, the groups' memory too (memory_floor, each group at any one of its choices): inf
        when they cannot hold the layers at any ZeRO stage, else the least bottleneck their memory forces. Where
        that is below ``target`` and at most TAIL_OPEN groups' TP is open, plus the ZeRO stages' traffic and DP
        tails (_lined_tail_bound): always without ``tails``, else against a finite target where the trial of the
        node's level (``tails``, one per count of groups whose TP is still open) says it pays, what it cut told to
        that trial; not with ``traffic`` False (a node back out of line for its memory terms, whose place in line
        holds them). With ``memory`` and every TP fixed, at least the least ZeRO-2/3 traffic of the ZeRO stages
        whose memory holds the layers (_fitting_lines)."""
        plain = self._schedule_bound(ctx, target, memory)
        if plain >= target:
            return plain
        value = plain
        level = len(ctx.order) - len(self.fixed)  # (groups whose TP is still open)
        if traffic and level <= TAIL_OPEN:
            trial = None if tails is None else tails[level]
            if trial is None or (target < float("inf") and trial.pays()):
                value = self._lined_tail_bound(ctx, plain, target)
                if trial is not None:
                    trial.tell(value >= target)
        if value < target and memory and len(self.fixed) == len(ctx.order):
            value = max(value, plain + self._fitting_lines(ctx))
        return value

    def _lined_tail_bound(self, ctx: MixedContext, plain: float, target: float) -> float:
        """A floor under every candidate of the node at two or more stages (``plain`` where one may have one stage:
        _one_stage_possible), from its schedule floor ``plain`` (_schedule_bound): the least over its ZeRO stages of
        plain plus the stage's least ZeRO-2/3 traffic lines (_least_lines) plus the least largest DP tail at which
        the node's stages hold the layers (_least_tail), raised where the stage has such traffic by the schedule
        with that traffic in every layer's seconds (_lined_schedule: in the bottleneck, not only in the stages'
        sum). An interleaved schedule at few micro-batches runs at few stages, each holding many layers whose
        gathers it exposes once per micro-batch and chunk: on seed-5 suite job 10 (DeepSeek-V2 on four types),
        ZeRO-3's lines in the sum alone were 0.03 s, and a TP-choice node at vpp 15 was bounded at 0.34 s where its
        family's bound, which adds them to each layer, was 0.79 s. The ZeRO stages are taken least lines first;
        once one's floor is below a finite ``target`` the others are left at plain plus their lines (valid, and the
        node is not cut)."""
        if self._one_stage_possible():
            return plain
        ways = self._zero_lines(ctx)
        least = float("inf")
        for i, (lines, zero, sloped) in enumerate(ways):
            if plain + lines >= least:
                break  # (the rest only add)
            tail = self._least_tail(ctx, zero)
            value = plain + lines + tail
            if sloped and value < target:
                value = max(value, self._lined_schedule(ctx, zero, target - tail) + tail)
            least = min(least, value)
            if least < target < float("inf"):
                return min([least] + [plain + rest for rest, _, _ in ways[i + 1 :]])
        return least

    def _zero_lines(self, ctx: MixedContext) -> list[tuple[float, int, bool]]:
        """Per ZeRO stage of the node, (its least lines: _least_lines, the stage, whether any choice has a ZeRO-2/3
        traffic slope), least lines first; memoized per root by the fixed choices."""
        key = ("zero lines", self.fixed)
        hit = self.memo.get(key)
        if hit is None:
            ways = []
            for zero in self.zeros:
                zts = self._zero_terms_of(ctx, zero)
                ways.append((self._least_lines(ctx, zts), zero, any(z.slope > 0 for z in zts)))
            # (of equal lines the higher ZeRO stage first: its tails are the smaller, and ZeRO-0's, which ZeRO-1
            # mostly covers, are worked out only where the node may be cut)
            hit = self.memo[key] = sorted(ways, key=lambda w: (w[0], -w[1]))
        return hit

    def _lined_schedule(self, ctx: MixedContext, zero: int, target: float) -> float:
        """The node's schedule bound (_schedule_bound's box, without its memory and the end terms, which only add)
        with each choice's exposed ZeRO-2/3 traffic at this ZeRO stage (ZeroTerms.slope, valid at two or more
        stages) added to its seconds per layer: a fixed row at its one choice, an open row's choices each at its
        own (box_bound_reach's relaxed choices, and its best throughput at the least of their seconds)."""
        a, lo, hi, send, relaxed = [], [], [], [], []
        unused = self._open_unused(ctx)
        for i, row in enumerate(self._rows(ctx)):
            if row is None or (unused and row[0][5]):
                continue
            x, _, y, k_lo, k_hi, picks = row[0]
            slopes = [self._zero_terms(ctx, g, tp, zero).slope for g, tp in self._row_choices(ctx, i)]
            if picks:
                picks = tuple((k, x_c + z, y_c) for (k, x_c, y_c), z in zip(picks, slopes))
                x = min(x_c for _, x_c, _ in picks)
                k_hi = x * max(k / x_c for k, x_c, _ in picks)
            else:
                x += slopes[0]
            a.append(x)
            lo.append(k_lo)
            hi.append(k_hi)
            send.append(y)
            relaxed.append(picks)
        deepest = self._deepest(ctx)
        if not a or deepest == 0:
            return float("inf")
        if deepest:
            hi, relaxed = _within_depth(deepest, lo, hi, relaxed)
        L = ctx.job.model.num_layers
        args = (tuple(a), tuple(lo), tuple(hi), _NO_ENDS, L, self.mb, tuple(send), self.vpp)
        kw = {"whole": True, "relaxed": tuple(relaxed), "max_stages": deepest, "target": target}
        return box_bound_reach(*args, **kw)[0]

    def _one_stage_possible(self) -> bool:
        """Whether a candidate of the node (every TP fixed) may have one stage, where ZeroTerms' lines and tails,
        which hold at two stages or more, do not hold (pipeline_sends)."""
        return self.vpp == 1 and sum(1 for tp in self.fixed if tp) < 2

    def _fitting_lines(self, ctx: MixedContext) -> float:
        """What every candidate of the node (every TP fixed) adds to its schedule in ZeRO-2/3 traffic, at least: the
        least over the ZeRO stages whose memory can hold the layers (memory_zeros) of _lines_at; 0 where ZeRO-0 or
        1 can (no such traffic), or where a candidate may have one stage (_one_stage_possible). Worked out when the
        node comes out of line with its memory terms, so only where its family would be built next. (Seed-7 suite
        job 37, DeepSeek-V3 on B200 + H20 + H800: where only ZeRO-3 holds the layers, ZeRO-1's zero traffic stood
        for it, and the least slope of any group for every layer; its families' bounds were 2-8 times their
        nodes'. Of its 1,968 such nodes, 921 built their families instead of 1,773.) Memoized per root."""
        if self._one_stage_possible():
            return 0.0
        key = ("fitting lines", self.fixed)
        hit = self.memo.get(key)
        if hit is None:
            zeros = self.memory_zeros(ctx)
            if min(zeros, default=2) < 2:
                hit = 0.0
            else:
                hit = min((self._lines_at(ctx, zero) for zero in zeros), default=float("inf"))
            self.memo[key] = hit
        return hit

    def _lines_at(self, ctx: MixedContext, zero: int) -> float:
        """The least ZeRO-2/3 traffic lines of the node's stages at this ZeRO stage: each group's layers at its own
        slope (ZeroTerms.slope; for a model with dense and MoE layers the MoE layers at each group's MoE slope and
        the dense ones at the least dense slope, as _Family.kind_mix), at most what its stages hold (ZeroTerms.room,
        its stages last: the most), the cheapest first (least_line_sum), plus the end stages' least constants; in
        the schedule's sum, so divided by vpp."""
        L = ctx.job.model.num_layers
        count = layer_counts(ctx.job.model)
        zts = self._zero_terms_of(ctx, zero)
        rooms = [z.room(0, self.kmax_of[g][tp], self.vpp) for z, (g, tp) in zip(zts, self._flat_choices(ctx))]
        lines = least_line_sum([(z.slope, room) for z, room in zip(zts, rooms)], L)
        if count["dense"] and count["moe"]:
            moe = [z.slopes[1] for z in zts]
            dense = min(z.slopes[0] for z in zts)
            lines = max(lines, least_line_sum(list(zip(moe, rooms)), count["moe"]) + count["dense"] * dense)
        ends = min(z.first for z in zts) + min(z.last for z in zts)
        return max(0.0, lines + ends) / self.vpp

    def _least_lines(self, ctx: MixedContext, zts: list[ZeroTerms]) -> float:
        """The least traffic lines over the L layers of the node's choices at one ZeRO stage (their ZeroTerms
        ``zts``: each layer at the least slope, the end stages at their least constants), / vpp."""
        L = ctx.job.model.num_layers
        lines = L * min(z.slope for z in zts) + min(z.first for z in zts) + min(z.last for z in zts)
        return max(0.0, lines) / self.vpp

    def _least_tail(self, ctx: MixedContext, zero: int) -> float:
        """The least largest DP tail at which the node's stages hold the layers at this ZeRO stage (a row per group:
        _tail_row). Memoized per root by the fixed choices."""
        key = ("least tail", self.fixed, zero)
        hit = self.memo.get(key)
        if hit is None:
            rows = [self._tail_row(ctx, i, choices, zero) for i, choices in self._choices(ctx)]
            his, reaches = [k for k, _ in rows], [r for _, r in rows]
            L, v = ctx.job.model.num_layers, self.vpp
            hit = self.memo[key] = tail_bottleneck(reaches, his, L, None, v, self._deepest(ctx))
        return hit

    def _tail_row(self, ctx: MixedContext, i: int, choices, zero: int) -> tuple[int, tuple[float, ...]]:
        """(most stages, DP tail reach: ZeroTerms.reach) of group i's row at this ZeRO stage: its one choice's, or,
        while its TP is open, the most stages of any of its choices and the least reach of any at each layer count
        (it runs at one of them, or none: no more stages, each holding no more layers within a tail). Memoized per
        root (an open group's row is the same for every node of the root that leaves it open)."""
        if len(choices) == 1:
            (g, tp) = choices[0]
            return self.kmax_of[g][tp], self._zero_terms(ctx, g, tp, zero).reach(self.vpp)
        key = ("tail row", i, zero)
        hit = self.memo.get(key)
        if hit is None:
            reaches = [self._zero_terms(ctx, g, tp, zero).reach(self.vpp) for g, tp in choices]
            hit = self.memo[key] = (max(self.kmax_of[g][tp] for g, tp in choices), tuple(map(min, *reaches)))
        return hit

    def _zero_terms(self, ctx: MixedContext, g: int, tp: int, zero: int) -> ZeroTerms:
        """The ZeroTerms of group g at this TP and ZeRO stage, at the node's degrees."""
        return zero_terms(ctx, g, tp, self.dp, self.cp, self.mbs, self.base, zero, self.ep)

    def _zero_terms_of(self, ctx: MixedContext, zero: int) -> list[ZeroTerms]:
        """The ZeroTerms of the node's (group, TP) choices (_flat_choices) at this ZeRO stage."""
        return [self._zero_terms(ctx, g, tp, zero) for g, tp in self._flat_choices(ctx)]

    def _flat_choices(self, ctx: MixedContext) -> list[tuple[int, int]]:
        """Every (group, TP) choice of the node's rows (_choices), in row order (memoized per root by the fixed
        choices: _zero_terms_of reads them at each ZeRO stage)."""
        key = ("flat", self.fixed)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = [u for _, row in self._choices(ctx) for u in row]
        return hit

    def _schedule_bound(self, ctx: MixedContext, target: float, memory: bool) -> float:
        rows = [row for row in self._rows(ctx) if row is not None]
        if self._open_unused(ctx):
            rows = [row for row in rows if not row[0][5]]  # (rows handed down from a node with room for them)
        if not rows:
            return float("inf")
        a, _, send, lo, hi, free = zip(*(row[0] for row in rows))
        L = ctx.job.model.num_layers
        deepest = self._deepest(ctx, rows)
        if deepest == 0:
            return float("inf")  # no depth that takes the vpp (and the framework) lies within the node's stage counts
        if deepest:
            hi, free = _within_depth(deepest, lo, hi, free)
        mix = self._kind_mix(ctx, [row[1] for row in rows])
        ends = Ends.least([row[2] for row in rows])  # (Ends.any_order of the rows)
        args = (a, lo, hi, ends, L, self.mb, send, self.vpp)
        kw = {"mix": mix, "whole": True, "relaxed": free, "max_stages": deepest}
        plain, reach = box_bound_reach(*args, **kw, target=target)
        if plain < target:  # at most that many stages: each group's at its own choice's seconds
            work = mix.work if mix is not None else L * min(a)
            plain = max(plain, self._capped_bound(ctx, deepest or L // self.vpp, work))
        if not memory or plain >= target:
            return plain
        floor = self.memory_floor(ctx)
        if floor == float("inf"):
            return floor
        if floor < reach:  # (the bound with it is the bound without)
            return plain
        return max(plain, box_bound(*args, floor=floor, **kw))

    def _capped_bound(self, ctx: MixedContext, most: int, work: float) -> float:
        """schedule_bound at the least bottleneck at which at most ``most`` stages hold the heavy layers (the MoE
        layers of a model with both kinds, else every layer), each group at one of its TP choices (k stages of y
        seconds per heavy layer: choice_capped_rate), and the least ``work``; 0 where the groups' stages cannot
        exceed ``most`` (box_bound's capped_rate, which takes a group whose TP is open at its best throughput
        and its fastest seconds together, is then as good)."""
        key = ("capped", most, self.fixed)  # (the node's choices follow from its fixed ones: its root's memo)
        hit = self.memo.get(key)
        if hit is None:
            rows, hit = self._heavy_rows(ctx), 0.0
            if sum(max(k for k, _ in r) for r in rows) > most:
                hit = self._throughput_floor(ctx, rows, most, work)
            self.memo[key] = hit
        return hit

    def _heavy_rows(self, ctx: MixedContext) -> tuple:
        """Per row of the node (_choices), its choices as (most stages, least seconds per heavy layer), each row
        read through _heavy_row."""
        return tuple(self._heavy_row(ctx, c) for _, c in self._choices(ctx))

    def _heavy_row(self, ctx: MixedContext, choices) -> tuple:
        """One row's (most stages, least seconds per heavy layer) per (group, TP) choice, memoized per root by the
        choices: the nodes of a root share their rows, though almost no two share all of them (seed-5 suite job
        10: 59,956 distinct nodes of its 61,176 reads; the reads 1.50 -> 1.19 s of its 23 s in one process)."""
        key = ("heavy row", choices)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = tuple((self.kmax_of[g][tp], self._heavy_seconds(ctx, g, tp)) for g, tp in choices)
        return hit

    def _throughput_floor(self, ctx: MixedContext, rows, most: int, work: float) -> float:
        """schedule_bound at the least bottleneck at which at most ``most`` stages, each group at one of its choices
        (``rows``: _heavy_rows), hold the model's heavy layers (choice_capped_rate), and ``work`` seconds at least in
        the stages' sum."""
        need = heavy_kind(ctx.job.model)[1]
        return schedule_bound(need / choice_capped_rate(rows, most), work, self.mb, self.vpp)

    def rough_bound(self, ctx: MixedContext) -> float:
        """A floor under bound(memory=False), cheap (no rows, no boxes): _throughput_floor at most num_layers/vpp
        stages, with the least work of the node's choices (_least_work). A root goes in line at it (``rough``) and
        back in line at its bound the first time it comes out (_PipelineSearch.step): on seed-5 suite job 10 it is
        at or above the best plan for 18,603 of the 20,246 roots, never bounded then (their bounds took 5.1 s of
        one process, their rough bounds 1.5 s)."""
        rows = self._heavy_rows(ctx)
        if not rows:
            return float("inf")
        return self._throughput_floor(ctx, rows, self.max_pp(ctx), self._least_work(ctx))

    def _least_work(self, ctx: MixedContext) -> float:
        """The least seconds the model's layers add to the stages' sum at the node's choices, as the rows count it
        (_schedule_bound): num_layers times the least per_layer_bound, or for a model with dense and MoE layers each
        kind at its least floor (_least_kind_work)."""
        choices = self._flat_choices(ctx)
        count = layer_counts(ctx.job.model)
        if not (count["dense"] and count["moe"]):
            return ctx.job.model.num_layers * min(self._terms(ctx, c)[0] for c in choices)
        return _least_kind_work(
            count, [kind_layer_bounds(ctx, g, tp, self.cp, self.mbs, self.base, self.ep) for g, tp in choices]
        )

    def _heavy_seconds(self, ctx: MixedContext, g: int, tp: int) -> float:
        """The least seconds per heavy layer (heavy_kind) of a stage of group g at this TP."""
        kinds = kind_layer_bounds(ctx, g, tp, self.cp, self.mbs, self.base, self.ep)
        return kinds[1] if kinds is not None else self._terms(ctx, (g, tp))[0]

    def _deepest(self, ctx: MixedContext, rows=None) -> int | None:
        """Where not every depth runs (_depths): the most stages a candidate of the node has, the deepest depth that
        takes its vpp and micro-batches within its stage counts (each used group at least one stage, each group at
        most its kmax at any of its choices); 0 where no such depth lies between them (as _Family._clip, for the
        families below the node); None where every depth runs (as _Family.deepest). ``rows``: the node's rows
        (_rows, without the None), where the caller has them. Memoized per root by the least and most stage counts
        (the rows' lo and most stages)."""
        if _depths(ctx, self.vpp, self.mb) is None:
            return None
        if rows is None:
            rows = [row for row in self._rows(ctx) if row is not None]
        least, most = sum(row[0][3] for row in rows), sum(row[3] for row in rows)
        key = ("deepest", least, most)
        hit = self.memo.get(key)
        if hit is None:
            span = _depth_span(_depths(ctx, self.vpp, self.mb), least, most)
            hit = self.memo[key] = 0 if span is None else span[1]
        return hit

    def _rows(self, ctx: MixedContext) -> tuple:
        """Every group's _row (None where it has none), as handed down (``rows``) or read once."""
        if self.rows is None:
            object.__setattr__(self, "rows", tuple(self._row(ctx, i) for i in range(len(ctx.order))))
        return self.rows

    def _row(self, ctx: MixedContext, i: int, choice="node") -> tuple | None:
        """Group i's row of the bound at ``choice`` (default: the node's; a TP, None for unused, or "free" while
        open): its box_bound terms (a, (emb, logits), send, lo, hi, relaxed), a used group at its one TP choice (at
        least one stage; relaxed False) or a group whose TP is still open relaxed (_free; relaxed: its choices as
        (stages, seconds per layer, sends), for whole_chunk_bottleneck), its _kind_row for a model with dense and
        MoE layers (else None), its Ends.row and the most stages of any of its choices (_deepest); None where the
        group has no stage (unused, or no TP option). Memoized per root (the nodes of a root share its rows)."""
        if choice == "node":
            choice = self.fixed[i] if i < len(self.fixed) else "free"
        key = ("row", i, choice)
        if key in self.memo:
            return self.memo[key]
        g = ctx.order[i]
        choices = tuple((g, tp) for tp in (self.tp_opts[i] if choice == "free" else (choice,)) if tp)
        stages = tuple(self.kmax_of[g][tp] for _, tp in choices)
        # what the row reads: an open row's terms but its sends are the same for every dp and vpp with these stage
        # limits (shared across roots); its sends, the least of its choices', and a fixed row's are the vpp chunks'
        # at this dp
        shared = (choices, stages, self.cp, self.mbs, self.base, self.ep)
        shared += () if choice == "free" else (self.dp, self.vpp)
        row = ctx.caches.node_rows.get(shared, False)
        if row is False:
            row = ctx.caches.node_rows[shared] = self._row_of(ctx, i, choices, stages, choice == "free")
        if row is not None and choice == "free":
            # the least of its choices' sends, and its choices (stages, seconds per layer, sends) for the whole-chunk
            # bottleneck (mixed_pipeline_bounds.whole_chunk_bottleneck), both at this dp and vpp
            picks = tuple((k, *self._terms(ctx, u)[::2]) for u, k in zip(choices, stages))
            terms = row[0]
            row = ((terms[0], terms[1], min(y for _, _, y in picks), *terms[3:], picks), *row[1:])
        self.memo[key] = row
        return row

    def _row_of(self, ctx: MixedContext, i: int, choices, stages, free: bool) -> tuple | None:
        if not choices:
            return None
        # (a free row's relaxed entry, its choices at this dp and vpp, is added by _row)
        terms = self._free(ctx, i) if free else (*self._terms(ctx, choices[0]), 1, stages[0], False)
        count = layer_counts(ctx.job.model)
        kinds = self._kind_row(ctx, choices, terms[4]) if count["dense"] and count["moe"] else None
        # the end terms at their least over the choices, each at its own seconds per layer: a free row's fastest
        # seconds with its least embedding would count the embedding as more layers than any choice's stage does
        ends = tuple(map(min, zip(*(Ends.row(*self._terms(ctx, u)[:2]) for u in choices))))
        return terms, kinds, ends, max(stages)

    def _choices(self, ctx: MixedContext) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
        """(index in ctx.order, (group, TP) choices) of each row of the node: a used group's one fixed choice, a
        group whose TP is still open its every TP (the unused groups, and those with no TP option, have none).
        Memoized per root by the fixed choices."""
        key = ("choices", self.fixed)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = tuple((i, row) for i in range(len(ctx.order)) if (row := self._row_choices(ctx, i)))
        return hit

    def _row_choices(self, ctx: MixedContext, i: int) -> tuple[tuple[int, int], ...]:
        """The (group, TP) choices of group i's row: its fixed TP, or every TP while it is open (none: unused, or
        open where no candidate under the node can use it: _open_unused)."""
        if i >= len(self.fixed) and self._open_unused(ctx):
            return ()
        tps = (self.fixed[i],) if i < len(self.fixed) else self.tp_opts[i]
        return tuple((ctx.order[i], tp) for tp in tps if tp)

    def _open_unused(self, ctx: MixedContext) -> bool:
        """Whether every candidate under the node leaves the groups whose TP is open unused: its fixed used groups
        have a stage each, and where a depth of that many stages is the deepest that takes the node's vpp and
        micro-batches (_depths), a stage more has none. (Seed-5 suite job 10, DeepSeek-V2 on four types: interleaved
        nodes at two micro-batches run at depth 2 only; of its 6,000 nodes with one group open, about 1,200 had two
        used groups fixed, their bounds as if the open group could still join: 23,644 -> 22,483 steps.)"""
        depths = _depths(ctx, self.vpp, self.mb)
        return depths is not None and sum(1 for tp in self.fixed if tp) >= depths[-1]

    def memory_floor(self, ctx: MixedContext) -> float:
        """The least bottleneck (seconds per micro-batch of the slowest stage) at which the node's groups hold the
        layers in memory, over the ZeRO stages (one for the whole pipeline), each group at any of its choices
        (_memory_rows): memory_floor, and kind_memory_floor for a model with dense and MoE layers, as
        _memory_floor for a family; inf where no ZeRO stage can hold them, 0 where a group has no depth-3 model.
        (The rooms by pipeline position, ZeroTerms.room, are left to the families: every stage here is taken at
        the last stage's in-flight count, the same for every vpp, so the rows serve all of a root's vpp, and so does
        the floor: memoized by what it reads, shared with the nodes of the same choices at other vpp.)"""
        return min(self._floors(ctx).values(), default=float("inf"))

    def memory_zeros(self, ctx: MixedContext) -> frozenset[int]:
        """The node's ZeRO stages whose memory may hold the layers: those whose floor (_floors) is finite, and
        ZeRO-0 where ZeRO-1 is one (its floor is not worked out: _memory_zeros)."""
        floors = self._floors(ctx)
        fit = {z for z, floor in floors.items() if floor < float("inf")}
        return frozenset(fit | ({0} if 0 in self.zeros and 1 in fit else set()))

    def _floors(self, ctx: MixedContext) -> dict[int, float]:
        """memory_floor by ZeRO stage (_memory_zeros), memoized by what it reads."""
        choices = tuple(c for _, c in self._choices(ctx))
        key = (choices, tuple(tuple(self.kmax_of[g][tp] for g, tp in c) for c in choices))
        key += (self.dp, self.cp, self.mbs, self.base, self.ep, _memory_zeros(self.zeros))
        floors = ctx.caches.memory_floors.get(key)
        if floors is None:
            floors = ctx.caches.memory_floors[key] = self._floors_of_choices(ctx, choices)
        return floors

    def _floors_of_choices(self, ctx: MixedContext, choices) -> dict[int, float]:
        """Per ZeRO stage, its memory floor; the kind floor only where the floor over the heavy layers is below the
        least of the ZeRO stages before it (it cannot lower the least floor), so a floor may be below its own
        (never above), and is inf only where the stage cannot hold the layers."""
        model, aon = ctx.job.model, ctx.opts.all_or_none_recompute
        zeros = _memory_zeros(self.zeros)
        floors, least = {}, float("inf")
        for zero, per_zero in zip(zeros, zip(*(self._memory_rows(ctx, c) for c in choices))):
            if any(row is None for row, _ in per_zero):
                return dict.fromkeys(zeros, 0.0)
            kinds = tuple(t for _, t in per_zero)
            rows = tuple(row for row, _ in per_zero)
            floors[zero] = _memory_floors(model, rows, None if None in kinds else kinds, least, aon)
            least = min(least, floors[zero])
        return floors

    def _memory_rows(self, ctx: MixedContext, choices) -> tuple[tuple[tuple | None, tuple | None], ...]:
        """Per ZeRO stage, (memory_floor group, kind_memory_floor group) of a row standing for its (group, TP)
        choices, each choice with its most stages, each stage as if no stage followed it (memory_terms and
        kind_times only fall with stages after them): the choices as (stages, roomiest stage's memory terms)
        (None where a choice has no depth-3 model), and for a model with dense and MoE layers as (stages,
        kind_times) (else None), memoized."""
        stages = tuple(self.kmax_of[g][tp] for g, tp in choices)
        zeros = _memory_zeros(self.zeros)
        key = (choices, stages, self.dp, self.cp, self.mbs, self.base, self.ep, zeros)
        hit = ctx.caches.memory_rows.get(key)
        if hit is None:
            out = []
            for zero in zeros:
                alts, times = [], []
                for (g, tp), k in zip(choices, stages):
                    z = self._zero_terms(ctx, g, tp, zero)
                    alts.append((k, z.memory_terms(0)))
                    times.append((k, z.kind_times(0)))
                row = None if any(t is None for _, t in alts) else tuple(alts)
                kinds = None if any(t is None for _, t in times) else tuple(times)
                out.append((row, kinds))
            hit = ctx.caches.memory_rows[key] = tuple(out)
        return hit

    def _kind_mix(self, ctx: MixedContext, kind_rows) -> KindMix | None:
        """The KindMix of the rows (None for a model with one kind), each row standing for its (group, TP) choices
        (``kind_rows``: their _kind_row), the least MoE-to-dense ratio over every choice, the least seconds of each
        kind for the work, and no end terms (they only add). Its ``lead`` (where the model's leading dense layers
        end, in any order: KindMix.lead) is read where every TP is fixed (box_bound's moe_split: the stages past
        it hold MoE layers only, each at its MoE layer's seconds), as the node's open family reads it: on seed-5
        suite job 13 (GLM-4.5-Air on four types) 3,160 of the 28,570 bounds of such nodes then reached the K-th
        best, which their families' bounds (about 1 ms each) had cut before; its steps 34,620 -> 26,542, one
        process 35.5 -> 29.4 s (two runs each, alternating). Those bounds cost more (28,570 of them 3.55 -> 5.19
        s; seed-1 job 43, 20,548: 2.42 -> 2.70 s, its steps 19,116 -> 18,682)."""
        count = layer_counts(ctx.job.model)
        D, E = count["dense"], count["moe"]
        if not D or not E:
            return None
        dense, moe, ratio, x_min, y_min = zip(*kind_rows)
        work = _least_kind_work(count, zip(x_min, y_min))
        lead = moe_lead(ctx.job.model.all_moe_from, D + E)
        return KindMix(
            dense, _NO_ENDS, D + min(ratio) * E, work, moe=moe, moe_layers=E, moe_from=D + E, lead=lead, moe_least=y_min
        )

    def _kind_row(self, ctx: MixedContext, choices, hi: float) -> tuple[float, ...]:
        """(dense, MoE seconds per layer at which the row's hi stages have the best throughput of its choices (hi /
        x = the most k_tp / x_tp), least MoE-to-dense ratio, least dense and MoE seconds) of a row standing for
        its (group, TP) choices (memoized with the row: _row)."""
        kinds = [kind_layer_bounds(ctx, g, tp, self.cp, self.mbs, self.base, self.ep) for g, tp in choices]
        stages = [self.kmax_of[g][tp] for g, tp in choices]
        return (
            hi / max(k / x for (x, _), k in zip(kinds, stages)),
            hi / max(k / y for (_, y), k in zip(kinds, stages)),
            min(y / x for x, y in kinds),
            min(x for x, _ in kinds),
            min(y for _, y in kinds),
        )

    def families(
        self, ctx: MixedContext, target: float = float("inf"), tails: tuple[TailTrial, ...] | None = None
    ) -> list[tuple[float, _TpChoiceNode | _Family, tuple | None]]:
        """The next group's choices (each a _TpChoiceNode, bounded with ``tails``: bound); with every choice fixed,
        the family itself, its bound worked out in full only where it is below ``target`` (_Family.bound)."""
        L = ctx.job.model.num_layers
        if len(self.fixed) == len(ctx.order):
            used = tuple((g, tp) for g, tp in zip(ctx.order, self.fixed) if tp)
            terms = [self._terms(ctx, u) for u in used]
            zts = tuple(tuple(self._zero_terms(ctx, g, tp, zero) for g, tp in used) for zero in self.zeros)
            fam = _Family(
                self.dp,
                self.cp,
                self.mbs,
                self.zeros,
                self.base,
                used,
                tuple(x[0] for x in terms),
                tuple(x[1] for x in terms),
                self.mb,
                tuple(x[2] for x in terms),
                ordered=False,
                ep=self.ep,
                vpp=self.vpp,
                zts=zts,
                depths=_depths(ctx, self.vpp, self.mb),
                **_kinds(ctx, used, self),
            )
            box = (1,) * len(used), tuple(self.kmax_of[g][tp] for g, tp in used)
            return [(fam.bound(L, *box, target), fam, box)]
        out = []
        i = len(self.fixed)
        last = i + 1 == len(ctx.order)
        rows = self._rows(ctx)
        for tp in self.tp_opts[i]:
            fixed = self.fixed + (tp,)
            used = tuple((g, t) for g, t in zip(ctx.order, fixed) if t)
            if (last and not used) or (used and not _uniform_ok(ctx, used)):
                continue
            node = _TpChoiceNode(
                self.dp,
                self.cp,
                self.mbs,
                self.base,
                self.zeros,
                self.mb,
                self.tp_opts,
                self.kmax_of,
                fixed,
                self.ep,
                self.vpp,
                memo=self.memo,
                rows=rows[:i] + (self._row(ctx, i, tp),) + rows[i + 1 :],
            )
            out.append((node.bound(ctx, target, memory=False, tails=tails), node, None))
        return out


@dataclass(frozen=True)
class _Family:
    """Everything of a candidate but its stage counts per used group (which range over boxes lo..hi). An open
    family (``ordered`` False) also leaves the groups' pipeline order and the ZeRO stage open."""

    dp: int
    cp: int
    mbs: int
    zeros: tuple[int, ...]
    base: str
    used: tuple[tuple[int, int], ...]  # (group, tp) in pipeline order
    a: tuple[float, ...]  # per-layer seconds bound of each used group
    ends: tuple[tuple[float, float], ...]  # (embedding, logits) seconds per micro-batch on each used group
    mb: int
    send: tuple[float, ...]  # pipeline-send seconds per micro-batch of a stage of each used group (all its chunks)
    ordered: bool = True  # False: order and ZeRO stage still open (expand before splitting boxes)
    zero: int | None = None  # the ZeRO stage of an ordered family
    zt: tuple[ZeroTerms, ...] = ()  # what it adds per used group
    ep: int = 1  # the EP degree of every stage
    vpp: int = 1  # model chunks per stage (interleaved schedule)
    zts: tuple[tuple[ZeroTerms, ...], ...] = ()  # an open family: zt of each of its ZeRO stages (used-group order)
    depths: tuple[int, ...] | None = None  # the depths that take its vpp and micro-batches (_depths), ascending
    # a model with dense and MoE layers: (dense, MoE) least seconds per layer of each used group, and (D, E) counts
    kinds: tuple[tuple[float, float], ...] | None = None
    kind_counts: tuple[int, int] = (0, 0)
    moe_from: int | None = None  # ModelSpec.all_moe_from of such a model
    # such a model whose MoE layers are interleaved with its dense ones, at vpp 1: where they sit (the box bounds'
    # sequence check: box_sequence_holds)
    runs: LayerRuns | None = None
    # an open family of one ZeRO stage: the used groups (indices into used) that lead its pipeline order, in that
    # order, and the one that ends it (open_ends: the order opens its first group, then its last); the others sit
    # between them in any order
    prefix: tuple[int, ...] = ()
    last: int | None = None

    def __getstate__(self) -> dict:
        """Pickled for the other share (_pickle_nodes): the fields only; the cached terms are worked out again
        there (one of them is keyed by object identity, which another process does not share)."""
        names = {f.name for f in dataclasses.fields(self)}
        return {k: v for k, v in self.__dict__.items() if k in names}

    @functools.cached_property
    def deepest(self) -> int | None:
        """The most stages a candidate of the family has where not every depth runs (the deepest of its depths),
        else None."""
        return self.depths[-1] if self.depths else None

    @functools.cached_property
    def lead(self) -> int | None:
        """KindMix.lead of the family: the model's leading dense layers' end (moe_from) where a later position
        holds MoE layers only, else None."""
        return None if self.moe_from is None else moe_lead(self.moe_from, sum(self.kind_counts))

    @functools.cached_property
    def firsts(self) -> tuple[int, ...]:
        """The used groups (indices into used) that may come first in pipeline order: an open family's first
        prefix group where it has one, else all (an ordered family's first)."""
        if self.ordered:
            return (0,)
        return self.prefix[:1] or tuple(range(len(self.used)))

    @functools.cached_property
    def lasts(self) -> tuple[int, ...]:
        """The used groups (indices into used) that may come last in pipeline order: all but an open family's
        prefix, or its last where known (an ordered family's last)."""
        if self.ordered:
            return (len(self.used) - 1,)
        return (self.last,) if self.last is not None else self.free

    @functools.cached_property
    def free(self) -> tuple[int, ...]:
        """The used groups whose place in an open family's order is open: neither in its prefix nor its last."""
        return tuple(i for i in range(len(self.used)) if i not in self.prefix and i != self.last)

    @functools.cached_property
    def bound_ends(self) -> Ends:
        return self._ends(self.a, self.ends)

    def _ends(self, a, ends) -> Ends:
        """The end terms of the used groups' per-layer seconds ``a`` and (embedding, logits) seconds ``ends``: in
        pipeline order, or with the order open each at its least over the groups that may come first and last."""
        if self.ordered:
            return Ends.of(a, ends, 0, len(a) - 1)
        return Ends.partial(a, ends, self.firsts, self.lasts, self.prefix, self.last)

    def open_afters(self, lo) -> list[int]:
        """The least stages after each used group's stages in every order an open family stands for: its prefix
        groups have the later prefix groups' and every other group's lo after them, a group between the prefix
        and a known last the last's lo, the others none."""
        afters = [0] * len(self.used)
        if self.last is not None:
            for i in self.free:
                afters[i] = lo[self.last]
        after = sum(lo[i] for i in range(len(self.used)) if i not in self.prefix)
        for i in reversed(self.prefix):
            afters[i] = after
            after += lo[i]
        return afters

    def _lined(self, zt: tuple[ZeroTerms, ...]) -> tuple[tuple[float, ...], tuple[tuple[float, float], ...]]:
        """(per-layer seconds, (embedding, logits) seconds) of the used groups with zt's ZeRO-2/3 traffic lines
        added (ZeroTerms: valid for two or more stages)."""
        a = tuple(x + z.slope for x, z in zip(self.a, zt))
        return a, tuple((e + z.first, lg + z.last) for (e, lg), z in zip(self.ends, zt))

    def kind_mix(self, zt: tuple[ZeroTerms, ...] = (), ordered: bool = True) -> KindMix | None:
        """The KindMix of the used groups (None for a model with one kind), with zt's ZeRO-2/3 lines added to both
        kinds and the end stages as in ``_lined`` (for two or more stages)."""
        if self.kinds is None:
            return None
        moe_from = self.moe_from if ordered else None  # positions are known in pipeline order only
        if not zt:
            none = (0.0,) * len(self.kinds)
            return KindMix.of(self.kinds, none, self.ends, self.kind_counts, ordered, None, moe_from, self.lead)
        # each kind its own slope where the group has them (ZeroTerms.slopes)
        dense = [z.slopes[0] for z in zt]
        moe = [z.slopes[1] for z in zt]
        return KindMix.of(self.kinds, dense, self._lined(zt)[1], self.kind_counts, ordered, moe, moe_from, self.lead)

    @functools.cached_property
    def mixes(self) -> tuple[KindMix | None, KindMix | None]:
        """kind_mix of an ordered family with one stage, and with two or more (its ZeRO stage's lines)."""
        return self.kind_mix(), self.kind_mix(self.zt)

    @functools.cached_property
    def sharded(self) -> tuple[tuple[float, ...], Ends]:
        """Per-layer seconds and ends with the ZeRO-2/3 traffic lines (ZeroTerms), for two or more stages."""
        a, ends = self._lined(self.zt)
        return a, Ends.of(a, ends, 0, len(a) - 1)

    def bound(self, L: int, lo, hi, target: float = float("inf")) -> float:
        """box_bound of the stage-count box lo..hi, in the schedule of vpp chunks per stage, and inf when the
        groups' GPUs cannot hold the layers at their in-flight micro-batches (ZeroTerms.room, at this vpp). The
        memory bottleneck (_memory_floor) is only worked out when the bound without it is below ``target``."""
        v = self.vpp
        if self.depths is not None:
            lo, hi = self._clip(lo, hi)
            if lo is None:
                return float("inf")
        if not self.ordered:
            return self._open_bound(L, lo, hi, target)
        after, room, afters = 0, 0.0, []
        for z, k_lo, k_hi in zip(reversed(self.zt), reversed(lo), reversed(hi)):
            room += z.room(after, k_hi, v)  # group j's stages have at least the lo stages of later groups after them
            afters.append(after)
            after += k_lo
        if room < L:
            return float("inf")
        a, ends = (self.a, self.bound_ends) if sum(lo) < 2 else self.sharded  # (two or more: ZeRO-2/3 traffic)
        mix = self.mixes[sum(lo) >= 2]
        value = self._zero_stage_bound(self.zt, afters[::-1], a, ends, mix, L, lo, hi, target)
        if value < target and not self._holds_in_place(self.zt, mix, L, lo, hi, target):
            return max(target, value)
        return value

    @functools.cached_property
    def orders(self) -> tuple[tuple[int, ...], ...]:
        """The pipeline orders of the used groups (indices into used) the family stands for: its own, or an open
        family's prefix, then every order of its free groups, then its last where known."""
        if self.ordered:
            return (tuple(range(len(self.used))),)
        end = () if self.last is None else (self.last,)
        return tuple((*self.prefix, *rest, *end) for rest in itertools.permutations(self.free))

    @functools.cached_property
    def in_place(self) -> bool:
        """Whether the family's boxes are checked with their layers in their places (_holds_in_place): a model whose
        MoE layers interleave with its dense ones at vpp 1 (``runs``), two or more micro-batches (a schedule that
        grows with the bottleneck), and an ordered family or an open one of at most SEQUENCE_ORDERS orders."""
        return self.runs is not None and self.mb >= 2 and len(self.orders) <= SEQUENCE_ORDERS

    def _holds_in_place(self, zt, mix: KindMix | None, L: int, lo, hi, target: float) -> bool:
        """Whether a candidate of the box at one ZeRO stage (``zt``, and its KindMix ``mix``) may still beat
        ``target`` with its layers in their places: the schedule reaches the target at the bottleneck where
        (micro-batches - 1) of it plus the least work (each kind at its least seconds, the sends of the lo stages, the
        embedding and the logits) and the least largest DP tail come to it (schedule_probe), and where in no order
        the family stands for the stages can hold the layers as runs in their places within it (box_sequence_holds)
        none can. True where the family is not checked so (in_place)."""
        if not self.in_place or mix is None or target == float("inf"):
            return True
        sends = self.send if pipeline_sends(lo, self.vpp) else (0.0,) * len(lo)
        ends = self._lined(zt)[1] if sum(lo) >= 2 else self.ends  # ((embedding, logits) of each used group)
        tail = self._box_tail(zt, lo, hi, L) if sum(lo) >= 2 else 0.0
        work = mix.work + sum(k * y for k, y in zip(lo, sends)) + tail
        for order in self.orders:
            emb, logits = ends[order[0]][0], ends[order[-1]][1]
            probe = schedule_probe(target, work + emb + logits, self.mb)

            def pick(xs, order=order):
                return tuple(xs[i] for i in order)

            x, y, c = pick(mix.dense), pick(mix.moe), pick(sends)
            if box_sequence_holds(self.runs, x, y, c, pick(lo), pick(hi), emb, logits, probe):
                return True
        return False

    def _zero_stage_bound(self, zt, afters, a, ends, mix, L: int, lo, hi, target: float) -> float:
        """box_bound of a box at one ZeRO stage (the used groups' ``zt``), with two or more stages plus the largest
        DP tail of the stages (bounded together with the schedule: BoxTails), raised by the memory floor of group
        j's stages with at least afters[j] stages after them; the tail and memory terms only where the bound
        without them is below ``target`` (the tail terms are worked out when first read). The one rule of an
        ordered family's bound and of an open one's at each of its ZeRO stages."""
        v = self.vpp
        args = (a, lo, hi, ends, L, self.mb, self.send, v)
        kw = {"mix": mix, "whole": True, "max_stages": self.deepest}
        if sum(lo) >= 2:  # the schedule and the largest DP tail bounded together (box_schedule_with_tail)
            kw["tails"] = lambda: BoxTails(
                self._reaches(zt), self._levels(zt), self._box_tail(zt, lo, hi, L), self._moe_reaches(zt)
            )
        plain, reach = box_bound_reach(*args, **kw, target=target)
        if plain >= target:
            return plain
        sends = pipeline_sends(lo, v)
        last = self.lasts[0] if len(self.lasts) == 1 else None  # (the group holding the logits, where known)
        key = ("memory", id(zt), tuple(afters), hi, sends, last)
        floor = self._box_memo.get(key)
        if floor is None:
            logits = 0.0 if last is None else self.ends[last][1]
            floor = self._box_memo[key] = _memory_floor(zt, afters, hi, v, self.send if sends else None, logits, last)
        if floor == float("inf"):
            return floor
        if floor < reach:  # (below its reach the floor changes nothing)
            return plain
        return box_bound(*args, floor=floor, **kw)

    def _clip(self, lo, hi):
        """The box narrowed to the depths that take the family's vpp and micro-batches (_depths): with P = sum k
        between the least such depth >= sum(lo) and the largest <= sum(hi), group g has at least that least depth
        less the others' hi and at most the largest less the others' lo; (None, None) when no such depth lies in
        the box."""
        low, high = sum(lo), sum(hi)
        span = _depth_span(self.depths, low, high)
        if span is None:
            return None, None
        pmin, pmax = span
        new_lo = tuple(max(a, pmin - (high - b)) for a, b in zip(lo, hi))
        new_hi = tuple(min(b, pmax - (low - a)) for a, b in zip(lo, hi))
        if any(a > b for a, b in zip(new_lo, new_hi)):
            return None, None
        return new_lo, new_hi

    def _open_bound(self, L: int, lo, hi, target: float = float("inf")) -> float:
        """The bound of an open family, valid for every group order it stands for and every ZeRO stage: per ZeRO
        stage, the ordered bound with each end term at its least over the groups that may come first and last
        (Ends.any_order, Ends.partial) and each group's memory room with the fewest stages after it those orders
        allow (open_afters; the most it can hold: ZeroTerms.room only falls with stages after it); the least over
        the ZeRO stages (_zero_bound)."""
        v = self.vpp
        plain_mix, lined = self.open_terms
        if not self.zts:
            return box_bound(
                self.a,
                lo,
                hi,
                self.bound_ends,
                L,
                self.mb,
                self.send,
                v,
                mix=plain_mix,
                whole=True,
                max_stages=self.deepest,
            )
        best = float("inf")
        below = []  # the ZeRO stages whose bound is below the target
        for i in self.bounded_zeros:
            value = self._zero_bound(self.zts[i], lined[i], L, lo, hi, min(best, target))
            best = min(best, value)
            if value < target:
                below.append(i)
        if below and self.in_place:
            # cut where each of them is, by its layers' places in every order (_holds_in_place)
            mixes = [lined[i][2] if sum(lo) >= 2 else plain_mix for i in below]
            if not any(self._holds_in_place(self.zts[i], mix, L, lo, hi, target) for i, mix in zip(below, mixes)):
                return max(target, best)
        return best

    @functools.cached_property
    def bounded_zeros(self) -> tuple[int, ...]:
        """The indices of the ZeRO stages (zts) _open_bound works out: those no other covers (uncovered; seed-5
        suite job 13: ZeRO-1 covers ZeRO-0 in every open family with both, 3.0 s of 28 s of steps in one
        process)."""
        return uncovered(self.zts, self.vpp)

    def _zero_bound(self, zt, terms, L: int, lo, hi, target: float) -> float:
        """_open_bound's bound at one ZeRO stage (zt, and its open_terms ``terms``): its memory and DP tail terms
        only where the bound without them is below ``target``. Memoized with the target it was worked out for
        (by_zero's families share the memo: each ZeRO stage's bound is worked out once where it was in full, below
        its target, or where it reaches the new one)."""
        key = ("zero bound", id(zt), lo, hi, self.prefix, self.last)
        hit = self._box_memo.get(key)
        if hit is not None and (hit[0] < hit[1] or hit[0] >= target):
            return hit[0]
        value = self._box_memo[key] = self._zero_bound_of(zt, terms, L, lo, hi, target), target
        return value[0]

    def _zero_bound_of(self, zt, terms, L: int, lo, hi, target: float) -> float:
        afters = self.open_afters(lo)
        if sum(z.room(after, k_hi, self.vpp) for z, after, k_hi in zip(zt, afters, hi)) < L:
            return float("inf")
        a, ends, mix = (self.a, self.bound_ends, self.open_terms[0]) if sum(lo) < 2 else terms
        if self.prefix and mix is not None and mix.moe and self.lead is not None:
            a, ends = self._past_lead(zt, a, ends, mix, lo)
        return self._zero_stage_bound(zt, afters, a, ends, mix, L, lo, hi, target)

    def _past_lead(self, zt, a, ends: Ends, mix: KindMix, lo) -> tuple[tuple[float, ...], Ends]:
        """An open family's per-layer seconds ``a`` (with zt's lines) with each group whose stages all sit past the
        model's leading dense layers at its MoE layer's seconds (mixed_pipeline_bounds.moe_only_rates, at the
        least position of the group's first stage in the orders the family stands for: first_positions), and the
        end terms at them."""
        rates = moe_only_rates(a, mix, first_positions(lo, lo, self.prefix, self.last), self.lead)
        return (a, ends) if rates is a else (rates, self._ends(rates, self._lined(zt)[1]))

    def by_zero(self) -> list[_Family]:
        """The open family once per ZeRO stage (its order still open), each bounded by _open_bound like this one:
        it starts with this family's terms of its stage (open_terms, the DP tail levels), not working them out
        again."""
        plain_mix, lined = self.open_terms
        out = []
        for z, zt, terms in zip(self.zeros, self.zts, lined):
            child = dataclasses.replace(self, zeros=(z,), zts=(zt,))
            child.__dict__.update(open_terms=(plain_mix, [terms]), _box_memo=self._box_memo)  # (cached props)
            out.append(child)
        return out

    @functools.cached_property
    def open_terms(self) -> tuple[KindMix | None, list[tuple]]:
        """What _open_bound reads that does not depend on the box: the KindMix of one stage, and per ZeRO stage
        (zts) the per-layer seconds, ends at their least over the groups that may come first and last and KindMix
        of two or more (its ends so too, at its dense layers' seconds)."""
        lined = []
        for zt in self.zts:
            a, ends = self._lined(zt)
            mix = self.kind_mix(zt, ordered=False)
            if mix is not None and self.prefix:
                mix = mix._replace(ends=self._ends(mix.dense, ends))
            lined.append((a, self._ends(a, ends), mix))
        return self.kind_mix(ordered=False), lined

    @functools.cached_property
    def tail(self) -> float:
        return self._tail(self.zt)

    def _tail(self, zt: tuple[ZeroTerms, ...]) -> float:
        """The DP tail floor of the used groups at the family's vpp: the largest of their least tails."""
        return max(z.tail(self.vpp) for z in zt)

    def _box_tail(self, zt: tuple[ZeroTerms, ...], lo, hi, L: int) -> float:
        """The DP tail floor of a box of two or more stages: _tail; the tails of the pipeline's first stage (it
        holds the embedding, and with at least sum(lo) - 1 stages after it, few layers) and of its last (the
        logits; past the leading dense layers, MoE layers only), on the first and last group in pipeline order, or
        on the groups that may come first and last while the order is open (ZeroTerms.end_tails); and the least
        largest tail at which at most hi stages per group hold the layers (mixed_pipeline_bounds.tail_bottleneck;
        an open family's prefix places its groups: split_rows). Memoized: the ends by the box's least depth and
        first group, the rest by hi (a halved box keeps its parent's in one half)."""
        split = split_rows(lo, hi, self.lead, self.ordered, self.prefix, self.last) if self.kinds is not None else None
        key = ("tail", id(zt), hi if split is None else split)
        hit = self._box_memo.get(key)
        if hit is None:
            reaches, levels = self._reaches(zt), self._levels(zt)
            bottleneck = tail_bottleneck(reaches, hi, L, levels, self.vpp, self.deepest)
            if split is not None:  # (box_bound's rows: MoE-only stages at their own reaches)
                rows, _, his = split
                split_reaches = row_reaches(reaches, self._moe_reaches(zt), rows)
                tail = tail_bottleneck(split_reaches, his, L, levels, self.vpp, self.deepest)
                bottleneck = max(bottleneck, tail)
            hit = self._box_memo[key] = max(self._tail(zt), bottleneck)
        key = ("ends", id(zt), sum(lo), self.prefix[:1], self.last)
        ends = self._box_memo.get(key)
        if ends is None:
            each = [z.end_tails(sum(lo) - 1, self.vpp) for z in zt]
            ends = max(min(each[i][0] for i in self.firsts), min(each[i][1] for i in self.lasts))
            self._box_memo[key] = ends
        return max(hit, ends)

    def _levels(self, zt: tuple[ZeroTerms, ...]) -> list[float]:
        """merged_levels of the used groups' DP tail reaches (the same for every box of the family: its zt are its
        own), memoized."""
        levels = self._box_memo.get(id(zt))
        if levels is None:
            moe = [r for r in self._moe_reaches(zt) if r is not None]
            levels = self._box_memo[id(zt)] = merged_levels([*self._reaches(zt), *moe])
        return levels

    def _reaches(self, zt: tuple[ZeroTerms, ...]) -> tuple:
        """The used groups' DP tail reaches (ZeroTerms.reach) at the family's vpp, memoized (read by every box
        bound with the tails, and by _levels and _box_tail)."""
        key = ("reaches", id(zt))
        hit = self._box_memo.get(key)
        if hit is None:
            hit = self._box_memo[key] = tuple(z.reach(self.vpp) for z in zt)
        return hit

    def _moe_reaches(self, zt: tuple[ZeroTerms, ...]) -> tuple:
        """The used groups' DP tail reaches of a stage past the leading dense layers (ZeroTerms.moe_reach; None
        where a group has none) at the family's vpp, memoized."""
        key = ("moe reaches", id(zt))
        hit = self._box_memo.get(key)
        if hit is None:
            hit = self._box_memo[key] = tuple(z.moe_reach(self.vpp) for z in zt)
        return hit

    @functools.cached_property
    def _box_memo(self) -> dict:
        """What the family's boxes share, by the identity of one of its zt (its ZeRO stage's terms): their DP tail
        reaches (_reaches) and the merged_levels of them, and the tail (_box_tail) and memory floor
        (_zero_stage_bound) of a box by its hi (and the stages after each group)."""
        return _Memo()

    def opened(self) -> list[_Family]:
        """The open families an open family opens into before its orders (expand), each bounded like it (empty
        where it opens its orders): one per ZeRO stage (by_zero); with one, and more than OPEN_ALL groups, one per
        first group and then one per last group (open_ends)."""
        if len(self.zeros) > 1:
            return self.by_zero()
        if len(self.used) > OPEN_ALL and (not self.prefix or self.last is None):
            return self.open_ends()
        return []

    def open_ends(self) -> list[_Family]:
        """The open family (of one ZeRO stage) once per group that may come first in pipeline order, or where its
        first is known, once per group that may come last, each bounded by _open_bound for the orders that start
        (end) so: its first group carries the embedding and has every other group's stages after it (its memory
        room and DP tails at that depth), its last the logits, after every other group. Its boxes and the terms
        that do not depend on the order are shared with this family (the same zts, _box_memo)."""
        out = []
        for g in self.free:
            child = dataclasses.replace(self, prefix=(g,)) if not self.prefix else dataclasses.replace(self, last=g)
            child.__dict__.update(_box_memo=self._box_memo)  # (a cached property)
            out.append(child)
        return out

    def expand(self, ctx: MixedContext, lo, hi) -> list[tuple[_Family, tuple]]:
        """Every pipeline order of the used groups that starts with the prefix (and ends on the last, where known),
        at every ZeRO stage, each with its box (the groups' counts follow them)."""
        out = []
        terms = dict(zip(self.zeros, self.zts))  # each ZeRO stage's terms of the used groups
        for perm in self.orders:

            def pick(xs, perm=perm):
                return tuple(xs[i] for i in perm)

            used, a, ends, send = pick(self.used), pick(self.a), pick(self.ends), pick(self.send)
            box = pick(lo), pick(hi)
            for zero in self.zeros:
                fam = _Family(
                    self.dp,
                    self.cp,
                    self.mbs,
                    self.zeros,
                    self.base,
                    used,
                    a,
                    ends,
                    self.mb,
                    send,
                    ordered=True,
                    zero=zero,
                    zt=pick(terms[zero]),
                    ep=self.ep,
                    vpp=self.vpp,
                    depths=self.depths,
                    kinds=None if self.kinds is None else pick(self.kinds),
                    kind_counts=self.kind_counts,
                    moe_from=self.moe_from,
                    runs=self.runs,
                )
                out.append((fam, box))
        return out

    def candidates(self, ctx: MixedContext, ks, lb: float) -> list[HeteroCandidate]:
        """The candidate of one stage-count choice if it is in the space: at most one stage per layer, the
        interleaving rule at this depth (planner.parallel.vpp_options, as the homogeneous search asks it: stages
        of whole chunks, micro-batches in rounds of pp), and the framework's limits, asked with each stage's own TP
        (some read it together with EP)."""
        P = sum(ks)
        L = ctx.job.model.num_layers
        v = self.vpp
        if P > L or (ctx.opts.even_layers and L % (P * v)) or v not in depth_vpp_options(L, P, self.mb):
            return []
        if ctx.fw is not None:
            degrees = {"pp": P, "zero": self.zero, "cp": self.cp, "ep": self.ep, "dp": self.dp, "recompute": self.base}
            for tp in sorted({tp for _, tp in self.used}):
                if not ctx.fw.allows(**degrees, vpp=v, tp=tp, microbatches=self.mb, sequence_parallel=tp > 1):
                    return []
        groups = tuple((g, tp, k) for (g, tp), k in zip(self.used, ks))
        return [HeteroCandidate(self.dp, self.cp, self.mbs, self.zero, self.base, groups, lb, self.ep, v)]


_NO_ENDS = Ends(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, ordered=False)  # (_TpChoiceNode._kind_mix: the ends only add)


@dataclass
class TailTrial:
    """Whether a share's TP-choice nodes of one level (how many groups' TP is still open) count the ZeRO traffic
    and DP tails in their bound when put in line (_TpChoiceNode._lined_tail_bound): the tails cost what the
    families under them may never read, and pay only where the DP tails or the ZeRO-2/3 traffic are large against
    the schedule. Worked out while at least TAIL_PAYS of the nodes it was worked out for (against a finite target)
    were cut by it, and else for every TAIL_PROBE-th node still, so that the count follows the search. Counted per
    share, in its own order, so the answer is the same in one process or two."""

    calls: int = 0
    tries: int = 0
    cuts: int = 0

    def pays(self) -> bool:
        self.calls += 1
        return self.cuts >= TAIL_PAYS * self.tries or self.calls % TAIL_PROBE == 0

    def tell(self, cut: bool) -> None:
        self.tries += 1
        self.cuts += cut


TAIL_PAYS = 0.1
TAIL_PROBE = 64
# The most groups whose TP is still open at a node that counts the ZeRO traffic and DP tails (_lined_tail_bound):
# each open group's tail row reads the tails of every TP choice of it, which the families under the node mostly
# never read. At every level, seed-5 suite job 10 took 10,336 steps instead of 14,700, but seed-7 job 16 worked out
# 10,742 tails (4.5 s of 24 s, one process) for the cuts of 312 nodes with two or three groups open.
TAIL_OPEN = 1


def _within_depth(deepest: int, lo, hi, relaxed) -> tuple[tuple, tuple]:
    """A TP-choice node's box rows (hi, relaxed) under the deepest depth its candidates run (_deepest): a used group
    has at most that many stages less one of each other used group's, and a group whose TP is open, which is not
    among lo, at most deepest - sum(lo) at any of its choices."""
    most = deepest - sum(lo) + 1
    hi = tuple(k if r else min(k, most) for k, r in zip(hi, relaxed))
    relaxed = tuple(tuple((min(k, most - 1), x, y) for k, x, y in r) if r else r for r in relaxed)
    return hi, relaxed


def _least_kind_work(count: dict, floors) -> float:
    """The least seconds a model's dense and MoE layers (``count``: layer_counts) add to the stages' sum: each kind's
    layers at the least of its seconds over ``floors``, (dense, MoE) seconds per layer of each choice."""
    dense, moe = zip(*floors)
    return count["dense"] * min(dense) + count["moe"] * min(moe)


class MemoryTrial(TailTrial):
    """Whether a share puts a TP-choice node with every TP fixed back in line at its bound with the groups' memory
    (and ZeRO-2/3 traffic: _TpChoiceNode.bound) before it builds the node's family, or builds it at once: the family's
    own bound counts both, and the step in between pays only where it cuts. By TailTrial's rule (while at least
    TAIL_PAYS of the nodes it was worked out for were cut by it, else every TAIL_PROBE-th node), counted once the
    share knows a plan: before, nothing is cut, and the node goes back in line at that bound, which orders the line
    (seed-1 job 43, counted from its start, turned it off before its first plan: 81% of its nodes are cut by it).
    (Seed-5 suite job 13: 230 of 8,377 cut, 2.0 s; seed-4 job 4: 2,101 of 3,282, job 19: 77 of 505.)"""


def _kinds(ctx: MixedContext, used, node: _TpChoiceNode) -> dict:
    """_Family's kinds and kind_counts for its used (group, TP) pairs, for a model with dense and MoE layers."""
    kinds = [kind_layer_bounds(ctx, g, tp, node.cp, node.mbs, node.base, node.ep) for g, tp in used]
    if any(k is None for k in kinds):
        return {}
    count = layer_counts(ctx.job.model)
    counts = (count["dense"], count["moe"])
    model = ctx.job.model
    runs = ctx.layer_runs if model.all_moe_from == model.num_layers and node.vpp == 1 else None
    return {"kinds": tuple(kinds), "kind_counts": counts, "moe_from": model.all_moe_from, "runs": runs}


def _memory_floor(
    zt: tuple[ZeroTerms, ...], afters, his, v: int, sends=None, logits: float = 0.0, last: int | None = None
) -> float:
    """mixed_pipeline_bounds.memory_floor over the used groups' stages: group j with at most his[j] stages, the
    last with at least afters[j] stages after it and each one before it one more (ZeroTerms.stage_runs: each run
    of stages at its in-flight count, memory_terms); 0 (no floor) where a group has no depth-3 model. The heavy
    layers are the MoE layers of an MoE model, else all; a model with dense and MoE layers also counts both
    (mixed_pipeline_bounds.kind_memory_floor over ZeroTerms.kind_times: the dense layers' activations need room
    too), each stage's layers there taking at least what its stage surely adds besides them: ``sends`` (each
    group's stages', two or more stages) and ``logits`` (the pipeline's last stage, on group ``last``: an ordered
    family's last group, or an open family's where known; afters[last] is then 0)."""
    if not zt or any(z.sm is None for z in zt):
        return 0.0
    runs = []  # (terms, stages, after of the run's last stage, seconds each of its stages adds)
    for j, (z, after, k) in enumerate(zip(zt, afters, his)):
        c = sends[j] if sends is not None else 0.0
        for n, first in z.stage_runs(after, k, v):
            if logits and j == last and first == after:  # the pipeline's last stage
                runs.append((z, 1, first, c + logits))
                n -= 1
            if n:
                runs.append((z, n, first, c))
    rows = tuple(((n, z.memory_terms(first, v)),) for z, n, first, _ in runs)
    times = [z.kind_times(first, v) for z, _, first, _ in runs]
    kind_rows = None if None in times else tuple(((n, t, c),) for (_, n, _, c), t in zip(runs, times))
    return _memory_floors(zt[0].sm.job.model, rows, kind_rows, all_or_none=zt[0].all_or_none)


def _memory_floors(model, rows, kind_rows, below: float = float("inf"), all_or_none: bool = False) -> float:
    """The memory floor of ``rows`` (memory_floor over the heavy layers), raised where it is below ``below`` by the
    kind floor of ``kind_rows`` (kind_memory_floor, for a model with dense and MoE layers; None otherwise): the
    dense layers' activations need room too. ``all_or_none``: every stage recomputes all its layers or none, all
    alike (SearchOptions.all_or_none_recompute), so the heavy layers' floor is the lesser of the two pipelines: none
    recomputed (a layer frees nothing) or all (each holds alpha - beta bytes and takes its recompute seconds too);
    the kind floor, with recompute just where it is needed, holds for both. The one rule _memory_floor and
    _TpChoiceNode.memory_floor share."""
    floor = (_cached_all_or_none_floor if all_or_none else _cached_memory_floor)(rows, heavy_kind(model)[1])
    if floor < below and kind_rows is not None:
        floor = max(floor, _cached_kind_memory_floor(kind_rows, model.num_layers))
    return floor


def _all_or_none_floor(rows, need: int) -> float:
    """memory_floor of the two all-or-none pipelines, the lesser: the rows with no layer recomputed (a recompute
    frees nothing) and with every one (each holds alpha - beta bytes, takes a + rc seconds, frees nothing more)."""
    none = tuple(tuple((k, (room, alpha, 0.0, a, rc)) for k, (room, alpha, _, a, rc) in row) for row in rows)
    every = tuple(
        tuple((k, (room, alpha - beta, 0.0, a + rc, rc)) for k, (room, alpha, beta, a, rc) in row) for row in rows
    )
    return min(memory_floor(none, need), memory_floor(every, need))


# boxes halved from one family share most of their rows
_cached_memory_floor = functools.lru_cache(maxsize=1 << 16)(memory_floor)
_cached_all_or_none_floor = functools.lru_cache(maxsize=1 << 16)(_all_or_none_floor)
_cached_kind_memory_floor = functools.lru_cache(maxsize=1 << 16)(kind_memory_floor)


def _memory_zeros(zeros: tuple[int, ...]) -> tuple[int, ...]:
    """The ZeRO stages whose memory floor can be the least of ``zeros``: ZeRO-0 goes where ZeRO-1 is there, which
    holds the same items with its optimizer states sharded (planner/cost/memory.model_state_bytes), so at least as
    many layers in every stage at every bottleneck: its floor is at most ZeRO-0's. (ZeRO-3 adds the gathered layers,
    so it does not rule out ZeRO-1.)"""
    return tuple(z for z in zeros if z != 0) if 0 in zeros and 1 in zeros else zeros


def _has_depth(fam: _Family, lo, hi) -> bool:
    """Whether a box of stage counts holds a depth P = sum k at which the family runs (_Family.depths; always where
    every depth does)."""
    return fam.depths is None or _depth_span(fam.depths, sum(lo), sum(hi)) is not None


def _depths(ctx: MixedContext, vpp: int, mb: int) -> tuple[int, ...] | None:
    """The depths P (ascending) at which ``vpp`` model chunks per stage run with ``mb`` micro-batches
    (planner.parallel.vpp_options) and the framework runs a pipeline of P stages with them (Framework.rejects:
    torchtitan's schedules need mb >= P), as _Family.candidates asks both; None where every depth 1..num_layers
    does (vpp 1 without such a limit: no box to narrow)."""
    key = (vpp, mb)
    if key not in ctx.caches.depths:
        L = ctx.job.model.num_layers
        fw = ctx.fw
        runs = tuple(
            p
            for p in range(1, L + 1)
            if vpp in depth_vpp_options(L, p, mb) and (fw is None or fw.allows(pp=p, vpp=vpp, microbatches=mb))
        )
        ctx.caches.depths[key] = None if runs == tuple(range(1, L + 1)) else runs
    return ctx.caches.depths[key]


def _depth_span(depths: tuple[int, ...], low: int, high: int) -> tuple[int, int] | None:
    """(least, deepest) of the ascending ``depths`` (_depths) within low..high stages, None where none lies there:
    the one rule an interleaved family's box (_has_depth, _Family._clip) and a TP-choice node (_TpChoiceNode._deepest)
    read."""
    i = bisect.bisect_left(depths, low)
    j = bisect.bisect_right(depths, high) - 1
    return (depths[i], depths[j]) if i <= j else None


def _split(lo, hi) -> list[tuple]:
    """Halve a box of stage counts along its widest coordinate."""
    i = max(range(len(lo)), key=lambda j: (hi[j] - lo[j], -j))
    mid = (lo[i] + hi[i]) // 2
    return [(lo, hi[:i] + (mid,) + hi[i + 1 :]), (lo[:i] + (mid + 1,) + lo[i + 1 :], hi)]


@functools.lru_cache(maxsize=4096)
def _box_size(lo, hi, L: int) -> int:
    """Stage-count vectors in a box with at most L stages in all (the candidates it stands for): with y = k - lo,
    the vectors 0 <= y_i <= w_i = hi_i - lo_i with sum y <= R = L - sum lo, counted by inclusion-exclusion over
    the coordinates that break their upper limit (stars and bars: C(R + n, n) vectors with sum y <= R)."""
    n, R = len(lo), L - sum(lo)
    if R < 0:
        return 0
    widths = [b - a for a, b in zip(lo, hi)]
    total = 0
    for over in itertools.product((0, 1), repeat=n):
        rest = R - sum(w + 1 for w, o in zip(widths, over) if o)
        if rest >= 0:
            total += (-1) ** sum(over) * math.comb(rest + n, n)
    return total


def _stage_models(ctx: MixedContext, c: HeteroCandidate, cache: dict) -> list[StageModel]:
    """One StageModel per stage, shared by the stages of a group (same degrees) and by every candidate with the
    same degrees and depth."""
    dims = None
    out = []
    for g, tp, k in c.groups:
        key = (g, tp, c.dp, c.cp, c.ep, c.mbs, c.zero, c.recompute, c.pp, c.vpp)
        sm = cache.get(key)
        if sm is None:
            dims = dims or c.dims(ctx.job)
            # models of the same degrees share their forms at every depth (StageModel.form_key)
            sm = cache[key] = StageModel(ctx.job, dims.stage_dims(len(out)), ctx.costs(g), ctx.form_caches)
        out += [sm] * k
    return out


def _solve(ctx: MixedContext, c: HeteroCandidate, sms, cap_s: float, limit: float, wall: float, workers: int):
    caps = [ctx.capacity(g) for g in c.stage_groups]
    partial = ctx.opts.partial_recompute
    res = solve_partition(
        sms,
        caps,
        partial_recompute=partial,
        time_limit_s=wall,
        work_limit=limit,
        workers=workers,
        objective_cap_s=cap_s if cap_s < float("inf") else None,
        even_layers=ctx.opts.even_layers,
        uniform_recompute=ctx.opts.uniform_recompute,
        recompute_step=c.vpp if ctx.opts.recompute_in_chunks else 1,  # as the homogeneous search asks it
    )
    if res.plans is None:
        return res, None
    layers, rec, base = stage_tuple(res.plans, c.recompute)
    dims = c.dims(ctx.job, layers, rec, base)
    final_sms = hetero_stage_models(ctx.job, dims, ctx.costs)
    return res, evaluate_stages(ctx.job, dims, final_sms, res.plans, ctx.opts.memory_margin)


# progress(done, total, what): what each phase of search_hetero counts
MIXED_PROGRESS = "mixed-pipeline candidates"  # solved, or ruled out by a bound


class _PipelineSearch:
    """One share of the mixed-pipeline search (planner/search/lockstep.py): best-first over the boxes of its roots
    (_TpChoiceNode groups), a box's bound holding for every candidate in it, a one-point box a candidate. The first
    box whose bound reaches the K-th best time ends it (all others are worse). A bound must beat the K-th best by
    more than RESOLUTION (0.01%) to be explored: plans closer than that are equal in time (as in
    planner/search/quick.py), so the top K are optimal to within it. ``best`` is set to the plans known before each
    explore (lockstep.Lockstep.explore) and takes in the other share's plans at the epochs lockstep gives them.
    ``total``: the candidates of every share, and ``progress``, where given, what reports them (MIXED_PROGRESS).
    ``counting``: whether the candidates a cut node stands for are counted (_node_size) for a progress report of
    either share; without one they are not (2% of suite job 46's search went into counting them)."""

    def __init__(
        self,
        ctx: MixedContext,
        roots,
        top: int,
        time_limit_s: float,
        workers: int,
        total: int,
        progress: Callable[..., None] | None = None,
        counting: bool = True,
        first: bool = False,
        solve_first: bool = False,
    ):
        self.ctx, self.top, self.time_limit_s, self.workers = ctx, top, time_limit_s, workers
        # the first share (lockstep's shares[0]): its explore bounds its roots (explore)
        self.first = first
        # no replica look gives the search a first cut (under a framework, or replicas=False): while no plan is known,
        # a candidate is solved as soon as its refined bound is known (with the bounds far below the plans of such a
        # space, as with a framework's all-or-none recompute, best-first would otherwise explore every box below the
        # first plan's time before it solves one: suite job 19 under torchtitan found no mixed plan by its deadline)
        self.solve_first = solve_first
        self.total, self.progress, self.counting = total, progress, counting
        self.L = ctx.job.model.num_layers
        self.roots = roots  # (index, root, candidates): put in line at their bounds by prepare
        self.heap: list = []
        self.tie = itertools.count(max((i for i, *_ in roots), default=0) + 1)  # (a root's index breaks ties)
        self.counted = sum(size for *_, size in roots)  # candidates under its roots
        self.best: list[Plan] = []
        self.found: list[Plan] = []  # plans found since the last snapshot
        self.settled = 0  # candidates solved or ruled out (progress)
        self.others_settled = 0  # the other share's, as last heard (progress)
        self.pops = 0
        self.work = 0  # lockstep's work units (WORK): nodes out of and into line, refined bounds, solves
        self.epoch = 0  # the last epoch of the current explore
        self.solved = 0
        self.frontier = float("inf")
        self.timed_out = False
        self.deadline = 0.0
        self.open_solves: list[tuple[float, HeteroCandidate, list[StageModel]]] = []  # solves stopped by their cap
        self.cache: dict = {}
        self.other: dict = {}  # the other share's last result()
        # whether its TP-choice nodes count the ZeRO traffic and DP tails, per how many groups' TP is still open
        self.tails = tuple(TailTrial() for _ in range(TAIL_OPEN + 1))
        self.memory_trial = MemoryTrial()  # whether those with every TP fixed go back in line at their memory bound
        self.ways_seen: set = set()  # the tail ways its steps read (WayMeter)
        # where the other share works out some of its first explore's root bounds (lockstep.Meet: prepare_for)
        self.meet: Meet | None = None

    def prepare(self, forked: bool = False) -> None:
        """The roots put in line at their bounds. ``forked``: in the child as soon as it is forked, mostly idle
        until the parent has taken its first look at the replica plans; a thread loads CP-SAT there meanwhile (0.3-0.4
        s that its first solve would otherwise take, the parent waiting for it), which a search that needs no solve
        in the child does not wait for (loaded in line, it added 0.3 s to small jobs)."""
        if self.roots:
            self.heap = [self._root_entry(i, grp) for i, grp, _ in self.roots]
            heapq.heapify(self.heap)
            self.roots = []
        if forked and self.heap:
            threading.Thread(target=cp_sat, daemon=True).start()

    def _root_entry(self, i: int, grp: _TpChoiceNode, given: float | None = None) -> tuple:
        """Root ``i`` in line at its rough bound (worked out here unless ``given``: prepare_for's); its bound comes
        when it first comes out of line (the node's ``rough``: step)."""
        return (grp.rough_bound(self.ctx) if given is None else given, i, grp, None)

    def prepare_for(self, other: _PipelineSearch, front, back) -> list[tuple[int, float]]:
        """The other share's root bounds (its _root_entry's rough bounds), worked out here, in the child, from its
        last root back while the parent takes its first replica look and then works them out from its first root on
        (_bound_roots), until the two meet: ``front`` (shared memory) holds the parent's next root, ``back`` this
        side's last one taken (each side reads the other's before it takes a root: at most one is worked out on both
        sides). As (position in its roots, bound), for the other share to take in. The same bounds either way, so
        the same line and counts."""
        bounds: list[tuple[int, float]] = []
        n = len(other.roots) - 1
        while n >= front.value:
            back.value = n
            bounds.append((n, other.roots[n][1].rough_bound(self.ctx)))
            n -= 1
        return bounds

    def _bound_roots(self) -> None:
        """The first share's roots put in line at their bounds (in its explore, after the replica look): from the
        first on, and where the other share works some out from the last back (``meet``: prepare_for) until the two
        meet, those."""
        roots, done = self.roots, 0
        meet, self.meet = self.meet, None
        while done < len(roots) and (meet is None or done < meet.back.value):
            if meet is not None:
                meet.front.value = done + 1
            i, grp, _ = roots[done]
            self.heap.append(self._root_entry(i, grp))
            done += 1
        if done < len(roots):
            theirs = dict(meet.theirs())
            self.heap += [self._root_entry(i, grp, theirs[n]) for n, (i, grp, _) in enumerate(roots) if n >= done]
        heapq.heapify(self.heap)
        self.roots = []

    def _pass_epochs(self, start: int, peer: Peer):
        """lockstep.boundary at every epoch the work since ``start`` has reached, one by one (in explore)."""
        while (self.work - start) // EPOCH > self.epoch:
            self.epoch += 1
            yield from boundary(self, peer, self.epoch)

    def kth_time(self) -> float:
        return kth_time(self.best, self.top)

    def cut(self) -> float:
        return self.kth_time() * (1 - RESOLUTION)

    def report(self) -> None:
        if self.progress is not None:
            self.progress(min(self.settled + self.others_settled, self.total), self.total, MIXED_PROGRESS)

    def solve(
        self,
        c: HeteroCandidate,
        sms: list[StageModel],
        kth: float,
        bound: float,
        limit: float | None = None,
        until: float | None = None,
    ):
        """CP-SAT on one candidate, capped at ``kth``; its PartitionResult. A candidate's first solve (no limit
        given; solve_again and solve_capped give one) is counted; without a plan to beat it only needs to find one:
        a short limit (its bound is kept). The limit is CP-SAT's deterministic time, so that a solve stops at the
        same point on any machine (and the plans and counts after it are the same); the wall clock stops it only at
        ``until`` (default: the explore's deadline) or at SOLVE_WALL times its limit."""
        if limit is None:
            limit = self.first_limit(kth < float("inf"))
            self.solved += 1
            self.settled += 1
        wall = solve_wall((self.deadline if until is None else until) - time.monotonic(), limit)
        sent = with_group_sends(self.ctx.job, c.stage_groups, sms)
        res, est = _solve(self.ctx, c, sent, kth, limit, wall, self.workers)
        # (its search counted by CP-SAT's deterministic time, the same in every run with one worker only; with
        # more, by the model's stages and layers)
        searched = round(res.work_s * SOLVE_UNITS) if self.workers == 1 else c.pp * self.L
        self.work += WORK["solve"] + c.pp * (self.L // c.vpp) // WORK["chunks"] + searched
        if res.status not in ("optimal", "infeasible"):
            # the candidate's own bound holds for the solve too
            self.open_solves.append((max(res.bound_s, bound), c, sms))
        if est is not None and est.fits:
            plan = Plan(c, est, res.status)
            keep_top(self.best, plan, self.top)
            self.found.append(plan)
        self.report()
        return res

    def first_limit(self, plan_known: bool) -> float:
        """A candidate's first solve's limit in CP-SAT's deterministic seconds: the solve cap of the time limit, or
        without a plan to beat the least one (it only needs to find one)."""
        return solve_cap(self.time_limit_s if plan_known else 0.0)

    def solve_new(self, c: HeteroCandidate, sms: list[StageModel], kth: float, bound: float, family) -> None:
        """A candidate's first solve: capped at ``kth``, or while no plan is known at FIRST_CAP above its ``bound``
        (solve_capped), unless the search solves at once to find a first plan (solve_first: any plan will do)."""
        if kth == float("inf") and not self.solve_first:
            self.solve_capped(c, sms, bound, family)
        else:
            self.solve(c, sms, kth, bound)

    def solve_capped(self, c: HeteroCandidate, sms: list[StageModel], bound: float, family) -> None:
        """While no plan is known: CP-SAT on one candidate, capped at FIRST_CAP above its ``bound``. Where it
        proves that no split is that fast, the candidate goes back in line at the cap (less the partition model's
        rounding, PRECISION), and is solved again when it comes out; it counts as solved once, when a solve
        settles it."""
        cap = bound * (1 + FIRST_CAP)
        res = self.solve(c, sms, cap, bound, limit=self.first_limit(False))
        if res.status == "infeasible":
            self.push(cap * (1 - PRECISION), c, (family, sms))
            return
        self.solved += 1
        self.settled += 1
        self.report()

    def solve_again(self, until: float) -> None:
        """Solves stopped by their cap whose bound is below the K-th best, again, best bound first, each with an
        even share of the time left until ``until`` (at least the cap it had)."""
        left = sorted(self.open_solves, key=lambda x: x[0])
        self.open_solves.clear()
        for i, (bound, c, sms) in enumerate(left):
            remaining = until - time.monotonic()
            if bound >= self.cut() or remaining <= 0:
                self.open_solves.extend(left[i:])
                return
            share = max(remaining / (len(left) - i), solve_limit(remaining, self.time_limit_s))
            self.solve(c, sms, self.kth_time(), bound, limit=share, until=until)

    def push(self, bound: float, node, nbox) -> None:
        self.work += WORK["bound"]
        if bound < self.cut() and (not isinstance(node, _Family) or _has_depth(node, *nbox)):
            heapq.heappush(self.heap, (bound, next(self.tie), node, nbox))
        elif self.counting:  # cut by its bound (or, interleaved, no depth in it takes its vpp): its candidates settled
            self.settled += _node_size(self.ctx, node, nbox)

    def explore(self, until: float):
        """Best-first over the boxes in line until the K-th best cuts them all or ``until`` passes; what the
        deadline leaves stays in line (``frontier``: its least bound), so a later call goes on from there. A
        generator (lockstep's share): at every EPOCH units of work it trades plans and work with the other share
        (lockstep.boundary); out of work, it goes on from epoch to epoch until both shares are out of work for
        good."""
        self.deadline, self.timed_out, self.frontier = until, False, float("inf")
        self.report()
        start, self.epoch = self.work, 0
        peer = Peer()
        if self.first:
            # the first share bounds its roots here, after the replica look, the second share's having been bounded in
            # the child meanwhile, and the child as many of this one's as it gets to (prepare_for; they count no work)
            self._bound_roots()
        self.prepare()
        while True:
            if not self.heap:  # out of work: the next epoch, for a gift or the end
                self.epoch += 1
                self.work = max(self.work, start + self.epoch * EPOCH)
                if (yield from boundary(self, peer, self.epoch)):
                    break
                continue
            kth = self.cut()
            lb, _, fam, box = heapq.heappop(self.heap)
            self.pops += 1
            self.work += WORK["pop"]
            if self.pops % 64 == 0:
                self.report()
            if lb >= kth:
                self.frontier = min(self.frontier, lb)
                self.settled = self.counted  # this node and every one left in line are cut by their bounds
                self.heap.clear()
                continue
            if time.monotonic() > until:  # everything left is unexplored: the top K are not proven (yet)
                self.timed_out = True
                self.frontier = min(self.frontier, lb)
                heapq.heappush(self.heap, (lb, next(self.tie), fam, box))
                break
            rows, levels, ways = Meter.rows, Meter.levels, WayMeter.firsts
            WayMeter.seen = self.ways_seen
            self.step(kth, lb, fam, box)
            self.work += (Meter.rows - rows) // WORK["rows"] + (Meter.levels - levels) * WORK["level"]
            self.work += (WayMeter.firsts - ways) * WORK["way"]
            yield from self._pass_epochs(start, peer)  # every epoch the step's work reached
        self.report()

    # lockstep's share: plans and nodes traded with the other share
    def take_plans(self, plans: list[Plan]) -> None:
        for plan in plans:
            keep_top(self.best, plan, self.top)

    def flush(self) -> list[Plan]:
        """The plans found since the last snapshot."""
        found, self.found = self.found, []
        return found

    def load(self) -> int:
        return len(self.heap)

    def give(self) -> bytes | None:
        """Every other node of the best GIFT nodes in line, best bound first, for the other share, or None where
        fewer than two could go; the candidates under them go with them (``counted``). A candidate back with its
        refined bound goes without its stage models (built again on taking it in: _stage_models): near its end a
        search's line may hold little but candidates waiting for their solves (seed-4 suite job 26: 13 of them,
        about 80 ms each, while the other share had been out of work for 0.7 s). (Half the whole line cost 0.1-0.5
        s to pickle and take in on the slow suite jobs, most of it nodes the cut later settles unopened.)"""
        best = heapq.nsmallest(GIFT, self.heap)
        if len(best) < 2:
            return None
        gift = best[1::2]
        given = {id(e) for e in gift}
        self.heap = [e for e in self.heap if id(e) not in given]
        heapq.heapify(self.heap)
        size = sum(_node_size(self.ctx, node, box) for _, _, node, box in gift) if self.counting else 0
        self.counted -= size
        nodes = [(lb, node, (box[0], None) if isinstance(node, HeteroCandidate) else box) for lb, _, node, box in gift]
        return _pickle_nodes(self.ctx, nodes, size)

    def take_gift(self, payload: bytes) -> None:
        """The other share's nodes into this one's line; after an explore that stopped at its deadline (a gift
        taken in late: lockstep._take_late), what is left open includes them (``frontier``)."""
        nodes, size = _unpickle_nodes(self.ctx, payload)
        for lb, node, box in nodes:
            if isinstance(node, HeteroCandidate):
                box = (box[0], _stage_models(self.ctx, node, self.cache))
            heapq.heappush(self.heap, (lb, next(self.tie), node, box))
            if self.timed_out:
                self.frontier = min(self.frontier, lb)
        self.counted += size

    def final(self) -> Snapshot:
        """What explore found after its last epoch, tagged one past the epoch it ended in."""
        return Snapshot(self.epoch + 1, self.flush(), self.settled, True, self.load())

    def result(self) -> dict:
        """What the caller takes of this share after an explore (picklable): its plans, solve count and what it
        left open; its solves stopped by their cap are handed over (without their stage models, built again)."""
        handed = [(bound, c) for bound, c, _ in self.open_solves]
        self.open_solves = []
        return {
            "best": list(self.best),
            "solved": self.solved,
            "frontier": self.frontier,
            "timed_out": self.timed_out,
            "open_solves": handed,
            "settled": self.settled,
        }

    def absorb(self, other: dict) -> None:
        """The other share's result(): its plans and stopped solves into this share, in a fixed order (this
        share's own first)."""
        self.other = other
        self.others_settled = other["settled"]
        self.report()
        for plan in other["best"]:
            for member in (plan, *plan.equivalent):
                keep_top(self.best, dataclasses.replace(member, equivalent=[]), self.top)
        self.open_solves += [(bound, c, _stage_models(self.ctx, c, self.cache)) for bound, c in other["open_solves"]]

    def refined_work(self, c: HeteroCandidate) -> int:
        """Work units of a candidate's refined bound: it grows with the layers and the stages."""
        return WORK["refined"] + (self.L // c.vpp + c.pp) // 8

    def step(self, kth: float, lb: float, fam, box) -> None:
        """One box out of line: its families or sub-boxes put in line, or its candidates bounded and solved (or
        put back in line at their refined bounds)."""
        ctx, L, push = self.ctx, self.L, self.push
        if isinstance(fam, _TpChoiceNode):
            if fam.rough:  # a root out of line for the first time: back at its bound
                bound = fam.bound(ctx, self.cut(), memory=False, tails=self.tails)
                push(max(lb, bound), dataclasses.replace(fam, rough=False), None)
                return
            known = kth < float("inf")  # (no plan yet: nothing to cut, the bound only orders the line)
            if not fam.memory and len(fam.fixed) == len(ctx.order) and (not known or self.memory_trial.pays()):
                self.work += WORK["memory"]
                cut = self.cut()
                bound = fam.bound(ctx, cut, traffic=False)  # (lb holds what the traffic and tails added: put in line)
                if known:
                    self.memory_trial.tell(bound >= cut)
                push(max(lb, bound), dataclasses.replace(fam, memory=True), None)
                return
            for flb, family, fbox in fam.families(ctx, self.cut(), self.tails):
                self.work += WORK["open"] if isinstance(family, _Family) else 0
                push(max(lb, flb), family, fbox)  # (the node's bound holds for every family under it)
            return
        if isinstance(fam, HeteroCandidate):  # a candidate back with its refined bound: solve it
            family, sms = box
            self.work += self.refined_work(fam)
            # the bound was decided against the K-th best of its time (refined_bound only decides whether it
            # reaches its target): against today's, it may be cut
            if refined_bound(ctx, family, fam, sms, kth) >= kth:
                self.settled += 1
                self.report()
                return
            self.solve_new(fam, sms, kth, lb, family)
            return
        lo, hi = box
        if not fam.ordered:
            opened = fam.opened()  # (a ZeRO stage, a first or a last group whose bound is cut opens no order)
            for child in opened:
                self.work += WORK["open"]
                push(max(lb, child.bound(L, lo, hi, self.cut())), child, box)
            if opened:
                return
            for ordered, box in fam.expand(ctx, lo, hi):
                push(ordered.bound(L, *box, self.cut()), ordered, box)
            return
        if lo != hi:
            for box in _split(lo, hi):
                if sum(box[0]) <= L // fam.vpp:
                    push(fam.bound(L, *box, self.cut()) if _has_depth(fam, *box) else float("inf"), fam, box)
            return
        # a single candidate: its refined bound puts it back in line, so candidates are solved in the order of
        # their refined bounds and the first solves already give a plan close to the best
        cands = fam.candidates(ctx, lo, lb)
        self.settled += 1 - len(cands)  # a stage-count choice outside the space is settled at once
        for c in cands:
            sms = _stage_models(ctx, c, self.cache)
            self.work += self.refined_work(c)
            refined = refined_bound(ctx, fam, c, sms, kth)
            if refined >= kth:
                self.settled += 1
                continue
            if (self.solve_first and kth == float("inf")) or (
                refined * (1 + DIVE) < kth and (not self.heap or refined <= self.heap[0][0] * (1 + DIVE))
            ):
                self.solve_new(c, sms, kth, max(lb, refined), fam)  # no good plan yet: one close to the frontier cuts
            else:
                heapq.heappush(self.heap, (max(lb, refined), next(self.tie), c, (fam, sms)))


class _NodePickler(pickle.Pickler):
    """Nodes given to the other share (lockstep): each ZeroTerms by its key in the context's cache, which the other
    process, forked with the same context, finds or builds again the same (_unpickle_nodes); each _Memo by a token,
    for a new one there."""

    def __init__(self, file, keys: dict[int, tuple]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.keys = keys

    def persistent_id(self, obj):
        if isinstance(obj, ZeroTerms):
            return ("zero_terms", self.keys[id(obj)])
        if isinstance(obj, _Memo):
            return ("memo", id(obj))
        return None


class _NodeUnpickler(pickle.Unpickler):
    def __init__(self, file, ctx: MixedContext) -> None:
        super().__init__(file)
        self.ctx = ctx
        self.memos: dict[int, _Memo] = {}

    def persistent_load(self, pid):
        if pid[0] == "memo":
            return self.memos.setdefault(pid[1], _Memo())
        g, tp, dp, cp, ep, mbs, base, zero = pid[1]  # (zero_terms' cache key)
        return zero_terms(self.ctx, g, tp, dp, cp, mbs, base, zero, ep)


def _pickle_nodes(ctx: MixedContext, nodes: list, size: int) -> bytes:
    buf = io.BytesIO()
    _NodePickler(buf, {id(z): key for key, z in ctx.caches.zero_terms.items()}).dump((nodes, size))
    return buf.getvalue()


def _unpickle_nodes(ctx: MixedContext, payload: bytes) -> tuple[list, int]:
    return _NodeUnpickler(io.BytesIO(payload), ctx).load()


def _shares(roots) -> list[list[tuple]]:
    """The roots dealt to the two shares, those of one dp, cp, ep, micro-batch and baseline recompute (every vpp
    of them) to the same share, alternately in the order they were listed: (index, root, candidates). The roots
    of one such key share the groups' memory and DP-tail terms (ZeroTerms, cached per process), which the other
    process would build again. (Work is moved later where one share runs out: lockstep's gifts.)"""
    keys: dict[tuple, int] = {}
    out: list[list[tuple]] = [[], []]
    for i, (grp, size) in enumerate(roots):
        key = (grp.dp, grp.cp, grp.ep, grp.mbs, grp.base)
        out[keys.setdefault(key, len(keys) % 2)].append((i, grp, size))
    return out


def _single_type_baselines(
    share: _PipelineSearch, workers: int, limit: float, beat: float, part: tuple[int, int], progress=None
):
    """best_single_type for the share's job below ``beat`` on the ``part`` of each group's candidates, with its cost
    caches (the share's): on the other share's side (lockstep.Lockstep.start_call, without progress) or this one's."""
    ctx = share.ctx
    return best_single_type(ctx.job, ctx.opts, workers, limit, progress, beat, ctx.costs, part)


def _exact_part(share: _PipelineSearch, items, shadow, top: int, best: float, deadline: float, workers: int):
    """replicas.exact_shapes on the other share's side (its process and context): its part of the replica shapes,
    with the memo of what it proved there (replicas.exact_memo) for this side to absorb."""
    done, low = exact_shapes(share.ctx, items, shadow, top, best, deadline, workers)
    return done, low, exact_memo(share.ctx, [cand for _, cand, _, _ in items])


class _OtherSide:
    """The other share's side between the explores (Lockstep.start_call, one call at a time): the single-type
    baselines of its part of each group's candidates, then, where the replica search proper has two or more
    pipelined shapes to solve exactly, every other one of them (replicas.ExactShare; the baselines' answer is taken
    first)."""

    def __init__(self, lockstep: Lockstep) -> None:
        self.lockstep = lockstep
        self.waiting = False
        self.single = None

    def start_single(self, *args) -> None:
        self.lockstep.start_call(_single_type_baselines, *args)
        self.waiting = True

    def single_answer(self):
        """The single-type baselines' answer (waiting for it where it is still out)."""
        if self.waiting:
            self.single, self.waiting = self.lockstep.finish_call(), False
        return self.single

    def start(self, *args) -> None:
        self.single_answer()
        self.lockstep.start_call(_exact_part, *args)

    def finish(self) -> tuple[list, float, dict]:
        return self.lockstep.finish_call()


class _LookAhead:
    """The other share's side during the first replica look (replicas.LookAhead): the look's throughput floors
    worked out there ahead of it (replicas.look_ahead, a help of the lockstep's child, which sits idle through the
    look once its roots are bounded). Started before the look, so that the child has it by the time the look has its
    shapes; ended after it (end), what came in then kept too (the replica search proper reads them again)."""

    def __init__(self, lockstep: Lockstep) -> None:
        self.lockstep = lockstep
        lockstep.start_help(look_ahead)

    def start(self, found_shapes: list) -> None:
        self.lockstep.board.send(found_shapes)

    def front(self, key: float) -> None:
        self.lockstep.board[AHEAD_FRONT] = key

    def take_in(self, ctx: MixedContext) -> None:
        self._keep(ctx, self.lockstep.helped())

    def end(self, ctx: MixedContext) -> None:
        self._keep(ctx, self.lockstep.end_help())

    @staticmethod
    def _keep(ctx: MixedContext, batches: list) -> None:
        for batch in batches:
            ctx.caches.replica_throughput.update(batch)


def search_hetero(
    job: Job,
    *,
    top: int = 5,
    time_limit_s: float = 60.0,
    workers: int = 1,
    options: SearchOptions | None = None,
    single_type: bool = True,
    replicas: bool = True,
    progress: Callable[..., None] | None = None,
    processes: int | None = None,
) -> SearchResult:
    """Best heterogeneous plans of a multi-group job (see the module docstring). With ``single_type`` the best
    plan on each node group alone (the homogeneous search) is reported for comparison; with ``replicas`` plans
    whose DP replicas sit on different GPU types (planner/search/replicas.py) join the top list. The mixed
    pipelines are searched in two shares in lock step (planner/search/lockstep.py), side by side in ``processes``
    2 (default: where this machine allows, lockstep.processes_available) or one after the other in 1: the same
    answer and counts either way.

    ``progress(done, total, what)`` is called as each phase moves, ``what`` naming what it counts: mixed-pipeline
    replica shapes evaluated in a first, short look, then candidates solved or ruled out by a bound
    (MIXED_PROGRESS; a box cut by its bound settles every candidate in it), then replica shapes evaluated or ruled
    out, then each single-type search of this process (every other candidate of each group); then, where the mixed
    pipelines or replica shapes are still open, their counts again as the time left goes on with them."""
    opts = (options or SearchOptions()).for_job(job)
    start = time.monotonic()
    # shares of the time limit: mixed pipelines, then replicas on different types, then the single-type searches;
    # what the deadline left open in the mixed pipelines then gets the time the others did not use
    share = 0.6 if single_type else 1.0
    deadline = start + time_limit_s * share * 0.7
    ctx = MixedContext(job, opts, opts.framework, cost_source(job), group_order(job.cluster))
    roots = _roots(ctx)
    counted = sum(size for _, size in roots)
    best: list[Plan] = []
    # A first, short look at the replica plans (the best-bound shapes): the best of them is the first cut of the
    # mixed pipelines. The replica search proper comes after them, cut by the best plan of either kind.
    with_replicas = replicas and len(job.cluster) > 1 and opts.framework is None  # stock frameworks: one count
    main, other = (
        _PipelineSearch(
            ctx, dealt, top, time_limit_s, workers, counted, report, progress is not None, first, not with_replicas
        )
        for dealt, report, first in zip(_shares(roots), (progress, None), (True, False))
    )  # main: this process's share; after each explore it holds the other's plans too
    processes = processes_available() if processes is None else processes

    def replica_pass(
        incumbent: float, stop: float, exact_pass: bool = True, look: int | None = None, share=None, ahead=None
    ):
        rs = search_replicas(ctx, incumbent, stop, workers, progress, best, top, exact_pass, look, share, ahead)
        for cand, est, exact in rs.found:
            keep_top(best, Plan(cand, est, "optimal" if exact else "feasible"), top)
        return rs

    def explore(lockstep: Lockstep, until: float) -> list[Plan]:
        """Both shares' explore until ``until`` from the plans in ``best``; the top list after it (main's: explore
        starts each share from a copy of ``best``, so what it found is there, with the other share's plans)."""
        main.absorb(lockstep.explore(until, best))
        return main.best

    with Lockstep([main, other], processes) as lockstep:  # (the other share's roots are bounded in the child meanwhile)
        other_side = _OtherSide(lockstep)
        if with_replicas:
            # its shape enumeration (of the shapes it can reach only) may take up to the mixed pipelines'
            # deadline; the look itself at most REPLICA_LOOK steps after it
            # (its throughput floors worked out ahead of it in the child meanwhile, where there is one)
            ahead = _LookAhead(lockstep) if lockstep.child is not None else None
            replica_pass(float("inf"), deadline, exact_pass=False, look=REPLICA_LOOK, ahead=ahead)
            if ahead is not None:
                ahead.end(ctx)
        best = explore(lockstep, deadline)  # (replica_pass and the rest below add to it)
        single = group = single_beat = None
        if single_type:
            # a single-type plan matters if it beats the best mixed plan: the baselines are searched below its time,
            # on the other share's side while this process searches the replica shapes proper
            single_beat = best[0].time if best else None
            beat = single_beat * (1 + RESOLUTION) if best else float("inf")
            limit = max(0.5, start + time_limit_s - time.monotonic())
            other_side.start_single(workers, limit, beat, (0, 2))
        rs = None
        if with_replicas:
            # the replica shapes' share of the time limit; a quarter of it where the explore stopped at its deadline
            # (it goes on after the baselines). With the mixed pipelines done it stops no sooner: each exact solve
            # gets a share of the time left (replica_partition.exact_splits), and one cut short leaves its shape to
            # the pass at the end, in this process alone (seed-1 suite job 31 on a slow hour: a 33-stage choice cut at
            # 0.53 s by a stop 4.5 s after the pass began; solved again at the end, 12.8 s instead of about 10.5)
            stop = start + time_limit_s * share
            if main.timed_out or main.other["timed_out"]:
                stop = min(stop, time.monotonic() + 0.25 * time_limit_s * share)
            # (every other pipelined shape of its exact pass solved on the other side)
            rs = replica_pass(main.kth_time(), stop, share=other_side)
        if single_type:
            # every other candidate of each group here (after the replica shapes), the others on the other side
            limit = max(0.5, start + time_limit_s - time.monotonic())
            here = _single_type_baselines(main, workers, limit, beat, (1, 2), progress)
            single, group = better_single_type(job, other_side.single_answer(), here)
            # it is a mixed layout too (every stage on that group): a plan of the job, unless mixed layouts cannot
            # express it (then the report names the faster group), and a cut for the rest of the mixed search
            adopted = None if single is None else as_mixed_plan(job, group, single, opts)
            if adopted is not None:
                keep_top(best, adopted, top)
        # The time the other phases left goes to what is still open, cut by every plan found: the mixed pipelines,
        # the solves their cap stopped, then the replica shapes whose bound is below the K-th best.
        end = start + time_limit_s
        if main.timed_out or main.other["timed_out"]:
            best = explore(lockstep, end)
    main.solve_again(end)
    if rs is not None and rs.open_parts(main.kth_time() * (1 - 1e-9)) and time.monotonic() < end:
        rs = replica_pass(main.kth_time(), end)
    timed_out = main.timed_out or main.other["timed_out"]
    frontier = min(main.frontier, main.other["frontier"])
    solved = main.solved + main.other["solved"]
    complete, open_bound = settle_open_solves(not timed_out, [b for b, _, _ in main.open_solves], best, top)
    # What keeps the top K from being proven, as (bound, stop reason, part of the space): the mixed pipelines as
    # ``complete`` says (cut by the deadline, or a solve stopped at its per-solve cap), and replica shapes whose
    # bound is below the K-th best (left unexplored by the deadline, or evaluated heuristically: replica plans
    # themselves are never proven).
    kth = main.kth_time() * (1 - 1e-9)
    if not complete and min(frontier, open_bound) >= main.cut():
        complete = True  # a better plan found since (a replica plan) cuts all the deadline or a solve cap left open
    open_parts = []
    if not complete:
        open_parts.append((min(frontier, open_bound), "time_limit" if timed_out else "solve_cap", "mixed_pipelines"))
    if rs is not None:
        open_parts += rs.open_parts(kth)
    proven = not open_parts
    final = [with_proof(p, proven) for p in best]
    gap, reason, source = 0.0, "proven", None
    if open_parts:
        reason = min((r for _, r, _ in open_parts), key=STOP_REASONS.index)  # the most decisive
        low, _, source = min(open_parts, key=lambda x: x[0])  # the part whose bound sets the gap
        if final:
            gap = max(0.0, (final[0].time - min(low, final[0].time)) / final[0].time)
    # candidates: every (family, stage counts) in the space; all but the solved ones were pruned by a bound
    result = SearchResult(
        final, counted, counted - solved, solved, 0.0, complete, gap, stop_reason=reason, gap_source=source
    )
    if single_type:
        if single is None:
            result.single_type_bound_s = single_beat
        else:
            result.single_type_best_s, result.single_type_group = single.time, group
    result.seconds = time.monotonic() - start
    return result
