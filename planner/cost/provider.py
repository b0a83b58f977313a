"""The seam between the estimator and where per-layer and per-collective costs come from.

``AnalyticCosts`` derives them from datasheets and the calibrated efficiencies. Measured profiles (layer
timings, nccl-tests bus bandwidths) plug in by subclassing and overriding ``layer`` / ``link``; the estimator
and the search only ever call these methods.
"""
from __future__ import annotations

from planner.cost import comm, compute
from planner.cost.calibration import Calibration, default_calibration
from planner.spec import ModelSpec, NodeGroup


class AnalyticCosts:
    def __init__(self, group: NodeGroup, precision: str, cal: Calibration | None = None):
        self.group = group
        self.cal = cal or default_calibration()
        self.precision = precision
        self.roof = compute.Roofline(group.gpu, precision, self.cal)
        self._layers: dict = {}
        self._models: list = []
        self.memo: dict = {}  # derived per-layer coefficients, keyed by callers (StageModel)

    def layer(self, model: ModelSpec, tokens: int, seq: int, tp: int, sp: bool, cp: int, ep: int,
              moe: bool, flash: bool, recompute: str) -> compute.PassTime:
        # cached by the model's identity: hashing a pydantic model on every call costs more than the formula
        key = (id(model), tokens, seq, tp, sp, cp, ep, moe, flash, recompute)
        hit = self._layers.get(key)
        if hit is None:
            hit = self._layers[key] = compute.layer_time(model, self.roof, tokens=tokens, seq=seq, tp=tp, sp=sp,
                                                         cp=cp, ep=ep, moe=moe, flash=flash, recompute=recompute)
            self.keep(model)
        return hit

    def keep(self, model: ModelSpec) -> None:
        """Hold a model referenced by id() in a cache key, so its id cannot be reused."""
        if not any(x is model for x in self._models):
            self._models.append(model)

    def embedding(self, model: ModelSpec, tokens: int, tp: int, sp: bool) -> compute.PassTime:
        return compute.embedding_time(model, self.roof, tokens, tp, sp)

    def logits(self, model: ModelSpec, tokens: int, tp: int) -> compute.PassTime:
        return compute.logits_time(model, self.roof, tokens, tp)

    def link(self, size: int, per_node: int) -> comm.Link:
        return comm.group_link(self.group, size, per_node, self.cal)

    def p2p(self, crosses_node: bool) -> comm.Link:
        return comm.p2p_link(self.group, crosses_node, self.cal)

    def optimizer_step(self, params_local: float) -> float:
        """Adam reads fp32 master, m, v and the fp32 grad and writes master, m, v and the 16-bit weight:
        about 30 bytes per locally updated parameter, HBM-bound."""
        return self.roof.traffic(30.0 * params_local)
