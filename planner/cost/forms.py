"""Affine forms: the algebra of a pipeline stage's costs in its decision variables (planner/cost/stage.py builds
the forms; the estimator evaluates them, planner/search/partition.py turns them into CP-SAT linear expressions,
the bounds of planner/search read their coefficients).

A stage's decision variables are its layer counts (StagePlan): dense and MoE layers, and how many of each are
fully recomputed, plus two 0/1 indicators (it holds an MoE layer; it recomputes a layer). Every stage quantity is
an ``Affine`` form in them. Collectives over the stage's parameters are ``Line``s (seconds affine in the
parameters moved) grouped into ``Traffic``; communication that runs alongside compute is an ``Overlap``,
max(0, traffic - share * window), the only non-linear piece (convex, so exact inside a minimizing CP-SAT model).
``TimeForms``, ``TailForms`` and ``MemoryForms`` bundle a stage's forms per micro-batch, per iteration and in
bytes, each with the one evaluation at a StagePlan the estimator uses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from planner.cost.comm import Link

# The compute an overlapped collective hides behind: all of a micro-batch's compute, its forward part, or the
# rest (backward and recompute).
WINDOWS = ("compute", "forward", "backward")
REF_PARAMS = 1e9  # the parameter counts (REF_PARAMS and twice it) at which Line.of reads a collective's line


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
        value = (
            self.const
            + self.dense * plan.dense
            + self.moe * plan.moe
            + self.r_dense * plan.r_dense
            + self.r_moe * plan.r_moe
        )
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

    def kind_line(self, kind: str, recomputed: bool = False) -> tuple[float, float]:
        """(constant, per layer) of the form on a stage of n >= 1 layers of ``kind``, none of them recomputed (with
        ``recomputed``, every one): the indicators those layers switch on go into the constant."""
        on = (self.any_moe if kind == "moe" else 0.0) + (self.any_recomputed if recomputed else 0.0)
        per = self.per_layer(kind) + (self.per_recomputed(kind) if recomputed else 0.0)
        return self.const + on, per

    def __add__(self, other: Affine) -> Affine:
        return Affine(
            self.const + other.const,
            self.dense + other.dense,
            self.moe + other.moe,
            self.r_dense + other.r_dense,
            self.r_moe + other.r_moe,
            self.any_moe + other.any_moe,
            self.any_recomputed + other.any_recomputed,
        )

    def __sub__(self, other: Affine) -> Affine:
        return self + other * -1.0

    def scaled(self, k: float, plus: Affine) -> Affine:
        """self * k + plus, in one step (the forms are built for thousands of candidates)."""
        return Affine(
            self.const * k + plus.const,
            self.dense * k + plus.dense,
            self.moe * k + plus.moe,
            self.r_dense * k + plus.r_dense,
            self.r_moe * k + plus.r_moe,
            self.any_moe * k + plus.any_moe,
            self.any_recomputed * k + plus.any_recomputed,
        )

    def __mul__(self, k: float) -> Affine:
        return Affine(
            self.const * k,
            self.dense * k,
            self.moe * k,
            self.r_dense * k,
            self.r_moe * k,
            self.any_moe * k,
            self.any_recomputed * k,
        )

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
def collective_line(link: Link, op: str, bytes_per_param: float) -> Line:
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

    def _window(self, compute: Affine, forward: Affine) -> Affine:
        return compute if self.window == "compute" else forward if self.window == "forward" else compute - forward

    def recomputed_line(
        self, compute: Affine, forward: Affine, kind: str, recomputed: bool = True
    ) -> tuple[float, float]:
        """(constant, per layer) of traffic - share * window on a stage of n >= 1 layers of ``kind``, every one
        fully recomputed (the longest window; with ``recomputed`` False, none), given the stage's compute and
        forward forms: read off the forms' coefficients, indicators on."""
        traffic, window = self.traffic.total(), self._window(compute, forward)
        (t0, t1), (w0, w1) = traffic.kind_line(kind, recomputed), window.kind_line(kind, recomputed)
        return t0 - self.share * w0, t1 - self.share * w1

    def hidden_by_recompute(self, compute: Affine, forward: Affine, kind: str) -> tuple[float, float]:
        """(per recomputed layer of ``kind``, once for any) seconds by which recompute lowers traffic - share *
        window, at least 0: what the longer window hides."""
        traffic, window = self.traffic.total(), self._window(compute, forward)
        return (
            max(0.0, self.share * window.per_recomputed(kind) - traffic.per_recomputed(kind)),
            max(0.0, self.share * window.any_recomputed - traffic.any_recomputed),
        )


class Position(NamedTuple):
    """Where a stage sits, as far as its costs care: first (embedding), last (logits), and the micro-batches whose
    activations it holds at its peak. (A NamedTuple: built and hashed for every memory lookup of the bounds.)"""

    first: bool
    last: bool
    inflight: float


@dataclass(slots=True)
class TimeForms:
    """Seconds of one micro-batch through a stage, without its pipeline sends (StageModel.pp_time)."""

    compute: Affine  # forward + backward (+ recompute), embedding and logits included
    forward: Affine
    tp: Affine  # exposed TP collectives (stage.tp_overlap_share where they overlap GEMMs)
    cp: Affine
    ep: Affine
    zero: Overlap | None  # ZeRO-2/3 traffic behind the compute (None below ZeRO-2)

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

    weights: Affine  # 16-bit weights; under ZeRO-3 plus the gathered layer and the prefetched next one
    gradients: Affine
    optimizer: Affine
    total: Affine


@dataclass(slots=True)
class InflightAffine:
    """states + (per_microbatch * inflight + end): the bytes a stage allocates, as a form that is also affine in
    the micro-batches it keeps in flight (the bounds read it at many in-flight counts, field by field)."""

    states: Affine
    per_microbatch: Affine  # activations each in-flight micro-batch leaves
    end: Affine  # the logits of the last stage, the working set of a recomputed layer

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
        return [
            (s.moe, m.moe, e.moe, s.r_moe, m.r_moe, e.r_moe)
            if k == "moe"
            else (s.dense, m.dense, e.dense, s.r_dense, m.r_dense, e.r_dense)
            for k in kinds
        ]


@dataclass(slots=True)
class MemoryForms:
    """Bytes a stage holds at its peak, before (``allocated``) and with the allocator's allowance (``overhead``)."""

    states: States
    activations: Affine  # stored for the in-flight micro-batches, embedding output, logits; the working set
    #                          of a recomputed layer on its indicator
    allocated: Affine  # states.total + activations
    fragmentation: float  # allocator share on top of what is allocated
    fixed: float  # bytes of CUDA context, NCCL buffers, ...
    overhead: Affine = field(init=False)  # allocated * fragmentation + fixed

    def __post_init__(self) -> None:
        self.overhead = self.allocated * self.fragmentation + Affine(const=self.fixed)

    def at(self, plan: StagePlan) -> dict[str, float]:
        """Every component at one stage's layer counts (their sum is the stage's peak)."""
        st = self.states
        mem = {
            "weights": st.weights.at(plan),
            "gradients": st.gradients.at(plan),
            "optimizer": st.optimizer.at(plan),
            "activations": self.activations.at(plan),
        }
        mem["overhead"] = self.overhead.at(plan)
        return mem

    def peak(self, plan: StagePlan) -> float:
        """The sum of ``at(plan)``, added in the same order (bit-identical), without building the dict."""
        st = self.states
        return (
            st.weights.at(plan)
            + st.gradients.at(plan)
            + st.optimizer.at(plan)
            + self.activations.at(plan)
            + self.overhead.at(plan)
        )


@dataclass(slots=True)
class StageForms:
    """All forms of one stage of a pipeline."""

    time: TimeForms
    memory: MemoryForms
    tail: TailForms
