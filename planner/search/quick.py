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
    groups: dict[float, int] = {}
    for i in range(p):
        c = _stage_const(sm, i)
        groups[c] = groups.get(c, 0) + 1

    def holds(T: float) -> int:
        return sum(k * _capacity(T, a, c, v) for c, k in groups.items())

    # holds(T) >= (p*T - sum c)/a - p*v, so the answer lies in [T0, T0 + a*v] with T0 the fractional balance;
    # it is a breakpoint c_g + j*a*v of some group, and each group has at most two in that interval.
    floor_t = max(c + v * a for c in groups)
    t0 = max(floor_t, (L * a + sum(c * k for c, k in groups.items())) / p)
    points = {floor_t}
    for c in groups:
        j = max(0, int((t0 - c) / (a * v)))
        points.update(c + (j + step) * a * v for step in range(3))
    for T in sorted(x for x in points if x >= floor_t * (1 - 1e-12)):
        if holds(T) >= L:
            return T * (1 - 1e-12)
    return floor_t + L * a  # unreachable: L layers always fit one per v-chunk at T = max c + L*a


def _effective_layers(sm: StageModel) -> float:
    """Layers counted in units of the heaviest kind: a dense layer of an MoE model counts as the largest
    fraction of an MoE layer's memory it can be on any stage (with or without recompute)."""
    m = sm.job.model
    L = m.num_layers
    n_dense = L - m.num_moe_layers
    if "moe" not in sm.kinds or not n_dense:
        return float(L)
    per_d = sum(sm.states_per_param["dense"].values())
    per_e = sum(sm.states_per_param["expert"].values())

    def mem(kind: str, inflight: float, recomputed: bool) -> float:
        k = sm.kinds[kind]
        return k.params_dense * per_d + k.params_expert * per_e + inflight * (k.act_recomputed if recomputed else k.act)

    ratio = max(mem("dense", sm.inflight(i), rc) / mem("moe", sm.inflight(i), rc)
                for i in range(sm.dims.pp) for rc in (False, True))
    return L - n_dense * (1 - min(1.0, ratio))


def forced_recompute(sm: StageModel, capacity_gib: float) -> float | None:
    """Fewest layers that must be fully recomputed for L layers to fit in memory (fractional, a lower bound), or
    None when even full recompute everywhere cannot fit them. Per stage, memory is base_i + n*alpha_i - r*beta_i;
    taking the lightest layer kind for alpha and the largest saving for beta keeps the bound valid for MoE."""
    d = sm.dims
    L, p = sm.job.model.num_layers, d.pp
    cal = sm.cal
    cap = (capacity_gib * M.GIB - cal.memory_fixed_gib * M.GIB) / (1 + cal.memory_fragmentation)
    per_d = sum(sm.states_per_param["dense"].values())
    per_e = sum(sm.states_per_param["expert"].values())
    states = {n: k.params_dense * per_d + k.params_expert * per_e for n, k in sm.kinds.items()}
    free_total, extra = 0, []
    full_total = 0
    for i in range(p):
        inflight = sm.inflight(i)
        base = sm.position_params(i) * per_d + (4.0 * sm.largest_layer if d.zero_stage >= 3 else 0.0)
        base += (inflight * sm.emb_act if i == 0 else 0.0) + (sm.logits_act if i == p - 1 else 0.0)
        heavy = "moe" if "moe" in sm.kinds else "dense"
        alpha = states[heavy] + inflight * sm.kinds[heavy].act
        lean = states[heavy] + inflight * sm.kinds[heavy].act_recomputed
        beta = max(inflight * (k.act - k.act_recomputed) for k in sm.kinds.values())
        room = cap - base
        if room < min(states[n] + inflight * k.act_recomputed for n, k in sm.kinds.items()) * d.vpp:
            return None
        free = max(0, int(room / alpha)) if alpha > 0 else L
        full = int(room / lean) if lean > 0 else L
        free_total += free
        full_total += full
        if full > free and beta > 0:
            extra.append((alpha / beta, full - free))
    effective = _effective_layers(sm)
    if full_total < effective:
        return None
    need = effective - free_total
    forced = 0.0
    for ratio, room in sorted(extra):
        if need <= 0:
            break
        take = min(room, need)
        forced += take * ratio
        need -= take
    return forced


def _stage_memory_terms(sm: StageModel, capacity_gib: float):
    """Per stage (room, alpha, beta): allocatable bytes left after the stage's fixed items, bytes per layer of the
    heaviest kind, and bytes saved per fully recomputed layer."""
    return [stage_memory_term(sm, capacity_gib, i) for i in range(sm.dims.pp)]


def stage_memory_term(sm: StageModel, capacity_gib: float, i: int) -> tuple[float, float, float]:
    """(room, alpha, beta) of stage i (see _stage_memory_terms)."""
    d, cal = sm.dims, sm.cal
    p = d.pp
    cap = (capacity_gib * M.GIB - cal.memory_fixed_gib * M.GIB) / (1 + cal.memory_fragmentation)
    per_d = sum(sm.states_per_param["dense"].values())
    per_e = sum(sm.states_per_param["expert"].values())
    heavy = "moe" if "moe" in sm.kinds else "dense"
    k = sm.kinds[heavy]
    states = k.params_dense * per_d + k.params_expert * per_e
    inflight = sm.inflight(i)
    base = sm.position_params(i) * per_d + (4.0 * sm.largest_layer if d.zero_stage >= 3 else 0.0)
    base += (inflight * sm.emb_act if i == 0 else 0.0) + (sm.logits_act if i == p - 1 else 0.0)
    return cap - base, states + inflight * k.act, inflight * (k.act - k.act_recomputed)


def memory_bottleneck(sm: StageModel, capacity_gib: float, effective_layers: float,
                      probe: float | None = None) -> float:
    """Smallest bottleneck T at which the stages can hold ``effective_layers`` layers of the heaviest kind (the
    other layers only add time and memory) when each stage recomputes just enough
    layers (whole layers) to fit in memory: stage i holds n layers in n*a + r_i(n)*rc + c_i seconds with
    r_i(n) = ceil((n*alpha_i - room_i)/beta_i). A lower bound on max_i t_i for every feasible plan.
    With ``probe`` only one question is answered (is the bottleneck above ``probe``?): the result is just above
    ``probe`` if so, else a weaker valid bound; enough for pruning against a known best."""
    counts, lo, hi = _memory_counts(sm, capacity_gib)

    def holds(T: float) -> int:
        return sum(counts(T))

    if holds(hi) < effective_layers - 1e-9:
        return float("inf")
    if holds(lo) >= effective_layers - 1e-9:
        return lo
    if probe is not None:
        return probe * (1 + 1e-12) if probe < hi and holds(probe) < effective_layers - 1e-9 else lo
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        if holds(mid) >= effective_layers - 1e-9:
            hi = mid
        else:
            lo = mid
    return lo


def _memory_counts(sm: StageModel, capacity_gib: float):
    """(counts, lo, hi): counts(T) gives, per stage, the most heavy layers (multiples of v) it holds within a
    bottleneck T when it recomputes just enough whole layers to fit; lo and hi bracket the bottleneck."""
    d = sm.dims
    v = d.vpp
    heavy = sm.kinds["moe" if "moe" in sm.kinds else "dense"]
    a = heavy.compute + (0.0 if d.tp_comm_overlap else heavy.tp) + heavy.cp + heavy.ep
    rc = heavy.recompute_extra + heavy.tp_recompute + heavy.ep_recompute
    terms = _stage_memory_terms(sm, capacity_gib)
    consts = [_stage_const(sm, i) for i in range(d.pp)]

    def capacity(i: int, T: float) -> float:
        """Most layers stage i holds within T, relaxing r_i(n) to (n*alpha - room)/beta (no ceiling)."""
        room, alpha, beta = terms[i]
        slack = T - consts[i]
        if slack <= 0 or room <= 0:
            return 0.0
        n = min(slack / a, room / alpha)  # no recompute
        if beta > 0 and rc > 0:
            with_rc = (slack + room * rc / beta) / (a + alpha * rc / beta)
            lean = alpha - beta
            full = room / lean if lean > 0 else float("inf")
            if with_rc > room / alpha:
                n = max(n, min(with_rc, full))
        return n

    def stage_time(i: int, n: int) -> float:
        """Exact time of n heavy layers on stage i with the fewest whole recomputed layers that fit."""
        room, alpha, beta = terms[i]
        over = n * alpha - room
        r = 0
        if over > 0:
            if beta <= 0:
                return float("inf")
            r = -(-over // beta)
            if r > n:
                return float("inf")
        return n * a + r * rc + consts[i]

    def counts(T: float) -> list[int]:
        out = []
        for i in range(d.pp):
            k = int(capacity(i, T) / v + 1e-9)  # relaxed capacity, then whole recomputed layers
            while k > 0 and stage_time(i, k * v) > T * (1 + 1e-12):
                k -= 1
            out.append(k * v)
        return out

    lo = max(consts) if consts else 0.0
    return counts, lo, lo + sm.job.model.num_layers * (a + rc)


def lower_bound(sm: StageModel, capacity_gib: float | None = None, cutoff: float = float("inf")) -> float:
    """Valid for every partition and recompute placement of these degrees. Beyond the integer bottleneck it
    keeps the convex overlap terms in aggregate: sum_i max(0, x_i) >= max(0, sum_i x_i), and collective costs are
    affine with non-negative latency, so f(a) + f(b) >= f(a + b). Against a finite ``cutoff`` (the K-th best
    plan) the memory bottleneck is only probed at the value that would reach it."""
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
    if capacity_gib is not None:
        forced = forced_recompute(sm, capacity_gib)
        if forced is None:
            return float("inf")
        if forced > 0:
            per_recompute = min(k.recompute_extra + k.tp_recompute + k.ep_recompute for k in sm.kinds.values())
            total += forced * per_recompute
            comp += forced * min(k.recompute_extra for k in sm.kinds.values())
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
    rest = total / v + tail + opt
    slope = sm.mb - 1 / v
    if capacity_gib is not None and slope * T + rest < cutoff:
        # the heaviest kind alone must fit: all layers of a dense model, the MoE layers of an MoE model
        probe = (cutoff - rest) / slope if cutoff < float("inf") and slope > 0 else None
        T = max(T, memory_bottleneck(sm, capacity_gib, m.num_moe_layers if "moe" in sm.kinds else m.num_layers, probe))
    return slope * T + rest


def _trim_surplus(sm: StageModel, counts: list[int], L: int) -> bool:
    """Remove layers (v at a time) from the slowest stages, last stages first on ties, until the counts add up
    to L. False when that would leave a stage empty."""
    v = sm.dims.vpp
    a = _per_layer(sm)
    surplus = sum(counts) - L
    while surplus > 0:
        order = sorted(range(len(counts)), key=lambda i: (-(counts[i] * a + _stage_const(sm, i)), -i))
        for i in order:
            if counts[i] > v:
                counts[i] -= v
                surplus -= v
                break
        else:
            return False
    return True


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
    if sum(counts) < L or not _trim_surplus(sm, counts, L):
        return None
    plans = split_kinds(sm.job, tuple(counts), None, d.recompute == "full")
    if any(sum(sm.memory(i, pl).values()) > cap for i, pl in enumerate(plans)):
        return None
    return plans


def greedy_recompute_partition(sm: StageModel, capacity_gib: float) -> list[StagePlan] | None:
    """A feasible plan when memory forces recompute: stage capacities at the memory bottleneck (heaviest kind),
    the surplus trimmed from the slowest stages, then on each stage the fewest recomputed layers that fit."""
    d = sm.dims
    m = sm.job.model
    L, p, v = m.num_layers, d.pp, d.vpp
    T = memory_bottleneck(sm, capacity_gib, m.num_moe_layers if "moe" in sm.kinds else L)
    if T == float("inf"):
        return None
    stage_counts, _, _ = _memory_counts(sm, capacity_gib)
    counts = stage_counts(T * (1 + 1e-9))
    if sum(counts) < L or min(counts) < v:
        bump = 1.0
        while (sum(counts) < L or min(counts) < v) and bump < 4:
            bump *= 1.05
            counts = stage_counts(T * bump)
        if sum(counts) < L or min(counts) < v:
            return None
    if not _trim_surplus(sm, counts, L):
        return None
    cap = capacity_gib * M.GIB
    recompute = [0] * p
    for i in range(p):
        while True:
            plan = split_kinds(sm.job, tuple(counts), tuple(recompute), False)[i]
            if sum(sm.memory(i, plan).values()) <= cap:
                break
            if recompute[i] >= counts[i]:
                return None
            recompute[i] += 1
    return split_kinds(sm.job, tuple(counts), tuple(recompute), False)
