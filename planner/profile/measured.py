"""Costs from a measured profile (planner/profile/schema.py), the analytic model where the profile is silent.

``MeasuredCosts`` is the cost provider (planner/cost/provider.py) of a node group whose job names a profile. It
overrides the costs a profile can measure — a layer's forward and backward seconds (``layer``, ``embedding``,
``logits``) and each collective's seconds per message size (``link``, ``p2p``) — and keeps every other rate
analytic. A measured curve is read where it covers the point (planner/profile/interpolate.py: log-log between
points, up to the profile's ``extrapolation`` factor beyond them); elsewhere the analytic value is used. What came
from where is recorded per component (``sources``) and reported by `estimate --json` (``cost_sources``).

Matching rules: layer points apply to a job whose model has the profile's shape, at the same TP degree, sequence
length and precision, without CP or EP (which change what one GPU computes); elsewhere the analytic layer time is
scaled by the median measured/analytic ratio of the profile's points ("scaled"), so that measured and unmeasured
layouts are not compared across two different models of the same GPU. Collective points apply to a group of the
same size spread over the same number of nodes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from planner.cost import comm, compute
from planner.cost.provider import AnalyticCosts
from planner.profile.interpolate import loglog
from planner.profile.schema import LayerShape, Profile
from planner.spec import ModelSpec

# Link method -> the nccl-tests operation whose rows price it


def shape_of(model: ModelSpec) -> LayerShape:
    """The LayerShape a profile must carry for its layer points to apply to ``model``."""
    moe = model.moe
    return LayerShape(
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_kv_heads=model.kv_heads,
        ffn_hidden_size=model.ffn_hidden_size,
        mlp=model.mlp,
        num_experts=moe.num_experts if moe else None,
        top_k=moe.top_k if moe else None,
        expert_ffn_hidden_size=moe.expert_ffn_hidden_size if moe else None,
        vocab_size=model.vocab_size,
    )


def shapes_match(measured: LayerShape, model: ModelSpec) -> bool:
    """The profile's layer shape is the model's (the vocabulary only matters for embedding and logits points). A
    profile's layer shape has no latent attention: an MLA model's layers are never read from one."""
    if model.mla is not None:
        return False
    want = shape_of(model)
    keys = [k for k in LayerShape.model_fields if k != "vocab_size"]
    kv = measured.num_kv_heads or measured.num_attention_heads
    return (
        all(getattr(measured, k) == getattr(want, k) for k in keys if k != "num_kv_heads") and kv == want.num_kv_heads
    )


@dataclass(frozen=True)
class MeasuredLink(comm.Link):
    """A Link whose collectives read measured seconds-per-size curves (op -> ((bytes, seconds), ...)) where they
    cover the message, and the analytic formula otherwise."""

    curves: dict = field(default_factory=dict, compare=False, hash=False)
    reach: float = 2.0
    record: object = field(default=None, compare=False, hash=False)  # MeasuredCosts.note

    # A measured link is equal only to itself. Links are otherwise values (forms.collective_line caches by them):
    # two measured links with the same bus bandwidth but other curves, or reporting to another provider's record,
    # must not share a cached line. MeasuredCosts builds each link once per key, so its own lines stay cached.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def _measured(self, op: str, nbytes: float) -> float | None:
        curve = self.curves.get(op)
        value = loglog(curve, nbytes, self.reach) if curve else None
        if self.record is not None:
            self.record(f"collective {op}", value is not None)
        return value

    def all_reduce(self, nbytes: float) -> float:
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        hit = self._measured("all_reduce", nbytes)
        return hit if hit is not None else comm.Link.all_reduce(self, nbytes)

    def all_gather(self, nbytes: float) -> float:
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        hit = self._measured("all_gather", nbytes)
        return hit if hit is not None else comm.Link.all_gather(self, nbytes)

    def reduce_scatter(self, nbytes: float) -> float:
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        hit = self._measured("reduce_scatter", nbytes)
        return hit if hit is not None else comm.Link.all_gather(self, nbytes)

    def all_to_all(self, nbytes: float) -> float:
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        hit = self._measured("all_to_all", nbytes)
        return hit if hit is not None else comm.Link.all_gather(self, nbytes)

    def p2p(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        hit = self._measured("send_recv", nbytes)
        return hit if hit is not None else comm.Link.p2p(self, nbytes)


class MeasuredCosts(AnalyticCosts):
    """AnalyticCosts with the group's profile read first (module docstring)."""

    def __init__(
        self, group, precision, cal=None, attention_kernel="flash", cross_entropy="fused", fp8_recipe="delayed"
    ):
        super().__init__(group, precision, cal, attention_kernel, cross_entropy, fp8_recipe)
        self.profile: Profile = group.profile
        self.sources: dict[str, set[str]] = {}  # component -> {"measured", "scaled", "analytic"}
        self._ratios: dict = {}
        self._built: dict = {}  # _memo: ends and links by what they depend on

    def note(self, component: str, measured: bool | str) -> None:
        how = measured if isinstance(measured, str) else "measured" if measured else "analytic"
        self.sources.setdefault(component, set()).add(how)

    def source_report(self) -> dict[str, str]:
        """Per component: measured, scaled (analytic times the profile's measured/analytic ratio), analytic, or
        several joined by + (some points one way, others another)."""
        return {k: "+".join(sorted(v)) for k, v in sorted(self.sources.items())}

    # ------------------------------------------------------------------ layers
    def _layer_curve(self, kind: str, seq: int, tp: int) -> list[tuple[float, float, float]]:
        """(tokens, forward, backward) of the measured points of ``kind`` at this sequence length and TP."""
        return [
            (p.micro_batch_size * p.seq_length, p.forward_s, p.backward_s)
            for p in self.profile.layers
            if p.kind == kind and p.seq_length == seq and p.tp == tp and p.precision == self.precision
        ]

    def _read(self, kind: str, tokens: int, seq: int, tp: int) -> tuple[float, float] | None:
        pts = self._layer_curve(kind, seq, tp)
        if not pts:
            return None
        reach = self.profile.extrapolation
        fwd = loglog([(t, f) for t, f, _ in pts], tokens, reach)
        bwd = loglog([(t, b) for t, _, b in pts if b > 0], tokens, reach) if any(b > 0 for _, _, b in pts) else 0.0
        return None if fwd is None or bwd is None else (fwd, bwd)

    def measured_layer(self, model: ModelSpec, tokens: int, seq: int, tp: int, cp: int, ep: int, moe: bool):
        """(forward, backward) seconds of one layer from the profile, or None where it does not cover the point."""
        shape = self.profile.model
        if shape is None or cp != 1 or ep != 1 or not shapes_match(shape, model):
            return None
        if model.moe is None:
            whole = self._read("layer", tokens, seq, tp)
            if whole is not None:
                return whole
        parts = [self._read("attention", tokens, seq, tp), self._read("moe" if moe else "mlp", tokens, seq, tp)]
        if any(p is None for p in parts):
            return None
        return parts[0][0] + parts[1][0], parts[0][1] + parts[1][1]

    def layer(self, model, tokens, seq, tp, sp, cp, ep, moe, flash, recompute) -> compute.PassTime:
        key = ("measured", id(model), tokens, seq, tp, sp, cp, ep, moe, flash, recompute)
        hit = self._layers.get(key)
        if hit is not None:
            return hit
        analytic = super().layer(model, tokens, seq, tp, sp, cp, ep, moe, flash, recompute)
        found = self.measured_layer(model, tokens, seq, tp, cp, ep, moe)
        ratio = self.layer_ratio(model) if found is None else None
        self.note("layer", "measured" if found is not None else "scaled" if ratio else "analytic")
        if found is None and ratio:
            # not measured here: the analytic value times what the profile measured against the analytic model
            fwd_r, bwd_r = ratio
            hit = compute.PassTime(analytic.forward * fwd_r, analytic.backward * bwd_r, analytic.recompute * fwd_r)
        elif found is None:
            hit = analytic
        else:
            fwd, bwd = found
            # recompute repeats (part of) the forward: the analytic share of it, applied to the measured forward
            share = analytic.recompute / analytic.forward if analytic.forward > 0 else 0.0
            hit = compute.PassTime(fwd, bwd, fwd * share)
        self._layers[key] = hit
        return hit

    def layer_ratio(self, model: ModelSpec) -> tuple[float, float] | None:
        """Median measured / analytic seconds (forward, backward) over the profile's whole-layer points for this
        model (None without any): how the analytic model is scaled where the profile has no point, so that
        measured and unmeasured layouts are compared on one footing."""
        key = ("ratio", id(model))
        if key not in self._ratios:
            fwd, bwd = [], []
            for p in self.profile.layers:
                if p.kind != "layer" or p.precision != self.precision or self.profile.model is None:
                    continue
                if model.moe is not None or not shapes_match(self.profile.model, model):
                    continue
                tokens = p.micro_batch_size * p.seq_length
                a = super().layer(model, tokens, p.seq_length, p.tp, p.tp > 1, 1, 1, False, True, "none")
                fwd.append(p.forward_s / a.forward)
                if p.backward_s > 0 and a.backward > 0:
                    bwd.append(p.backward_s / a.backward)
            self._ratios[key] = (statistics.median(fwd), statistics.median(bwd) if bwd else 1.0) if fwd else None
        return self._ratios[key]

    def _memo(self, key: tuple, build):
        """``build()`` once per key: the searches ask for the same ends and links for thousands of candidates."""
        hit = self._built.get(key)
        if hit is None:
            hit = self._built[key] = build()
        return hit

    def _end(self, kind: str, model: ModelSpec, tokens: int, tp: int, analytic: compute.PassTime) -> compute.PassTime:
        shape = self.profile.model
        found = None
        if shape is not None and shape.vocab_size == model.vocab_size and shape.hidden_size == model.hidden_size:
            seqs = sorted({p.seq_length for p in self.profile.layers if p.kind == kind and p.tp == tp})
            found = next((hit for seq in seqs if (hit := self._read(kind, tokens, seq, tp)) is not None), None)
        self.note(kind, found is not None)
        return analytic if found is None else compute.PassTime(found[0], found[1], 0.0)

    def embedding(self, model, tokens, tp, sp) -> compute.PassTime:
        return self._memo(
            ("embedding", id(model), tokens, tp, sp),
            lambda: self._end(
                "embedding", model, tokens, tp, super(MeasuredCosts, self).embedding(model, tokens, tp, sp)
            ),
        )

    def logits(self, model, tokens, tp) -> compute.PassTime:
        return self._memo(
            ("logits", id(model), tokens, tp),
            lambda: self._end("logits", model, tokens, tp, super(MeasuredCosts, self).logits(model, tokens, tp)),
        )

    # ------------------------------------------------------------------ collectives
    def _curves(self, size: int, nodes: int) -> dict[str, list[tuple[float, float]]]:
        out: dict[str, list[tuple[float, float]]] = {}
        for p in self.profile.collectives:
            if p.ranks == size and p.nodes == nodes:
                out.setdefault(p.op, []).append((p.bytes, p.time_s))
        return out

    def link(self, size: int, per_node: int) -> comm.Link:
        return self._memo(("link", size, per_node), lambda: self._measured_link(size, per_node))

    def _measured_link(self, size: int, per_node: int) -> comm.Link:
        base = super().link(size, per_node)
        curves = self._curves(size, math.ceil(size / max(1, per_node)))
        curves.pop("send_recv", None)
        if not curves:
            self.note("collectives", False)
            return base
        return MeasuredLink(base.busbw, base.latency, base.size, curves, self.profile.extrapolation, self.note)

    def p2p(self, crosses_node: bool) -> comm.Link:
        return self._memo(("p2p", crosses_node), lambda: self._measured_p2p(crosses_node))

    def _measured_p2p(self, crosses_node: bool) -> comm.Link:
        base = super().p2p(crosses_node)
        rows = [p for p in self.profile.collectives if p.op == "send_recv" and (p.nodes > 1) == crosses_node]
        if not rows:
            self.note("pipeline sends", False)
            return base
        ranks = min(p.ranks for p in rows)  # the smallest ring measured: closest to one pipeline neighbour pair
        curve = [(p.bytes, p.time_s) for p in rows if p.ranks == ranks]
        return MeasuredLink(
            base.busbw, base.latency, base.size, {"send_recv": curve}, self.profile.extrapolation, self.note
        )
