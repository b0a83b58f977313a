"""CP-SAT model of the combinatorial core: how many layers each pipeline stage holds and how many of them are
fully recomputed, for one choice of parallel degrees.

The model is built from the same StageModel coefficients the estimator evaluates (planner/cost/stage.py):
every stage quantity is affine in the stage's layer counts, and every overlap term is max(0, affine), which CP-SAT
represents exactly with AddMaxEquality. Times are integers in units between a nanosecond and a microsecond, fine
enough that rounding moves no plan's time by more than PRECISION (_time_unit); memory is in integer KiB. The
solution is then re-evaluated in floating point by the estimator, so rounding only matters between plans within
PRECISION of each other.

    minimize  v*m*T + sum_i t_i - T + v*(D + O)        (= v * iteration time, Narayanan's schedule)
    s.t.      t_i <= T, dp_i <= D, opt_i <= O, memory_i <= capacity, sum_i n_i = L, n_i = v*k_i
"""
from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner.cost import memory as M
from planner.cost.stage import StageModel, StagePlan

MIN_UNITS, MAX_UNITS = 1e6, 1e9  # integer time units per second: between a microsecond and a nanosecond
PRECISION = 1e-4  # relative rounding error the time unit allows (quick.RESOLUTION)
KIB = 1024.0


@dataclass
class PartitionResult:
    plans: list[StagePlan] | None  # None: infeasible (or nothing found in time)
    status: str                    # "optimal" | "feasible" | "infeasible" | "unknown"
    objective_s: float             # CP-SAT objective as iteration seconds (integer-rounded model)
    bound_s: float                 # proven lower bound, seconds


def _affine(fn, x1: float, x2: float) -> tuple[float, float]:
    """(slope, intercept) of a function that is affine for positive arguments (collective cost vs bytes)."""
    y1, y2 = fn(x1), fn(x2)
    slope = (y2 - y1) / (x2 - x1)
    return slope, y1 - slope * x1


def _moe_prefix(model: cp_model.CpModel, sm: StageModel, prefix, name: str):
    """MoE layers among the first ``prefix`` layers, as a table lookup (AddElement)."""
    job = sm.job
    L = job.model.num_layers
    table = [job.model.moe_layers_before(x) for x in range(L + 1)]
    out = model.NewIntVar(0, table[-1], name)
    model.AddElement(prefix, table, out)
    return out


def _time_horizon(sm: StageModel, L: int, p: int) -> float:
    """Upper bound of any stage or tail time (seconds): every layer on one stage, fully recomputed, plus all
    extras."""
    kinds = sm.kinds
    worst_layer = max(k.compute + k.recompute_extra + k.tp + k.tp_recompute + k.cp + k.ep + k.ep_recompute
                      for k in kinds.values())
    worst_params = (sm.position_params(0) + sm.position_params(p - 1)
                    + L * max(k.params_dense + k.params_expert for k in kinds.values()))
    worst = (L * worst_layer + sm.emb_time + sm.logits_time + sm.pp_time
             + sm.sharded_comm(worst_params, worst_params) + sm.shard_link.all_reduce(8.0 * worst_params)
             + sm.exp_link.all_reduce(8.0 * worst_params) + sm.costs.optimizer_step(worst_params))
    return 2 * worst + 1e-3


def _time_unit(horizon_s: float, weight: int, span: int, sms: list[StageModel], zero: int) -> float:
    """Integer time units per second. Coefficients are rounded to whole units, so a stage's time is off by up to
    half a unit per rounded term and layer, and the objective carries that error once per micro-batch: relative
    to the time, at most half a unit per term over one layer's compute. The unit keeps that below PRECISION for
    every layer kind of every stage, so plans are ordered correctly to within it and a cap loosened by it
    excludes no plan below the cap; it is no finer (finer units slow CP-SAT), at most a nanosecond, at least a
    microsecond, and coarser where the weighted objective (span horizons times the tie-break weight) would reach
    2**62."""
    need = MIN_UNITS
    for k in {id(k): k for x in sms for k in x.kinds.values()}.values():
        terms = sum(1 for c in (k.compute, k.recompute_extra, k.tp, k.tp_recompute, k.cp, k.ep, k.ep_recompute) if c)
        terms += (0, 0, 1, 3)[zero]  # ZeRO-2/3 per-micro-batch traffic
        if k.compute > 0:
            need = max(need, terms / 2 / (PRECISION * k.compute))
    fits = 2**62 / (4 * weight * span * horizon_s)
    return max(MIN_UNITS, min(MAX_UNITS, need, fits))


def solve_partition(sm: StageModel | list[StageModel], capacity_gib: float | list[float], *,
                    partial_recompute: bool, time_limit_s: float, workers: int = 1, seed: int = 0,
                    objective_cap_s: float | None = None, even_layers: bool = False,
                    uniform_recompute: bool = False, hint: list[StagePlan] | None = None) -> PartitionResult:
    """Best layer partition and recompute placement.

    ``sm`` is one StageModel for all stages (homogeneous degrees) or a list with one StageModel per stage
    (heterogeneous plans: stage i's coefficients, links, memory and capacity all come from ``sm[i]`` and
    ``capacity_gib[i]``); the stage count, interleaving, micro-batches and recompute mode are shared.
    ``objective_cap_s`` lets the caller prune: only solutions faster than it are of interest (a solution up to
    PRECISION above it may still be returned).
    ``even_layers`` forces the same layer count on every stage (frameworks without uneven splits);
    ``uniform_recompute`` the same number of fully recomputed layers on every stage (Megatron's
    ``--recompute-num-layers`` applies to each stage alike). ``hint`` (a known feasible split) seeds the search;
    it changes how fast the optimum is found, not which optimum (ties are broken in the objective)."""
    sms = sm if isinstance(sm, list) else [sm] * sm.dims.pp
    caps = capacity_gib if isinstance(capacity_gib, list) else [capacity_gib] * len(sms)
    s0 = sms[0]
    d = s0.dims
    job = s0.job
    L, p, v, mb = job.model.num_layers, d.pp, d.vpp, s0.mb
    has_moe = "moe" in s0.kinds
    full_only = d.recompute == "full"
    m = cp_model.CpModel()
    horizon_s = max(_time_horizon(x, L, p) for x in {id(x): x for x in sms}.values())
    # Ties in time are broken inside the objective (fewer layers, then less recompute, on earlier stages) so the
    # optimum is the same for any worker count or search order; the tie-break weighs less than one time unit.
    weight = p * (p + 1) // 2 * (L + 1) * (L + 1) + 1
    span = v * mb + p + 2 * v  # the objective is at most span horizons
    unit = _time_unit(horizon_s, weight, span, sms, d.zero_stage)
    big_t = int(horizon_s * unit)

    def ti(x: float) -> int:
        return int(round(x * unit))

    n, k_v, r, rm, rd, nm, nd, b, hm = [], [], [], [], [], [], [], [], []
    prev_prefix, prev_moe = None, None
    for i in range(p):
        kv = m.NewIntVar(1, L // v, f"k{i}")
        ni = m.NewIntVar(v, L, f"n{i}")
        m.Add(ni == v * kv)
        n.append(ni)
        k_v.append(kv)
        prefix = m.NewIntVar(0, L, f"S{i}")
        m.Add(prefix == (prev_prefix if prev_prefix is not None else 0) + ni)
        if has_moe:
            moe_prefix = _moe_prefix(m, s0, prefix, f"M{i}")
            nmi = m.NewIntVar(0, L, f"nm{i}")
            m.Add(nmi == moe_prefix - (prev_moe if prev_moe is not None else 0))
            prev_moe = moe_prefix
            hmi = m.NewBoolVar(f"hm{i}")
            m.Add(nmi >= 1).OnlyEnforceIf(hmi)
            m.Add(nmi == 0).OnlyEnforceIf(hmi.Not())
        else:
            nmi, hmi = m.NewConstant(0), m.NewConstant(0)
        nm.append(nmi)
        hm.append(hmi)
        ndi = m.NewIntVar(0, L, f"nd{i}")
        m.Add(ndi == ni - nmi)
        nd.append(ndi)
        prev_prefix = prefix
        if full_only:
            ri = ni
        elif partial_recompute:
            ri = m.NewIntVar(0, L, f"r{i}")
            m.Add(ri <= ni)
        else:
            ri = m.NewConstant(0)
        r.append(ri)
        rmi = m.NewIntVar(0, L, f"rm{i}")
        m.AddMinEquality(rmi, [ri, nmi])
        rdi = m.NewIntVar(0, L, f"rd{i}")
        m.Add(rdi == ri - rmi)
        rm.append(rmi)
        rd.append(rdi)
        bi = m.NewBoolVar(f"b{i}")
        m.Add(ri >= 1).OnlyEnforceIf(bi)
        m.Add(ri == 0).OnlyEnforceIf(bi.Not())
        b.append(bi)
    m.Add(prev_prefix == L)
    for i in range(1, p):
        if even_layers:
            m.Add(n[i] == n[0])
        if uniform_recompute:
            m.Add(r[i] == r[0])

    T = m.NewIntVar(0, big_t, "T")
    D = m.NewIntVar(0, big_t, "D")
    O = m.NewIntVar(0, big_t, "O")
    t_all = []
    ref = 1e9
    for i in range(p):
        sm = sms[i]  # every per-stage coefficient below comes from this stage's own model
        kinds, cal = sm.kinds, sm.cal
        kd = kinds["dense"]
        km = kinds.get("moe", kd)
        # Collective costs are affine in bytes (bus-bandwidth model + latency); read their slopes off the links.
        g = sm.grad_wire
        z = d.zero_stage
        sh, ex = sm.shard_link, sm.exp_link
        rs_d = _affine(lambda x: sh.reduce_scatter(g * x), ref, 2 * ref)
        ag_d = _affine(lambda x: sh.all_gather(2.0 * x), ref, 2 * ref)
        ar_d = _affine(lambda x: sh.all_reduce(g * x), ref, 2 * ref)
        rs_e = _affine(lambda x: ex.reduce_scatter(g * x), ref, 2 * ref)
        ag_e = _affine(lambda x: ex.all_gather(2.0 * x), ref, 2 * ref)
        ar_e = _affine(lambda x: ex.all_reduce(g * x), ref, 2 * ref)
        hbm_opt = sm.costs.optimizer_step(1.0)
        shard_div = sm.shard if z >= 1 else 1
        exp_div = sm.exp_shard if z >= 1 else 1
        frag = 1.0 + cal.memory_fragmentation
        cap_kib = int((caps[i] * M.GIB - cal.memory_fixed_gib * M.GIB) / frag / KIB)
        pos_params = sm.position_params(i)
        comp_const = (sm.emb_time if i == 0 else 0.0) + (sm.logits_time if i == p - 1 else 0.0)
        fwd_const = (sm.emb_fwd if i == 0 else 0.0) + (sm.logits_fwd if i == p - 1 else 0.0)
        comp = m.NewIntVar(0, big_t, f"comp{i}")
        m.Add(comp == ti(kd.compute) * nd[i] + ti(km.compute) * nm[i] + ti(kd.recompute_extra) * rd[i]
              + ti(km.recompute_extra) * rm[i] + ti(comp_const))
        fwd = ti(kd.forward) * nd[i] + ti(km.forward) * nm[i] + ti(fwd_const)
        tp_raw = (ti(kd.tp) * nd[i] + ti(km.tp) * nm[i] + ti(kd.tp_recompute) * rd[i] + ti(km.tp_recompute) * rm[i])
        if sm.dims.tp_comm_overlap:
            tp = m.NewIntVar(0, big_t, f"tp{i}")
            m.AddMaxEquality(tp, [tp_raw - comp, 0])
        else:
            tp = tp_raw
        other = ti(kd.cp) * nd[i] + ti(km.cp) * nm[i] + ti(kd.ep) * nd[i] + ti(km.ep) * nm[i] \
            + ti(kd.ep_recompute) * rd[i] + ti(km.ep_recompute) * rm[i] + ti(sm.pp_time)
        # params on this GPU: dense part (replicated over DP*CP) and expert part (over expert-DP)
        dense_p = (kd.params_dense, km.params_dense, pos_params)
        exp_p = km.params_expert if has_moe else 0.0
        zero_t = 0
        if z >= 2:
            sharded = (ti(rs_d[0] * dense_p[0]) * nd[i] + ti(rs_d[0] * dense_p[1]) * nm[i] + ti(rs_d[0] * dense_p[2] + rs_d[1]))
            if has_moe:
                sharded += ti(rs_e[0] * exp_p) * nm[i] + ti(rs_e[1]) * hm[i]
            if z >= 3:
                sharded += 2 * (ti(ag_d[0] * dense_p[0]) * nd[i] + ti(ag_d[0] * dense_p[1]) * nm[i]
                                + ti(ag_d[0] * dense_p[2] + ag_d[1]))
                if has_moe:
                    sharded += 2 * (ti(ag_e[0] * exp_p) * nm[i] + ti(ag_e[1]) * hm[i])
            hidden = int(round(cal.fsdp_overlap * 1000))
            # max(0, sharded - overlap*comp) in thousandths of a time unit (the overlap share in thousandths)
            scaled = m.NewIntVar(-big_t * 1000, big_t * 1000, f"zs{i}")
            m.Add(scaled == 1000 * sharded - hidden * comp)
            zero_t = m.NewIntVar(0, big_t * 1000, f"zp{i}")
            m.AddMaxEquality(zero_t, [scaled, 0])
        t_i = m.NewIntVar(0, big_t, f"t{i}")
        # t_i >= its time, rounded up to a whole unit (minimizing makes it equal); no division constraint, which
        # CP-SAT propagates poorly
        m.Add(1000 * t_i >= 1000 * (comp + tp + other) + zero_t)
        m.Add(t_i <= T)
        t_all.append(t_i)

        # end-of-iteration DP communication and optimizer step
        if z < 3:
            ov = int(round(cal.dp_overlap * 1000))
            if z == 0:
                red = (ti(ar_d[0] * dense_p[0]) * nd[i] + ti(ar_d[0] * dense_p[1]) * nm[i] + ti(ar_d[0] * dense_p[2] + ar_d[1]))
                if has_moe:
                    red += ti(ar_e[0] * exp_p) * nm[i] + ti(ar_e[1]) * hm[i]
                gather = 0
            else:
                red = 0
                if z == 1:
                    red = (ti(rs_d[0] * dense_p[0]) * nd[i] + ti(rs_d[0] * dense_p[1]) * nm[i] + ti(rs_d[0] * dense_p[2] + rs_d[1]))
                    if has_moe:
                        red += ti(rs_e[0] * exp_p) * nm[i] + ti(rs_e[1]) * hm[i]
                gather = (ti(ag_d[0] * dense_p[0]) * nd[i] + ti(ag_d[0] * dense_p[1]) * nm[i] + ti(ag_d[0] * dense_p[2] + ag_d[1]))
                if has_moe:
                    gather += ti(ag_e[0] * exp_p) * nm[i] + ti(ag_e[1]) * hm[i]
            parts = []
            for j, (comm, window) in enumerate(((red, comp - fwd), (gather, fwd))):
                s = m.NewIntVar(-big_t * 1000, big_t * 1000, f"dps{i}_{j}")
                m.Add(s == 1000 * comm - ov * window)
                pos = m.NewIntVar(0, big_t * 1000, f"dpp{i}_{j}")
                m.AddMaxEquality(pos, [s, 0])
                parts.append(pos)
            m.Add(sum(parts) <= 1000 * D)  # in thousandths, as above
        local_d = 1.0 / shard_div
        local_e = 1.0 / exp_div
        opt = (ti(hbm_opt * dense_p[0] * local_d) * nd[i] + ti(hbm_opt * (dense_p[1] * local_d + exp_p * local_e)) * nm[i]
               + ti(hbm_opt * dense_p[2] * local_d))
        m.Add(opt <= O)

        # memory (KiB), before the allocator allowance
        spp = sm.states_per_param
        per_d = sum(spp["dense"].values())
        per_e = sum(spp["expert"].values())
        inflight = sm.inflight(i)
        kib = lambda x: int(round(x / KIB))  # noqa: E731
        const = pos_params * per_d + (2 * 2.0 * sm.largest_layer if z >= 3 else 0.0)
        const += (inflight * sm.emb_act if i == 0 else 0.0) + (sm.logits_act if i == p - 1 else 0.0)
        mem = (kib(kd.params_dense * per_d + inflight * kd.act) * nd[i]
               + kib(km.params_dense * per_d + exp_p * per_e + inflight * km.act) * nm[i]
               + kib(inflight * (kd.act_recomputed - kd.act)) * rd[i]
               + kib(inflight * (km.act_recomputed - km.act)) * rm[i]
               + kib(sm.working) * b[i] + kib(const))
        m.Add(mem <= cap_kib)

    obj = v * mb * T + sum(t_all) - T + v * (D + O)
    if objective_cap_s is not None:
        m.Add(obj <= int(objective_cap_s * (1 + PRECISION) * unit * v))  # rounding must not exclude a plan below it
    tiebreak = sum((p - i) * ((L + 1) * n[i] + r[i]) for i in range(p))
    horizon = span * big_t  # bound of obj from the variables' domains
    m.Minimize(obj * weight + tiebreak if horizon * weight < 2**62 else obj)
    if hint is not None and len(hint) == p:
        # a variable may stand for several stages (constants are shared, uniform recompute ties them): hint once
        hinted: set[int] = set()
        for i, plan in enumerate(hint):
            for var, value in ((n[i], plan.layers), (r[i], plan.recomputed)):
                if var.Index() not in hinted:
                    hinted.add(var.Index())
                    m.AddHint(var, value)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    solver.parameters.catch_sigint_signal = False  # Ctrl-C must reach Python (exit 130), not end one solve
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        st = "infeasible" if status == cp_model.INFEASIBLE else "unknown"
        return PartitionResult(None, st, float("inf"), float("inf") if st == "infeasible" else 0.0)
    best = solver.Value(obj)
    bound = solver.BestObjectiveBound() / (weight if horizon * weight < 2**62 else 1)
    optimal = status == cp_model.OPTIMAL
    plans = []
    for i in range(p):
        plans.append(StagePlan(dense=int(solver.Value(nd[i])), moe=int(solver.Value(nm[i])),
                               r_dense=int(solver.Value(rd[i])), r_moe=int(solver.Value(rm[i]))))
    return PartitionResult(plans, "optimal" if optimal else "feasible", best / unit / v, bound / unit / v)
