"""The seam between the estimator and where per-layer and per-collective costs come from.

``AnalyticCosts`` derives them from datasheets and the calibrated efficiencies. Measured profiles (layer
timings, nccl-tests bus bandwidths) plug in by subclassing and overriding ``layer`` / ``link``; the estimator
and the search only ever call these methods.
"""
from __future__ import annotations

import functools

from planner.cost import comm, compute
from planner.cost.calibration import Calibration, default_calibration
from planner.spec import ModelSpec, NodeGroup


class AnalyticCosts:
    def __init__(self, group: NodeGroup, precision: str, cal: Calibration | None = None):
        self.group = group
        self.cal = cal or default_calibration()
        self.precision = precision
        self.roof = compute.Roofline(group.gpu, precision, self.cal)

    @functools.lru_cache(maxsize=4096)
    def layer(self, model: ModelSpec, tokens: int, seq: int, tp: int, sp: bool, cp: int, ep: int,
              moe: bool, flash: bool, recompute: str) -> compute.PassTime:
        return compute.layer_time(model, self.roof, tokens=tokens, seq=seq, tp=tp, sp=sp, cp=cp, ep=ep,
                                  moe=moe, flash=flash, recompute=recompute)

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
