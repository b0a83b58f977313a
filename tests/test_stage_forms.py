"""The CP-SAT model (planner/search/partition.py) and the estimator (planner/cost/estimate.py) read the same stage
forms (planner/cost/stage.py): with every stage's layer and recompute counts fixed to a random plan, the model's
stage times, iteration time, DP tail, optimizer step and memory equal the estimator's within the rounding to
integer time units (and KiB)."""

import itertools
import random

import pytest
from ortools.sat.python import cp_model
from strategies import (
    RandomChooser,
    gen_mixed_cluster,
    gen_model,
    gen_raw_job,
    gen_training,
)

from planner.cost.estimate import evaluate_plans, evaluate_stages, hetero_stage_models
from planner.cost.forms import Affine, StagePlan
from planner.cost.provider import cost_source
from planner.cost.stage import StageModel, split_kinds
from planner.errors import SpecError
from planner.load import parse_job
from planner.parallel import tp_heads_error
from planner.search.mixed_context import pipeline_dims
from planner.search.partition import KIB, PRECISION, build_partition_model
from planner.search.space import SearchOptions, dims_for, divisors, enumerate_candidates

HUGE_GIB = 1e6  # capacity that no plan reaches: memory is compared, not constrained


def random_split(rng: random.Random, L: int, p: int, v: int) -> tuple[int, ...] | None:
    """Stage layer counts, multiples of v, summing to L (None if there are none)."""
    chunks = L // v
    if L % v or chunks < p:
        return None
    cuts = sorted(rng.sample(range(1, chunks), p - 1))
    return tuple(v * (b - a) for a, b in zip([0] + cuts, cuts + [chunks]))


def random_plans(rng, job, split, base: str) -> list[StagePlan]:
    full = base == "full"
    rec = None if full else tuple(rng.randint(0, n) for n in split)
    return split_kinds(job, split, rec, full)


def fixed_solve(sms, plans) -> tuple:
    """Build the partition model with each stage's counts fixed to ``plans``; solve it; return the built model,
    the solver and, per stage, a variable equal to the stage's allocated KiB."""
    built = build_partition_model(sms, [HUGE_GIB] * len(plans), partial_recompute=True)
    m, pv = built.model, built.vars
    allocated = []
    for i, plan in enumerate(plans):
        m.Add(pv.layers[i] == plan.layers)
        if pv.recomputed[i] is not pv.layers[i]:
            m.Add(pv.recomputed[i] == plan.recomputed)
        form = sms[i].forms(i).memory.allocated
        var = m.NewIntVar(-(2**40), 2**40, f"allocated_kib[{i}]")
        m.Add(var == pv.linear(form, i, lambda x: round(x / KIB)))
        allocated.append(var)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 30
    assert solver.Solve(m) == cp_model.OPTIMAL, m.Validate()
    return built, solver, allocated


def assert_model_matches(sms, plans, est) -> None:
    built, solver, allocated = fixed_solve(sms, plans)
    unit, v = built.scale.unit, built.vpp
    pv = built.vars
    slack = 4.0 / unit  # the ceiling to whole units and the shares kept in thousandths
    for i, (sm, plan, st) in enumerate(zip(sms, plans, est.stages)):
        # the stage's MoE layers are those of its span (with or without the prefix chain: _add_layer_counts)
        assert (solver.Value(pv.moe_layers[i]), solver.Value(pv.dense_layers[i])) == (plan.moe, plan.dense)
        t = solver.Value(pv.stage_time[i]) / unit
        assert t == pytest.approx(st.microbatch_time_s, rel=PRECISION, abs=slack), f"stage {i} time"
        kib = solver.Value(allocated[i]) * KIB
        assert kib == pytest.approx(sm.forms(i).memory.allocated.at(plan), abs=8 * KIB), f"stage {i} memory"
        exact = sum(st.memory_bytes.values()) - st.memory_bytes["overhead"]
        assert kib == pytest.approx(exact, abs=8 * KIB, rel=1e-12)
    tails = [sm.iteration_tail(i, plan) for i, (sm, plan) in enumerate(zip(sms, plans))]
    # the exposed tail is a difference (traffic - what hides it): its rounding is relative to the compute
    near = PRECISION * max(st.time_s["compute"] for st in est.stages) + slack
    assert solver.Value(pv.dp_tail) / unit == pytest.approx(max(d for d, _ in tails), rel=PRECISION, abs=near)
    assert solver.Value(pv.optimizer) / unit == pytest.approx(max(o for _, o in tails), rel=PRECISION, abs=near)
    iteration = solver.Value(built.objective) / unit / v
    assert iteration == pytest.approx(est.iteration_time_s, rel=PRECISION, abs=slack * est.dims.num_microbatches)


def homogeneous_cases(n: int, seed: int):
    """(job, candidate, plans) for random small jobs, candidates and plans."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        try:
            job = parse_job(gen_raw_job(RandomChooser(rng)))
        except SpecError:
            continue
        costs = cost_source(job)(0)
        opts = SearchOptions(tp_comm_overlap=rng.random() < 0.3, max_micro_batch=8)
        cands, _, _ = enumerate_candidates(job, costs, opts)
        if not cands:
            continue
        c = rng.choice(cands)
        split = random_split(rng, job.model.num_layers, c.pp, c.vpp)
        if split is None:
            continue
        out.append((job, costs, c, opts, random_plans(rng, job, split, c.recompute)))
    return out


@pytest.mark.parametrize("case", homogeneous_cases(40, seed=7), ids=lambda c: f"L{c[0].model.num_layers}-{c[2]}")
def test_cp_sat_expressions_equal_the_estimator_homogeneous(case):
    job, costs, c, opts, plans = case
    sm = StageModel(job, dims_for(job, c, tp_overlap=opts.tp_comm_overlap), costs)
    dims = dims_for(job, c, tuple(p.layers for p in plans), None, opts.tp_comm_overlap)
    est = evaluate_plans(job, dims, sm, plans)
    assert_model_matches([sm] * c.pp, plans, est)


@pytest.mark.parametrize("case", homogeneous_cases(10, seed=3), ids=lambda c: f"L{c[0].model.num_layers}-{c[2]}")
def test_peak_memory_is_the_sum_of_the_components_bit_for_bit(case):
    """The bounds compare StageModel.peak_memory with capacities; the estimator reports the components. The two must
    agree exactly, or a plan could fit for one and not the other."""
    job, costs, c, opts, plans = case
    sm = StageModel(job, dims_for(job, c, tp_overlap=opts.tp_comm_overlap), costs)
    for i, plan in enumerate(plans):
        assert sm.peak_memory(i, plan) == sum(sm.memory(i, plan).values())


def mixed_cases(n: int, seed: int):
    """(job, dims, plans) for random mixed pipelines: stages on random node groups with random TP degrees."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        ch = RandomChooser(rng)
        try:
            job = parse_job({"model": gen_model(ch), "cluster": gen_mixed_cluster(ch), "training": gen_training(ch)})
        except SpecError:
            continue
        L, t = job.model.num_layers, job.training
        p = rng.randint(1, min(4, L))
        groups = sorted(rng.randrange(len(job.cluster)) for _ in range(p))
        tps = []
        for g in groups:
            ok = [
                tp
                for tp in divisors(job.cluster[g].gpus_per_node)
                if tp_heads_error(job.model, tp) is None and t.seq_length % tp == 0
            ]
            tps.append(rng.choice(ok))
        mbs = rng.choice([x for x in divisors(t.global_batch_size) if x <= 4])
        zero, base = rng.choice((0, 1, 2, 3)), rng.choice(("none", "selective", "full"))
        split = random_split(rng, L, p, 1)
        plans = random_plans(rng, job, split, base)
        layers = tuple(x.layers for x in plans)
        rec = tuple(x.recomputed for x in plans)
        dims = pipeline_dims(job, groups, tps, 1, 1, mbs, zero, base, layers, None if base == "full" else rec)
        out.append((job, dims, plans))
    return out


@pytest.mark.parametrize("case", mixed_cases(15, seed=11), ids=lambda c: f"{c[1].stage_groups}-{c[1].stage_tp}")
def test_cp_sat_expressions_equal_the_estimator_mixed(case):
    job, dims, plans = case
    sms = hetero_stage_models(job, dims, cost_source(job))
    est = evaluate_stages(job, dims, sms, plans)
    assert_model_matches(sms, plans, est)


def test_affine_form_evaluates_every_variable_and_indicator():
    form = Affine(const=1.0, dense=2.0, moe=3.0, r_dense=5.0, r_moe=7.0, any_moe=11.0, any_recomputed=13.0)
    assert form.at(StagePlan(dense=1, moe=0)) == 3.0
    assert form.at(StagePlan(dense=2, moe=1, r_dense=1, r_moe=0)) == 1 + 4 + 3 + 5 + 11 + 13
    for plan in itertools.starmap(StagePlan, [(3, 2, 1, 2), (0, 4, 0, 4), (5, 0, 0, 0)]):
        assert (form + form * 2.0).at(plan) == pytest.approx(3 * form.at(plan))
        assert (form - form).at(plan) == 0.0
