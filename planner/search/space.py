"""The search space: every combination of parallel degrees, micro-batch, interleaving and ZeRO stage that the
degree rules (planner/parallel.py) accept, each with a lower bound on its iteration time.

Dominated options are pruned by rule and counted: with TP > 1 sequence parallelism is always on (same
communication volume, strictly less activation memory: Korthikanti et al. 2022); with flash attention selective
recompute is the same as none (the kernel already recomputes scores), so only none + per-layer full recompute
are searched.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from planner.cost.memory import DEFAULT_MEMORY_MARGIN
from planner.cost.provider import AnalyticCosts
from planner.errors import SpecError
from planner.frameworks import Framework
from planner.parallel import (
    ParallelDims,
    baseline_recompute_modes,
    cp_options,
    ep_options,
    grad_zero_error,
    micro_batch_options,
    pp_options,
    seq_shard_error,
    tp_options,
    vpp_options,
)
from planner.parallel import divisors as divisors  # re-exported: the searches' divisor helper lives with the rules
from planner.spec import Job


@dataclass(frozen=True)
class Candidate:
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    mbs: int
    vpp: int
    zero: int
    recompute: str  # baseline mode for layers not chosen for full recompute
    lower_bound_s: float
    world: int = 0  # GPUs used (whole nodes); the rest of the cluster stays idle

    def sort_key(self):
        return (
            self.lower_bound_s,
            -self.world,
            self.tp,
            self.cp,
            self.pp,
            self.ep,
            self.mbs,
            self.vpp,
            self.zero,
            self.recompute,
        )


@dataclass
class SearchOptions:
    allow_cross_node_tp: bool = False
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    max_micro_batch: int = 64
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    partial_recompute: bool = True
    op_recompute: bool = False  # search per-op selective checkpointing (on for frameworks that have it)
    allow_idle_nodes: bool = True
    tp_comm_overlap: bool = False  # the framework overlaps TP collectives with GEMMs (Megatron + Transformer Engine)
    framework: Framework | None = None  # restrict to what this framework runs (planner/frameworks.py)

    def __post_init__(self) -> None:
        if self.framework is not None and not self.framework.partial_recompute:
            self.partial_recompute = False
        if self.framework is not None and self.framework.op_recompute:
            self.op_recompute = True

    def for_job(self, job: Job) -> SearchOptions:
        """These options searching only the ZeRO stages the job's gradient buffers run at (planner.parallel
        grad_zero_error) and, under a framework, the ones it runs them at (Framework.grad_rejects)."""
        t, fw = job.training, self.framework
        keep = tuple(
            z
            for z in self.zero_stages
            if grad_zero_error(t, z) is None and (fw is None or fw.grad_rejects(t.grad_dtype, t.precision, z) is None)
        )
        return self if keep == self.zero_stages else dataclasses.replace(self, zero_stages=keep)

    @property
    def uniform_recompute(self) -> bool:
        """The framework takes one recompute count for all stages."""
        return self.framework is not None and not self.framework.per_stage_recompute

    @property
    def all_or_none_recompute(self) -> bool:
        """Every stage recomputes all its layers or none, all stages alike: a framework without partial recompute
        and with one recompute setting for all stages (DeepSpeed, torchtitan; the CP-SAT model:
        planner/search/partition.py _add_layer_totals)."""
        return not self.partial_recompute and self.uniform_recompute

    @property
    def recompute_in_chunks(self) -> bool:
        """The framework counts recomputed layers per interleaved model chunk (a multiple of vpp per stage)."""
        return self.framework is not None and self.framework.recompute_per_chunk

    @property
    def even_layers(self) -> bool:
        return self.framework is not None and not self.framework.uneven_layers


def dims_for(
    job: Job, c: Candidate, stage_layers: tuple[int, ...] | None = None, stage_recompute=None, tp_overlap: bool = False
) -> ParallelDims:
    """ParallelDims of a candidate (even split unless ``stage_layers`` is given)."""
    L = job.model.num_layers
    stages = stage_layers or tuple([L // c.pp] * c.pp)
    return ParallelDims(
        tp=c.tp,
        pp=c.pp,
        dp=c.dp,
        cp=c.cp,
        ep=c.ep,
        vpp=c.vpp,
        micro_batch_size=c.mbs,
        sequence_parallel=c.tp > 1,
        zero_stage=c.zero,
        recompute=c.recompute,
        tp_comm_overlap=tp_overlap and c.tp > 1,
        stage_layers=stages,
        stage_recompute=stage_recompute,
        world=c.world or job.num_gpus,
        model=job.model,
        training=job.training,
    )


def enumerate_candidates(
    job: Job, costs: AnalyticCosts, opts: SearchOptions, deadline: float | None = None, cap: float = float("inf")
) -> tuple[list[Candidate], int, bool]:
    """All valid candidates sorted by lower bound, the number pruned by dominance rules or by a lower bound at or
    above ``cap`` (a time no plan of interest reaches: a search given one never visits them), and whether the
    enumeration finished (past ``deadline``, a time.monotonic value, it stops early)."""
    gpn = job.cluster[0].gpus_per_node
    worlds = [job.num_gpus]
    if opts.allow_idle_nodes:
        worlds = sorted({n * gpn for n in usable_node_counts(job.cluster[0].nodes)}, reverse=True)
    out: list[Candidate] = []
    pruned = 0
    complete = True
    lb_memo: dict = {}  # the per-micro-batch bound does not depend on the world size, pp, dp, vpp or ZeRO
    for world in worlds:
        cands, p, done = _enumerate_world(job, costs, opts, world, deadline, cap, lb_memo)
        out += cands
        pruned += p
        complete = complete and done
        if not done:
            break
    out.sort(key=Candidate.sort_key)
    return out, pruned, complete


def usable_node_counts(nodes: int) -> list[int]:
    """All nodes, plus the node count rounded down to multiples of 2, 4, ... 64: an awkward count (a prime like
    641) leaves no degree that divides it, and idling a node or two beats no plan."""
    rounded = {nodes // 2**k * 2**k for k in range(1, 7) if nodes >= 2**k}
    return sorted({nodes} | {n for n in rounded if n >= nodes * 3 // 4})


def _enumerate_world(
    job: Job, costs: AnalyticCosts, opts: SearchOptions, world: int, deadline: float | None, cap: float, lb_memo: dict
) -> tuple[list[Candidate], int, bool]:
    m, t = job.model, job.training
    gpn = job.cluster[0].gpus_per_node
    L = m.num_layers
    flash = t.attention == "flash"
    pruned = 0
    bases = baseline_recompute_modes(t, opts.op_recompute)
    out: list[Candidate] = []
    for tp in tp_options(m, world, gpn, opts.allow_cross_node_tp):
        for cp in cp_options(t, world):
            if world % (tp * cp) or seq_shard_error(t, cp, tp):
                continue
            rest = world // (tp * cp)
            for pp in pp_options(L, rest):
                if deadline is not None and time.monotonic() > deadline:
                    return out, pruned, False
                dp = rest // pp
                mbss = micro_batch_options(t, dp, opts.max_micro_batch)
                if not mbss:
                    continue
                for ep in ep_options(m, dp, cp):
                    for mbs in mbss:
                        nmb = t.global_batch_size // (mbs * dp)
                        vpps = vpp_options(L, pp, nmb)
                        for base in bases:
                            key = (tp, cp, ep, mbs, base)
                            lb_stage = lb_memo.get(key)
                            if lb_stage is None:
                                lb_stage = lb_memo[key] = _compute_lower_bound(
                                    job, costs, tp, cp, ep, mbs, base, opts.tp_comm_overlap and tp > 1
                                )
                            for vpp in vpps:
                                lb = lb_stage / pp * (nmb + (pp - 1) / vpp)
                                if lb >= cap:
                                    pruned += len(opts.zero_stages)
                                    continue
                                for zero in opts.zero_stages:
                                    fw = opts.framework
                                    if fw is not None and not fw.allows(
                                        pp=pp, vpp=vpp, zero=zero, cp=cp, ep=ep, tp=tp, dp=dp, recompute=base,
                                        microbatches=nmb, sequence_parallel=tp > 1,
                                    ):  # fmt: skip
                                        continue
                                    out.append(Candidate(tp, cp, pp, dp, ep, mbs, vpp, zero, base, lb, world))
                        pruned += len(vpps) * len(opts.zero_stages) * (1 if flash else 0)  # selective == none
                        if tp > 1:
                            pruned += len(vpps) * len(opts.zero_stages) * len(bases)  # SP off dominated
    return out, pruned, True


def _compute_lower_bound(job: Job, costs: AnalyticCosts, tp, cp, ep, mbs, base, tp_overlap: bool = False) -> float:
    """Seconds of one micro-batch through all layers (the per-layer floor KindCoeffs.layer_floor: compute and the
    exposed TP (overlapped with GEMMs under ``tp_overlap``), CP and EP communication every layer needs), embedding
    and logits with the accumulation of their gradients (the output layer as a one-stage pipeline has it), without
    pipeline sends or extra recompute. Spread over p stages this bounds the
    iteration from below, since with stage times t_i the schedule takes
    m*max(t) + (sum(t) - max(t))/v >= sum(t)/p * (m + (p-1)/v)."""
    from planner.cost.stage import embedding_seconds, kind_coeffs, layers_floor, logits_seconds

    m, t = job.model, job.training
    tokens = mbs * t.seq_length // cp
    total = layers_floor(kind_coeffs(job, costs, tokens, tp, cp, ep, tp > 1, base, tp_overlap), m)
    emb = embedding_seconds(costs, m, tokens, tp, tp > 1, t.grad_dtype)[0]
    return total + emb + logits_seconds(costs, m, tokens, tp, t.grad_dtype, False)[0]


def check_searchable(job: Job) -> None:
    if len(job.cluster) != 1:
        raise SpecError(
            "cluster", "the homogeneous search takes one node group; several go through the heterogeneous search"
        )
