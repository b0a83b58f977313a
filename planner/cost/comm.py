"""Collective communication times (NCCL ring/tree algorithms, bus-bandwidth model of nccl-tests).

nccl-tests PERFORMANCE.md defines bus bandwidth so that a collective over n ranks of an S-byte buffer takes
    all-reduce: 2(n-1)/n * S / busbw      all-gather / reduce-scatter / all-to-all: (n-1)/n * S / busbw
(S = the full gathered buffer). The bus bandwidth of a group depends on where its ranks sit: inside one node it
is the NVLink rate times the ring efficiency; across nodes each ring crosses every node boundary once, so the
node's k member GPUs share k NICs and busbw = min(NVLink, k * NIC) (a 2x8 A100 ring reaches ~190 GB/s busbw on
16x100G, samples/nccl_allreduce_a100_2x8_roce_oci.txt). Per-collective latency: NCCL's ~10 us intra-node and
~25 us inter-node base plus a log2(n) tree/ring term (NCCL tuning model, src/graph/tuning.cc).

The rates these formulas take (bus bandwidths in bytes/s, base latencies in seconds) come from the cost provider
(planner/cost/provider.py), which derives them with ``nvlink_busbw``, ``network_busbw`` and ``base_latency``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.calibration import Calibration
from planner.spec import GpuSpec

LAT_INTRA_S = 10e-6
LAT_INTER_S = 25e-6


@dataclass(frozen=True)
class Link:
    """Bus bandwidth (bytes/s) and base latency of one communication group."""

    busbw: float
    latency: float
    size: int

    def all_reduce(self, nbytes: float) -> float:
        n = self.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        return 2 * (n - 1) / n * nbytes / self.busbw + self.latency * (1 + math.log2(n))

    def all_gather(self, nbytes: float) -> float:
        """Also reduce-scatter: same traffic pattern. ``nbytes`` is the full (gathered) buffer."""
        n = self.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        return (n - 1) / n * nbytes / self.busbw + self.latency * (1 + math.log2(n))

    reduce_scatter = all_gather
    all_to_all = all_gather

    def p2p(self, nbytes: float) -> float:
        return nbytes / self.busbw + self.latency if nbytes > 0 else 0.0


def nvlink_busbw(gpu: GpuSpec, cal: Calibration) -> float:
    """Ring bus bandwidth inside one node (bytes/s): the GPU's NVLink rate per direction (GB/s) times the
    calibrated ring efficiency."""
    return gpu.intra_node_gbps * 1e9 * cal.nvlink_efficiency


def network_busbw(line_gbps: float, cal: Calibration) -> float:
    """Bus bandwidth (bytes/s) that a per-GPU network line rate of ``line_gbps`` (Gb/s: a NIC, or the network
    between two node groups) reaches: bits to bytes, times the calibrated network efficiency."""
    return line_gbps / 8 * 1e9 * cal.network_efficiency


def base_latency(crosses_node: bool) -> float:
    """NCCL's base latency of one collective or send: ~25 us when it crosses a node boundary, else ~10 us."""
    return LAT_INTER_S if crosses_node else LAT_INTRA_S


def group_link(nvlink: float, nic: float, size: int, per_node: int, latency: float) -> Link:
    """The Link of a group of ``size`` ranks, ``per_node`` of which share each node: NVLink inside one node, else
    the ring crosses every node boundary once and the node's ``per_node`` GPUs share as many NICs
    (busbw = min(NVLink, per_node * NIC)). ``latency``: the base latency of that placement."""
    if size <= per_node:
        return Link(nvlink, latency, size)
    return Link(min(nvlink, per_node * nic), latency, size)


def p2p_link(rate: float, latency: float) -> Link:
    """Point-to-point between two GPUs at ``rate`` bytes/s: pipeline neighbours over one GPU's NVLink or its own
    NIC, or GPUs of two node groups over the network between them."""
    return Link(rate, latency, 2)


def spanning_link(nvlink: float, network: float, size: int, per_node: int, latency: float) -> Link:
    """A collective group whose ranks sit on nodes of several node groups. The ring crosses node boundaries inside
    each group and between groups, so its bus bandwidth is the group_link formula at the slowest NVLink
    (``nvlink``) and the slowest per-GPU network rate on the ring (``network``: the smallest NIC and inter-group
    rate)."""
    return Link(min(nvlink, per_node * network), latency, size)
