"""The seam between the cost model and where its rates come from: every rate the estimator, the CP-SAT model,
the bounds and the mixed and replica searches use is read from here.

``AnalyticCosts`` prices one node group's GPUs from their datasheet and the calibrated efficiencies, in two
layers:
  - rates: ``gemm_rate``, ``attention_rate`` (FLOP/s), ``hbm_rate`` and ``stream_hbm_rate`` (bytes/s of
    element-wise kernels, and of kernels streaming over large tensors), ``layer_overhead`` (seconds per layer pass),
    ``nvlink_rate``, ``network_rate(line_gbps)`` (bus bandwidths, bytes/s) and ``latency(crosses_node)`` (seconds);
  - costs built from those rates with the formulas of compute.py and comm.py: ``layer``, ``embedding``,
    ``logits``, ``grad_accumulation`` (seconds per micro-batch), ``traffic``, ``optimizer_step`` (seconds),
    ``best_flop_rate``, ``link(size, per_node)`` and ``p2p(crosses_node)`` (comm.Link).
``CostSource`` holds one provider per node group of a job and prices the links between node groups
(``between``, ``spanning``, ``spanning_ceiling``) from the rates of the groups' providers.

Measured profiles plug in by subclassing: a node group with a ``profile`` is priced by
planner/profile/measured.MeasuredCosts, which overrides whole costs (``layer``, ``embedding``, ``logits``,
``link``, ``p2p``) where the profile covers them; other sources can override rates or costs the same way and be
named as the ``provider`` of a ``CostSource`` subclass. The estimator and every search get their costs from
``cost_source(job, cal)``, so ``with use_cost_source(MySource): ...`` prices everything inside the block with it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from planner.cost import comm, compute
from planner.cost.calibration import Calibration, default_calibration, job_calibration
from planner.spec import Job, ModelSpec, NodeGroup


class AnalyticCosts:
    """The costs on one node group's GPUs (module docstring: rates, and costs built from them)."""

    source: CostSource | None = None  # the job's CostSource when it built this provider (links between groups)

    def __init__(
        self,
        group: NodeGroup,
        precision: str,
        cal: Calibration | None = None,
        attention_kernel: str = "flash",
        cross_entropy: str = "fused",
        fp8_recipe: str = "delayed",
    ):
        self.group = group
        self.cal = cal or default_calibration()
        self.precision = precision
        self.fp8_recipe = fp8_recipe  # Training.fp8_recipe: the FP8 casts priced when the GEMMs run in FP8
        self.attention_kernel = attention_kernel  # Training.attention: which fused kernel prices the attention core
        self.cross_entropy = cross_entropy  # Training.cross_entropy: the loss kernel of the logits
        self._layers: dict = {}
        self._ends: dict = {}  # embedding and logits PassTime per (kind, model, micro-batch, TP, SP)
        self._models: list = []
        self._links: dict = {}  # (size, per_node) -> comm.Link (immutable)
        self._p2p: dict = {}  # crosses_node -> comm.Link
        self.kind_coeffs: dict = {}  # planner.cost.stage.kind_coeffs per (model, micro-batch, degrees), memoized

    # ------------------------------------------------------------------ rates
    def gemm_rate(self) -> float:
        """Achieved GEMM FLOP/s (before the HBM roof of small shapes)."""
        return compute.gemm_rate(self.group.gpu, self.precision, self.cal)

    def attention_rate(self) -> float:
        """Achieved FLOP/s of the attention core (flash kernels)."""
        return compute.attention_rate(self.group.gpu, self.cal, self.attention_kernel)

    def hbm_rate(self) -> float:
        """Achieved HBM bytes/s of element-wise kernels."""
        return compute.hbm_rate(self.group.gpu, self.cal)

    def stream_hbm_rate(self) -> float:
        """Achieved HBM bytes/s of a kernel streaming over large contiguous tensors (FP8 casts, gradient
        accumulation: compute.STREAM_HBM_EFFICIENCY of the datasheet bandwidth)."""
        return compute.stream_hbm_rate(self.group.gpu)

    def layer_overhead(self) -> float:
        """Fixed seconds of one layer's forward pass (kernel launches, framework dispatch; backward: twice)."""
        return self.cal.layer_overhead_s

    def nvlink_rate(self) -> float:
        """Bus bandwidth (bytes/s) of a ring inside one node."""
        return comm.nvlink_busbw(self.group.gpu, self.cal)

    def network_rate(self, line_gbps: float) -> float:
        """Bus bandwidth (bytes/s) one GPU reaches on a network port of ``line_gbps`` Gb/s."""
        return comm.network_busbw(line_gbps, self.cal)

    def latency(self, crosses_node: bool) -> float:
        """Base seconds of one collective or send, inside a node or across nodes."""
        return comm.base_latency(crosses_node)

    # ------------------------------------------------------------------ costs built from the rates
    def nic_rate(self) -> float:
        """Bus bandwidth (bytes/s) of this group's own NIC per GPU."""
        return self.network_rate(self.group.nic_gbps)

    def best_flop_rate(self) -> float:
        """The better of the GEMM and attention FLOP/s: no FLOP runs faster (global lower bounds)."""
        return max(self.gemm_rate(), self.attention_rate())

    def traffic(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` through HBM."""
        return self._roof.traffic(nbytes)

    @functools.cached_property
    def _roof(self) -> compute.Roofline:
        casts = None
        if compute.runs_fp8(self.group.gpu, self.precision):
            casts = compute.FP8_CASTS[self.fp8_recipe]
        return compute.Roofline(
            self.gemm_rate(),
            self.attention_rate(),
            self.hbm_rate(),
            self.layer_overhead(),
            casts,
            self.stream_hbm_rate(),
        )

    def layer(
        self,
        model: ModelSpec,
        tokens: int,
        seq: int,
        tp: int,
        sp: bool,
        cp: int,
        ep: int,
        moe: bool,
        flash: bool,
        recompute: str,
    ) -> compute.PassTime:
        # cached by the model's identity: hashing a pydantic model on every call costs more than the formula
        key = (id(model), tokens, seq, tp, sp, cp, ep, moe, flash, recompute)
        hit = self._layers.get(key)
        if hit is None:
            hit = self._layers[key] = self._other_mode(key) or compute.layer_time(
                model,
                self._roof,
                tokens=tokens,
                seq=seq,
                tp=tp,
                sp=sp,
                cp=cp,
                ep=ep,
                moe=moe,
                flash=flash,
                recompute=recompute,
            )
            self.keep(model)
        return hit

    def _other_mode(self, key: tuple) -> compute.PassTime | None:
        """The layer of ``key`` read from the same layer priced under another recompute mode, where its extra
        recompute follows from the forward (compute.recompute_from_forward); None if it does not or none is priced.
        The searches ask for each layer under its baseline mode and under full recompute."""
        *layer, flash, recompute = key
        for other in compute.RECOMPUTE_MODES:
            p = self._layers.get((*layer, flash, other)) if other != recompute else None
            if p is not None:
                extra = compute.recompute_from_forward(p.forward, recompute, flash)
                return None if extra is None else compute.PassTime(p.forward, p.backward, extra)
        return None

    def tp_gemms(self, model: ModelSpec, tokens: int, tp: int, sp: bool, moe: bool, ep: int) -> tuple:
        """Forward seconds of the GEMMs a layer's TP collectives overlap with (compute.tp_paired_gemms)."""
        key = ("tp_gemms", id(model), tokens, tp, sp, moe, ep)
        hit = self._ends.get(key)
        if hit is None:
            hit = self._ends[key] = compute.tp_paired_gemms(model, self._roof, tokens, tp, sp, moe, ep)
            self.keep(model)
        return hit

    def keep(self, model: ModelSpec) -> None:
        """Hold a model referenced by id() in a cache key, so its id cannot be reused."""
        if not any(x is model for x in self._models):
            self._models.append(model)

    def embedding(self, model: ModelSpec, tokens: int, tp: int, sp: bool) -> compute.PassTime:
        key = ("embedding", id(model), tokens, tp, sp)
        hit = self._ends.get(key)
        if hit is None:
            hit = self._ends[key] = compute.embedding_time(model, self._roof, tokens, tp, sp)
            self.keep(model)
        return hit

    def logits(self, model: ModelSpec, tokens: int, tp: int) -> compute.PassTime:
        key = ("logits", id(model), tokens, tp)
        hit = self._ends.get(key)
        if hit is None:
            hit = self._ends[key] = compute.logits_time(model, self._roof, tokens, tp, self.cross_entropy)
            self.keep(model)
        return hit

    def link(self, size: int, per_node: int) -> comm.Link:
        """A collective group of ``size`` ranks, ``per_node`` of which share each node."""
        hit = self._links.get((size, per_node))
        if hit is None:
            hit = self._links[size, per_node] = comm.group_link(
                self.nvlink_rate(), self.nic_rate(), size, per_node, self.latency(size > per_node)
            )
        return hit

    def p2p(self, crosses_node: bool) -> comm.Link:
        """Point-to-point between pipeline neighbours: one GPU's NVLink, or its own NIC across nodes."""
        hit = self._p2p.get(crosses_node)
        if hit is None:
            rate = self.nic_rate() if crosses_node else self.nvlink_rate()
            hit = self._p2p[crosses_node] = comm.p2p_link(rate, self.latency(crosses_node))
        return hit

    def grad_accumulation(self, params: float, grad_dtype: str) -> float:
        """Seconds per micro-batch to fold the gradients of ``params`` parameters into the gradient buffers of
        ``grad_dtype`` (compute.GRAD_ACCUMULATION_BYTES; zero where the backward accumulates in place)."""
        return compute.GRAD_ACCUMULATION_BYTES[grad_dtype] * params / self.stream_hbm_rate()

    def optimizer_step(self, params_local: float) -> float:
        """Adam reads fp32 master, m, v and the fp32 grad and writes master, m, v and the 16-bit weight:
        about 30 bytes per locally updated parameter, HBM-bound."""
        return self.traffic(30.0 * params_local)


class CostSource:
    """Where one job's costs come from: a provider per node group (``provider``, built on first use, shared by
    every caller) and the links between node groups, priced from the rates of the groups' providers."""

    provider: type[AnalyticCosts] = AnalyticCosts

    def __init__(self, job: Job, cal: Calibration | None = None):
        self.job = job
        self.cal = cal or job_calibration(job)
        self._groups: dict[int, AnalyticCosts] = {}
        self._links: dict = {}  # between and spanning links (comm.Link, immutable)

    def __call__(self, group: int) -> AnalyticCosts:
        """The provider of node group ``group`` (an index into ``job.cluster``)."""
        hit = self._groups.get(group)
        if hit is None:
            node_group = self.job.cluster[group]
            provider = self.provider
            if node_group.profile is not None and provider is AnalyticCosts:
                from planner.profile.measured import MeasuredCosts  # the group's measured profile, read first

                provider = MeasuredCosts
            t = self.job.training
            hit = self._groups[group] = provider(
                node_group, t.precision, self.cal, t.attention, t.cross_entropy, t.fp8_recipe
            )
            hit.source = self
        return hit

    def measured_sources(self) -> dict[int, dict[str, str]]:
        """Per node group priced from a profile: which components came from measurement (MeasuredCosts)."""
        return {g: c.source_report() for g, c in sorted(self._groups.items()) if hasattr(c, "source_report")}

    def between(self, a: int, b: int) -> comm.Link:
        """Point-to-point from a GPU of group ``a`` to one of group ``b`` over the network between their nodes
        (Job.link_gbps: a ``links`` entry, else the slower of the two NICs), priced by ``a``'s provider."""
        hit = self._links.get((a, b))
        if hit is None:
            costs = self(a)
            hit = self._links[a, b] = comm.p2p_link(costs.network_rate(self.job.link_gbps(a, b)), costs.latency(True))
        return hit

    def spanning(self, groups: list[int], size: int, per_node: int) -> comm.Link:
        """A collective group of ``size`` ranks on nodes of several node groups, ``per_node`` of them per node (a
        DP ring over replicas on different GPU types): the slowest NVLink and network rate on the ring."""
        key = (tuple(groups), size, per_node)
        hit = self._links.get(key)
        if hit is None:
            nvlink = min(self(g).nvlink_rate() for g in groups)
            first = self(groups[0])
            network = first.network_rate(self.job.ring_gbps(groups))
            hit = self._links[key] = comm.spanning_link(nvlink, network, size, per_node, first.latency(True))
        return hit

    def spanning_ceiling(self, groups: list[int]) -> float:
        """Bus bandwidth (bytes/s) no ring over nodes of ``groups`` exceeds: the best NVLink on it, nor a full
        node of the largest of them sending at the slowest network rate on the ring (comm.spanning_link)."""
        nvlink = max(self(g).nvlink_rate() for g in groups)
        node = max(self.job.cluster[g].gpus_per_node for g in groups)
        return min(nvlink, self(groups[0]).network_rate(node * self.job.ring_gbps(groups)))


_source_class: type[CostSource] = CostSource


def cost_source(job: Job, cal: Calibration | None = None) -> CostSource:
    """The costs of ``job``: what the estimator and every search price with (``use_cost_source`` swaps them)."""
    return _source_class(job, cal)


@contextlib.contextmanager
def use_cost_source(source_class: type[CostSource]) -> Iterator[None]:
    """Price everything inside the block with ``source_class`` (measured profiles, tests)."""
    global _source_class
    previous, _source_class = _source_class, source_class
    try:
        yield
    finally:
        _source_class = previous
