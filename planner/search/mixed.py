"""What both mixed-cluster searches share (planner/search/hetero.py: mixed pipelines; planner/search/replicas.py:
replicas on different GPU types): the search context with its per-model memory terms, the TP and CP degrees a
node group may use, and per-micro-batch lower bounds on a stage's time (layers, sends, embedding and logits)."""
from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost.stage import StageModel, StagePlan, kind_coeffs, pipeline_send
from planner.frameworks import Framework
from planner.parallel import HeteroDims, cp_error, tp_heads_error
from planner.search import quick
from planner.search.space import SearchOptions, divisors
from planner.spec import Job


def pipeline_dims(job: Job, stage_groups, stage_tp, dp: int, cp: int, mbs: int, zero: int, base: str,
                  layers: tuple[int, ...] | None = None, recompute=None, **extra) -> HeteroDims:
    """The degrees of a mixed pipeline (``extra``: a replica's micro_batches and dp_total); without ``layers`` an
    even split (the last stage takes the rest), which the cost coefficients do not depend on."""
    p, L = len(stage_groups), job.model.num_layers
    return HeteroDims(stage_groups=tuple(stage_groups), stage_tp=tuple(stage_tp), dp=dp, micro_batch_size=mbs,
                      zero_stage=zero, recompute=base,
                      stage_layers=layers or tuple([L // p] * (p - 1) + [L - L // p * (p - 1)]),
                      stage_recompute=recompute, cluster=job.cluster, model=job.model, training=job.training, cp=cp,
                      **extra)


def per_layer_bound(ctx: "MixedContext", g: int, tp: int, cp: int, mbs: int, base: str) -> float:
    """Smallest seconds per layer of any kind on group g's GPU with this TP and CP (compute, TP collectives,
    exposed CP ring)."""
    key = ("layer", g, tp, cp, mbs, base)
    hit = ctx.memo.get(key)
    if hit is None:
        job = ctx.job
        tokens = mbs * job.training.seq_length // cp
        hit = ctx.memo[key] = fastest_layer(kind_coeffs(job, ctx.costs(g), tokens, tp, cp, 1, tp > 1, base))
    return hit


def fastest_layer(kinds) -> float:
    """The least seconds any one layer adds to a stage per micro-batch: compute, TP collectives, exposed CP ring."""
    return min(k.compute + k.tp + k.cp for k in kinds.values())


@dataclass
class MixedContext:
    """One mixed-cluster search: the job, its options and framework, a cost provider per node group, the groups in
    pipeline order (planner.parallel.group_order) and memoized bounds."""
    job: Job
    opts: SearchOptions
    fw: Framework | None
    costs: object  # group -> AnalyticCosts
    order: list[int]
    memo: dict = field(default_factory=dict)  # end costs, sends, per-stage memory terms

    def family_id(self, key) -> int:
        """A small integer for a stage model's degrees (cheap memo keys)."""
        ids = self.memo.setdefault("family ids", {})
        return ids.setdefault(key, len(ids))

    def stage_terms(self, sm: StageModel, g: int, s: int) -> tuple[float, float, float, int]:
        """(room, alpha, beta) of quick.stage_memory_term and max_layers for stage s of a model from
        _stage_models on group g. They depend on the pipeline depth only through the stage's in-flight
        micro-batches and whether it is first or last, so they are shared across depths."""
        sm = sm.original  # sends do not change memory
        key = ("terms", sm.family_key, sm.inflight(s), s == 0, s == sm.dims.pp - 1)
        hit = self.memo.get(key)
        if hit is None:
            room, alpha, beta = quick.stage_memory_term(sm, self.capacity(g), s)
            hit = self.memo[key] = (room, alpha, beta, max_layers(sm, s, room))
        return hit

    def tail_floor(self, sm: StageModel, s: int, cap: int) -> float:
        """The least exposed DP communication after stage s's last backward (StageModel.iteration_tail) over
        every layer count 1..cap (the most the stage can hold), each layer fully recomputed (the longest backward hides the most); 0 for MoE
        models. It is the sum of two max(0, affine in n) parts (StageModel.tail_parts), so its least value over
        integers lies at an end or next to where a part reaches 0."""
        sm = sm.original
        cap = min(cap, self.job.model.num_layers)
        key = ("tail", sm.family_key, s == 0, s == sm.dims.pp - 1, cap)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = _tail_floor(sm, s, cap)
        return hit

    def sharded_line(self, sm: StageModel, s: int) -> tuple[float, float]:
        """(per layer, constant) of a line under ZeRO-2/3's exposed per-micro-batch traffic of stage s
        (StageModel.microbatch_time: max(0, sharded_comm - fsdp_overlap * compute)), valid for every layer count
        and recompute: the compute that hides it is taken with every layer recomputed. (0, 0) below ZeRO-2."""
        sm = sm.original
        key = ("sharded", sm.family_key, s == 0, s == sm.dims.pp - 1)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = _sharded_line(sm, s)
        return hit

    def capacity(self, g: int) -> float:
        return self.job.cluster[g].gpu.memory_gib * (1 - self.opts.memory_margin)


@dataclass
class ZeroTerms:
    """What a ZeRO stage adds to the bound of a node group's stages at fixed degrees, valid at every depth >= 2:
    ``slope`` seconds per layer of exposed ZeRO-2/3 traffic (MixedContext.sharded_line; 0 when a middle stage's
    line could fall below it), ``first`` / ``last`` the (<= 0) constants that line adds on the end stages, the
    least DP tail, and the most layers a stage can hold by how many micro-batches it keeps in flight
    (``room``)."""
    slope: float
    first: float
    last: float
    tail: float            # the least exposed DP tail of any of the group's stages (MixedContext.tail_floor)
    sm: StageModel | None  # the group's model at depth 3 (None: too few layers for one)
    middle_room: float
    caps: list[int] = field(default_factory=lambda: [0])  # prefix sums over in-flight counts 1, 2, ...

    def room(self, after: int, count: int) -> float:
        """Most layers ``count`` stages of this group can hold when at least ``after`` stages follow them: each
        stage holds at most what a middle stage can at its in-flight count (the ends hold less), and the count
        only falls with more stages after it (planner.cost.memory.inflight_microbatches)."""
        if self.sm is None:
            return float("inf")
        top = after + count
        while len(self.caps) <= top:
            f = len(self.caps)
            self.caps.append(self.caps[-1] + max_layers(self.sm, 1, self.middle_room, float(min(f, self.sm.mb))))
        return self.caps[top] - self.caps[after]


def zero_terms(ctx: MixedContext, g: int, tp: int, dp: int, cp: int, mbs: int, base: str, zero: int) -> ZeroTerms:
    key = ("zero terms", g, tp, dp, cp, mbs, base, zero)
    hit = ctx.memo.get(key)
    if hit is None:
        hit = ctx.memo[key] = _zero_terms(ctx, g, tp, dp, cp, mbs, base, zero)
    return hit


def _zero_terms(ctx: MixedContext, g: int, tp: int, dp: int, cp: int, mbs: int, base: str, zero: int) -> ZeroTerms:
    job = ctx.job
    L = job.model.num_layers
    if L < 3:
        return ZeroTerms(0.0, 0.0, 0.0, 0.0, None, 0.0)
    dims = pipeline_dims(job, (g, g, g), (tp, tp, tp), dp, cp, mbs, zero, base)
    sm = StageModel(job, dims.stage_dims(0), ctx.costs(g))
    sm.family_key = ctx.family_id(("zero terms", g, tp, dp, cp, mbs, base, zero))
    lines = [ctx.sharded_line(sm, s) for s in range(3)]
    room = quick.stage_memory_term(sm, ctx.capacity(g), 1)[0]
    tail = min(ctx.tail_floor(sm, s, L) for s in range(3))  # first, middle, last: at any depth >= 2
    if lines[1][1] < 0:
        return ZeroTerms(0.0, 0.0, 0.0, tail, sm, room)
    return ZeroTerms(min(z for z, _ in lines), min(0.0, lines[0][1]), min(0.0, lines[2][1]), tail, sm, room)


def tp_options(ctx: MixedContext, g: int, cp: int) -> list[int]:
    """TP degrees a stage on group g may use: divide gpus_per_node, the heads rules, the sequence shard."""
    m, t = ctx.job.model, ctx.job.training
    gpn = ctx.job.cluster[g].gpus_per_node
    return [tp for tp in divisors(gpn) if tp_heads_error(m, tp) is None and (tp == 1 or t.seq_length // cp % tp == 0)]


def cp_options(ctx: MixedContext) -> list[int]:
    """CP degrees shared by all stages: split the sequence (planner.parallel.cp_error), the sequence shard
    divisible by every TP degree a stage may use is checked per family."""
    t = ctx.job.training
    top = max(g.num_gpus for g in ctx.job.cluster)
    return [cp for cp in divisors(top) if cp_error(t, cp) is None]


def send_bound(ctx: MixedContext, g: int, tp: int, cp: int, dp: int, mbs: int) -> float:
    """Pipeline-send seconds per micro-batch of a stage on group g over its own links (planner/cost/stage.py:
    an activation forward and a gradient back)."""
    key = ("send", g, tp, cp, dp, mbs)
    if key not in ctx.memo:
        job = ctx.job
        link, nbytes = pipeline_send(ctx.costs(g), job.model, mbs * job.training.seq_length // cp, tp, cp, dp)
        ctx.memo[key] = 2 * link.p2p(nbytes)
    return ctx.memo[key]


def end_costs(ctx: MixedContext, first, last, cp: int, mbs: int) -> tuple[float, float]:
    """Embedding seconds on the first stage and logits seconds on the last, per micro-batch."""
    key = ("ends", first, last, cp, mbs)
    if key not in ctx.memo:
        ctx.memo[key] = _end_times(ctx, first, last, cp, mbs)
    return ctx.memo[key]


def _end_times(ctx: MixedContext, first, last, cp: int, mbs: int) -> tuple[float, float]:
    job = ctx.job
    tokens = mbs * job.training.seq_length // cp
    e = ctx.costs(first[0]).embedding(job.model, tokens, first[1], first[1] > 1)
    lg = ctx.costs(last[0]).logits(job.model, tokens, last[1])
    return e.forward + e.backward, lg.forward + lg.backward


def max_layers(sm: StageModel, s: int, room: float, inflight: float | None = None) -> int:
    """Most layers stage s can hold in ``room`` allocatable bytes (quick._stage_memory_terms), with every layer
    at its lightest (kind, recompute) footprint: an upper bound on n_s for any recompute placement. ``inflight``
    overrides the stage's in-flight micro-batches."""
    per_d = sum(sm.states_per_param["dense"].values())
    per_e = sum(sm.states_per_param["expert"].values())
    inflight = sm.inflight(s) if inflight is None else inflight
    lean = min(k.params_dense * per_d + k.params_expert * per_e + inflight * min(k.act, k.act_recomputed)
               for k in sm.kinds.values())
    return max(0, int(room / lean)) if room > 0 else 0


def _tail_floor(sm: StageModel, s: int, L: int) -> float:
    if "moe" in sm.kinds:
        return 0.0

    def parts(n: int) -> tuple[float, float]:
        return sm.tail_parts(s, StagePlan(dense=n, moe=0, r_dense=n))

    (r1, g1), (r2, g2) = parts(1), parts(2)
    points = {1, L}
    for y1, slope in ((r1, r2 - r1), (g1, g2 - g1)):
        if slope:  # where this part reaches 0, and its integer neighbours
            z = 1 - y1 / slope
            points.update(min(L, max(1, int(z) + d)) for d in (0, 1))
    return min(max(0.0, r) + max(0.0, g) for r, g in map(parts, sorted(points)))


def _sharded_line(sm: StageModel, s: int) -> tuple[float, float]:
    if sm.dims.zero_stage < 2:
        return 0.0, 0.0
    kind = "moe" if "moe" in sm.kinds else "dense"

    def inner(n: int) -> float:
        plan = StagePlan(dense=0, moe=n, r_moe=n) if kind == "moe" else StagePlan(dense=n, moe=0, r_dense=n)
        return sm.sharded_comm(*sm.params(s, plan)) - sm.cal.fsdp_overlap * sm.compute(s, plan)[0]

    y1, y2 = inner(1), inner(2)
    slope = y2 - y1
    # max(0, slope*n + y0) >= slope*n + y0 when slope >= 0; else only >= 0
    return (slope, y1 - slope) if slope >= 0 else (0.0, 0.0)
