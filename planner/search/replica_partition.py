"""Exact layer split of a pipelined replica shape (planner/search/replicas.py): the CP-SAT model of
planner/search/partition.py with one set of stage times, recompute counts, DP tail and optimizer step per replica
group, sharing the stages' layer counts (the replicas reduce their gradients stage by stage, so they hold the same
layers), and each group's micro-batch count m_g:

    minimize  Z   s.t.  Z >= m_g*T_g + sum_i t_gi - T_g + D_g + O_g   for every used group g   (1F1B per replica)
              sum_g d_g m_g = M,  t_gi <= T_g,  memory_gi <= capacity_g,  sum_i n_i = L

m_g*T_g is an exact integer product (AddMultiplicationEquality). The m_g range comes from a lower bound -- a
replica of g running m micro-batches takes at least (m + pp - 1) W_g / pp and at least W_g, with W_g its
per-micro-batch work at the fastest per-layer rate (the shape bound of replicas.py) -- so only counts that could
beat the best plan are in the model. Stage memory depends on m_g only below pp micro-batches (fewer in flight):
when such counts are in range, each choice is solved with its own stage models instead (best bound first).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from planner.cost.stage import StageModel
from planner.search.partition import (
    PRECISION,
    PartitionVars,
    Scale,
    _add_dp_tail,
    _add_layer_counts,
    _add_layer_totals,
    _add_memory,
    _add_optimizer_step,
    _add_recompute_counts,
    _add_stage_time,
    _time_horizon,
    _time_unit,
    cp_sat,
    new_solver,
)
from planner.search.result import solve_wall

MAX_CHOICES = 4096  # micro-batch choices one shape may enumerate (more: the shape stays open)
# Partial choices the enumeration may visit (most are dropped because the last group's count does not divide): a
# shape with three or more groups and thousands of micro-batches has millions; past this the shape stays open.
MAX_VISITS = 64 * MAX_CHOICES
# A fixed choice's first solve, without presolve, stops at this much of CP-SAT's deterministic time (_solve_choice):
# the far-from-the-cap choices it is for take 0.000-0.007 (seed-5 job 10); the close ones it leaves to presolve
# took 0.06-0.24 without it (seed-1 job 31)
FIXED_QUICK_WORK = 0.02
STEADY_SOLVE_S = 1.0  # the variable-count model's cap (CP-SAT's deterministic time) before the choices one by one


@dataclass
class ShapeSplit:
    """Per micro-batch choice solved: its counts, the shared layer split and each replica's recompute counts."""

    ms: tuple[int, ...]
    layers: tuple[int, ...]
    recompute: tuple[tuple[int, ...], ...]


@dataclass
class ExactShape:
    """The splits worth evaluating (best first), whether they include the shape's optimum (``proven``) and, when
    not, the least time no unsolved choice can beat (``open_bound_s``)."""

    splits: list[ShapeSplit]
    proven: bool
    open_bound_s: float


def micro_batch_choices(
    M: int,
    counts,
    work: list[float],
    pp: int,
    beat: float,
    tails: list[float] | None = None,
    bottlenecks: list[float] | None = None,
) -> tuple[list, bool]:
    """(bound, ms) for every m with sum_g d_g m_g = M, m_g >= 1, whose bound is below ``beat``, sorted; and
    whether the enumeration was complete (False past MAX_CHOICES choices or MAX_VISITS partial ones). ``tails``:
    per group, a floor under what its replicas add after their last backward (D_g + O_g), added to each bound;
    ``bottlenecks``: per group, a floor under its slowest stage's seconds per micro-batch T_g. A replica of g
    running m micro-batches takes (m - 1) T_g + sum_i t_gi (1F1B, the model's objective), with sum_i t_gi >= W_g
    (``work``) and T_g >= sum_i t_gi / pp."""
    d = [c for _, c in counts]
    visits = 0
    floor = group_floors(work, pp, tails, bottlenecks)

    # The groups after g share what is left, R: the slowest of them takes at least the T at which each group h
    # runs its most micro-batches, m_h <= T pp / w_h - pp + 1 (floor), and those hold R: T >= (R + (pp - 1) sum d_h)
    # / (pp sum d_h / w_h), and at least its one micro-batch, T >= max w_h. A count of g that leaves the rest
    # above ``beat`` has no choice below it (checked against brute force in tests/test_replica_exact.py).
    tail_d = [sum(d[h:]) for h in range(len(d) + 1)]
    tail_rate = [sum(dh / w for dh, w in zip(d[h:], work[h:])) for h in range(len(d) + 1)]
    tail_work = [max(work[h:], default=0.0) for h in range(len(d) + 1)]

    def rest_floor(h: int, left: int) -> float:
        return max(tail_work[h], (left + (pp - 1) * tail_d[h]) / (pp * tail_rate[h]))

    out: list[tuple[float, tuple[int, ...]]] = []

    def walk(g: int, left: int, ms: tuple[int, ...], lb: float) -> bool:
        nonlocal visits
        visits += 1
        if visits > MAX_VISITS:
            return False
        if g == len(d) - 1:
            if left >= d[g] and left % d[g] == 0:
                b = max(lb, floor(g, left // d[g]))
                if b < beat:
                    out.append((b, (*ms, left // d[g])))
            return len(out) <= MAX_CHOICES
        rest = sum(d[g + 1 :])
        m, step = 1, 1
        if g == len(d) - 2:  # the last count must divide what is left: only m with d_g m = left (mod d_last)
            m, step = _first_solution(d[g], left, d[-1])
            if m is None:
                return True
        if tail_work[g + 1] >= beat:
            return True  # every later replica runs at least one micro-batch
        # the least m that leaves the later groups below beat (rest_floor), one step early against rounding
        if beat < math.inf:
            least = math.floor((left + (pp - 1) * tail_d[g + 1] - beat * pp * tail_rate[g + 1]) / d[g])
            m += max(0, least - m) // step * step
        while left - d[g] * m >= rest:
            b = max(lb, floor(g, m))
            if b >= beat:
                break  # larger m only grows this replica's bound
            if rest_floor(g + 1, left - d[g] * m) < beat * (1 + 1e-12) and not walk(
                g + 1, left - d[g] * m, (*ms, m), b
            ):
                return False
            m += step
        return True

    complete = walk(0, M, (), 0.0)
    out.sort()
    return out, complete


def group_floors(
    work: list[float], pp: int, tails: list[float] | None = None, bottlenecks: list[float] | None = None
) -> Callable[[int, int], float]:
    """floor(g, m): a floor under the time of a replica of group g running m micro-batches, (m - 1) T_g + sum_i t_gi
    + D_g + O_g (1F1B, solve_split's objective), with sum_i t_gi >= ``work`` and T_g at least work / pp and at least
    ``bottlenecks``' floor; ``tails`` under D_g + O_g (micro_batch_choices' terms)."""
    slowest = [max(w / pp, t) for w, t in zip(work, bottlenecks or [0.0] * len(work))]
    tails = tails or [0.0] * len(work)

    def floor(g: int, m: int) -> float:
        return (m - 1) * slowest[g] + work[g] + tails[g]

    return floor


def _first_solution(a: int, left: int, n: int) -> tuple[int | None, int]:
    """(the least m >= 1 with a*m = left (mod n), the step between solutions); (None, 0) when there is none."""
    g = math.gcd(a, n)
    if (left % n) % g:
        return None, 0
    step = n // g
    m = ((left // g) * pow(a // g, -1, step)) % step if step > 1 else 0
    return (m if m >= 1 else m + step), step


def micro_batch_range(M: int, counts, work: list[float], pp: int, beat: float) -> list[tuple[int, int]] | None:
    """(lo, hi) of each group's micro-batch count over the choices whose bound is below ``beat``; None if none."""
    d = [c for _, c in counts]
    hi = []
    for g, w in enumerate(work):
        most = (M - sum(d) + d[g]) // d[g]  # every other replica runs at least one
        if w >= beat:
            return None
        fast = math.ceil(beat * pp / w - pp + 1) - 1 if beat < float("inf") else most
        hi.append(max(0, min(most, fast)))
    lo = [
        max(1, math.ceil((M - sum(dh * hh for h, (dh, hh) in enumerate(zip(d, hi)) if h != g)) / d[g]))
        for g in range(len(d))
    ]
    if any(a > b for a, b in zip(lo, hi)):
        return None
    return list(zip(lo, hi))


@dataclass
class _SplitModel:
    """What a shared split's model holds for every micro-batch choice of one set of stage times and one time unit:
    the stages' layer and recompute counts, each group's stage times, bottleneck, DP tail and optimizer step. A
    choice's solve copies it and adds its own memory (its stage models: the in-flight micro-batches), counts, cap
    and objective (solve_split): building it is most of a small solve's time (suite seed 2 job 26: 2,773 choices,
    18.1 s of solves, 4.2 s of it in CP-SAT), and the choices whose replicas keep fewer than pp micro-batches in
    flight, each with its own stage models, share it (seed-5 job 10: 76 builds, 3.6 s of 4.8 s of solves)."""

    per: list[list[StageModel]]  # the stage models whose times it holds (_same_times tells who else may share it)
    model: object  # cp_model.CpModel, never solved itself
    shared: PartitionVars
    pvs: list[PartitionVars]


def _split_model(
    per: list[list[StageModel]],
    caps: list[float],
    scale: Scale,
    *,
    partial_recompute: bool,
    even_layers: bool,
    uniform_recompute: bool,
) -> _SplitModel:
    """The choice-independent part of solve_split's model (its docstring has the constraints)."""
    s0 = per[0][0]
    L, p, d = s0.job.model.num_layers, s0.dims.pp, s0.dims
    m = cp_sat().CpModel()
    shared = PartitionVars()
    before = (None, None)
    for i in range(p):
        before = _add_layer_counts(m, shared, i, s0, before)
    pvs = []
    for g in range(len(per)):
        pv = PartitionVars(
            layers=shared.layers,
            chunks=shared.chunks,
            moe_layers=shared.moe_layers,
            dense_layers=shared.dense_layers,
            holds_moe=shared.holds_moe,
        )
        for i in range(p):
            _add_recompute_counts(m, pv, i, L, d.recompute == "full", partial_recompute)
        _add_layer_totals(m, pv, L, even_layers, uniform_recompute, partial_recompute)
        pv.bottleneck = m.NewIntVar(0, scale.big_t, f"T[{g}]")
        pv.dp_tail = m.NewIntVar(0, scale.big_t, f"D[{g}]")
        pv.optimizer = m.NewIntVar(0, scale.big_t, f"O[{g}]")
        for i, sm in enumerate(per[g]):
            forms = sm.forms(i)
            comp, fwd = _add_stage_time(m, pv, i, forms.time, sm.pp_time, scale)
            _add_dp_tail(m, pv, i, forms.tail, comp, fwd, scale)
            _add_optimizer_step(m, pv, i, forms.tail, scale)
        pvs.append(pv)
    return _SplitModel(per, m, shared, pvs)


def _same_times(a: list[list[StageModel]], b: list[list[StageModel]]) -> bool:
    """Whether two sets of stage models price every stage's time, DP tail and optimizer step alike (the forms a
    _SplitModel holds): those at different in-flight counts differ in their memory alone."""
    return all(
        x is y or (x.pp_time == y.pp_time and x.forms(i).time == y.forms(i).time and x.forms(i).tail == y.forms(i).tail)
        for xs, ys in zip(a, b)
        for i, (x, y) in enumerate(zip(xs, ys))
    )


def _copy_model(model):
    """A copy of a built CP-SAT model to add to. From OR-Tools 9.12 on (CpModel over the C++ CpBaseModel), each
    new CpModel binds every method under its pre-PEP8 name as well (_add_pre_pep8_methods), about 0.5 ms a model:
    a quarter of a small choice's whole solve (suite seed 2 job 26: 2.0 of 9.4 s over 3,887 solves). The copy here
    is CpModel.clone without that step; an older OR-Tools (a pure-Python CpModel) takes clone itself."""
    cls = type(model)
    base = cls.__mro__[1]
    if not base.__module__.endswith("cp_model_helper") or not hasattr(model, "rebuild_constant_map"):
        return model.clone()
    copy = cls.__new__(cls)
    base.__init__(copy, None)
    copy.proto.copy_from(model.proto)
    copy.rebuild_constant_map()
    return copy


def _ranges(ms) -> list[tuple[int, int]]:
    """Per group, (lo, hi) of its micro-batch count: ``ms`` as fixed counts or as ranges."""
    return [m if isinstance(m, tuple) else (m, m) for m in ms]


def _span(ranges, pp: int) -> int:
    """The most bottlenecks solve_split's objective can count (its upper bound, in horizons)."""
    return max(hi for _, hi in ranges) + pp + 2


def choice_scale(per: list[list[StageModel]], ms) -> Scale:
    """The time unit and horizon of solve_split's model of choice ``ms`` (fixed counts or (lo, hi) ranges) over the
    stage models ``per`` (partition._time_unit: the objective is the time alone)."""
    s0 = per[0][0]
    L, p = s0.job.model.num_layers, s0.dims.pp
    every = [sm for sms in per for sm in sms]
    horizon_s = max(_time_horizon(sm, L, p) for sm in {id(x): x for x in every}.values())
    unit = _time_unit(horizon_s, 1, _span(_ranges(ms), p), every, s0.dims.zero_stage)
    return Scale(unit, int(horizon_s * unit))


def solve_split(
    per: list[list[StageModel]],
    caps: list[float],
    ms: tuple[int, ...] | list[tuple[int, int]],
    counts,
    M: int,
    *,
    partial_recompute: bool,
    even_layers: bool,
    uniform_recompute: bool,
    cap_s: float,
    time_limit_s: float,
    workers: int,
    work_limit: float | None = None,
    models: dict | None = None,
    scale: Scale | None = None,
) -> tuple[ShapeSplit | None, str, float]:
    """(split or None, status, proven lower bound in seconds) of the shared split for micro-batch counts ``ms``
    (fixed counts, or per group a (lo, hi) range, solved for with sum_g d_g m_g = M); ``per[g][i]`` prices stage
    i of replica group g, ``caps[g]`` its GPUs' capacity. Only splits faster than ``cap_s`` (up to the time unit's
    precision) are of interest. ``work_limit``: a cap in CP-SAT's deterministic time (partition.new_solver).
    ``models``: the _SplitModel built so far by time unit, kept by the caller across its choices (the model solved
    is the same, constraint for constraint, as one built afresh, its memory constraints last). ``scale``: the time
    unit of another model this one relaxes (GroupBounds; default choice_scale's)."""
    ranges = _ranges(ms)
    s0 = per[0][0]
    job, d = s0.job, s0.dims
    L, p = job.model.num_layers, d.pp
    cp_model = cp_sat()
    span = _span(ranges, p)
    scale = scale or choice_scale(per, ms)
    kept = models.setdefault(scale, []) if models is not None else []
    built = next((x for x in kept if x.per is per or _same_times(x.per, per)), None)
    if built is None:
        built = _split_model(
            per,
            caps,
            scale,
            partial_recompute=partial_recompute,
            even_layers=even_layers,
            uniform_recompute=uniform_recompute,
        )
        kept.append(built)
    m = _copy_model(built.model)  # (snake_case from here: the copy has no pre-PEP8 aliases)
    shared, pvs = built.shared, built.pvs
    for pv, sms, cap in zip(pvs, per, caps):  # this choice's memory: its own stage models
        for i, sm in enumerate(sms):
            _add_memory(m, pv, i, sm.forms(i).memory, sm.allocatable(cap))
    z = m.new_int_var(0, span * scale.big_t, "Z")
    counts_m = []
    for g, (pv, (lo, hi)) in enumerate(zip(pvs, ranges)):
        T = pv.bottleneck
        if lo == hi:
            busy = lo * T
            counts_m.append(lo)
        else:
            mg = m.new_int_var(lo, hi, f"m[{g}]")
            busy = m.new_int_var(0, hi * scale.big_t, f"mT[{g}]")
            m.add_multiplication_equality(busy, [mg, T])
            counts_m.append(mg)
        m.add(z >= busy + sum(pv.stage_time) - T + pv.dp_tail + pv.optimizer)
    m.add(sum(d * x for (_, d), x in zip(counts, counts_m)) == M)
    if cap_s < float("inf"):
        m.add(z <= int(cap_s * (1 + PRECISION) * scale.unit))
    m.minimize(z)
    # ties in time: fewer layers on earlier stages, then less recompute (one optimum for any worker count)
    tiebreak = sum((p - i) * (L + 1) * shared.layers[i] for i in range(p))
    tiebreak += sum((p - i) * pv.recomputed[i] for pv in pvs for i in range(p))

    variable = any(lo != hi for lo, hi in ranges)
    status, bound, solver = _solve_choice(m, z, tiebreak, variable, time_limit_s, workers, work_limit)
    if status == cp_model.INFEASIBLE:
        return None, "infeasible", float("inf")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, "unknown", 0.0
    bound /= scale.unit
    split = ShapeSplit(
        tuple(int(solver.Value(x)) if not isinstance(x, int) else x for x in counts_m),
        tuple(int(solver.Value(x)) for x in shared.layers),
        tuple(tuple(int(solver.Value(pv.recomputed[i])) for i in range(p)) for pv in pvs),
    )
    return split, ("optimal" if status == cp_model.OPTIMAL else "feasible"), bound


def _solve_choice(model, z, tiebreak, variable: bool, time_limit_s: float, workers: int, work_limit: float | None):
    """(status, proven lower bound, solver holding the solution) of a choice's model (_solve_time_then_ties).
    The model with the counts as variables (``variable``) needs CP-SAT's presolve (0.03 s with it, 0.46 s
    without). With every count fixed the model is linear, and whether presolve pays depends on how close the cap is
    to the choice's optimum: far from it (an infeasible choice, the common case below the cut) the model is proved
    in about 1 ms without presolve and 10 ms with it (suite job 30; seed-5 job 10's pp=60 choices: 17 against 55
    ms); close to it, without presolve CP-SAT searches where presolve proves it at once (seed-1 job 31's 33-stage,
    four-group choices, within 0.1% of the best plan: 0.2-1.1 s against 0.2-0.3 s; seed-5 job 10's 129 choices of
    a replica pass at its best plan's time, 37 s without presolve, 15.5 s this way). So a fixed choice is first
    solved without presolve for at most FIXED_QUICK_WORK of CP-SAT's deterministic time (machine-independent,
    so the outcome is the same on any machine), and only if that does not settle it, again with presolve (0: every
    fixed choice with presolve only)."""
    cp_model = cp_sat()
    if not variable and FIXED_QUICK_WORK > 0:
        quick_limit = FIXED_QUICK_WORK if work_limit is None else min(work_limit, FIXED_QUICK_WORK)
        solver = new_solver(time_limit_s, workers, work_limit=quick_limit)
        solver.parameters.cp_model_presolve = False
        # (an optimum's tie-break step gets the caller's limit, not what the quick one left)
        tie_work = float("inf") if work_limit is None else work_limit
        status, bound = _solve_time_then_ties(solver, model, z, tiebreak, tie_work)
        if status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or (work_limit is not None and work_limit <= quick_limit):
            return status, bound, solver
        used = solver.response_proto.deterministic_time
        time_limit_s = max(0.01, time_limit_s - solver.wall_time)
        work_limit = None if work_limit is None else max(0.01, work_limit - used)
    solver = new_solver(time_limit_s, workers, work_limit=work_limit)
    solver.parameters.cp_model_presolve = True
    status, bound = _solve_time_then_ties(solver, model, z, tiebreak)
    return status, bound, solver


def _solve_time_then_ties(solver, model, time, tiebreak, tie_work: float | None = None) -> tuple[int, float]:
    """Solve ``model`` for the least ``time``, then, where that is proven, for the least ``tiebreak`` among the
    solutions at that time (``model`` gains the constraint time == least and the first solution as its hint): one
    optimum for any worker count or search order. (status, proven lower bound of ``time``); the solver holds the
    solution; the two steps share the solver's wall and deterministic time limits. On these models (several
    replica groups' stage times over one shared split) the time alone is proven sooner than one objective weighing
    time above the tie-break (partition._set_objective's): suite job 31 of scripts/bench_hetero.py (seed 1), a split
    of 33 stages on 4 GPU types, 1.5 s instead of 2.9 s to the same optimum, and its whole search proven where it
    was not. (On the single-pipeline models of partition.py it is the other way round: the weighted tie-break
    steers the search, and time alone took one gpt-530b solve of examples/bench 0.16 s instead of 0.10 s.)
    ``tie_work``: the tie-break step's deterministic limit instead of what the first step left of the solver's."""
    cp_model = cp_sat()
    status = solver.solve(model)
    if status != cp_model.OPTIMAL:
        return status, solver.best_objective_bound
    least = solver.value(time)
    first = list(solver.response_proto.solution)  # every variable's value, by index
    model.clear_hints()
    model.proto.solution_hint.vars.extend(range(len(first)))
    model.proto.solution_hint.values.extend(first)
    model.add(time == least)
    model.minimize(tiebreak)
    params = solver.parameters
    params.max_time_in_seconds = max(0.01, params.max_time_in_seconds - solver.wall_time)
    used = solver.response_proto.deterministic_time
    left = params.max_deterministic_time - used if tie_work is None else tie_work
    params.max_deterministic_time = max(0.01, left)  # (default: no limit, inf)
    if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        params.fix_variables_to_their_hinted_value = True  # out of time before the hint was read: take it as it is
        solver.solve(model)
    return cp_model.OPTIMAL, float(least)


@dataclass
class _GroupBound:
    """What one solve of a replica group alone proved: with these stage models, in this time unit, no split of its
    own finishes at or below ``below`` (solve_split's cap; 0: nothing), and its least time is at least ``least``
    (its proven bound)."""

    sms: list[StageModel]
    scale: Scale  # the time unit it was solved in: the choice's (a unit of its own rounds its times otherwise)
    below: float
    least: float


class GroupBounds:
    """One replica group alone, its m_g micro-batches over a split of its own, relaxes a micro-batch choice (every
    group over one shared split; solve_split): its model, in the choice's time unit, is the choice's constraints
    on that group. A group whose least time at m_g is above the cap therefore proves the choice infeasible, and
    the group's model, a quarter of the choice's on four groups, is proved infeasible quickly. Choices share their
    groups' counts, so one group's proof settles every choice that gives it as many micro-batches. Seed-1 suite
    job 31 (Qwen3-235B on four GPU types, 32- and 33-stage shapes): 13 choices, 12 infeasible, each 0.31-0.52 s in
    CP-SAT's presolve of the whole model; 11 of them have a group that is infeasible alone (0.04-0.13 s), always
    the one with the highest floor (group_floors). Each choice solves at most one group not yet known, the highest
    floor first."""

    def __init__(self, caps: list[float], counts, floors, workers: int, kw: dict):
        self.caps, self.counts, self.floors = caps, counts, floors
        self.workers = workers
        self.kw = {**kw, "models": {}}  # the single groups' models, apart from the choices'
        self.known: dict[tuple[int, int], list[_GroupBound]] = {}

    def exceeds(self, ms: tuple[int, ...], per: list[list[StageModel]], cap: float, time_limit_s: float) -> bool:
        """Whether some group of choice ``ms`` alone cannot finish at or below ``cap`` (solve_split's cap)."""
        solved = False
        scale = choice_scale(per, ms)
        for g in sorted(range(len(ms)), key=lambda g: -self.floors(g, ms[g])):
            known = self._known(g, ms[g], per[g], scale)
            if known is None:
                if solved:
                    continue
                known = self._solve(g, ms[g], per[g], scale, cap, time_limit_s)
                solved = True
            if cap <= known.below or known.least > cap * (1 + PRECISION):
                return True
        return False

    def _known(self, g: int, m: int, sms: list[StageModel], scale: Scale) -> _GroupBound | None:
        for known in self.known.get((g, m), ()):
            if known.scale == scale and (known.sms is sms or _same_stages(known.sms, sms, self.caps[g])):
                return known
        return None

    def _solve(self, g: int, m: int, sms: list[StageModel], scale: Scale, cap: float, time_limit_s: float):
        count = self.counts[g]
        _, status, bound = solve_split(
            [sms], [self.caps[g]], (m,), [count], count[1] * m,
            cap_s=cap, time_limit_s=time_limit_s, workers=self.workers, scale=scale, **self.kw,
        )  # fmt: skip
        infeasible = status == "infeasible"
        known = _GroupBound(sms, scale, cap if infeasible else 0.0, 0.0 if infeasible else bound)
        self.known.setdefault((g, m), []).append(known)
        return known


def _same_stages(a: list[StageModel], b: list[StageModel], capacity: float) -> bool:
    """Whether two groups' stage models price every stage alike: as _same_times, and its memory forms and what its
    GPU allows too."""
    return _same_times([a], [b]) and all(
        x is y or (x.forms(i).memory == y.forms(i).memory and x.allocatable(capacity) == y.allocatable(capacity))
        for i, (x, y) in enumerate(zip(a, b))
    )


def exact_splits(
    stage_models_for,
    caps: list[float],
    M: int,
    counts,
    work: list[float],
    pp: int,
    beat: float,
    deadline: float,
    *,
    partial_recompute: bool,
    even_layers: bool,
    uniform_recompute: bool,
    workers: int,
    tails: list[float] | None = None,
    bottlenecks: list[float] | None = None,
    settled: dict | None = None,
) -> ExactShape:
    """The best splits of a pipelined replica shape below ``beat`` (module docstring). ``stage_models_for(ms)``
    gives the per-group stage models for micro-batch counts ``ms``; ``tails``, ``bottlenecks``: micro_batch_choices'.
    ``settled``: the choices a solve proved, kept by the caller across calls (a later pass of the replica search,
    under a lower cut, asks again): by counts, (cap, its optimal split and time, or None: none below the cap).
    Once a choice's solve runs out of time without a split, the choices after it, which would have even less, are
    left open (their bounds are the open bound)."""
    ranges = micro_batch_range(M, counts, work, pp, beat)
    if ranges is None:
        return ExactShape([], True, float("inf"))
    built: dict[tuple[int, ...], list[list[StageModel]]] = {}
    kw = {
        "partial_recompute": partial_recompute,
        "even_layers": even_layers,
        "uniform_recompute": uniform_recompute,
        "models": {},  # the choice-independent models (_SplitModel), by time unit
    }

    def models_for(ms) -> list[list[StageModel]]:
        """The stage models depend on a count only below pp (micro-batches in flight): built once per in-flight
        choice."""
        key = tuple(min(m, pp) for m in ms)
        if key not in built:
            built[key] = stage_models_for(ms)
        return built[key]

    # every replica with at least pp micro-batches: the stage models are the same for all such counts. One model
    # with the counts as variables settles the common case at once (no split beats the cap: infeasible); otherwise
    # each choice is solved with its counts fixed, a linear model that CP-SAT proves quickly (products propagate
    # weakly), best bound first.
    steady = [(max(lo, pp), hi) for lo, hi in ranges]
    enumerate_steady = False
    if all(lo <= hi for lo, hi in steady):
        left = deadline - time.monotonic()
        _, status, _ = solve_split(
            models_for(tuple(lo for lo, _ in steady)),
            caps,
            steady,
            counts,
            M,
            cap_s=beat,
            time_limit_s=solve_wall(left, STEADY_SOLVE_S),
            work_limit=STEADY_SOLVE_S,  # (deterministic: the choices below do not depend on the machine)
            workers=workers,
            **kw,
        )
        # a plan it finds is found again below, by the choice's own model (the same for any solve time)
        enumerate_steady = status != "infeasible"
    if all(lo >= pp for lo, _ in ranges) and not enumerate_steady:
        return ExactShape([], True, float("inf"))
    # counts where some replica runs fewer than pp micro-batches (fewer in flight): one model per choice
    choices, complete = micro_batch_choices(M, counts, work, pp, beat, tails, bottlenecks)
    splits: list[ShapeSplit] = []
    best = beat
    # an enumeration cut short bounds nothing it did not visit (the caller keeps the shape's own bound)
    open_bound = float("inf") if complete else 0.0
    if not enumerate_steady:
        choices = [(lb, ms) for lb, ms in choices if min(ms) < pp]
    settled = {} if settled is None else settled
    one_group = GroupBounds(caps, counts, group_floors(work, pp, tails, bottlenecks), workers, kw)
    for i, (lb, ms) in enumerate(choices):
        if lb >= best:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            open_bound = min(open_bound, lb)
            break
        # once a split is proven the best so far, only one faster by more than the time unit's precision is of
        # interest (a tie within it is the same plan to the search, quick.RESOLUTION): proving there is none is the
        # quicker solve (seed-1 suite job 31: a choice tied with the best at 1.3106 s, 1.6 s to prove optimal, 0.8 s
        # to prove that nothing is faster)
        cap = best * (1 - PRECISION) if best < beat else best
        known = settled.get(ms)
        if known is not None and cap <= known[0]:  # proven under a cap at least this one
            if known[1] is not None and known[2] < cap * (1 + PRECISION):
                splits.append(known[1])
                best = min(best, known[2])
            continue
        per = models_for(ms)
        if len(counts) > 1 and one_group.exceeds(ms, per, cap, left / max(1, min(4, len(choices) - i))):
            settled[ms] = (cap, None, float("inf"))
            continue
        left = max(0.01, deadline - time.monotonic())
        split, status, bound = solve_split(
            per,
            caps,
            ms,
            counts,
            M,
            cap_s=cap,
            time_limit_s=left / max(1, min(4, len(choices) - i)),
            workers=workers,
            **kw,
        )
        if status in ("infeasible", "optimal"):
            settled[ms] = (cap, split, bound)
        if status in ("feasible", "unknown"):
            open_bound = min(open_bound, max(lb, bound))
        if status == "unknown":
            break  # out of time before a first split: the choices after it get less
        if split is not None:
            splits.append(split)
            if status == "optimal":
                best = min(best, bound)
    return ExactShape(splits, open_bound == float("inf"), open_bound)
