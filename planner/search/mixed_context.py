"""What both mixed-cluster searches share (planner/search/mixed_pipelines.py: mixed pipelines;
planner/search/replicas.py: replicas on different GPU types): the search context with its per-model memory terms,
the TP, CP and EP degrees a node group may use, and per-micro-batch lower bounds on a stage's time (layers, sends,
embedding and logits)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from planner import parallel
from planner.cost.memory import inflight_microbatches
from planner.cost.provider import CostSource
from planner.cost.stage import (
    FormCache,
    StageModel,
    embedding_seconds,
    fastest_layer,
    heavy_kind,
    kind_coeffs,
    layer_counts,
    layers_floor,
    logits_seconds,
    pipeline_send,
)
from planner.frameworks import Framework
from planner.parallel import HeteroDims, node_group_tp_options, seq_shard_error
from planner.search import quick
from planner.search.space import SearchOptions
from planner.spec import Job

if TYPE_CHECKING:  # numpy is imported where an MoE bound first needs it (about 0.1 s of every CLI start)
    import numpy as np


def pipeline_dims(
    job: Job,
    stage_groups,
    stage_tp,
    dp: int,
    cp: int,
    mbs: int,
    zero: int,
    base: str,
    layers: tuple[int, ...] | None = None,
    recompute=None,
    ep: int = 1,
    vpp: int = 1,
    **extra,
) -> HeteroDims:
    """The degrees of a mixed pipeline (``ep``, ``vpp``: the plan's EP and interleaving degrees, shared by all
    stages; ``extra``: a replica's micro_batches and dp_total); without ``layers`` an even split (the last stage
    takes the rest), which the cost coefficients do not depend on."""
    p, L = len(stage_groups), job.model.num_layers
    return HeteroDims(
        stage_groups=tuple(stage_groups),
        stage_tp=tuple(stage_tp),
        dp=dp,
        micro_batch_size=mbs,
        zero_stage=zero,
        recompute=base,
        stage_layers=layers or tuple([L // p] * (p - 1) + [L - L // p * (p - 1)]),
        stage_recompute=recompute,
        cluster=job.cluster,
        model=job.model,
        training=job.training,
        cp=cp,
        ep=ep,
        vpp=vpp,
        **extra,
    )


def per_layer_bound(ctx: MixedContext, g: int, tp: int, cp: int, mbs: int, base: str, ep: int = 1) -> float:
    """Smallest seconds per layer of any kind the model has on group g's GPU with this TP, CP and EP
    (stage.fastest_layer: compute, TP collectives, exposed CP ring, EP all-to-all)."""
    key = (g, tp, cp, ep, mbs, base)
    hit = ctx.caches.fastest_layer.get(key)
    if hit is None:
        hit = ctx.caches.fastest_layer[key] = fastest_layer(_layer_kinds(ctx, *key), ctx.job.model)
    return hit


def model_layers_bound(ctx: MixedContext, g: int, tp: int, cp: int, mbs: int, base: str, ep: int = 1) -> float:
    """Least seconds one micro-batch spends in all the model's layers on group g's GPU with this TP, CP and EP:
    each layer at the floor of its own kind (stage.layers_floor), so an MoE model's few dense layers do not stand
    for its MoE layers (L * per_layer_bound would)."""
    key = (g, tp, cp, ep, mbs, base)
    hit = ctx.caches.model_layers.get(key)
    if hit is None:
        hit = ctx.caches.model_layers[key] = layers_floor(_layer_kinds(ctx, *key), ctx.job.model)
    return hit


def _layer_kinds(ctx: MixedContext, g: int, tp: int, cp: int, ep: int, mbs: int, base: str) -> dict:
    """kind_coeffs of a stage of group g at these degrees (memoized on the group's costs)."""
    tokens = mbs * ctx.job.training.seq_length // cp
    return kind_coeffs(ctx.job, ctx.costs(g), tokens, tp, cp, ep, tp > 1, base)


def kind_layer_bounds(
    ctx: MixedContext, g: int, tp: int, cp: int, mbs: int, base: str, ep: int = 1
) -> tuple[float, float] | None:
    """(dense, MoE) least seconds per layer of each kind (KindCoeffs.layer_floor) on group g's GPU with this TP,
    CP and EP, for a model that has layers of both kinds; None for a model with one kind (per_layer_bound is then
    exact per layer)."""
    if not all(layer_counts(ctx.job.model).values()):
        return None
    key = (g, tp, cp, ep, mbs, base)
    hit = ctx.caches.kind_floors.get(key)
    if hit is None:
        kinds = _layer_kinds(ctx, *key)
        hit = ctx.caches.kind_floors[key] = (kinds["dense"].layer_floor(), kinds["moe"].layer_floor())
    return hit


@dataclass
class MixedCaches:
    """Memoized bounds of the mixed searches, one table per quantity (the key is the arguments of the function that
    fills it)."""

    fastest_layer: dict = field(default_factory=dict)  # per_layer_bound: (group, tp, cp, ep, mbs, base)
    kind_floors: dict = field(default_factory=dict)  # kind_layer_bounds: the same key
    model_layers: dict = field(default_factory=dict)  # model_layers_bound: the same key
    stage_terms: dict = field(default_factory=dict)  # MixedContext.stage_terms: memory room and layer cap
    tail_profile: dict = field(default_factory=dict)  # MixedContext.tail_profile: a stage's TailProfile
    tail_lines: dict = field(default_factory=dict)  # MixedContext.tail_lines: its lines, by stage position
    recompute_pays: dict = field(default_factory=dict)  # recompute_pays_up_to, by stage position
    sharded_line: dict = field(default_factory=dict)  # MixedContext.sharded_line: ZeRO-2/3 traffic line
    sharded_kinds: dict = field(default_factory=dict)  # MixedContext.sharded_kinds: its slope per layer kind
    zero_terms: dict = field(default_factory=dict)  # zero_terms: a group's ZeRO slope and memory room
    send: dict = field(default_factory=dict)  # send_bound: pipeline send seconds per micro-batch
    end_costs: dict = field(default_factory=dict)  # end_costs: embedding and logits stages
    stage_bound: dict = field(default_factory=dict)  # mixed_pipeline_bounds: per-position bound rows
    space_size: dict = field(default_factory=dict)  # mixed_pipelines: candidates below a family
    group_space_size: dict = field(default_factory=dict)  # mixed_pipelines: candidates below a TP-choice node
    node_rows: dict = field(default_factory=dict)  # mixed_pipelines: a TP-choice node's row of the bound
    memory_rows: dict = field(default_factory=dict)  # mixed_pipelines: a TP-choice node row's memory room and floor
    memory_floors: dict = field(default_factory=dict)  # mixed_pipelines: a TP-choice node's memory floors by ZeRO stage
    depths: dict = field(default_factory=dict)  # mixed_pipelines._depths: the depths that run, by (vpp, mb)
    replica_floor: dict = field(default_factory=dict)  # replicas.pipeline_floor, by ReplicaCandidate.key
    replica_throughput: dict = field(default_factory=dict)  # replicas.throughput_floor, by ReplicaCandidate.key
    replica_exact: dict = field(default_factory=dict)  # replicas._exact_once: (cut, best plan) where proven
    replica_choices: dict = field(default_factory=dict)  # replicas._exact_shape: each choice's proven split, by key
    replica_shapes: dict = field(default_factory=dict)  # replicas.shapes: the enumeration below a bound, by bound
    replica_blocks: dict = field(default_factory=dict)  # replicas._shapes: per (tp, cp, mbs, base), its work terms
    moe_windows: dict = field(default_factory=dict)  # moe_windows, by the first layer (window_start)
    kind_memory: dict = field(default_factory=dict)  # mixed_pipeline_bounds._kind_memory_times, by BlockTerms, start
    block_terms: dict = field(default_factory=dict)  # mixed_pipeline_bounds._block_terms
    window_arrays: dict = field(default_factory=dict)  # moe_window_arrays, by the first layer
    ep_ok: dict = field(default_factory=dict)  # replicas.replica_ep_options: ep_error is None, by (ep, d, cp)


class LayerRuns(NamedTuple):
    """Where a model's MoE layers sit, for box_sequence_holds: per run length d (index d), the starts q (q + d <= L)
    of the runs of d consecutive layers grouped by the MoE layers such a run holds, as (MoE layers, bit mask of its
    starts) pairs; per start q (index q), the MoE layers from q to the model's end."""

    layers: int
    by_length: tuple[tuple[tuple[int, int], ...], ...]
    to_end: tuple[int, ...]

    @classmethod
    def of(cls, before: list[int]) -> LayerRuns:
        """From ModelSpec.moe_layers_before of 0..L (MixedContext.moe_before)."""
        L = len(before) - 1
        by_length: list[tuple[tuple[int, int], ...]] = [()]
        for d in range(1, L + 1):
            masks: dict[int, int] = {}
            for q in range(L - d + 1):
                e = before[q + d] - before[q]
                masks[e] = masks.get(e, 0) | (1 << q)
            by_length.append(tuple(sorted(masks.items())))
        return cls(L, tuple(by_length), tuple(before[L] - before[q] for q in range(L + 1)))


@dataclass
class MixedContext:
    """One mixed-cluster search: the job, its options and framework, a cost provider per node group, the groups in
    pipeline order (planner.parallel.group_order) and memoized bounds."""

    job: Job
    opts: SearchOptions
    fw: Framework | None
    costs: CostSource  # group -> AnalyticCosts, and the links between groups
    order: list[int]
    caches: MixedCaches = field(default_factory=MixedCaches)
    # the stage models' shared forms (StageModel caches): models of one set of degrees share them at every depth
    form_caches: dict[tuple, FormCache] = field(default_factory=dict)

    @functools.cached_property
    def moe_before(self) -> list[int]:
        """ModelSpec.moe_layers_before of 0..num_layers: the MoE layers of layers q..q+n-1 are
        moe_before[q + n] - moe_before[q]."""
        m = self.job.model
        return [m.moe_layers_before(i) for i in range(m.num_layers + 1)]

    @functools.cached_property
    def layer_runs(self) -> LayerRuns:
        """LayerRuns of the model (mixed_pipeline_bounds.box_sequence_holds)."""
        return LayerRuns.of(self.moe_before)

    def stage_terms(self, sm: StageModel, g: int, s: int) -> tuple[float, float, float, int]:
        """(room, alpha, beta) of quick.stage_memory_term and max_layers for stage s of a model from
        _stage_models on group g. They depend on the pipeline depth only through the stage's in-flight
        micro-batches and whether it is first or last, so they are shared across depths."""
        key = (*_position(sm, s), sm.inflight(s))
        hit = self.caches.stage_terms.get(key)
        if hit is None:
            room, alpha, beta = quick.stage_memory_term(sm, self.capacity(g), s)
            hit = self.caches.stage_terms[key] = (room, alpha, beta, max_layers(sm, s, room))
        return hit

    def tail_floor(self, sm: StageModel, s: int, cap: int, vpp: int | None = None) -> float:
        """A floor under what stage s's exposed DP communication after its last backward (StageModel.iteration_tail)
        adds to a bound that also counts the stage's recompute seconds once in sum_s t_s / vpp (the schedule's
        second term: planner/cost/schedule.py): the least exposed communication over every layer count 1..cap
        (the most the stage can hold), in any mix of the model's layer kinds, without recompute where a recomputed
        layer adds at least as much there as its longer backward hides (recompute_pays_up_to), else with every
        layer recomputed (the longest backward hides the most); read off the stage's TailProfile. ``vpp``: the
        stage model's own unless given (math.inf: every layer recomputed, valid at any vpp)."""
        cap = max(1, min(cap, self.job.model.num_layers))
        return min(self.tail_profile(sm, s, vpp).at[1 : cap + 1])

    def tail_profile(self, sm: StageModel, s: int, vpp: float | None = None, start: int | None = None) -> TailProfile:
        """Stage s's TailProfile as tail_floor reads it (with recompute paid for up to recompute_pays_up_to, else
        with every layer recomputed), memoized by stage position. Its layers start at layer ``start`` or later
        (default s: every stage before it holds a layer), so they are counted in the layer mixes of the model from
        there on (moe_windows): past a model's leading dense layers, MoE layers only."""
        paid = (sm.dims.vpp if vpp is None else vpp) <= self.recompute_pays(sm, s)
        start = window_start(self.job.model, s if start is None else start)
        key = (*_position(sm, s), paid, start)
        profile = self.caches.tail_profile.get(key)
        if profile is None:
            lines = self.tail_lines(sm, s, paid)
            profile = self.caches.tail_profile[key] = tail_profile(lines, moe_window_arrays(self, start))
        return profile

    def tail_lines(self, sm: StageModel, s: int, paid: bool) -> tuple[dict[str, tuple[float, float]], ...]:
        """tail_lines, memoized by stage position (the profiles of one stage at every first layer read the same)."""
        key = (*_position(sm, s), paid)
        hit = self.caches.tail_lines.get(key)
        if hit is None:
            hit = self.caches.tail_lines[key] = tail_lines(sm, s, paid)
        return hit

    def recompute_pays(self, sm: StageModel, s: int) -> float:
        """recompute_pays_up_to, memoized by stage position."""
        key = _position(sm, s)
        hit = self.caches.recompute_pays.get(key)
        if hit is None:
            hit = self.caches.recompute_pays[key] = recompute_pays_up_to(sm, s)
        return hit

    def sharded_line(self, sm: StageModel, s: int) -> tuple[float, float]:
        """(per layer, constant) of a line under ZeRO-2/3's exposed per-micro-batch traffic of stage s
        (TimeForms.zero: max(0, traffic - fsdp_overlap * compute)), valid for every layer count and recompute:
        the compute that hides it is taken with every layer recomputed. (0, 0) below ZeRO-2."""
        key = _position(sm, s)
        hit = self.caches.sharded_line.get(key)
        if hit is None:
            hit = self.caches.sharded_line[key] = _sharded_line(sm, s)
        return hit

    def sharded_kinds(self, sm: StageModel, s: int) -> tuple[float, float] | None:
        """(dense, MoE) seconds per layer of each kind in a line under stage s's exposed ZeRO-2/3 traffic, for a
        model with both kinds: a stage of d dense and e MoE layers exposes at least d * dense + e * moe (the MoE
        layers' expert parameters are gathered too: far above sharded_line's any-mix slope). The dense slope may be
        below 0 (its layers' compute hides more than they gather). None for a model with one kind, below ZeRO-2,
        where a kind's constant is below 0 (the line then needs it, which its callers do not add) or where a kind's
        least seconds per layer with its slope would not stay above 0; sharded_line stands for both kinds then."""
        key = _position(sm, s)
        if key not in self.caches.sharded_kinds:
            self.caches.sharded_kinds[key] = _sharded_kinds(sm, s)
        return self.caches.sharded_kinds[key]

    def capacity(self, g: int) -> float:
        return self.job.cluster[g].gpu.memory_gib * (1 - self.opts.memory_margin)


def _position(sm: StageModel, s: int) -> tuple:
    """What MixedContext memoizes a stage's terms by: its model's shared forms (StageModel.form_cache: the same at
    every depth) and whether it is the first or the last stage (the depth reaches them only through those and the
    stage's in-flight count)."""
    return sm.form_cache, s == 0, s == sm.dims.pp - 1


class TailWay(NamedTuple):
    """The DP tail terms of ZeroTerms one way (_zero_tails): with recompute paid for in the schedule's sum, or with
    every layer recomputed."""

    reach: tuple  # per layer count n = 1..L, the least tail of a stage holding n or more layers
    ends: tuple | None  # (first stage's, last stage's by its first layer) tails holding 1..n layers
    moe_reach: tuple | None  # reach of a stage past the leading dense layers (None: the model has none)


_NO_WAY = TailWay((), None, None)


class WayMeter:
    """Tail ways (ZeroTails.at) a share of the mixed search reads for the first time: each is worked out then in
    the share's own process (0.3-0.5 ms on the slow suite jobs), so the search counts them as work for lockstep
    (mixed_pipelines.WORK). ``seen``: the share now stepping's ways read so far (its own set, swapped in by the
    share: the same count whether the two shares share a process and its caches or not)."""

    seen: set = set()
    firsts = 0


@dataclass
class ZeroTails:
    """The DP tail terms of ZeroTerms: each way (TailWay) worked out when first read, since a family reads only the
    one its vpp takes (paid for up to ``pays_up_to`` model chunks per stage, else every layer recomputed): on
    seed-7 suite job 37, 1,124 groups' tails at 1.6 ms each, about half of it the way no family read."""

    pays_up_to: float
    make_way: Callable[[int], TailWay] | None = field(default=None, repr=False, compare=False)
    ways: dict = field(default_factory=dict, repr=False, compare=False)

    def way(self, vpp: int) -> int:
        """Which way holds at ``vpp``: 0 (paid) up to pays_up_to, else 1 (every)."""
        return 0 if vpp <= self.pays_up_to else 1

    def at(self, vpp: int) -> TailWay:
        """The terms of the way that holds at ``vpp`` (counted in WayMeter)."""
        w = self.way(vpp)
        seen = (id(self), w)
        if seen not in WayMeter.seen:
            WayMeter.seen.add(seen)
            WayMeter.firsts += 1
        hit = self.ways.get(w)
        if hit is None:
            hit = self.ways[w] = _NO_WAY if self.make_way is None else self.make_way(w)
        return hit


_NO_TAILS = ZeroTails(float("inf"))


@dataclass
class ZeroTerms:
    """What a ZeRO stage adds to the bound of a node group's stages at fixed degrees, valid at every depth >= 2:
    ``slope`` seconds per layer of exposed ZeRO-2/3 traffic (MixedContext.sharded_line; 0 when a middle stage's
    line could fall below it), ``first`` / ``last`` the (<= 0) constants that line adds on the end stages, the
    least DP tail, and the most layers a stage can hold by how many micro-batches it keeps in flight
    (``room``, per interleaving degree)."""

    sm: StageModel | None  # the group's model at depth 3 (None: too few layers for one)
    middle_room: float
    caps: dict[int, list[int]] = field(default_factory=dict)  # by vpp: prefix sums over stages 1, 2, ... from the end
    memory: dict[float, tuple] = field(default_factory=dict)  # memory_terms by in-flight count
    kind_memory: dict[float, tuple] = field(default_factory=dict)  # kind_times by in-flight count
    inflight: dict[tuple[int, int], float] = field(default_factory=dict)  # least_inflight by (after, vpp)
    runs: dict[tuple[int, int, int], tuple] = field(default_factory=dict)  # stage_runs by (after, count, vpp)
    windows: tuple | None = None  # moe_windows of a model with dense and MoE layers
    capacity_gib: float = 0.0  # the group's usable GPU memory (MixedContext.capacity)
    all_or_none: bool = False  # its stages recompute all their layers or none (SearchOptions.all_or_none_recompute)
    # work out the traffic lines (_zero_lines) and the DP tail terms reach reads (_zero_tails) when a bound first
    # reads them: a TP-choice node only reads the memory terms, and many families are cut before their tails
    make_lines: Callable[[], tuple] | None = field(default=None, repr=False, compare=False)
    make_tails: Callable[[], ZeroTails] | None = field(default=None, repr=False, compare=False)
    covered: dict = field(default_factory=dict, repr=False, compare=False)  # covers, by (id(other), vpp)

    @functools.cached_property
    def _lines(self) -> tuple[float, float, float, tuple[float, float] | None]:
        return self.make_lines() if self.make_lines is not None else (0.0, 0.0, 0.0, None)

    @property
    def slope(self) -> float:
        return self._lines[0]

    @property
    def first(self) -> float:
        return self._lines[1]

    @property
    def last(self) -> float:
        return self._lines[2]

    @property
    def kind_slopes(self) -> tuple[float, float] | None:
        """(dense, MoE) slopes where each kind has its own (MixedContext.sharded_kinds at all three stages: the
        least of each; the dense one may be below 0 and ``slope``), else None and ``slope`` stands for both."""
        return self._lines[3]

    @property
    def slopes(self) -> tuple[float, float]:
        """(dense, MoE) slopes: kind_slopes where the group has them, else ``slope`` for both."""
        return self._lines[3] or (self._lines[0], self._lines[0])

    @functools.cached_property
    def _tails(self) -> ZeroTails:
        return _NO_TAILS if self.make_tails is None else self.make_tails()

    def tail(self, vpp: int = 1) -> float:
        """The least exposed DP tail of any of the group's stages in a pipeline of ``vpp`` model chunks per stage
        (MixedContext.tail_floor of the first, a middle and the last stage: at any depth >= 2): reach at one layer."""
        reach = self.reach(vpp)
        return reach[0] if reach else 0.0

    def reach(self, vpp: int = 1) -> tuple[float, ...]:
        """Per layer count n = 1..L (index n - 1), the least DP tail a stage of this group holding n or more layers
        has (TailProfile.reach, the least over the first, a middle and the last stage), as tail: with recompute
        paid for in the schedule's sum up to the vpp where that holds, else with every layer recomputed."""
        return self._tails.at(vpp).reach

    def moe_reach(self, vpp: int = 1) -> tuple[float, ...] | None:
        """``reach`` of a stage that holds MoE layers only (a middle or last stage past the model's leading dense
        layers: ModelSpec.all_moe_from), None for a model without leading dense layers (``reach`` is that)."""
        return self._tails.at(vpp).moe_reach

    def end_tails(self, after_first: int, vpp: int = 1) -> tuple[float, float]:
        """(first, last): the least DP tail of this group's stage at the start of a pipeline with at least
        ``after_first`` stages after it (it also holds the embedding's parameters, and at most room(after_first, 1)
        layers: fewer layers hide less of its communication behind their backward) and of its stage at the end of
        such a pipeline (the logits'; at most room(0, 1) layers, from layer after_first on), as ``reach`` takes
        them."""
        ends = self._tails.at(vpp).ends
        if ends is None:
            return 0.0, 0.0
        first, last = ends

        def held(within, after: int) -> float:
            return within[int(min(max(1.0, self.room(after, 1, vpp)), len(within))) - 1]

        return held(first, after_first), held(last[min(max(after_first, 1), len(last) - 1)], 0)

    def room(self, after: int, count: int, vpp: int = 1) -> float:
        """Most layers ``count`` stages of this group can hold when at least ``after`` stages follow them, in a
        pipeline of ``vpp`` model chunks per stage: each stage holds at most what a middle stage can at its
        in-flight count (the ends hold less), and the count only falls with more stages after it
        (planner.cost.memory.inflight_microbatches). A stage with f - 1 stages after it is in a pipeline of at
        least f stages, and its in-flight count only grows with the depth, so it keeps at least the first stage's
        count of an f-stage pipeline (1F1B: f; interleaved: more)."""
        if self.sm is None:
            return float("inf")
        top = after + count
        caps = self.caps.get(vpp)
        if caps is None:
            caps = self.caps[vpp] = [0]
        if len(caps) <= top:
            self._extend_caps(caps, top, vpp)
        return caps[top] - caps[after]

    def _extend_caps(self, caps: list[int], top: int, vpp: int) -> None:
        """room's prefix sums up to ``top`` stages (StageModel.most_layers_each over their in-flight counts)."""
        inflights = [self.least_inflight(after, vpp) for after in range(len(caps) - 1, top)]
        for held in self.sm.most_layers_each(self.middle_room, inflights):
            caps.append(caps[-1] + held)

    def least_inflight(self, after: int, vpp: int) -> float:
        """The fewest micro-batches a stage of this group with at least ``after`` stages after it keeps in flight
        (see room)."""
        key = (after, vpp)
        hit = self.inflight.get(key)
        if hit is None:
            hit = self.inflight[key] = inflight_microbatches(0, after + 1, vpp, self.sm.mb)
        return hit

    def stage_runs(self, after: int, count: int, vpp: int = 1) -> tuple[tuple[int, int], ...]:
        """``count`` stages of this group with at least ``after`` stages after the last of them, from the last one
        back, in runs that keep the same least in-flight count (the i-th from the end has at least after + i
        stages after it): (stages, the ``after`` of the run's last stage), for memory_terms and kind_times."""
        key = (after, count, vpp)
        hit = self.runs.get(key)
        if hit is None:
            out: list[tuple[int, int]] = []
            last = None
            for i in range(after, after + count):
                f = self.least_inflight(i, vpp)
                if f == last:
                    out[-1] = (out[-1][0] + 1, out[-1][1])
                else:
                    out.append((1, i))
                    last = f
            hit = self.runs[key] = tuple(out)
        return hit

    def memory_terms(self, after: int, vpp: int = 1) -> tuple[float, ...] | None:
        """(room, alpha, beta, a, rc) of the roomiest stage of this group when at least ``after`` stages follow it
        (the in-flight count of ZeroTerms.room): its allocatable bytes left for layers, bytes per layer of the heavy
        kind (the MoE layer of an MoE model) and bytes a full recompute of one saves (quick.stage_memory_term, at
        that in-flight count), and the heavy layer's least seconds and recompute seconds; None below depth 3."""
        if self.sm is None:
            return None
        sm = self.sm
        inflight = self.least_inflight(after, vpp)
        hit = self.memory.get(inflight)
        if hit is None:
            kind = sm.kinds[heavy_kind(sm.job.model)[0]]
            room = quick.memory_term(sm, self.capacity_gib, False, False, inflight)
            hit = self.memory[inflight] = (*room, kind.layer_floor(), kind.recompute_floor())
        return hit

    def kind_times(self, after: int, vpp: int = 1) -> tuple[float, ...] | None:
        """kind_memory_times of the roomiest stage of memory_terms (a middle stage at that in-flight count), for a
        model with dense and MoE layers (``windows``); None below depth 3 or for a model with one kind."""
        if self.sm is None or self.windows is None:
            return None
        inflight = self.least_inflight(after, vpp)
        hit = self.kind_memory.get(inflight)
        if hit is None:
            room = self.memory_terms(after, vpp)[0]
            hit = self.kind_memory[inflight] = kind_memory_times(
                block_terms(self.sm, room, inflight, False, False, 0.0), self.windows
            )
        return hit

    def covers(self, other: ZeroTerms, vpp: int) -> bool:
        """Whether no bound reads a term of this ZeRO stage's that is worse than ``other``'s (the same group at the
        same degrees, another ZeRO stage), so that no bound at this one is above one at ``other`` and a least over
        ZeRO stages may leave ``other`` out (the bounds read traffic lines and DP tails as floors, and memory as
        room, every one of them only raised by more traffic or tail and by less room): lines (slope, kind slopes,
        end constants) and the DP tail terms at ``vpp`` (reach, moe_reach, the end stages' tails) each at most
        other's, and the group's model holding no more bytes of state per parameter (ZeRO shards the optimizer
        state, gradients and weights; activations do not depend on it) and no gathered layers beyond other's, so at
        least its room at every in-flight count. ZeRO-1 covers ZeRO-0 where its reduce-scatter and all-gather
        expose no more than the all-reduce and its smaller optimizer step make up for: on seed-5 suite job 13 in
        all 8,114 open families with both. Memoized on this object (its ZeroTerms live as long as the context)."""
        key = (id(other), vpp)
        hit = self.covered.get(key)
        if hit is None:
            hit = self.covered[key] = self._covers(other, vpp)
        return hit

    def _covers(self, other: ZeroTerms, vpp: int) -> bool:
        if self.sm is None or other.sm is None:
            return self.sm is None and other.sm is None
        if not (self.slope <= other.slope and self.first <= other.first and self.last <= other.last):
            return False
        if not all(x <= y for x, y in zip(self.slopes, other.slopes)):
            return False
        mine, theirs = self.sm, other.sm
        if mine.gathered_layers > theirs.gathered_layers or self.middle_room < other.middle_room:
            return False
        if any(mine.bytes_per_param[k] > theirs.bytes_per_param[k] for k in theirs.bytes_per_param):
            return False
        a, b = self._tails.at(vpp), other._tails.at(vpp)
        if not _at_most(a.reach, b.reach):
            return False
        if (a.moe_reach is None) != (b.moe_reach is None) or (a.ends is None) != (b.ends is None):
            return False
        if a.moe_reach is not None and not _at_most(a.moe_reach, b.moe_reach):
            return False
        if a.ends is not None:
            (first_a, lasts_a), (first_b, lasts_b) = a.ends, b.ends
            if len(lasts_a) != len(lasts_b) or not _at_most(first_a, first_b):
                return False
            return all(_at_most(x, y) for x, y in zip(lasts_a, lasts_b))
        return True


def uncovered(zts, vpp: int) -> tuple[int, ...]:
    """The indices of the ZeRO stages ``zts`` (each a sequence of ZeroTerms, one per group or choice, in one order)
    that no other covers at every group (ZeroTerms.covers; of stages that cover each other, the first): a least over
    the ZeRO stages needs only these. The one rule of which ZeRO stages a bound leaves out."""

    def covers(j: int, i: int) -> bool:
        return covers_every(zts[j], zts[i], vpp)

    n = len(zts)
    return tuple(
        i for i in range(n) if not any(j != i and covers(j, i) and not (j > i and covers(i, j)) for j in range(n))
    )


def covers_every(better, worse, vpp: int) -> bool:
    """Whether each ZeroTerms of ``better`` covers the one of ``worse`` in the same place (ZeroTerms.covers: two
    ZeRO stages' terms of the same groups or choices, in one order)."""
    return all(x.covers(y, vpp) for x, y in zip(better, worse))


def _at_most(xs, ys) -> bool:
    """Whether two sequences of one length are elementwise xs <= ys."""
    return len(xs) == len(ys) and all(x <= y for x, y in zip(xs, ys))


def zero_terms(
    ctx: MixedContext, g: int, tp: int, dp: int, cp: int, mbs: int, base: str, zero: int, ep: int = 1
) -> ZeroTerms:
    key = (g, tp, dp, cp, ep, mbs, base, zero)
    hit = ctx.caches.zero_terms.get(key)
    if hit is None:
        hit = ctx.caches.zero_terms[key] = _zero_terms(ctx, g, tp, dp, cp, mbs, base, zero, ep)
    return hit


def _zero_terms(
    ctx: MixedContext, g: int, tp: int, dp: int, cp: int, mbs: int, base: str, zero: int, ep: int
) -> ZeroTerms:
    """The group's model at these degrees (EP included: it shrinks the expert parameters a stage holds, so the
    memory room below is that of an EP plan)."""
    job = ctx.job
    L = job.model.num_layers
    if L < 3:
        return ZeroTerms(None, 0.0)
    dims = pipeline_dims(job, (g, g, g), (tp, tp, tp), dp, cp, mbs, zero, base, ep=ep)
    sm = StageModel(job, dims.stage_dims(0), ctx.costs(g), ctx.form_caches)
    room = quick.stage_memory_term(sm, ctx.capacity(g), 1)[0]
    windows = moe_windows(ctx) if all(layer_counts(job.model).values()) else None
    return ZeroTerms(
        sm,
        room,
        capacity_gib=ctx.capacity(g),
        all_or_none=ctx.opts.all_or_none_recompute,
        windows=windows,
        make_lines=functools.partial(_zero_lines, ctx, sm),
        make_tails=functools.partial(_zero_tails, ctx, sm, L),
    )


def _zero_lines(ctx: MixedContext, sm: StageModel) -> tuple[float, float, float, tuple[float, float] | None]:
    """ZeroTerms' (slope, first, last, kind_slopes): the ZeRO-2/3 traffic lines of the first, a middle and the last
    stage (MixedContext.sharded_line); no slope where a middle stage's line could fall below it."""
    lines = [ctx.sharded_line(sm, s) for s in range(3)]
    if lines[1][1] < 0:
        return 0.0, 0.0, 0.0, None
    first, last = min(0.0, lines[0][1]), min(0.0, lines[2][1])
    kinds = [ctx.sharded_kinds(sm, s) for s in range(3)]
    slopes = None if None in kinds else (min(d for d, _ in kinds), min(e for _, e in kinds))
    return min(z for z, _ in lines), first, last, slopes


def _zero_tails(ctx: MixedContext, sm: StageModel, L: int) -> ZeroTails:
    """ZeroTerms' ZeroTails: the largest vpp at which recompute is paid for in the schedule's sum; and each way
    (paid, every layer recomputed; _tail_way, when first read) per layer count n = 1..L, the least tail any of the
    first, a middle and the last stage (at any depth >= 2) has holding n or more layers; per n the least tail of the
    first stage (it also holds the embedding) holding 1 to n layers, and the same of the last stage (the logits) by
    the first layer it may hold, 0 up to the leading dense layers (window_start: a last stage past them holds MoE
    layers only); and the reaches of a middle or last stage past those layers (None without them)."""
    pays = min(ctx.recompute_pays(sm, s) for s in range(3))
    return ZeroTails(pays, functools.partial(_tail_way, ctx, sm, L))


def _tail_way(ctx: MixedContext, sm: StageModel, L: int, way: int) -> TailWay:
    """_zero_tails' terms one way: 0 with recompute paid for, 1 with every layer recomputed."""
    import numpy as np

    vpp = 1 if way == 0 else math.inf
    lead = window_start(ctx.job.model, L)  # (past it every start reads the same layer mixes)

    def within(profile) -> tuple[float, ...]:
        return tuple(np.minimum.accumulate(np.asarray(profile.at[1:], dtype=float)).tolist())

    def least_reach(profiles) -> tuple[float, ...]:
        """Per layer count, the least reach of the stages' profiles."""
        return tuple(map(min, *(p.reach[1:] for p in profiles)))

    # the first stage, a middle and the last one of a 3-stage model: the latter two start at layer 1 or later
    reach = least_reach([ctx.tail_profile(sm, s, vpp, start=min(s, 1)) for s in range(3)])
    first = within(ctx.tail_profile(sm, 0, vpp, start=0))
    ends = first, tuple(within(ctx.tail_profile(sm, 2, vpp, start=s)) for s in range(lead + 1))
    moe = None
    if moe_lead(ctx.job.model.all_moe_from, L) is not None:
        moe = least_reach(ctx.tail_profile(sm, s, vpp, start=lead) for s in (1, 2))
    return TailWay(reach, ends, moe)


def tp_options(ctx: MixedContext, g: int, cp: int) -> list[int]:
    """TP degrees a stage on group g may use (planner.parallel: node_group_tp_options, seq_shard_error)."""
    job = ctx.job
    return [
        tp
        for tp in node_group_tp_options(job.model, [job.cluster[g].gpus_per_node])
        if seq_shard_error(job.training, cp, tp) is None
    ]


def cp_options(ctx: MixedContext) -> list[int]:
    """CP degrees shared by all stages (planner.parallel.cp_options over the largest group); the sequence shard
    divisible by every TP degree a stage may use is checked per family."""
    return parallel.cp_options(ctx.job.training, max(g.num_gpus for g in ctx.job.cluster))


def ep_options(ctx: MixedContext, dp: int, cp: int) -> list[int]:
    """EP degrees shared by all stages at this dp and cp (planner.parallel.ep_options: every stage carves its EP
    groups out of its own dp*cp ranks, whatever its TP) that the framework, if any, runs; the framework's rules
    that also read a stage's TP and ZeRO stage are checked per candidate (mixed_pipelines._Family.candidates)."""
    return [ep for ep in parallel.ep_options(ctx.job.model, dp, cp) if ctx.fw is None or ctx.fw.allows(cp=cp, ep=ep)]


def vpp_options(ctx: MixedContext, microbatches: int, max_pp: int) -> list[int]:
    """Interleaving degrees a mixed pipeline of at most ``max_pp`` stages may use with this micro-batch count: those
    planner.parallel.vpp_options (the homogeneous rule) gives at some depth 1..max_pp, that the framework, if any,
    runs. Whether a candidate's own depth takes its vpp is checked per candidate
    (mixed_pipelines._Family.candidates)."""
    L = ctx.job.model.num_layers
    found = set()
    for pp in range(1, min(L, max_pp) + 1):
        found.update(parallel.vpp_options(L, pp, microbatches))
    return [v for v in sorted(found) if ctx.fw is None or ctx.fw.allows(vpp=v)]


def send_bound(ctx: MixedContext, g: int, tp: int, cp: int, dp: int, mbs: int) -> float:
    """Pipeline-send seconds per micro-batch and model chunk of a stage on group g over its own links
    (planner/cost/stage.py: an activation forward and a gradient back; a stage of vpp chunks sends vpp times)."""
    key = (g, tp, cp, dp, mbs)
    if key not in ctx.caches.send:
        job = ctx.job
        link, nbytes = pipeline_send(ctx.costs(g), job.model, mbs * job.training.seq_length // cp, tp, cp, dp)
        ctx.caches.send[key] = 2 * link.p2p(nbytes)
    return ctx.caches.send[key]


def end_costs(ctx: MixedContext, first, last, cp: int, mbs: int) -> tuple[float, float]:
    """Embedding seconds on the first stage and logits seconds on the last, per micro-batch, each with the
    accumulation of its gradients (a tied output layer's copy counted only as a one-stage pipeline has it: none)."""
    key = (first, last, cp, mbs)
    if key not in ctx.caches.end_costs:
        ctx.caches.end_costs[key] = _end_times(ctx, first, last, cp, mbs)
    return ctx.caches.end_costs[key]


def _end_times(ctx: MixedContext, first, last, cp: int, mbs: int) -> tuple[float, float]:
    job = ctx.job
    tokens = mbs * job.training.seq_length // cp
    m, grads = job.model, job.training.grad_dtype
    emb = embedding_seconds(ctx.costs(first[0]), m, tokens, first[1], first[1] > 1, grads)[0]
    return emb, logits_seconds(ctx.costs(last[0]), m, tokens, last[1], grads, False)[0]


def max_layers(sm: StageModel, s: int, room: float, inflight: float | None = None) -> int:
    """Most layers stage s can hold in ``room`` allocatable bytes (quick._stage_memory_terms), every layer at its
    lightest footprint and no more layers of a kind than the model has (StageModel.most_layers): an upper bound on
    n_s for any recompute placement. ``inflight`` overrides the stage's in-flight micro-batches."""
    return sm.most_layers(room, sm.inflight(s) if inflight is None else inflight)


def _any_mix_line(overlap, compute, forward, model, recomputed: bool = True) -> tuple[float, float]:
    """(constant, per layer) of an overlap's traffic - share * window (Overlap.recomputed_line) that holds for a
    stage of n >= 1 layers in any mix of the kinds the model has, each fully recomputed (the longest window; with
    ``recomputed`` False, none): the least constant and the least per-layer term over those kinds (layers of kind
    k add n_k * slope_k >= n_k * min slope, and a stage of dense layers only has no MoE term)."""
    lines = _kind_lines(overlap, compute, forward, model, recomputed).values()
    return min(c for c, _ in lines), min(p for _, p in lines)


def _kind_lines(overlap, compute, forward, model, recomputed: bool) -> dict[str, tuple[float, float]]:
    """Overlap.recomputed_line of each layer kind the model has: a stage of d dense and e >= 1 MoE layers has
    traffic - share * window = c_moe + d * p_dense + e * p_moe (the MoE line's constant carries the terms that
    come with any MoE layer), one of dense layers only c_dense + d * p_dense."""
    count = layer_counts(model)
    return {k: overlap.recomputed_line(compute, forward, k, recomputed) for k in ("dense", "moe") if count[k]}


class WindowArrays(NamedTuple):
    """moe_windows as tail_profile reads them, arrays of (choice of e) x n for n = 0..num_layers: the MoE layers
    e of each choice (fewest[n], most[n], and 1 clipped into the window: max(fewest, min(1, most))), the dense
    layers n - e, and whether e >= 1."""

    moe: np.ndarray
    dense: np.ndarray
    any_moe: np.ndarray


def moe_window_arrays(ctx: MixedContext, start: int = 0) -> WindowArrays:
    """The WindowArrays of moe_windows from layer ``start`` on, memoized."""
    hit = ctx.caches.window_arrays.get(start)
    if hit is None:
        import numpy as np

        fewest, most = (np.asarray(x, dtype=float) for x in moe_windows(ctx, start))
        e = np.stack((fewest, most, np.maximum(fewest, np.minimum(1.0, most))))
        n = np.arange(len(fewest), dtype=float)
        hit = ctx.caches.window_arrays[start] = WindowArrays(e, n - e, e > 0)
    return hit


def moe_lead(moe_from: int, num_layers: int) -> int | None:
    """Where a model's leading dense layers end, for a model whose every later layer is MoE
    (ModelSpec.all_moe_from = ``moe_from``, with at least one such dense layer): a stage from that position on holds
    MoE layers only. None for a model without such a position."""
    return moe_from if 0 < moe_from < num_layers else None


def window_start(model, position: int) -> int:
    """The first layer a stage at ``position`` (or later) may hold, as far as the layer mixes of moe_windows tell
    apart: ``position`` (every stage before it holds a layer), but no further than the model's leading dense
    layers (past them the mixes of a model with a layer pattern repeat), 0 for a model with one kind."""
    lead = model.moe.first_dense_layers if model.moe is not None else 0
    return max(0, min(position, lead, model.num_layers - 1))


def moe_windows(ctx: MixedContext, start: int = 0) -> tuple[list[int], list[int]]:
    """(fewest, most) MoE layers in any n consecutive layers of the model from layer ``start`` on, for n =
    0..num_layers: the layer kinds of a stage's n layers as the cost model counts them (planner/cost/stage
    .split_kinds: a stage's layers are consecutive ones at any vpp; planner.spec.ModelSpec.is_moe_layer). A count
    n that does not fit from ``start`` on (no stage there holds it) takes the windows anywhere in the model."""
    hit = ctx.caches.moe_windows.get(start)
    if hit is None:
        m = ctx.job.model
        before = [m.moe_layers_before(i) for i in range(m.num_layers + 1)]
        L = m.num_layers
        counts = [[before[i + n] - before[i] for i in range(L - n + 1)] for n in range(L + 1)]
        counts = [c[start:] or c for c in counts]
        hit = ctx.caches.moe_windows[start] = ([min(c) for c in counts], [max(c) for c in counts])
    return hit


def recompute_pays_up_to(sm: StageModel, s: int) -> float:
    """The largest interleaving degree v at which recompute on stage s adds at least as much to an iteration bound
    as it hides of the stage's exposed DP tail, so that the tail may be floored without recompute. A stage
    recomputing r layers takes c_any + r*c_r more seconds per micro-batch (its compute form), counted once in the
    schedule's sum_s t_s / v; its longer backward hides at most h_any + r*h_r of the tail's parts together
    (Overlap.hidden_by_recompute; max(0, x - h) >= max(0, x) - h for h >= 0). So with c/v >= h for both terms,
    tail(n, r) + (c_any + r*c_r)/v >= tail(n, 0): v <= min c/h (inf when recompute hides nothing; below 1 when
    it hides more than it costs even at v = 1)."""
    first, last = s == 0, s == sm.dims.pp - 1
    compute, forward = sm.compute_form(first, last), sm.forward_form(first, last)
    parts = sm.tail_forms(first, last).parts()
    count = layer_counts(sm.job.model)
    most = float("inf")
    for kind in ("dense", "moe"):
        if not count[kind]:
            continue
        hidden = [x.hidden_by_recompute(compute, forward, kind) for x in parts]
        costs = (compute.per_recomputed(kind), compute.any_recomputed)
        for h, c in zip((sum(h for h, _ in hidden), sum(h for _, h in hidden)), costs):
            if h > 0:
                most = min(most, c / h)
    return most


class BlockTerms(NamedTuple):
    """What a stage's least seconds per micro-batch on a run of its layers read (block_terms): each kind's least
    seconds per layer (x dense, y MoE), bytes per layer kept (ad, ae) and kept when recomputed (lean_d, lean_e), the
    least seconds recompute costs per byte it frees (rho) and the stage's room for layers."""

    x: float
    y: float
    ad: float
    ae: float
    lean_d: float
    lean_e: float
    rho: float
    room: float

    def cost(self, n: int, e: int) -> float:
        """d*x + e*y + rho * max(0, d*ad + e*ae - room) (d = n - e): the least seconds on n layers of which e are
        MoE ones when the stage recomputes just enough to fit (inf where it must recompute and nothing frees
        memory), whether or not even every layer recomputed fits (time checks that)."""
        d = n - e
        value = d * self.x + e * self.y
        over = d * self.ad + e * self.ae - self.room
        if over > 0:
            value += self.rho * over
        return value

    def time(self, n: int, e: int) -> float:
        """cost, inf where even every layer recomputed needs more than the room (see kind_memory_times)."""
        if (n - e) * self.lean_d + e * self.lean_e > self.room * (1 + 1e-12):
            return float("inf")
        return self.cost(n, e)


def block_terms(sm: StageModel, room: float, inflight: float, first: bool, last: bool, lift: float) -> BlockTerms:
    """The BlockTerms of a stage (at this position, keeping ``inflight`` micro-batches, with ``room`` allocatable
    bytes left for layers): quick.memory_term per kind at the in-flight count, recompute freeing beta bytes per
    layer at rc seconds (at best rho = min rc/beta seconds per byte) and each kind's least seconds per layer plus
    ``lift`` (its ZeRO-2/3 line)."""
    memory = sm.allocated_memory(first, last)
    ad, ae = memory.per_layer("dense", inflight), memory.per_layer("moe", inflight)
    bd, be = -memory.per_recomputed("dense", inflight), -memory.per_recomputed("moe", inflight)
    kd, ke = sm.kinds["dense"], sm.kinds["moe"]
    rates = [k.recompute_floor() / b for k, b in ((kd, bd), (ke, be)) if b > 0]
    rho = min(rates) if rates else float("inf")
    return BlockTerms(kd.layer_floor() + lift, ke.layer_floor() + lift, ad, ae, ad - bd, ae - be, rho, room)


def kind_memory_times(terms: BlockTerms, windows) -> tuple:
    """For a model with dense and MoE layers, the least seconds a stage (its BlockTerms: block_terms at its
    position, in-flight micro-batches and room) spends on n of its layers (n = 1..L, index n - 1) when it
    recomputes just enough to fit, made to grow with n (the least over n or more layers).
    Its n layers hold e MoE layers, fewest[n] <= e <= most[n] (``windows``: moe_windows), and need
    d*alpha_d + e*alpha_e bytes (d = n - e; quick.memory_term per kind, at the stage's in-flight count) of its
    room; recompute frees beta bytes per layer at rc seconds, at best rho = min rc/beta seconds per byte, so the
    layers take at least d*x + e*y + rho * max(0, d*alpha_d + e*alpha_e - room), and nothing fits where even every
    layer recomputed needs more than the room (x, y: each kind's least seconds per layer plus ``lift``;
    BlockTerms.time). That is convex in e: its least lies at an end of the feasible e or next to where the
    recompute starts. With the dense layers counted, a model whose dense layers hold as much activation memory as
    its MoE ones (Llama 4: every other layer) is no longer bounded by its MoE layers alone (_memory_bottleneck)."""
    ad, ae, lean_d, lean_e, room = terms.ad, terms.ae, terms.lean_d, terms.lean_e, terms.room
    cost = terms.cost
    fewest, most = windows
    inf = float("inf")
    times = []
    for n in range(1, len(fewest)):  # (plain loops and comparisons: called for every group model the bounds build)
        lo, hi = fewest[n], most[n]
        # every layer recomputed: (n - e)(ad - bd) + e(ae - be) <= room, linear in e
        if lean_e != lean_d:
            edge = (room - n * lean_d) / (lean_e - lean_d)
            if lean_e > lean_d:
                hi = min(hi, math.floor(edge + 1e-9))
            else:
                lo = max(lo, math.ceil(edge - 1e-9))
        elif n * lean_d > room:
            lo, hi = 1, 0
        if lo > hi:
            times.append(inf)
            continue
        points = [lo, hi] if lo < hi else [lo]
        if ae != ad:
            kink = (room - n * ad) / (ae - ad)  # where the layers start to need recompute
            low, high = math.floor(kink), math.ceil(kink)
            if lo < low < hi:
                points.append(low)
            if lo < high < hi and high != low:
                points.append(high)
        best = inf
        for e in points:  # (e within the feasible range: cost, not time)
            value = cost(n, e)
            if value < best:
                best = value
        times.append(best)
    for i in range(len(times) - 2, -1, -1):
        if times[i + 1] < times[i]:
            times[i] = times[i + 1]
    return tuple(times)


def tail_lines(sm: StageModel, s: int, paid: bool) -> tuple[dict[str, tuple[float, float]], ...]:
    """What stage s adds after its last backward, as parts: its exposed DP tail, max(0, traffic - share * window)
    (reduction behind the backward, gather behind the forward: TailForms), each as its _kind_lines without
    recompute where the bound pays for it (``paid``: see MixedContext.tail_floor), else with every layer
    recomputed; and its optimizer step (TailForms.optimizer, c + d * p_dense + e * p_moe). The iteration adds the
    largest exposed tail and the largest step of the stages (planner.cost.estimate.evaluate_stages), at least
    the largest sum of the two on one stage, so a bound may take that sum as the stage's tail."""
    first, last = s == 0, s == sm.dims.pp - 1
    compute, forward = sm.compute_form(first, last), sm.forward_form(first, last)
    tail = sm.tail_forms(first, last)
    parts = tuple(_kind_lines(x, compute, forward, sm.job.model, not paid) for x in tail.parts())
    count = layer_counts(sm.job.model)
    return (*parts, {k: tail.optimizer.kind_line(k) for k in ("dense", "moe") if count[k]})


class TailProfile(NamedTuple):
    """A stage's tail floor (its exposed DP tail and optimizer step: tail_lines) by its layer count n = 0..num_layers
    (tail_profile), and ``reach[n]``: the least of it over n..num_layers (grows with n), which tells the most layers
    a stage can hold within a tail."""

    at: tuple[float, ...]
    reach: tuple[float, ...]


def tail_profile(lines, windows: WindowArrays) -> TailProfile:
    """The floor of a stage's tail (tail_lines: its exposed DP tail and optimizer step) when it holds n consecutive
    layers, for every n: those hold e MoE layers with fewest[n] <= e <= most[n] (moe_windows) and n - e dense ones,
    and each part is linear in e for e >= 1 (_kind_lines), so its least value over e lies at fewest[n], most[n] or
    1; the parts' least values add up to at most the tail's. An MoE model whose few dense layers carry little
    traffic thus no longer has the tail of a stage of dense layers only. (All parts at once, as arrays of part x
    choice of e x n: built for every group model the bounds read.)"""
    import numpy as np

    coeffs = np.array([(*kinds.get("dense", (0.0, 0.0)), *kinds.get("moe", (0.0, 0.0))) for kinds in lines])
    c_d, p_d, c_m, p_m = (coeffs[:, i, None, None] for i in range(4))  # (part, 1, 1) each
    value = np.where(windows.any_moe, c_m, c_d) + windows.dense * p_d + windows.moe * p_m  # (part, choice of e, n)
    total = np.maximum(0.0, value.min(axis=1)).sum(axis=0)
    total[0] = np.inf
    reach = np.minimum.accumulate(total[::-1])[::-1]
    return TailProfile(tuple(total.tolist()), tuple(reach.tolist()))


def _sharded_kinds(sm: StageModel, s: int) -> tuple[float, float] | None:
    """MixedContext.sharded_kinds: the slopes of _kind_lines of the exposed ZeRO-2/3 traffic, every layer
    recomputed (the longest window), as _sharded_line reads them: a stage of d dense and e MoE layers exposes
    max(0, c_k + d * p_dense + e * p_moe) >= c_k + d * p_dense + e * p_moe (c_k: the MoE line's constant when
    e >= 1, else the dense one's), which is >= d * p_dense + e * p_moe where both constants are >= 0."""
    if sm.dims.zero_stage < 2 or not all(layer_counts(sm.job.model).values()):
        return None
    time = sm.time_forms(s == 0, s == sm.dims.pp - 1)
    lines = _kind_lines(time.zero, time.compute, time.forward, sm.job.model, True)
    (c_d, dense), (c_m, moe) = lines["dense"], lines["moe"]
    floors = sm.kinds["dense"].layer_floor() + dense, sm.kinds["moe"].layer_floor() + moe
    return (dense, moe) if min(c_d, c_m) >= 0 and min(floors) > 0 else None


def _sharded_line(sm: StageModel, s: int) -> tuple[float, float]:
    if sm.dims.zero_stage < 2:
        return 0.0, 0.0
    time = sm.time_forms(s == 0, s == sm.dims.pp - 1)
    # the exposed part before max(0, .) with n layers of any mix of the model's kinds, all recomputed
    const, slope = _any_mix_line(time.zero, time.compute, time.forward, sm.job.model)
    # max(0, slope*n + y0) >= slope*n + y0 when slope >= 0; else only >= 0
    return (slope, const) if slope >= 0 else (0.0, 0.0)
