"""Collective communication times (NCCL ring/tree algorithms, bus-bandwidth model of nccl-tests).

nccl-tests PERFORMANCE.md defines bus bandwidth so that a collective over n ranks of an S-byte buffer takes
    all-reduce: 2(n-1)/n * S / busbw      all-gather / reduce-scatter / all-to-all: (n-1)/n * S / busbw
(S = the full gathered buffer). The bus bandwidth of a group depends on where its ranks sit: inside one node it
is the NVLink rate times the ring efficiency; across nodes each ring crosses every node boundary once, so the
node's k member GPUs share k NICs and busbw = min(NVLink, k * NIC) (a 2x8 A100 ring reaches ~190 GB/s busbw on
16x100G, samples/nccl_allreduce_a100_2x8_roce_oci.txt). Per-collective latency: NCCL's ~10 us intra-node and
~25 us inter-node base plus a log2(n) tree/ring term (NCCL tuning model, src/graph/tuning.cc).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.calibration import Calibration
from planner.spec import NodeGroup

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


def group_link(group: NodeGroup, size: int, per_node: int, cal: Calibration) -> Link:
    """The Link of a group of ``size`` ranks, ``per_node`` of which share each node."""
    nvlink = group.gpu.intra_node_gbps * 1e9 * cal.nvlink_efficiency
    if size <= per_node:
        return Link(nvlink, LAT_INTRA_S, size)
    nic = group.nic_gbps / 8 * 1e9 * cal.network_efficiency  # Gb/s line rate -> bytes/s
    return Link(min(nvlink, per_node * nic), LAT_INTER_S, size)


def p2p_link(group: NodeGroup, crosses_node: bool, cal: Calibration) -> Link:
    """Point-to-point between pipeline neighbours: one GPU's NVLink or its own NIC."""
    if not crosses_node:
        return Link(group.gpu.intra_node_gbps * 1e9 * cal.nvlink_efficiency, LAT_INTRA_S, 2)
    return Link(group.nic_gbps / 8 * 1e9 * cal.network_efficiency, LAT_INTER_S, 2)


def between_groups_link(rate_gbps: float, cal: Calibration) -> Link:
    """Point-to-point between a GPU of one node group and a GPU of another, at the per-GPU rate of the network
    between them (Job.link_gbps: a ``links`` entry, else the slower of the two NICs)."""
    return Link(rate_gbps / 8 * 1e9 * cal.network_efficiency, LAT_INTER_S, 2)


def spanning_link(groups: list[NodeGroup], rate_gbps: float, size: int, per_node: int, cal: Calibration) -> Link:
    """A collective group whose ranks sit on nodes of several node groups. The ring crosses node boundaries inside
    each group and between groups, so its bus bandwidth is the group_link formula at the slowest NVLink and the
    slowest per-GPU network rate on the ring (``rate_gbps``: the smallest NIC and inter-group rate)."""
    nvlink = min(g.gpu.intra_node_gbps for g in groups) * 1e9 * cal.nvlink_efficiency
    nic = rate_gbps / 8 * 1e9 * cal.network_efficiency
    return Link(min(nvlink, per_node * nic), LAT_INTER_S, size)
