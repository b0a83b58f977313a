"""Per-stage costs as affine forms in a stage's decision variables: the single source of truth shared by the
estimator (which evaluates the forms at one partition), the CP-SAT model (which turns them into linear
expressions, planner/search/partition.py) and the bounds (which read their coefficients, planner/search/quick.py,
mixed.py, hetero_bounds.py).

For fixed parallel degrees every layer of a kind (dense or MoE) costs the same on every stage, so a stage with
``n`` layers of a kind, ``r`` of them fully recomputed, costs ``n*per_layer + r*per_recomputed + constant``, plus
two 0/1 terms: the latency of collectives over expert parameters (present when the stage holds an MoE layer) and
the working activations of a recomputed layer (present when it recomputes one). Each such quantity is an
``Affine`` form, built once here. The only other non-linear pieces are overlaps, max(0, communication - share *
a compute window) (``Overlap``), which are convex and so stay exact inside a minimizing CP-SAT model; each
consumer applies them in one helper. Everything is per GPU and per micro-batch unless the name says per
iteration.

Where each quantity is written: per-layer coefficients in ``kind_coeffs``; time per micro-batch in
``StageModel._time_forms``; memory in ``StageModel._memory_forms``; the DP tail and optimizer step in
``StageModel._tail_forms``; the collectives over a stage's parameters per ZeRO stage in ``StageModel._collectives``.
"""
from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from planner.cost import flops as F
from planner.cost import memory as M
from planner.cost.comm import Link
from planner.cost.provider import AnalyticCosts
from planner.parallel import ParallelDims
from planner.spec import Job

KINDS = ("dense", "moe")
# The compute an overlapped collective hides behind: all of a micro-batch's compute, its forward part, or the
# rest (backward and recompute).
WINDOWS = ("compute", "forward", "backward")
REF_PARAMS = 1e9  # the parameter counts (REF_PARAMS and twice it) at which Line.of reads a collective's line


@dataclass(frozen=True)
class KindCoeffs:
    """What one layer of a kind adds to a stage."""

    compute: float          # forward + backward (+ baseline recompute) seconds
    forward: float          # forward part of compute
    recompute_extra: float  # extra seconds when the layer is fully recomputed
    tp: float               # TP collective seconds
    tp_recompute: float     # extra TP seconds when fully recomputed
    cp: float               # exposed CP ring seconds
    ep: float               # EP all-to-all seconds
    ep_recompute: float
    params_dense: float     # parameters on this GPU replicated over DP*CP
    params_expert: float    # parameters on this GPU replicated over expert-DP
    act: float              # stored activation bytes (baseline recompute mode)
    act_recomputed: float   # stored activation bytes when fully recomputed
    act_working: float      # full activations of one layer, present while a recomputed layer runs backward

    def layer_floor(self, tp_hidden: bool = False) -> float:
        """The least seconds one layer of this kind adds to a stage's micro-batch: its compute and the TP (unless
        hidden under compute, ``tp_hidden``), CP and EP communication it cannot avoid. Every per-layer time bound
        of the searches starts here."""
        return self.compute + (0.0 if tp_hidden else self.tp) + self.cp + self.ep

    def recompute_floor(self, tp_hidden: bool = False) -> float:
        """The least seconds full recompute adds to one layer: its forward again, with its TP (unless hidden under
        compute, ``tp_hidden``) and EP collectives."""
        return self.recompute_extra + (0.0 if tp_hidden else self.tp_recompute) + self.ep_recompute


def fastest_layer(kinds: dict[str, KindCoeffs], tp_hidden: bool = False) -> float:
    """The per-layer time floor (KindCoeffs.layer_floor) of the cheapest layer kind: valid for any layer."""
    return min(k.layer_floor(tp_hidden) for k in kinds.values())


@dataclass
class StagePlan:
    """Layer counts of one stage: layers and fully recomputed layers of each kind."""

    dense: int
    moe: int
    r_dense: int = 0
    r_moe: int = 0

    @property
    def layers(self) -> int:
        return self.dense + self.moe

    @property
    def recomputed(self) -> int:
        return self.r_dense + self.r_moe

    def with_recompute(self, r: int) -> StagePlan:
        """The same layers with ``r`` of them fully recomputed: MoE layers first (their activations are the
        largest), then dense ones."""
        r_moe = min(r, self.moe)
        return StagePlan(self.dense, self.moe, r - r_moe, r_moe)


@dataclass(slots=True)
class Affine:
    """const + dense*n_dense + moe*n_moe + r_dense*r_dense + r_moe*r_moe + any_moe*[n_moe >= 1]
    + any_recomputed*[r_dense + r_moe >= 1]: one stage quantity in the stage's decision variables (StagePlan).
    The two indicators are 0/1 variables of their own in the CP-SAT model. A model without MoE layers repeats its
    dense coefficients as MoE ones; no plan of it holds an MoE layer.

    Forms are treated as immutable. They are slotted, not frozen, dataclasses because frozen ones are four times
    slower to build and the bounds build them for thousands of candidates."""

    const: float = 0.0
    dense: float = 0.0
    moe: float = 0.0
    r_dense: float = 0.0
    r_moe: float = 0.0
    any_moe: float = 0.0
    any_recomputed: float = 0.0

    def at(self, plan: StagePlan) -> float:
        """The quantity at one stage's layer counts."""
        value = (self.const + self.dense * plan.dense + self.moe * plan.moe + self.r_dense * plan.r_dense
                 + self.r_moe * plan.r_moe)
        if plan.moe:
            value += self.any_moe
        if plan.r_dense or plan.r_moe:
            value += self.any_recomputed
        return value

    def per_layer(self, kind: str) -> float:
        """What one layer of ``kind`` ("dense" or "moe") adds."""
        return self.moe if kind == "moe" else self.dense

    def per_recomputed(self, kind: str) -> float:
        """What fully recomputing one layer of ``kind`` adds on top."""
        return self.r_moe if kind == "moe" else self.r_dense

    def __add__(self, other: Affine) -> Affine:
        return Affine(self.const + other.const, self.dense + other.dense, self.moe + other.moe,
                      self.r_dense + other.r_dense, self.r_moe + other.r_moe, self.any_moe + other.any_moe,
                      self.any_recomputed + other.any_recomputed)

    def __sub__(self, other: Affine) -> Affine:
        return self + other * -1.0

    def scaled(self, k: float, plus: Affine) -> Affine:
        """self * k + plus, in one step (the forms are built for thousands of candidates)."""
        return Affine(self.const * k + plus.const, self.dense * k + plus.dense, self.moe * k + plus.moe,
                      self.r_dense * k + plus.r_dense, self.r_moe * k + plus.r_moe, self.any_moe * k + plus.any_moe,
                      self.any_recomputed * k + plus.any_recomputed)

    def __mul__(self, k: float) -> Affine:
        return Affine(self.const * k, self.dense * k, self.moe * k, self.r_dense * k, self.r_moe * k,
                      self.any_moe * k, self.any_recomputed * k)

    __rmul__ = __mul__


@dataclass(slots=True)
class Line:
    """Seconds of one collective over ``params`` parameters: per_param * params + latency (0 for none). The
    bus-bandwidth model is affine in the bytes moved (planner/cost/comm.py), so two readings of the link's cost
    give the line."""

    per_param: float
    latency: float

    @classmethod
    def of(cls, seconds: Callable[[float], float]) -> Line:
        """The line through the cost at REF_PARAMS and at twice it."""
        x1, x2 = REF_PARAMS, 2 * REF_PARAMS
        y1, y2 = seconds(x1), seconds(x2)
        slope = (y2 - y1) / (x2 - x1)
        return cls(slope, y1 - slope * x1)

    def at(self, params: float) -> float:
        return self.per_param * params + self.latency if params > 0 else 0.0


@functools.lru_cache(maxsize=4096)
def _line(link: Link, op: str, bytes_per_param: float) -> Line:
    """The Line of collective ``op`` ("all_reduce", "reduce_scatter", "all_gather") on ``link`` over parameters of
    ``bytes_per_param`` bytes each (links are values: the same link gives the same line)."""
    cost = getattr(link, op)
    return Line.of(lambda x: cost(bytes_per_param * x))


@dataclass(slots=True)
class Collective:
    """A collective a stage runs ``count`` times over its parameters: the dense ones on the DP*CP group, the expert
    ones on the expert-DP group."""

    count: int
    dense: Line
    expert: Line

    def at(self, dense: float, expert: float) -> float:
        """Seconds for ``dense`` and ``expert`` parameters."""
        return self.count * (self.dense.at(dense) + self.expert.at(expert))


@dataclass(slots=True)
class Traffic:
    """Seconds of collectives as (times it runs, form) pairs, one pair per collective and parameter group: kept
    apart so that the CP-SAT model rounds each to whole time units on its own."""

    parts: tuple[tuple[int, Affine], ...] = ()
    _total: Affine | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, collectives: tuple[Collective, ...], dense: Affine, expert: Affine | None) -> Traffic:
        """The collectives over a stage's ``dense`` and ``expert`` parameter forms (None: the model has no
        experts). A stage always holds dense parameters; the expert collectives run when it holds an MoE layer."""
        parts = []
        for c in collectives:
            parts.append((c.count, dense.scaled(c.dense.per_param, Affine(const=c.dense.latency))))
            if expert is not None:
                parts.append((c.count, expert.scaled(c.expert.per_param, Affine(any_moe=c.expert.latency))))
        return cls(tuple(parts))

    def at(self, plan: StagePlan) -> float:
        total = 0.0
        for count, form in self.parts:
            total += count * form.at(plan)
        return total

    def total(self) -> Affine:
        """All of it as one form (for bounds; the CP-SAT model keeps the parts)."""
        if self._total is None:
            total = Affine()
            for count, form in self.parts:
                total = total + form * count
            self._total = total
        return self._total


@dataclass(slots=True)
class Overlap:
    """Communication that runs alongside one of the stage's compute windows (WINDOWS), of which ``share`` hides
    it: exposed seconds max(0, traffic - share * window)."""

    traffic: Traffic
    window: str
    share: float

    def signed(self, traffic_s: float, window_s: float) -> float:
        """traffic - share * window: exposed when positive."""
        return traffic_s - self.share * window_s

    def exposed(self, traffic_s: float, window_s: float) -> float:
        return max(0.0, self.signed(traffic_s, window_s))

    def recomputed_line(self, compute: Affine, forward: Affine, kind: str) -> tuple[float, float]:
        """(constant, per layer) of traffic - share * window on a stage of n >= 1 layers of ``kind``, every one
        fully recomputed (the longest window), given the stage's compute and forward forms: read off the forms'
        coefficients, indicators on."""
        traffic = self.traffic.total()
        window = compute if self.window == "compute" else forward if self.window == "forward" else compute - forward

        def line(form: Affine) -> tuple[float, float]:
            on = form.any_recomputed + (form.any_moe if kind == "moe" else 0.0)
            return form.const + on, form.per_layer(kind) + form.per_recomputed(kind)

        (t0, t1), (w0, w1) = line(traffic), line(window)
        return t0 - self.share * w0, t1 - self.share * w1


class Position(NamedTuple):
    """Where a stage sits, as far as its costs care: first (embedding), last (logits), and the micro-batches whose
    activations it holds at its peak. (A NamedTuple: built and hashed for every memory lookup of the bounds.)"""

    first: bool
    last: bool
    inflight: float


@dataclass(slots=True)
class TimeForms:
    """Seconds of one micro-batch through a stage, without its pipeline sends (StageModel.pp_time)."""

    compute: Affine          # forward + backward (+ recompute), embedding and logits included
    forward: Affine
    tp: Affine               # TP collectives; with ``tp_hidden`` only max(0, tp - compute) is exposed
    tp_hidden: bool
    cp: Affine
    ep: Affine
    zero: Overlap | None     # ZeRO-2/3 traffic behind the compute (None below ZeRO-2)

    def window(self, name: str) -> Affine:
        """The compute window ``name`` (WINDOWS) as a form."""
        if name == "backward":
            return self.compute - self.forward
        return self.compute if name == "compute" else self.forward

    def at(self, plan: StagePlan, pp: float) -> dict[str, float]:
        """Every component at one stage's layer counts, and their sum (``total``)."""
        comp, fwd = self.compute.at(plan), self.forward.at(plan)
        out = {"compute": comp, "forward": fwd}
        tp = self.tp.at(plan)
        if self.tp_hidden:
            # Pipelined with the adjacent GEMMs (Transformer Engine userbuffers, Megatron --tp-comm-overlap):
            # only the part longer than the compute stays on the critical path.
            tp = max(0.0, tp - comp)
        cp, ep = self.cp.at(plan), self.ep.at(plan)
        out.update(tp_comm=tp, cp_comm=cp, ep_comm=ep, pp_comm=pp)
        out["zero_comm"] = self.zero.exposed(self.zero.traffic.at(plan), comp) if self.zero else 0.0
        out["total"] = comp + tp + cp + ep + pp + out["zero_comm"]
        return out


@dataclass(slots=True)
class TailForms:
    """What a stage adds after its last backward, once per iteration: the exposed DP communication (gradient
    reduction behind the backward, parameter gather behind the forward; None where ZeRO-3 moves it into every
    micro-batch) and the optimizer step."""

    reduction: Overlap | None
    gather: Overlap | None
    optimizer: Affine

    def parts(self) -> tuple[Overlap, ...]:
        return tuple(x for x in (self.reduction, self.gather) if x is not None)

    def exposed(self, plan: StagePlan, compute: float, forward: float) -> float:
        """Exposed DP seconds at one stage's layer counts, given its compute and forward seconds."""
        windows = {"compute": compute, "forward": forward, "backward": compute - forward}
        return sum((x.exposed(x.traffic.at(plan), windows[x.window]) for x in self.parts()), 0.0)


@dataclass(slots=True)
class States:
    """Bytes of a stage's model states: weights, gradients and optimizer state, and their sum."""

    weights: Affine          # 16-bit weights; under ZeRO-3 plus the gathered layer and the prefetched next one
    gradients: Affine
    optimizer: Affine
    total: Affine


@dataclass(slots=True)
class InflightAffine:
    """states + (per_microbatch * inflight + end): the bytes a stage allocates, as a form that is also affine in
    the micro-batches it keeps in flight (the bounds read it at many in-flight counts, field by field)."""

    states: Affine
    per_microbatch: Affine   # activations each in-flight micro-batch leaves
    end: Affine              # the logits of the last stage, the working set of a recomputed layer

    def at(self, inflight: float) -> Affine:
        return self.states + self.per_microbatch.scaled(inflight, self.end)

    def const(self, inflight: float) -> float:
        return self.states.const + (self.per_microbatch.const * inflight + self.end.const)

    def per_layer(self, kind: str, inflight: float) -> float:
        s, m, e = self.states, self.per_microbatch, self.end  # (Affine.per_layer, inlined: the bounds' hot loop)
        return s.moe + (m.moe * inflight + e.moe) if kind == "moe" else s.dense + (m.dense * inflight + e.dense)

    def per_recomputed(self, kind: str, inflight: float) -> float:
        s, m, e = self.states, self.per_microbatch, self.end
        if kind == "moe":
            return s.r_moe + (m.r_moe * inflight + e.r_moe)
        return s.r_dense + (m.r_dense * inflight + e.r_dense)

    def layer_lines(self, kinds) -> list[tuple[float, float, float, float, float, float]]:
        """Per kind of ``kinds``, the (states, per micro-batch, fixed) parts of its per-layer and then of its
        per-recomputed-layer bytes: per_layer(kind, n) is states + (per micro-batch * n + fixed), likewise
        per_recomputed. For loops over many in-flight counts."""
        s, m, e = self.states, self.per_microbatch, self.end
        return [(s.moe, m.moe, e.moe, s.r_moe, m.r_moe, e.r_moe) if k == "moe" else
                (s.dense, m.dense, e.dense, s.r_dense, m.r_dense, e.r_dense) for k in kinds]


@dataclass(slots=True)
class MemoryForms:
    """Bytes a stage holds at its peak, before (``allocated``) and with the allocator's allowance (``overhead``)."""

    states: States
    activations: Affine      # stored for the in-flight micro-batches, embedding output, logits; the working set
    #                          of a recomputed layer on its indicator
    allocated: Affine        # states.total + activations
    fragmentation: float     # allocator share on top of what is allocated
    fixed: float             # bytes of CUDA context, NCCL buffers, ...

    @property
    def overhead(self) -> Affine:
        return self.allocated * self.fragmentation + Affine(const=self.fixed)

    def at(self, plan: StagePlan) -> dict[str, float]:
        """Every component at one stage's layer counts (their sum is the stage's peak)."""
        st = self.states
        mem = {"weights": st.weights.at(plan), "gradients": st.gradients.at(plan),
               "optimizer": st.optimizer.at(plan), "activations": self.activations.at(plan)}
        mem["overhead"] = self.overhead.at(plan)
        return mem


@dataclass(slots=True)
class StageForms:
    """All forms of one stage of a pipeline."""

    time: TimeForms
    memory: MemoryForms
    tail: TailForms


@dataclass(slots=True)
class LayerEnds:
    """The forms of a stage end position (first stage or not, last stage or not, in a pipeline of more than one
    stage or not) that depend on the per-layer coefficients alone, each built when first asked for."""

    params: tuple[Affine, Affine | None] | None = None
    compute: Affine | None = None
    time: tuple[Affine, Affine, Affine, Affine] | None = None  # forward, tp, cp, ep
    activations: Affine | None = None                         # per in-flight micro-batch


class LayerKinds(dict):
    """KindCoeffs by layer kind ("dense", "moe"), memoized per micro-batch and TP/CP/EP degrees (kind_coeffs), with
    the forms built from them: shared by every stage model of these degrees. Forms that also depend on a stage
    model's DP sharding, ZeRO stage or links are keyed by those values (StageModel.sharding), so every model with
    the same values shares them too, whatever its pipeline depth, interleaving or micro-batch count."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: dict[tuple[bool, bool, bool], LayerEnds] = {}    # by (first, last, deeper than one stage)
        self.collectives: dict[tuple, _Collectives] = {}            # by sharding
        self.time: dict[tuple, TimeForms] = {}                      # by end and sharding
        self.tail: dict[tuple, TailForms] = {}
        self.states: dict[tuple, States] = {}                       # by end and bytes per parameter
        self.memory: dict[tuple, InflightAffine] = {}

    def end(self, first: bool, last: bool, deep: bool) -> LayerEnds:
        hit = self.ends.get((first, last, deep))
        if hit is None:
            hit = self.ends[first, last, deep] = LayerEnds()
        return hit


def kind_coeffs(job: Job, costs: AnalyticCosts, tokens: int, tp: int, cp: int, ep: int, sp: bool,
                base_rc: str) -> LayerKinds:
    """Per-layer coefficients of each layer kind. They depend only on TP, CP, EP, the micro-batch and the model,
    so they are memoized on the costs object and shared by every pipeline/DP/ZeRO choice."""
    m, t = job.model, job.training
    seq = t.seq_length
    flash = t.attention == "flash"
    key = (id(m), tokens, seq, tp, cp, ep, sp, flash, base_rc)
    hit = costs.memo.get(key)
    if hit is not None:
        return hit
    costs.keep(m)
    spans = ParallelDims.spans(tp, cp, ep, costs.group.gpus_per_node)
    tp_link, cp_link, ep_link = (costs.link(*spans[k]) for k in ("tp", "cp", "ep"))
    act_tok = 2.0 * tokens * m.hidden_size  # one 16-bit activation of the micro-batch
    kinds = LayerKinds()
    for kind in KINDS:
        moe = kind == "moe"
        if moe and m.moe is None:
            continue
        lt = costs.layer(m, tokens, seq, tp, sp, cp, ep, moe, flash, base_rc)
        full = costs.layer(m, tokens, seq, tp, sp, cp, ep, moe, flash, "full")
        # TP: 2 all-reduces (or AG + RS with SP, same bytes) per layer forward and 2 backward, 2 more when the
        # forward is recomputed (Narayanan et al. 2021, Sec. 3.3; Korthikanti et al. 2022, Sec. 4.2.2).
        ar = tp_link.all_reduce(act_tok) if tp > 1 else 0.0
        ring_exposed = 0.0
        if cp > 1:
            # Ring attention passes this rank's K,V block around the CP ring, overlapped with the attention
            # kernel; forward once, backward K,V and their gradients (3x the forward traffic).
            kv_bytes = 2.0 * 2.0 * tokens * m.kv_heads * m.dim_head / tp
            ring = cp_link.all_gather(kv_bytes * cp)
            attn = F.attention_core_flops(m, tokens, seq, tp, causal=flash) / costs.attention_rate()
            ring_exposed = 3 * max(0.0, ring - attn)
        a2a = ep_link.all_to_all(act_tok * m.moe.top_k) if (moe and ep > 1) else 0.0
        if moe:
            pd = (F.attention_params(m) + F.moe_shared_params(m)) / tp
            pe = m.moe.num_experts / ep * F.expert_params(m) / tp
        else:
            pd, pe = (F.attention_params(m) + F.dense_mlp_params(m)) / tp, 0.0
        act_kw = {"tokens": tokens, "seq": seq, "tp": tp, "sp": sp, "flash": flash, "moe": moe}
        kinds[kind] = KindCoeffs(
            compute=lt.forward + lt.backward + lt.recompute, forward=lt.forward,
            recompute_extra=full.recompute - lt.recompute,
            tp=2 * ar, tp_recompute=ar, cp=ring_exposed, ep=4 * a2a, ep_recompute=2 * a2a,
            params_dense=pd, params_expert=pe,
            act=M.activation_bytes_per_layer(m, recompute=base_rc, **act_kw),
            act_recomputed=M.activation_bytes_per_layer(m, recompute="full", **act_kw),
            act_working=M.working_bytes_full_recompute(m, **act_kw),
        )
    costs.memo[key] = kinds
    return kinds


def pipeline_send(costs: AnalyticCosts, model, tokens: int, tp: int, cp: int, dp: int) -> tuple[Link, float]:
    """The link a stage sends its activations (and receives gradients) on, and the bytes per GPU per
    micro-batch: NVLink while one stage's tp*cp*dp GPUs share a node, else the GPU's own NIC; the activation is
    split over TP (Megatron's scatter-gather sends)."""
    link = costs.p2p(tp * cp * dp >= costs.group.gpus_per_node)
    return link, 2.0 * tokens * model.hidden_size / tp


@dataclass(slots=True)
class _Collectives:
    """The collectives over a stage's parameters under its ZeRO stage (StageModel._collectives)."""

    per_microbatch: tuple[Collective, ...]  # ZeRO-2/3, every micro-batch
    reduction: tuple[Collective, ...]       # after the last backward
    gather: tuple[Collective, ...]          # after the optimizer step


@dataclass(slots=True, eq=False)
class FormCache:
    """The memory forms of a stage model by position, shared by the models that differ at most in pipeline depth
    (a StageModel ``caches`` registry, keyed by StageModel.form_key). Hashed by identity, so the searches can key
    their own per-position bounds by it."""

    positions: dict[Position, MemoryForms] = field(default_factory=dict)


class StageModel:
    """The forms of every stage for one choice of parallel degrees (the partition left open). Models built with
    the same ``caches`` registry share their forms with every model of the same form_key."""

    def __init__(self, job: Job, dims: ParallelDims, costs: AnalyticCosts,
                 caches: dict[tuple, FormCache] | None = None):
        self.job, self.dims, self.costs = job, dims, costs
        m, t = job.model, job.training
        cal = costs.cal
        self.cal = cal
        gpn = costs.group.gpus_per_node
        self.flash = t.attention == "flash"
        base_rc = "selective" if dims.recompute == "selective" else "none"
        tokens = dims.tokens_per_microbatch
        self.mb = dims.num_microbatches
        self.grad_wire = 2.0 if t.grad_dtype == "bf16" else 4.0  # bytes per gradient element on the wire

        _, dp_per_node = dims.group_span("dp", gpn)
        self.shard = dims.dp * dims.cp
        self.shard_per_node = min(self.shard, dp_per_node * dims.group_span("cp", gpn)[1])
        self.shard_link = costs.link(self.shard, self.shard_per_node)
        self.exp_shard = dims.expert_dp
        self.exp_link = costs.link(self.exp_shard, min(self.exp_shard, dp_per_node))

        act_tok = 2.0 * tokens * m.hidden_size  # one 16-bit activation of the micro-batch
        self.kinds = kind_coeffs(job, costs, tokens, dims.tp, dims.cp, dims.ep, dims.sequence_parallel, base_rc)
        self.has_moe = "moe" in self.kinds
        # Per-position constants: embedding on the first stage, logits on the last, pipeline sends in between.
        emb = costs.embedding(m, tokens, dims.tp, dims.sequence_parallel)
        lg = costs.logits(m, tokens, dims.tp)
        self.emb_time, self.emb_fwd = emb.forward + emb.backward, emb.forward
        self.logits_time, self.logits_fwd = lg.forward + lg.backward, lg.forward
        self.emb_params = F.embedding_params(m) / dims.tp
        self.own_p2p, self.send_bytes = pipeline_send(costs, m, tokens, dims.tp, dims.cp, dims.dp)
        p2p = self.own_p2p
        self.pp_time = 2 * dims.vpp * p2p.p2p(self.send_bytes) if dims.pp > 1 else 0.0
        self.emb_act = act_tok / (dims.tp if dims.sequence_parallel else 1)
        self.logits_act = M.logits_bytes(m, tokens, dims.tp)
        self.largest_layer = max(k.params_dense + k.params_expert for k in self.kinds.values())
        self.working = max(k.act_working for k in self.kinds.values())
        self.states_per_param = {
            "dense": M.model_state_bytes(1.0, self.shard, dims.zero_stage, t.grad_dtype, t.optimizer),
            "expert": M.model_state_bytes(1.0, self.exp_shard, dims.zero_stage, t.grad_dtype, t.optimizer),
        }
        self.bytes_per_param = {group: sum(per.values()) for group, per in self.states_per_param.items()}
        # ZeRO-3 (FSDP) holds the gathered layer and the prefetched next one, 16-bit (Zhao et al. 2023, Sec. 3.3)
        self.gathered_layers = 2 * 2.0 * self.largest_layer if dims.zero_stage >= 3 else 0.0
        self._layer_floor = fastest_layer(self.kinds, dims.tp_comm_overlap)
        self._deep = dims.pp > 1
        self.form_cache = FormCache() if caches is None else caches.setdefault(self.form_key(), FormCache())

    @property
    def sharding(self) -> tuple:
        """What the DP collectives of the forms depend on besides the layers: the DP*CP and expert-DP links and
        group sizes, the gradient bytes on the wire and the ZeRO stage."""
        return (self.shard_link, self.exp_link, self.shard, self.exp_shard, self.grad_wire, self.dims.zero_stage)

    def _state_key(self, first: bool, last: bool) -> tuple:
        return first, last, self._deep, self.bytes_per_param["dense"], self.bytes_per_param["expert"], \
            self.gathered_layers

    def form_key(self) -> tuple:
        """Everything the forms depend on: the cost provider, the model, the degrees and whether the pipeline has
        more than one stage (not its depth, interleaving or micro-batch count: Position carries the in-flight
        micro-batches, and the sends are not part of the forms)."""
        d = self.dims
        return (id(self.costs), id(self.job.model), id(self.job.training), d.tokens_per_microbatch, d.tp, d.cp,
                d.ep, d.dp, d.sequence_parallel, d.recompute, d.zero_stage, d.tp_comm_overlap, d.pp > 1)

    def with_neighbour_links(self, prev: Link | None, nxt: Link | None) -> StageModel:
        """This model for a stage whose pipeline neighbours sit on other node groups: the activation send to the
        next stage and the gradient send to the previous one go over those links (None: a neighbour on this
        stage's own group, or none). A shallow copy; every form is shared (sends are not part of them)."""
        out = copy.copy(self)
        out.pp_time = self.neighbour_pp_time(prev, nxt)
        return out

    def neighbour_pp_time(self, prev: Link | None, nxt: Link | None) -> float:
        """Pipeline-send seconds per micro-batch with the given links to the neighbours (None: own links)."""
        return (prev or self.own_p2p).p2p(self.send_bytes) + (nxt or self.own_p2p).p2p(self.send_bytes)

    def with_dp_link(self, link: Link) -> StageModel:
        """This model with its DP*CP gradient/parameter collectives on ``link`` (a ring that spans node groups,
        planner/cost/comm.spanning_link). A shallow copy; memory and compute are shared."""
        out = copy.copy(self)
        out.shard_link = out.exp_link = link  # the forms that read the links are keyed by them (sharding)
        return out

    # ------------------------------------------------------------------ positions and forms
    def position(self, stage: int) -> Position:
        return Position(stage == 0, stage == self.dims.pp - 1, self.inflight(stage))

    def inflight(self, stage: int) -> float:
        d = self.dims
        return M.inflight_microbatches(stage, d.pp, d.vpp, self.mb)

    def forms(self, stage: int) -> StageForms:
        """The forms of pipeline stage ``stage``."""
        pos = self.position(stage)
        return StageForms(self.time_forms(pos.first, pos.last), self.memory_forms(pos),
                          self.tail_forms(pos.first, pos.last))

    def time_forms(self, first: bool, last: bool) -> TimeForms:
        z = self.dims.zero_stage
        key = (first, last, self._deep, self.dims.tp_comm_overlap, self.sharding if z >= 2 else z)
        hit = self.kinds.time.get(key)
        if hit is None:
            hit = self.kinds.time[key] = self._time_forms(first, last)
        return hit

    def compute_form(self, first: bool, last: bool) -> Affine:
        """Compute seconds of one micro-batch (TimeForms.compute): forward, backward and recompute of the layers,
        the embedding on the first stage and the logits on the last."""
        end = self.kinds.end(first, last, self._deep)
        if end.compute is None:
            kd, km = self.kinds["dense"], self._moe_kind()
            ends = (self.emb_time if first else 0.0) + (self.logits_time if last else 0.0)
            end.compute = Affine(ends, kd.compute, km.compute, kd.recompute_extra, km.recompute_extra)
        return end.compute

    def forward_form(self, first: bool, last: bool) -> Affine:
        """Forward seconds of one micro-batch (TimeForms.forward)."""
        return self._layer_time(first, last)[0]

    def _layer_time(self, first: bool, last: bool) -> tuple[Affine, Affine, Affine, Affine]:
        """(forward, tp, cp, ep) forms of TimeForms: per-layer coefficients (and the ends' forward)."""
        end = self.kinds.end(first, last, self._deep)
        if end.time is None:
            kd, km = self.kinds["dense"], self._moe_kind()
            ends_fwd = (self.emb_fwd if first else 0.0) + (self.logits_fwd if last else 0.0)
            end.time = (Affine(ends_fwd, kd.forward, km.forward),
                        Affine(0.0, kd.tp, km.tp, kd.tp_recompute, km.tp_recompute),
                        Affine(0.0, kd.cp, km.cp), Affine(0.0, kd.ep, km.ep, kd.ep_recompute, km.ep_recompute))
        return end.time

    def allocated_memory(self, first: bool, last: bool) -> InflightAffine:
        """The bytes a stage allocates at any in-flight count: model states (states), activations per in-flight
        micro-batch (activations_per_microbatch), and the logits of the last stage and, under full recompute, one
        layer's complete activations while it runs backward (memory.working_bytes_full_recompute)."""
        key = self._state_key(first, last)
        hit = self.kinds.memory.get(key)
        if hit is None:
            fixed = Affine(const=self.logits_act if last else 0.0, any_recomputed=self.working)
            hit = InflightAffine(self.states_total(first, last), self.activations_per_microbatch(first), fixed)
            self.kinds.memory[key] = hit
        return hit

    def memory_forms(self, pos: Position) -> MemoryForms:
        cache = self.form_cache.positions
        hit = cache.get(pos)
        if hit is None:
            hit = cache[pos] = self._memory_forms(pos)
        return hit

    def tail_forms(self, first: bool, last: bool) -> TailForms:
        key = (first, last, self._deep, self.sharding)
        hit = self.kinds.tail.get(key)
        if hit is None:
            hit = self.kinds.tail[key] = self._tail_forms(first, last)
        return hit

    def position_params(self, stage: int) -> float:
        """Embedding (first stage) and output-layer (last stage) parameters, replicated like dense weights."""
        return self._end_params(stage == 0, stage == self.dims.pp - 1)

    def _end_params(self, first: bool, last: bool) -> float:
        n = self.emb_params if first else 0.0
        if last and (not self.job.model.tie_embeddings or self.dims.pp > 1):
            n += self.emb_params  # a tied output layer still keeps a copy on the last stage when pp > 1
        return n

    def _moe_kind(self) -> KindCoeffs:
        return self.kinds.get("moe", self.kinds["dense"])

    def params(self, first: bool, last: bool) -> tuple[Affine, Affine | None]:
        """(dense, expert) parameters on this GPU: dense ones (attention, dense MLP, shared experts, embedding and
        output layer) are replicated over DP*CP, expert ones over expert-DP (None: the model has no experts)."""
        end = self.kinds.end(first, last, self._deep)
        if end.params is None:
            kd, km = self.kinds["dense"], self._moe_kind()
            dense = Affine(self._end_params(first, last), kd.params_dense, km.params_dense)
            end.params = dense, (Affine(0.0, 0.0, km.params_expert) if self.has_moe else None)
        return end.params

    def _collectives(self) -> _Collectives:
        """The collectives over the stage's parameters under its ZeRO stage, on the DP*CP links.
        ZeRO 0: all-reduce gradients after the last backward; 1: reduce-scatter them there and all-gather the
        updated 16-bit weights; 2: reduce-scatter gradients every micro-batch (DeepSpeed reduces during each
        backward with gradient accumulation) and gather after the step; 3: every micro-batch, gather weights for
        forward and backward and reduce-scatter gradients (PyTorch FSDP, Zhao et al. 2023, Sec. 3.3)."""
        key = self.sharding
        hit = self.kinds.collectives.get(key)
        if hit is None:
            hit = self.kinds.collectives[key] = self._collectives_of(*key)
        return hit

    @staticmethod
    def _collectives_of(sh: Link, ex: Link, shard: int, exp_shard: int, g: float, z: int) -> _Collectives:
        if z == 0:
            return _Collectives((), (Collective(1, _line(sh, "all_reduce", g), _line(ex, "all_reduce", g)),), ())
        reduce = Collective(1, _line(sh, "reduce_scatter", g), _line(ex, "reduce_scatter", g))
        gather = Collective(1, _line(sh, "all_gather", 2.0), _line(ex, "all_gather", 2.0))  # 16-bit weights
        if z == 1:
            return _Collectives((), (reduce,), (gather,))
        if z == 2:
            return _Collectives((reduce,), (), (gather,))
        return _Collectives((reduce, Collective(2, gather.dense, gather.expert)), (), ())

    def per_microbatch_traffic(self, dense: float, expert: float) -> float:
        """Seconds of the ZeRO-2/3 collectives of one micro-batch over the given parameter counts."""
        return sum((c.at(dense, expert) for c in self._collectives().per_microbatch), 0.0)

    def _time_forms(self, first: bool, last: bool) -> TimeForms:
        forward, tp, cp, ep = self._layer_time(first, last)
        zero = None
        if self.dims.zero_stage >= 2:
            # FSDP overlaps the per-micro-batch gathers and reductions with compute, fsdp_overlap of it.
            zero = Overlap(Traffic.of(self._collectives().per_microbatch, *self.params(first, last)), "compute",
                           self.cal.fsdp_overlap)
        return TimeForms(self.compute_form(first, last), forward, tp, self.dims.tp_comm_overlap, cp, ep, zero)

    def _tail_forms(self, first: bool, last: bool) -> TailForms:
        """Overlapped with the last backward (Megatron --overlap-grad-reduce, PyTorch DDP buckets) and the next
        forward (--overlap-param-gather), dp_overlap of each. The optimizer step updates the local shard
        (AnalyticCosts.optimizer_step per parameter)."""
        dense, expert = self.params(first, last)
        lines, ov = self._collectives(), self.cal.dp_overlap
        reduction = gather = None
        if self.dims.zero_stage < 3:
            reduction = Overlap(Traffic.of(lines.reduction, dense, expert), "backward", ov)
            gather = Overlap(Traffic.of(lines.gather, dense, expert), "forward", ov)
        sharded = self.dims.zero_stage >= 1
        local_d = 1.0 / (self.shard if sharded else 1)
        local_e = 1.0 / (self.exp_shard if sharded else 1)
        step = self.costs.optimizer_step(1.0)
        expert_moe = expert.moe if expert is not None else 0.0
        optimizer = Affine(const=step * dense.const * local_d, dense=step * dense.dense * local_d,
                           moe=step * (dense.moe * local_d + expert_moe * local_e))
        return TailForms(reduction, gather, optimizer)

    def _memory_forms(self, pos: Position) -> MemoryForms:
        """Model states and activations, and the allocator's allowance on their sum."""
        return MemoryForms(self.states(pos.first, pos.last), self._activations(pos),
                           self.allocated_memory(pos.first, pos.last).at(pos.inflight),
                           self.cal.memory_fragmentation, self.cal.memory_fixed_gib * M.GIB)

    def _activations(self, pos: Position) -> Affine:
        """The activations part of allocated_memory at the stage's in-flight count."""
        memory = self.allocated_memory(pos.first, pos.last)
        return memory.per_microbatch.scaled(pos.inflight, memory.end)

    def states(self, first: bool, last: bool) -> States:
        """Model states: each parameter group times its bytes per parameter of each kind of state
        (planner/cost/memory.model_state_bytes); the weights also hold ZeRO-3's gathered layers."""
        key = self._state_key(first, last)
        hit = self.kinds.states.get(key)
        if hit is None:
            dense, expert = self.params(first, last)
            parts = {}
            for key in ("weights", "gradients", "optimizer"):
                parts[key] = dense * self.states_per_param["dense"][key]
                if expert is not None:
                    parts[key] = parts[key] + expert * self.states_per_param["expert"][key]
            parts["weights"] = parts["weights"] + Affine(const=self.gathered_layers)
            hit = States(parts["weights"], parts["gradients"], parts["optimizer"], self.states_total(first, last))
            self.kinds.states[key] = hit
        return hit

    def states_total(self, first: bool, last: bool) -> Affine:
        """All model-state bytes (States.total): each parameter group times its bytes per parameter summed over
        the kinds of state, plus ZeRO-3's gathered layers. The sum of the parts of ``states`` up to rounding."""
        dense, expert = self.params(first, last)
        total = dense * self.bytes_per_param["dense"]
        if expert is not None:
            total = total + expert * self.bytes_per_param["expert"]
        return total + Affine(const=self.gathered_layers)

    def activations_per_microbatch(self, first: bool) -> Affine:
        """Activation bytes one in-flight micro-batch leaves on the stage (memory.activation_bytes_per_layer per
        layer, less when the layer is fully recomputed; the first stage also keeps the embedding output)."""
        end = self.kinds.end(first, False, self._deep)
        if end.activations is None:
            kd, km = self.kinds["dense"], self._moe_kind()
            end.activations = Affine(self.emb_act if first else 0.0, kd.act, km.act, kd.act_recomputed - kd.act,
                                     km.act_recomputed - km.act)
        return end.activations

    def lightest_layer(self, inflight: float) -> float:
        """The fewest bytes one layer adds to the allocated memory of a stage holding ``inflight`` micro-batches:
        the lighter kind, fully recomputed where that saves memory (per-layer coefficients of allocated_memory do
        not depend on the stage's position)."""
        memory = self.allocated_memory(False, False)
        return min(memory.per_layer(k, inflight) + min(0.0, memory.per_recomputed(k, inflight)) for k in self.kinds)

    def allocatable(self, capacity_gib: float) -> float:
        """The most bytes a stage may allocate on a GPU of ``capacity_gib``: MemoryForms.overhead solved for the
        allocated bytes."""
        cal = self.cal
        return (capacity_gib * M.GIB - cal.memory_fixed_gib * M.GIB) / (1 + cal.memory_fragmentation)

    # ------------------------------------------------------------------ the estimator's view of one stage
    def microbatch_time(self, stage: int, sp: StagePlan) -> dict[str, float]:
        pos = self.position(stage)
        return self.time_forms(pos.first, pos.last).at(sp, self.pp_time)

    def iteration_tail(self, stage: int, sp: StagePlan) -> tuple[float, float]:
        """(exposed DP communication, optimizer step) seconds after the stage's last backward."""
        first, last = stage == 0, stage == self.dims.pp - 1
        time, tail = self.time_forms(first, last), self.tail_forms(first, last)
        return tail.exposed(sp, time.compute.at(sp), time.forward.at(sp)), tail.optimizer.at(sp)

    def memory(self, stage: int, sp: StagePlan) -> dict[str, float]:
        return self.memory_forms(self.position(stage)).at(sp)

    # ------------------------------------------------------------------ bounds
    def layer_floor(self) -> float:
        """The least seconds any one layer adds to a stage's micro-batch (fastest_layer)."""
        return self._layer_floor

    def lower_bound(self) -> float:
        """Iteration seconds no partition can beat: every layer's compute and unavoidable communication (TP
        unless overlapped, CP, EP), embedding, logits and pipeline sends, spread evenly over the stages, in the
        schedule m*max(t) + (sum(t) - max(t))/v >= sum(t)/p * (m + (p-1)/v); plus the smallest optimizer step."""
        d, m = self.dims, self.job.model
        n_moe = m.num_moe_layers
        total = self.emb_time + self.logits_time + d.pp * self.pp_time
        params = self.position_params(0) + (self.position_params(d.pp - 1) if d.pp > 1 else 0.0)
        for kind, count in (("dense", m.num_layers - n_moe), ("moe", n_moe)):
            if count:
                k = self.kinds[kind]
                total += count * k.layer_floor(d.tp_comm_overlap)
                params += count * (k.params_dense + k.params_expert)
        sched = total / d.pp * (self.mb + (d.pp - 1) / d.vpp)
        sharded = d.zero_stage >= 1
        return sched + self.costs.optimizer_step(params / d.pp / (self.shard if sharded else 1))

    def whole_model(self) -> StagePlan:
        """Every layer of the model on one stage (aggregate bounds)."""
        m = self.job.model
        return StagePlan(dense=m.num_layers - m.num_moe_layers, moe=m.num_moe_layers)


def split_kinds(job: Job, stage_layers: tuple[int, ...], recompute_layers: tuple[int, ...] | None,
                full: bool) -> list[StagePlan]:
    """StagePlans for contiguous stages (recomputed layers placed by StagePlan.with_recompute)."""
    plans, first = [], 0
    for i, n in enumerate(stage_layers):
        moe = job.model.moe_layers_before(first + n) - job.model.moe_layers_before(first)
        r = n if full else (recompute_layers[i] if recompute_layers else 0)
        plans.append(StagePlan(dense=n - moe, moe=moe).with_recompute(r))
        first += n
    return plans
