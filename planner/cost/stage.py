"""Per-stage costs as linear functions of a stage's layer counts: the single source of truth shared by the
estimator (which evaluates one partition) and the CP-SAT search (which chooses the partition).

For fixed parallel degrees every layer of a kind (dense or MoE) costs the same on every stage, so a stage with
``n`` layers of a kind, ``r`` of them fully recomputed, costs ``n*per_layer + r*per_recomputed + constants``.
The only non-linear pieces are maxima of such linear terms (overlap: ``max(0, comm - hidden_by)``), which are
convex and so stay exact inside a minimizing CP-SAT model. Everything here is per GPU and per micro-batch unless
the name says per iteration.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from planner.cost import flops as F
from planner.cost import memory as M
from planner.cost.comm import Link
from planner.cost.provider import AnalyticCosts
from planner.parallel import ParallelDims
from planner.spec import Job

KINDS = ("dense", "moe")


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

    def with_recompute(self, r: int) -> "StagePlan":
        """The same layers with ``r`` of them fully recomputed: MoE layers first (their activations are the
        largest), then dense ones."""
        r_moe = min(r, self.moe)
        return StagePlan(self.dense, self.moe, r - r_moe, r_moe)


def kind_coeffs(job: Job, costs: AnalyticCosts, tokens: int, tp: int, cp: int, ep: int, sp: bool,
                base_rc: str) -> dict[str, KindCoeffs]:
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
    kinds: dict[str, KindCoeffs] = {}
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
            attn = F.attention_core_flops(m, tokens, seq, tp, causal=flash) / costs.roof.attn_rate
            ring_exposed = 3 * max(0.0, ring - attn)
        a2a = ep_link.all_to_all(act_tok * m.moe.top_k) if (moe and ep > 1) else 0.0
        if moe:
            pd = (F.attention_params(m) + F.moe_shared_params(m)) / tp
            pe = m.moe.num_experts / ep * F.expert_params(m) / tp
        else:
            pd, pe = (F.attention_params(m) + F.dense_mlp_params(m)) / tp, 0.0
        act_kw = dict(tokens=tokens, seq=seq, tp=tp, sp=sp, flash=flash, moe=moe)
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


class StageModel:
    """Linear cost coefficients of every stage for one choice of parallel degrees (the partition left open)."""

    def __init__(self, job: Job, dims: ParallelDims, costs: AnalyticCosts):
        self.job, self.dims, self.costs = job, dims, costs
        self.original = self  # with_neighbour_links copies point back here
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

    def with_neighbour_links(self, prev: Link | None, nxt: Link | None) -> "StageModel":
        """This model for a stage whose pipeline neighbours sit on other node groups: the activation send to the
        next stage and the gradient send to the previous one go over those links (None: a neighbour on this
        stage's own group, or none). A shallow copy; every other coefficient is shared."""
        out = copy.copy(self)
        out.original = self.original  # the memory model is the original's
        out.pp_time = self.neighbour_pp_time(prev, nxt)
        return out

    def neighbour_pp_time(self, prev: Link | None, nxt: Link | None) -> float:
        """Pipeline-send seconds per micro-batch with the given links to the neighbours (None: own links)."""
        return (prev or self.own_p2p).p2p(self.send_bytes) + (nxt or self.own_p2p).p2p(self.send_bytes)

    def with_dp_link(self, link: Link) -> "StageModel":
        """This model with its DP*CP gradient/parameter collectives on ``link`` (a ring that spans node groups,
        planner/cost/comm.spanning_link). A shallow copy; memory and compute are shared."""
        out = copy.copy(self)
        out.original = self.original
        out.shard_link = out.exp_link = link
        return out

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
                total += count * (k.compute + (0.0 if d.tp_comm_overlap else k.tp) + k.cp + k.ep)
                params += count * (k.params_dense + k.params_expert)
        sched = total / d.pp * (self.mb + (d.pp - 1) / d.vpp)
        sharded = d.zero_stage >= 1
        return sched + self.costs.optimizer_step(params / d.pp / (self.shard if sharded else 1))

    # ------------------------------------------------------------------ per stage
    def position_params(self, stage: int) -> float:
        """Embedding (first stage) and output-layer (last stage) parameters, replicated like dense weights."""
        d, m = self.dims, self.job.model
        n = self.emb_params if stage == 0 else 0.0
        if stage == d.pp - 1 and (not m.tie_embeddings or d.pp > 1):
            n += self.emb_params  # a tied output layer still keeps a copy on the last stage when pp > 1
        return n

    def inflight(self, stage: int) -> float:
        d = self.dims
        return M.inflight_microbatches(stage, d.pp, d.vpp, self.mb)

    def params(self, stage: int, sp: StagePlan) -> tuple[float, float]:
        dense = self.position_params(stage)
        expert = 0.0
        for kind, n in (("dense", sp.dense), ("moe", sp.moe)):
            if n:
                k = self.kinds[kind]
                dense += n * k.params_dense
                expert += n * k.params_expert
        return dense, expert

    def compute(self, stage: int, sp: StagePlan) -> tuple[float, float]:
        """(compute seconds, forward seconds) of one micro-batch."""
        comp = fwd = 0.0
        for kind, n, r in (("dense", sp.dense, sp.r_dense), ("moe", sp.moe, sp.r_moe)):
            if n:
                k = self.kinds[kind]
                comp += n * k.compute + r * k.recompute_extra
                fwd += n * k.forward
        if stage == 0:
            comp, fwd = comp + self.emb_time, fwd + self.emb_fwd
        if stage == self.dims.pp - 1:
            comp, fwd = comp + self.logits_time, fwd + self.logits_fwd
        return comp, fwd

    def sharded_comm(self, dense: float, expert: float) -> float:
        """ZeRO-3: gather weights for forward and backward and reduce-scatter gradients every micro-batch
        (PyTorch FSDP, Zhao et al. 2023, Sec. 3.3). ZeRO-2: reduce-scatter gradients every micro-batch
        (DeepSpeed reduces during each backward with gradient accumulation)."""
        z = self.dims.zero_stage
        g = self.grad_wire
        if z < 2:
            return 0.0
        t = self.shard_link.reduce_scatter(g * dense) + (self.exp_link.reduce_scatter(g * expert) if expert else 0.0)
        if z >= 3:
            t += 2 * self.shard_link.all_gather(2.0 * dense) + (2 * self.exp_link.all_gather(2.0 * expert) if expert else 0.0)
        return t

    def microbatch_time(self, stage: int, sp: StagePlan) -> dict[str, float]:
        comp, fwd = self.compute(stage, sp)
        out = {"compute": comp, "forward": fwd}
        tp = ep = cp = 0.0
        for kind, n, r in (("dense", sp.dense, sp.r_dense), ("moe", sp.moe, sp.r_moe)):
            if n:
                k = self.kinds[kind]
                tp += n * k.tp + r * k.tp_recompute
                ep += n * k.ep + r * k.ep_recompute
                cp += n * k.cp
        if self.dims.tp_comm_overlap:
            # Pipelined with the adjacent GEMMs (Transformer Engine userbuffers, Megatron --tp-comm-overlap):
            # only the part longer than the compute stays on the critical path.
            tp = max(0.0, tp - comp)
        out.update(tp_comm=tp, cp_comm=cp, ep_comm=ep, pp_comm=self.pp_time)
        dense, expert = self.params(stage, sp)
        sharded = self.sharded_comm(dense, expert)
        out["zero_comm"] = max(0.0, sharded - self.cal.fsdp_overlap * comp) if sharded else 0.0
        out["total"] = comp + tp + cp + ep + self.pp_time + out["zero_comm"]
        return out

    def iteration_tail(self, stage: int, sp: StagePlan) -> tuple[float, float]:
        """(exposed DP communication, optimizer step) seconds after the stage's last backward.
        ZeRO 0: all-reduce gradients; 1-2: reduce-scatter (ZeRO-1 only; ZeRO-2 did it per micro-batch) and
        all-gather the updated weights. Overlapped with the last backward (Megatron --overlap-grad-reduce,
        PyTorch DDP buckets) and the next forward (--overlap-param-gather)."""
        d = self.dims
        dense, expert = self.params(stage, sp)
        red, gather = self.tail_parts(stage, sp)
        sharded = d.zero_stage >= 1
        local = dense / (self.shard if sharded else 1) + expert / (self.exp_shard if sharded else 1)
        return max(0.0, red) + max(0.0, gather), self.costs.optimizer_step(local)

    def tail_parts(self, stage: int, sp: StagePlan) -> tuple[float, float]:
        """The gradient reduction minus the backward that hides it, and the parameter gather minus the forward
        that hides it (seconds; a part is exposed when positive). Both are affine in the stage's layer counts."""
        d = self.dims
        if d.zero_stage >= 3:
            return 0.0, 0.0
        dense, expert = self.params(stage, sp)
        g = self.grad_wire
        comp, fwd = self.compute(stage, sp)
        if d.zero_stage == 0:
            red = self.shard_link.all_reduce(g * dense) + self.exp_link.all_reduce(g * expert)
            gather = 0.0
        else:
            red = 0.0 if d.zero_stage == 2 else (
                self.shard_link.reduce_scatter(g * dense) + self.exp_link.reduce_scatter(g * expert))
            gather = self.shard_link.all_gather(2.0 * dense) + self.exp_link.all_gather(2.0 * expert)
        return red - self.cal.dp_overlap * (comp - fwd), gather - self.cal.dp_overlap * fwd

    def memory(self, stage: int, sp: StagePlan) -> dict[str, float]:
        dense, expert = self.params(stage, sp)
        mem = {}
        for key in ("weights", "gradients", "optimizer"):
            mem[key] = dense * self.states_per_param["dense"][key] + expert * self.states_per_param["expert"][key]
        if self.dims.zero_stage >= 3:
            mem["weights"] += 2 * 2.0 * self.largest_layer  # the gathered layer and the prefetched next one
        act = 0.0
        for kind, n, r in (("dense", sp.dense, sp.r_dense), ("moe", sp.moe, sp.r_moe)):
            if n:
                k = self.kinds[kind]
                act += (n - r) * k.act + r * k.act_recomputed
        inflight = self.inflight(stage)
        total_act = inflight * act + (self.working if sp.recomputed else 0.0)
        if stage == 0:
            total_act += inflight * self.emb_act
        if stage == self.dims.pp - 1:
            total_act += self.logits_act
        mem["activations"] = total_act
        allocated = sum(mem.values())
        mem["overhead"] = allocated * self.cal.memory_fragmentation + self.cal.memory_fixed_gib * M.GIB
        return mem


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
