"""Fast bounds around the CP-SAT partition model: an integer-aware lower bound and a greedy balanced partition.

For fixed degrees a stage with n layers takes about n*a + c_i per micro-batch (c_i: embedding on the first stage,
logits on the last, pipeline sends). With a bottleneck T every stage holds at most floor((T - c_i)/a) layers
(in multiples of v), so the smallest T for which these capacities add up to L bounds the bottleneck from below
for every partition, and the iteration from below through m*T + (sum(t) - T)/v. When the greedy partition at
that T fits in memory and evaluates to within RESOLUTION of the bound, it is optimal and CP-SAT is not needed.
"""
from __future__ import annotations

from planner.cost import memory as M
from planner.cost.stage import StageModel, StagePlan, split_kinds

RESOLUTION = 1e-4  # plans closer than 0.01% are treated as equal in time


def _per_layer(sm: StageModel) -> float:
    """Smallest per-layer seconds of any kind (compute + unavoidable communication): valid for a bound."""
    d = sm.dims
    return min(k.compute + (0.0 if d.tp_comm_overlap else k.tp) + k.cp + k.ep for k in sm.kinds.values())


def _stage_const(sm: StageModel, i: int) -> float:
    p = sm.dims.pp
    return (sm.emb_time if i == 0 else 0.0) + (sm.logits_time if i == p - 1 else 0.0) + sm.pp_time


def _capacity(T: float, a: float, c: float, v: int) -> int:
    return max(0, int((T - c) / a / v + 1e-12)) * v


def integer_bottleneck(sm: StageModel) -> float:
    """Smallest T with sum_i floor_v((T - c_i)/a) >= L and every stage holding at least v layers."""
    d = sm.dims
    L, p, v = sm.job.model.num_layers, d.pp, d.vpp
    a = _per_layer(sm)
    consts = [_stage_const(sm, i) for i in range(p)]
    lo = max(c + v * a for c in consts) * (1 - 1e-12)
    hi = max(consts) + L * a
    if sum(_capacity(lo, a, c, v) for c in consts) >= L:
        return lo
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(_capacity(mid, a, c, v) for c in consts) >= L:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo


def lower_bound(sm: StageModel) -> float:
    """Valid for every partition and recompute placement of these degrees. Beyond the integer bottleneck it
    keeps the convex overlap terms in aggregate: sum_i max(0, x_i) >= max(0, sum_i x_i), and collective costs are
    affine with non-negative latency, so f(a) + f(b) >= f(a + b)."""
    d, m = sm.dims, sm.job.model
    p, v = d.pp, d.vpp
    a = _per_layer(sm)
    total = m.num_layers * a + sum(_stage_const(sm, i) for i in range(p))
    dense = sm.position_params(0) + (sm.position_params(p - 1) if p > 1 else 0.0)
    expert = 0.0
    comp = sm.emb_time + sm.logits_time
    fwd = sm.emb_fwd + sm.logits_fwd
    for kind, count in (("dense", m.num_layers - m.num_moe_layers), ("moe", m.num_moe_layers)):
        if count:
            k = sm.kinds[kind]
            dense += count * k.params_dense
            expert += count * k.params_expert
            comp += count * k.compute
            fwd += count * k.forward
    sharded = sm.sharded_comm(dense, expert)
    if sharded:
        total += max(0.0, sharded - sm.cal.fsdp_overlap * comp)
    T = max(integer_bottleneck(sm), total / p)
    tail = 0.0
    if d.zero_stage < 3:
        g = sm.grad_wire
        if d.zero_stage == 0:
            red = sm.shard_link.all_reduce(g * dense) + sm.exp_link.all_reduce(g * expert)
            gather = 0.0
        else:
            red = 0.0 if d.zero_stage == 2 else sm.shard_link.reduce_scatter(g * dense) + sm.exp_link.reduce_scatter(g * expert)
            gather = sm.shard_link.all_gather(2.0 * dense) + sm.exp_link.all_gather(2.0 * expert)
        ov = sm.cal.dp_overlap
        tail = (max(0.0, red - ov * (comp - fwd)) + max(0.0, gather - ov * fwd)) / p
    sharded_opt = d.zero_stage >= 1
    opt = sm.costs.optimizer_step(dense / p / (sm.shard if sharded_opt else 1) + expert / p / (sm.exp_shard if sharded_opt else 1))
    return (sm.mb - 1 / v) * T + total / v + tail + opt


def greedy_partition(sm: StageModel, capacity_gib: float) -> list[StagePlan] | None:
    """Balanced partition at the integer bottleneck, without recompute beyond the baseline; None when memory
    forces recompute or the layers do not fit."""
    d = sm.dims
    L, p, v = sm.job.model.num_layers, d.pp, d.vpp
    a = _per_layer(sm)
    T = integer_bottleneck(sm) * (1 + 1e-9)
    counts = [_capacity(T, a, _stage_const(sm, i), v) for i in range(p)]
    cap = capacity_gib * M.GIB
    # memory cap per stage (no recompute): the memory of a stage grows with its layers
    for i in range(p):
        while counts[i] >= v:
            plans = split_kinds(sm.job, tuple(counts), None, d.recompute == "full")
            if sum(sm.memory(i, plans[i]).values()) <= cap:
                break
            counts[i] -= v
        if counts[i] < v:
            return None
    surplus = sum(counts) - L
    if surplus < 0:
        return None
    # trim the surplus from the stages with the largest time, last stages first on ties
    while surplus > 0:
        times = [counts[i] * a + _stage_const(sm, i) for i in range(p)]
        order = sorted(range(p), key=lambda i: (-times[i], -i))
        for i in order:
            if counts[i] > v:
                counts[i] -= v
                surplus -= v
                break
        else:
            return None
    plans = split_kinds(sm.job, tuple(counts), None, d.recompute == "full")
    if any(sum(sm.memory(i, pl).values()) > cap for i, pl in enumerate(plans)):
        return None
    return plans
