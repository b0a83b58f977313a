"""CP-SAT model of the combinatorial core: how many layers each pipeline stage holds and how many of them are
fully recomputed, for one choice of parallel degrees.

The model is built from the same forms the estimator evaluates (planner/cost/stage.py): every stage quantity is an
Affine form in the stage's variables, turned here into a linear expression with each coefficient rounded on its
own, and every overlap term is max(0, affine), which CP-SAT represents exactly with AddMaxEquality. Times are
integers in units between a nanosecond and a microsecond, fine enough that rounding moves no plan's time by more
than PRECISION (_time_unit); memory is in integer KiB. The solution is then re-evaluated in floating point by the
estimator, so rounding only matters between plans within PRECISION of each other.

    minimize  v*m*T + sum_i t_i - T + v*(D + O)        (= v * iteration time, Narayanan's schedule)
    s.t.      t_i <= T, dp_i <= D, opt_i <= O, memory_i <= capacity, sum_i n_i = L, n_i = v*k_i

Layout, as in the OR-Tools examples: PartitionVars names the variables; each constraint family is one function
(_add_layer_counts, _add_recompute_counts, _add_layer_totals, _add_stage_time, _add_dp_tail, _add_optimizer_step,
_add_memory, _set_objective); build_partition_model builds, solve_partition solves. To look at a model,
PLANNER_DUMP_CPSAT=DIR writes every model built as a text proto, DIR/partition-<pid>-<n>.pbtxt
(PartitionModel.dump).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from planner.cost.forms import Affine, MemoryForms, StagePlan, TailForms, TimeForms, Traffic
from planner.cost.stage import StageModel

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

MIN_UNITS, MAX_UNITS = 1e6, 1e9  # integer time units per second: between a microsecond and a nanosecond
PRECISION = 1e-4  # relative rounding error the time unit allows (quick.RESOLUTION)
PRESOLVED_CONFLICTS = 5000  # conflicts of a presolved single-worker solve before it goes on without presolve (_solve)
KIB = 1024.0
MILLI = 1000  # overlaps with a fractional share are kept in thousandths of a time unit
DUMP_ENV = "PLANNER_DUMP_CPSAT"
_dumped = itertools.count(1)


def cp_sat():
    """OR-Tools' CP-SAT module, imported when a model is first built (a search whose bounds settle every candidate
    never needs it), without pandas where pandas is not loaded yet (_without_pandas)."""
    if "ortools.sat.python.cp_model" not in sys.modules and "pandas" not in sys.modules:
        with _without_pandas():
            from ortools.sat.python import cp_model
    from ortools.sat.python import cp_model

    return cp_model


@contextlib.contextmanager
def _without_pandas():
    """OR-Tools' cp_model imports pandas (0.17 of the 0.32 s its import takes on a 2-core machine) only for its
    DataFrame helpers (add_*_series), which the planner never calls; its import itself reads just the names Index
    and Series (a type alias). A stand-in module with those two names serves that import and is taken out of
    sys.modules right after, so a later ``import pandas`` gets the real one. Should a newer OR-Tools read more of it,
    the stand-in and the half-imported modules go and the import runs again with the real pandas."""
    stand_in = types.ModuleType("pandas")
    stand_in.Index = type("Index", (), {})
    stand_in.Series = type("Series", (), {})
    sys.modules["pandas"] = stand_in
    try:
        yield
    except Exception:
        for name in [n for n in sys.modules if n.startswith("ortools.sat.python.cp_model")]:
            del sys.modules[name]
    finally:
        if sys.modules.get("pandas") is stand_in:
            del sys.modules["pandas"]


def new_solver(time_limit_s: float, workers: int, seed: int = 0, work_limit: float | None = None):
    """A CP-SAT solver for one partition model: its time limit, workers and seed, and Ctrl-C left to Python (exit
    130) instead of ending one solve. ``work_limit``: a limit in CP-SAT's deterministic time too, which stops a
    solve at the same point on any machine (with one worker), where the time limit is the wall clock's."""
    solver = cp_sat().CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
    if work_limit is not None:
        solver.parameters.max_deterministic_time = max(0.01, work_limit)
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    solver.parameters.catch_sigint_signal = False
    return solver


@dataclass
class PartitionResult:
    plans: list[StagePlan] | None  # None: infeasible (or nothing found in time)
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    objective_s: float  # CP-SAT objective as iteration seconds (integer-rounded model)
    bound_s: float  # proven lower bound, seconds
    # CP-SAT's deterministic seconds the solve used (both passes of a guarded one): machine-independent with one
    # worker, and on this machine's suite about its wall seconds (mixed_pipelines counts a solve's work by it)
    work_s: float = 0.0


@dataclass
class PartitionVars:
    """The model's variables: per stage i, its layer and recompute counts (the StagePlan it becomes) and its
    micro-batch time; per iteration, the bottleneck stage time and the largest DP tail and optimizer step."""

    layers: list = field(default_factory=list)  # n_i = vpp * chunks_i
    chunks: list = field(default_factory=list)  # layers per interleaved model chunk
    moe_layers: list = field(default_factory=list)  # MoE layers in the stage's contiguous span
    dense_layers: list = field(default_factory=list)
    holds_moe: list = field(default_factory=list)  # 0/1: the stage holds an MoE layer
    recomputed: list = field(default_factory=list)  # fully recomputed layers, MoE ones first
    recomputed_moe: list = field(default_factory=list)
    recomputed_dense: list = field(default_factory=list)
    recomputes: list = field(default_factory=list)  # 0/1: the stage recomputes a layer
    stage_time: list = field(default_factory=list)  # t_i, time units per micro-batch
    bottleneck: cp_model.IntVar | None = None  # T >= every t_i
    dp_tail: cp_model.IntVar | None = None  # D >= every stage's exposed DP tail
    optimizer: cp_model.IntVar | None = None  # O >= every stage's optimizer step

    def linear(self, form: Affine, i: int, rounded) -> cp_model.LinearExpr:
        """``form`` of stage i as a linear expression, each coefficient rounded to an integer by ``rounded``."""
        terms = (
            self.dense_layers[i],
            self.moe_layers[i],
            self.recomputed_dense[i],
            self.recomputed_moe[i],
            self.holds_moe[i],
            self.recomputes[i],
        )
        coeffs = (form.dense, form.moe, form.r_dense, form.r_moe, form.any_moe, form.any_recomputed)
        return cp_sat().LinearExpr.weighted_sum(terms, [rounded(c) for c in coeffs]) + rounded(form.const)

    def traffic(self, traffic: Traffic, i: int, rounded) -> cp_model.LinearExpr:
        """Collectives of stage i: each collective's form rounded on its own, then counted."""
        return sum(count * self.linear(form, i, rounded) for count, form in traffic.parts)


@dataclass(frozen=True)
class Scale:
    """Integer time units per second (``unit``) and the horizon every time variable stays below (``big_t``)."""

    unit: float
    big_t: int

    def ti(self, seconds: float) -> int:
        return round(seconds * self.unit)


@dataclass
class PartitionModel:
    """A built model: the CP-SAT model, its variables, the objective (v * iteration time in units), the tie-break
    weight it carries (1: no tie-break) and the time scale."""

    model: cp_model.CpModel
    vars: PartitionVars
    objective: cp_model.LinearExpr
    weight: int
    scale: Scale
    vpp: int

    def dump(self, path: str | Path) -> None:
        """Write the model as a text proto (for reading, or for ``solve`` in OR-Tools' tools)."""
        Path(path).write_text(str(self.model.Proto()))

    def plans(self, solver: cp_model.CpSolver) -> list[StagePlan]:
        pv = self.vars
        return [
            StagePlan(
                dense=int(solver.Value(pv.dense_layers[i])),
                moe=int(solver.Value(pv.moe_layers[i])),
                r_dense=int(solver.Value(pv.recomputed_dense[i])),
                r_moe=int(solver.Value(pv.recomputed_moe[i])),
            )
            for i in range(len(pv.layers))
        ]


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
    worst_layer = max(
        k.compute + k.recompute_extra + k.tp + k.tp_recompute + k.cp + k.ep + k.ep_recompute for k in kinds.values()
    )
    worst_params = (
        sm.position_params(0)
        + sm.position_params(p - 1)
        + L * max(k.params_dense + k.params_expert for k in kinds.values())
    )
    worst = (
        L * worst_layer
        + sm.emb_time
        + sm.logits_time
        + sm.pp_time
        + sm.per_microbatch_traffic(worst_params, worst_params)
        + sm.shard_link.all_reduce(8.0 * worst_params)
        + sm.exp_link.all_reduce(8.0 * worst_params)
        + sm.costs.optimizer_step(worst_params)
    )
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


# ----------------------------------------------------------------------------------------- constraint families
def _add_layer_counts(m: cp_model.CpModel, pv: PartitionVars, i: int, s0: StageModel, prefix_before):
    """Stage i holds a multiple of vpp layers, and its MoE layers are those of its contiguous span of the model.
    Where that span may start before the model's all-MoE tail (ModelSpec.all_moe_from), they are counted from a
    prefix sum of the layers (a table lookup of the MoE layers among them); from stage i = all_moe_from / vpp on,
    every layer of the stage is MoE (each stage before it holds at least vpp layers), and a model without MoE has
    none: no prefix sum there. (A prefix chain over every stage took CP-SAT's presolve 1.0-1.3 s on a 55-stage
    partition of a model whose every layer is MoE, 0.2 s without it: suite job 43.) Returns the layers before the
    next stage and the MoE layers among them, (None, None) past the chain."""
    L, v = s0.job.model.num_layers, s0.dims.vpp
    chunks = m.NewIntVar(1, L // v, f"chunks[{i}]")
    layers = m.NewIntVar(v, L, f"layers[{i}]")
    m.Add(layers == v * chunks)
    after = (None, None)
    if not s0.has_moe:
        moe, holds, dense = m.NewConstant(0), m.NewConstant(0), layers
    elif i * v >= s0.job.model.all_moe_from:
        moe, holds, dense = layers, m.NewConstant(1), m.NewConstant(0)
    else:
        prefix = m.NewIntVar(0, L, f"layers_through[{i}]")
        m.Add(prefix == (prefix_before[0] if prefix_before[0] is not None else 0) + layers)
        moe_prefix = _moe_prefix(m, s0, prefix, f"moe_through[{i}]")
        moe = m.NewIntVar(0, L, f"moe_layers[{i}]")
        m.Add(moe == moe_prefix - (prefix_before[1] if prefix_before[1] is not None else 0))
        holds = m.NewBoolVar(f"holds_moe[{i}]")
        m.Add(moe >= 1).OnlyEnforceIf(holds)
        m.Add(moe == 0).OnlyEnforceIf(holds.Not())
        dense = m.NewIntVar(0, L, f"dense_layers[{i}]")
        m.Add(dense == layers - moe)
        after = (prefix, moe_prefix)
    pv.chunks.append(chunks)
    pv.layers.append(layers)
    pv.moe_layers.append(moe)
    pv.holds_moe.append(holds)
    pv.dense_layers.append(dense)
    return after


def _add_recompute_counts(
    m: cp_model.CpModel, pv: PartitionVars, i: int, L: int, full_only: bool, partial_recompute: bool, step: int = 1
) -> None:
    """Stage i fully recomputes every layer (baseline full), any number of them (partial recompute; a multiple of
    ``step`` where the framework counts recomputed layers per model chunk), or else all of them or none (a
    framework without partial recompute: DeepSpeed's activation_checkpoint_interval 1, torchtitan's full
    activation checkpointing), MoE layers first (StagePlan.with_recompute)."""
    layers = pv.layers[i]
    recomputes = m.NewBoolVar(f"recomputes[{i}]")
    if full_only:
        recomputed = layers
    elif partial_recompute:
        recomputed = m.NewIntVar(0, L, f"recomputed[{i}]")
        m.Add(recomputed <= layers)
        if step > 1:
            chunks = m.NewIntVar(0, L // step, f"recomputed_per_chunk[{i}]")
            m.Add(recomputed == step * chunks)
    else:
        recomputed = m.NewIntVar(0, L, f"recomputed[{i}]")
        m.Add(recomputed == layers).OnlyEnforceIf(recomputes)
    recomputed_moe = m.NewIntVar(0, L, f"recomputed_moe[{i}]")
    m.AddMinEquality(recomputed_moe, [recomputed, pv.moe_layers[i]])
    recomputed_dense = m.NewIntVar(0, L, f"recomputed_dense[{i}]")
    m.Add(recomputed_dense == recomputed - recomputed_moe)
    m.Add(recomputed >= 1).OnlyEnforceIf(recomputes)
    m.Add(recomputed == 0).OnlyEnforceIf(recomputes.Not())
    pv.recomputed.append(recomputed)
    pv.recomputed_moe.append(recomputed_moe)
    pv.recomputed_dense.append(recomputed_dense)
    pv.recomputes.append(recomputes)


def _add_layer_totals(
    m: cp_model.CpModel, pv: PartitionVars, L: int, even_layers: bool, uniform_recompute: bool, partial_recompute: bool
) -> None:
    """The stages hold every layer of the model, each stage alike where the framework needs it (even split, one
    recompute setting: the same count with partial recompute, else all of them recomputing or none)."""
    m.Add(sum(pv.layers) == L)
    alike = pv.recomputed if partial_recompute else pv.recomputes
    for i in range(1, len(pv.layers)):
        if even_layers:
            m.Add(pv.layers[i] == pv.layers[0])
        if uniform_recompute:
            m.Add(alike[i] == alike[0])


def _exposed_milli(m: cp_model.CpModel, name: str, traffic, window, share: float, big_t: int):
    """max(0, traffic - share * window) in thousandths of a time unit, the share rounded to thousandths: no
    division constraint, which CP-SAT propagates poorly."""
    signed = m.NewIntVar(-big_t * MILLI, big_t * MILLI, f"{name}_signed")
    m.Add(signed == MILLI * traffic - round(share * MILLI) * window)
    out = m.NewIntVar(0, big_t * MILLI, name)
    m.AddMaxEquality(out, [signed, 0])
    return out


def _add_stage_time(m: cp_model.CpModel, pv: PartitionVars, i: int, time: TimeForms, pp_time: float, scale: Scale):
    """Stage i's micro-batch time t_i covers its compute, exposed TP, CP, EP, pipeline sends and exposed ZeRO-2/3
    traffic (TimeForms.at), and the bottleneck T covers every t_i. Returns (compute, forward) for the tail."""
    ti, big_t = scale.ti, scale.big_t
    comp = m.NewIntVar(0, big_t, f"compute[{i}]")
    m.Add(comp == pv.linear(time.compute, i, ti))
    fwd = pv.linear(time.forward, i, ti)
    tp = pv.linear(time.tp, i, ti)
    other = pv.linear(time.cp, i, ti) + pv.linear(time.ep, i, ti) + ti(pp_time)
    zero = 0
    if time.zero is not None:
        zero = _exposed_milli(
            m, f"zero_exposed[{i}]", pv.traffic(time.zero.traffic, i, ti), comp, time.zero.share, big_t
        )
    t_i = m.NewIntVar(0, big_t, f"stage_time[{i}]")
    # t_i >= its time, rounded up to a whole unit (minimizing makes it equal)
    m.Add(MILLI * t_i >= MILLI * (comp + tp + other) + zero)
    m.Add(t_i <= pv.bottleneck)
    pv.stage_time.append(t_i)
    return comp, fwd


def _add_dp_tail(m: cp_model.CpModel, pv: PartitionVars, i: int, tail: TailForms, comp, fwd, scale: Scale) -> None:
    """Stage i's exposed DP communication after its last backward (reduction behind the backward, gather behind
    the forward; none under ZeRO-3) is at most D."""
    if tail.reduction is None:
        return
    windows = {"compute": comp, "forward": fwd, "backward": comp - fwd}
    parts = [
        _exposed_milli(
            m, f"dp_{name}[{i}]", pv.traffic(x.traffic, i, scale.ti), windows[x.window], x.share, scale.big_t
        )
        for name, x in (("reduction", tail.reduction), ("gather", tail.gather))
    ]
    m.Add(sum(parts) <= MILLI * pv.dp_tail)


def _add_optimizer_step(m: cp_model.CpModel, pv: PartitionVars, i: int, tail: TailForms, scale: Scale) -> None:
    """Stage i's optimizer step is at most O."""
    m.Add(pv.linear(tail.optimizer, i, scale.ti) <= pv.optimizer)


def _add_memory(m: cp_model.CpModel, pv: PartitionVars, i: int, memory: MemoryForms, allocatable: float) -> None:
    """Stage i's allocated bytes (KiB) fit what its GPU allows before the allocator's allowance (``add``: also on a
    copied model, replica_partition._copy_model, which has no pre-PEP8 names)."""
    m.add(pv.linear(memory.allocated, i, _kib) <= int(allocatable / KIB))


def _kib(nbytes: float) -> int:
    return round(nbytes / KIB)


def _set_objective(
    m: cp_model.CpModel,
    pv: PartitionVars,
    mb: int,
    v: int,
    L: int,
    scale: Scale,
    span: int,
    objective_cap_s: float | None,
) -> tuple[cp_model.LinearExpr, int]:
    """Minimize v times the iteration time of the 1F1B/interleaved schedule (planner/cost/schedule.py), below the
    caller's cap; ties in time are broken inside the objective (fewer layers, then less recompute, on earlier
    stages) so that the optimum is the same for any worker count or search order. Returns (objective, weight of
    the time in the minimized expression)."""
    p = len(pv.layers)
    T = pv.bottleneck
    obj = v * mb * T + sum(pv.stage_time) - T + v * (pv.dp_tail + pv.optimizer)
    if objective_cap_s is not None:
        m.Add(obj <= _cap_units(objective_cap_s, scale, v))
    weight = _tiebreak_weight(p, L)
    tiebreak = sum((p - i) * ((L + 1) * pv.layers[i] + pv.recomputed[i]) for i in range(p))
    if span * scale.big_t * weight < 2**62:  # bound of obj from the variables' domains, weighted
        m.Minimize(obj * weight + tiebreak)
        return obj, weight
    m.Minimize(obj)
    return obj, 1


def _cap_units(objective_cap_s: float, scale: Scale, v: int) -> int:
    """The objective's cap in its units (v times the iteration time): loosened by PRECISION, since rounding must
    not exclude a plan below the cap."""
    return int(objective_cap_s * (1 + PRECISION) * scale.unit * v)


def _capped_tops(objective_cap_s: float | None, scale: Scale, v: int, mb: int) -> tuple[int, int]:
    """Upper ends of the bottleneck T's domain and of the DP tail D's and optimizer step O's, as the objective's cap
    implies them at every point that meets it: the objective (_set_objective) is (v*mb - 1) * T + sum_i t_i +
    v * (D + O), every term >= 0, so (v*mb - 1) * T and v * D, v * O are each at most the cap (T only where
    v*mb >= 2); the horizon (Scale.big_t, far above) without a cap. The same points are feasible, but CP-SAT's
    presolve no longer works the domains down from the horizon itself: capped solves of seed-4 suite job 19 (52
    models, the same statuses and objectives) took 28% less CPU time, seed-7 job 37's (21) 21%, seed-4 job 4's (35)
    11%, seed-4 job 25's and seed-5 job 13's about as long."""
    if objective_cap_s is None:
        return scale.big_t, scale.big_t
    cap = _cap_units(objective_cap_s, scale, v)
    top_t = min(scale.big_t, cap // (v * mb - 1)) if v * mb >= 2 else scale.big_t
    return top_t, min(scale.big_t, cap // v)


def _tiebreak_weight(p: int, L: int) -> int:
    """The tie-break weighs less than one time unit: every stage's (L+1)*n + r, weighted by position, is below it."""
    return p * (p + 1) // 2 * (L + 1) * (L + 1) + 1


def _add_hint(m: cp_model.CpModel, pv: PartitionVars, hint: list[StagePlan]) -> None:
    """Seed the search with a known split; a variable may stand for several stages (constants are shared, uniform
    recompute ties them): hinted once."""
    hinted: set[int] = set()
    for i, plan in enumerate(hint):
        for var, value in ((pv.layers[i], plan.layers), (pv.recomputed[i], plan.recomputed)):
            if var.Index() not in hinted:
                hinted.add(var.Index())
                m.AddHint(var, value)


# ----------------------------------------------------------------------------------------- build, solve
def _solve(built: PartitionModel, time_limit_s: float, workers: int, seed: int, work_limit: float | None, guard: bool):
    """CP-SAT on a built model: (the solver that answered, its status, the best objective bound either pass proved, the
    deterministic seconds both passes used). One presolve pass: on the partition models of 9 mixed suite jobs and
    the shipped examples (249 models) the same status, objective and split, in 10-15% less solver time (most of a
    solve that proves no split beats the cap is presolve). With ``guard`` (solve_partition: one worker, and a plan
    to beat), a solve that runs past PRESOLVED_CONFLICTS conflicts without its answer is solved again without
    presolve (its split kept where the second pass finds none as good): on a few models the presolved search raises
    the objective bound one conflict at a time, where the model as built is solved at once (seed-2 suite job 46, a
    34-variable model: 10 s to its wall cap, 18,000 conflicts, against 0.13 s; seed-1 job 42: 0.77 s, 4,924
    conflicts, against 0.05 s; of 117 dumped models of 7 suite jobs these two are the only ones past 1,000
    conflicts, the median 6). Not every such model is solved faster without presolve, so the limit is set high:
    seed-4 job 26's 1,940-conflict model takes 0.19 s presolved and 1.4 s without (1,000 as the limit: the job 4.7
    -> 5.9 s), seed-4 job 13's 4,548-conflict one 0.33 s and 0.51 s, its 6,648-conflict one 0.56 s and 0.05 s. The
    first pass's split as the second's hint was tried: 2.0 s instead of 0.51 on the 4,548-conflict model. A conflict
    count stops the first pass at the same point on any machine. A solve with no plan to beat is left to its limits:
    the mixed search's first solve only needs a plan (seed-1 job 43's: 6,728 conflicts to its 1.0 deterministic
    seconds, 0.68 s; guarded, 5,050 conflicts and then 1.85 s without presolve)."""
    cp_model = cp_sat()
    solver = new_solver(time_limit_s, workers, seed, work_limit)
    solver.parameters.max_presolve_iterations = 1
    if guard:
        solver.parameters.max_number_of_conflicts = PRESOLVED_CONFLICTS
    status = solver.Solve(built.model)
    used = solver.ResponseProto().deterministic_time
    if not guard or status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or solver.NumConflicts() < PRESOLVED_CONFLICTS:
        return solver, status, float("-inf"), used
    bound = solver.BestObjectiveBound()
    left_s = time_limit_s - solver.WallTime()
    left_work = None if work_limit is None else work_limit - used
    if left_s <= 0 or (left_work is not None and left_work <= 0):
        return solver, status, bound, used
    second = new_solver(left_s, workers, seed, left_work)
    second.parameters.cp_model_presolve = False
    again = second.Solve(built.model)
    used += second.ResponseProto().deterministic_time
    if again not in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.INFEASIBLE) or (
        again == cp_model.FEASIBLE and status == cp_model.FEASIBLE and solver.ObjectiveValue() < second.ObjectiveValue()
    ):
        return solver, status, bound, used  # (the first pass's split, if any, stands)
    return second, again, bound, used


def build_partition_model(
    sm: StageModel | list[StageModel],
    capacity_gib: float | list[float],
    *,
    partial_recompute: bool,
    objective_cap_s: float | None = None,
    even_layers: bool = False,
    uniform_recompute: bool = False,
    hint: list[StagePlan] | None = None,
    recompute_step: int = 1,
) -> PartitionModel:
    """The CP-SAT model of solve_partition (see there for the arguments)."""
    sms = sm if isinstance(sm, list) else [sm] * sm.dims.pp
    caps = capacity_gib if isinstance(capacity_gib, list) else [capacity_gib] * len(sms)
    s0 = sms[0]
    d = s0.dims
    L, p, v, mb = s0.job.model.num_layers, d.pp, d.vpp, s0.mb
    m = cp_sat().CpModel()
    horizon_s = max(_time_horizon(x, L, p) for x in {id(x): x for x in sms}.values())
    span = v * mb + p + 2 * v  # the objective is at most span horizons
    unit = _time_unit(horizon_s, _tiebreak_weight(p, L), span, sms, d.zero_stage)
    scale = Scale(unit, int(horizon_s * unit))

    pv = PartitionVars()
    before = (None, None)
    for i in range(p):
        before = _add_layer_counts(m, pv, i, s0, before)
        _add_recompute_counts(m, pv, i, L, d.recompute == "full", partial_recompute, recompute_step)
    _add_layer_totals(m, pv, L, even_layers, uniform_recompute, partial_recompute)

    top_t, top_tail = _capped_tops(objective_cap_s, scale, v, mb)
    pv.bottleneck = m.NewIntVar(0, top_t, "T")
    pv.dp_tail = m.NewIntVar(0, top_tail, "D")
    pv.optimizer = m.NewIntVar(0, top_tail, "O")
    for i in range(p):
        forms = sms[i].forms(i)  # every per-stage form comes from this stage's own model
        comp, fwd = _add_stage_time(m, pv, i, forms.time, sms[i].pp_time, scale)
        _add_dp_tail(m, pv, i, forms.tail, comp, fwd, scale)
        _add_optimizer_step(m, pv, i, forms.tail, scale)
        _add_memory(m, pv, i, forms.memory, sms[i].allocatable(caps[i]))

    obj, weight = _set_objective(m, pv, mb, v, L, scale, span, objective_cap_s)
    if hint is not None and len(hint) == p:
        _add_hint(m, pv, hint)
    return PartitionModel(m, pv, obj, weight, scale, v)


def solve_partition(
    sm: StageModel | list[StageModel],
    capacity_gib: float | list[float],
    *,
    partial_recompute: bool,
    time_limit_s: float,
    workers: int = 1,
    seed: int = 0,
    objective_cap_s: float | None = None,
    even_layers: bool = False,
    uniform_recompute: bool = False,
    hint: list[StagePlan] | None = None,
    recompute_step: int = 1,
    work_limit: float | None = None,
) -> PartitionResult:
    """Best layer partition and recompute placement.

    ``sm`` is one StageModel for all stages (homogeneous degrees) or a list with one StageModel per stage
    (heterogeneous plans: stage i's coefficients, links, memory and capacity all come from ``sm[i]`` and
    ``capacity_gib[i]``); the stage count, interleaving, micro-batches and recompute mode are shared.
    ``objective_cap_s`` lets the caller prune: only solutions faster than it are of interest (a solution up to
    PRECISION above it may still be returned).
    ``even_layers`` forces the same layer count on every stage (frameworks without uneven splits);
    ``uniform_recompute`` the same number of fully recomputed layers on every stage (Megatron's
    ``--recompute-num-layers`` applies to each stage alike); ``recompute_step`` makes every recompute count a
    multiple of it (Megatron counts per model chunk: the interleaving degree). ``hint`` (a known feasible split)
    seeds the search; it changes how fast the optimum is found, not which optimum (ties are broken in the
    objective). ``work_limit``: a cap in CP-SAT's deterministic time (new_solver), ``time_limit_s`` the wall
    clock's."""
    built = build_partition_model(
        sm,
        capacity_gib,
        partial_recompute=partial_recompute,
        objective_cap_s=objective_cap_s,
        even_layers=even_layers,
        uniform_recompute=uniform_recompute,
        hint=hint,
        recompute_step=recompute_step,
    )
    if os.environ.get(DUMP_ENV):
        folder = Path(os.environ[DUMP_ENV])
        folder.mkdir(parents=True, exist_ok=True)
        built.dump(folder / f"partition-{os.getpid()}-{next(_dumped):05d}.pbtxt")
    cp_model = cp_sat()
    guard = workers == 1 and objective_cap_s is not None
    solver, status, bound, used = _solve(built, time_limit_s, workers, seed, work_limit, guard)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        st = "infeasible" if status == cp_model.INFEASIBLE else "unknown"
        return PartitionResult(None, st, float("inf"), float("inf") if st == "infeasible" else 0.0, used)
    unit, v = built.scale.unit, built.vpp
    best = solver.Value(built.objective)
    bound = max(bound, solver.BestObjectiveBound()) / built.weight
    status_name = "optimal" if status == cp_model.OPTIMAL else "feasible"
    return PartitionResult(built.plans(solver), status_name, best / unit / v, bound / unit / v, used)
