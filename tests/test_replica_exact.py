"""Pipelined replica shapes (DP replicas on different GPU types sharing one layer split) are solved exactly:
planner/search/replica_partition.py against every layer split, per-replica recompute and micro-batch split."""

import itertools
import math
from types import SimpleNamespace

import pytest
from strategies import SMALL_MOE
from test_hetero import SMALL, SMALL_GPU, compositions

from planner.cost.estimate import estimate_replicas
from planner.cost.provider import cost_source
from planner.load import parse_job
from planner.parallel import group_order
from planner.search.mixed_context import MixedContext
from planner.search.partition import cp_sat
from planner.search.quick import RESOLUTION
from planner.search.replica_partition import (
    _copy_model,
    _solve_time_then_ties,
    micro_batch_choices,
    micro_batch_range,
)
from planner.search.replicas import (
    ReplicaCandidate,
    _exact_shape,
    _probe_models,
    _replica_dims,
    _shapes,
    choice_floor_terms,
    integer_reach,
    micro_batch_work,
    pipeline_floor,
    throughput_floor,
)
from planner.search.space import SearchOptions


def suite_job(model, cluster, seq: int, batch: int, precision: str = "bf16"):
    """A job of the bench suite (scripts/bench_hetero.py --suite): ``cluster`` as (gpu, nodes, GPUs per node)."""
    return parse_job(
        {
            "model": model,
            "cluster": [{"gpu": g, "nodes": n, "gpus_per_node": k} for g, n, k in cluster],
            "training": {"seq_length": seq, "global_batch_size": batch, "precision": precision, "optimizer": "adam"},
        }
    )


def job31_shape(pp: int, counts):
    """Seed-1 job 31 of the bench suite (qwen3-235b on four GPU types): (its search context, its pipelined replica
    shape of ``pp`` stages with ``counts``, the groups' capacities, solve_split's options of its search)."""
    job = suite_job(
        "qwen3-235b-a22b", [("h200", 231, 8), ("gb200", 30, 72), ("b200", 550, 8), ("h800", 195, 8)], 16384, 1024
    )
    opts = SearchOptions().for_job(job)
    ctx = MixedContext(job, opts, None, cost_source(job), group_order(job.cluster))
    kw = {
        "partial_recompute": opts.partial_recompute,
        "even_layers": opts.even_layers,
        "uniform_recompute": opts.uniform_recompute,
    }
    return ctx, ReplicaCandidate(4, 4, pp, 1, 1, "none", counts, 0.0), [ctx.capacity(g) for g, _ in counts], kw


def replica_job(gbs: int = 8, model=SMALL, memory_gib: float | None = None):
    """A 4-layer ``model`` on 4 small GPUs (of ``memory_gib`` each, where given) and 2 A100-40GB."""
    small = SMALL_GPU if memory_gib is None else {**SMALL_GPU, "memory_gib": memory_gib}
    return parse_job(
        {
            "model": {**model, "num_layers": 4},
            "cluster": [
                {"gpu": small, "nodes": 1, "gpus_per_node": 4},
                {"gpu": "a100-40gb", "nodes": 1, "gpus_per_node": 2},
            ],
            "training": {"seq_length": 4096, "global_batch_size": gbs, "attention": "eager"},
        }
    )


def brute_force(job, shape, zero, counts, base, ep=1):
    """Every layer split, every recompute count of every replica's stages, every micro-batch split."""
    tp, cp, pp, mbs = shape
    L, M = job.model.num_layers, job.training.global_batch_size // mbs
    d = [c for _, c in counts]
    best = float("inf")
    for layers in compositions(L, pp):
        recs_per_replica = list(itertools.product(*[range(n + 1) for n in layers]))
        for recs in itertools.product(recs_per_replica, repeat=len(counts)):
            for m0 in range(1, M):
                rest = M - d[0] * m0
                if rest < d[1] or rest % d[1]:
                    continue
                dims = _replica_dims(job, shape, zero, counts, layers, list(recs), [m0, rest // d[1]], base, ep)
                est = estimate_replicas(job, dims, SearchOptions().memory_margin)
                if est.fits:
                    best = min(best, est.iteration_time_s)
    return best


@pytest.mark.parametrize("quick_work", [None, 0.0])
@pytest.mark.parametrize(("gbs", "zero", "memory_gib"), [(8, 1, None), (5, 1, None), (5, 3, 5.5), (7, 3, 5.5)])
def test_the_exact_split_of_a_pipelined_replica_shape_is_the_brute_force_optimum(
    monkeypatch, gbs, zero, memory_gib, quick_work
):
    """On the small GPU as it is and on one so tight that ZeRO-3 fits only by recomputing: the choices whose
    replicas keep fewer micro-batches in flight (their own stage models, their own memory) share one built model
    of the stage times (replica_partition._split_model, built once per time unit), and the plan is the brute-force
    optimum, with each fixed choice solved first without presolve (the default) and with presolve only
    (FIXED_QUICK_WORK 0)."""
    import planner.cost.estimate as E
    import planner.search.replica_partition as RP

    if quick_work is not None:
        monkeypatch.setattr(RP, "FIXED_QUICK_WORK", quick_work)

    job = replica_job(gbs, memory_gib=memory_gib)
    shared = E.costs_by_group(job)  # one cost source for the brute force's many estimates (its caches)
    monkeypatch.setattr(E, "costs_by_group", lambda job, cal=None: shared)
    builds, priced = [], set()
    build, solve = RP._split_model, RP.solve_split

    def counted_build(per, caps, scale, **kw):
        if len(per) == len(counts):  # (a choice's, not a group's alone: replica_partition.GroupBounds)
            builds.append(scale)
        return build(per, caps, scale, **kw)

    def counted_solve(per, *args, **kw):
        priced.add(id(per))
        return solve(per, *args, **kw)

    monkeypatch.setattr(RP, "_split_model", counted_build)
    monkeypatch.setattr(RP, "solve_split", counted_solve)
    opts = SearchOptions()
    ctx = MixedContext(job, opts, None, cost_source(job), group_order(job.cluster))
    shape, base, counts = (1, 1, 2, 1), "none", ((0, 2), (1, 1))
    work = [micro_batch_work(ctx, g, 1, 1, 1, base) for g, _ in counts]
    cand = ReplicaCandidate(*shape, zero, base, counts, 0.0)
    est, proven, open_s = _exact_shape(ctx, cand, None, 120.0, 1, float("inf"), work)
    expected = brute_force(job, shape, zero, counts, base)
    assert proven and open_s == float("inf")
    assert expected < float("inf") and est is not None
    assert est.iteration_time_s == pytest.approx(expected, rel=RESOLUTION)
    assert len(builds) == len(set(builds))  # one build a time unit
    if gbs != 8:  # (5 and 7 micro-batches: choices with one replica at one micro-batch in flight, and at two)
        assert len(priced) >= 2


def test_a_choice_on_a_shared_split_model_keeps_its_own_memory(monkeypatch):
    """Choices whose replicas keep different micro-batches in flight share the built model of the stage times
    (replica_partition._split_model) but each fits its own stage models' memory: on a GPU where one micro-batch in
    flight leaves room that two do not, the choice solved second on the shared model gets the split and recompute
    it gets on its own (less recompute than the first choice's)."""
    import planner.search.replica_partition as RP
    from planner.search.replicas import _probe_models

    job = replica_job(5, memory_gib=5.8)
    ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
    counts = ((0, 2), (1, 1))
    cand = ReplicaCandidate(1, 1, 2, 1, 3, "none", counts, 0.0)
    caps = [ctx.capacity(g) for g, _ in counts]
    kw = {
        "partial_recompute": True,
        "even_layers": False,
        "uniform_recompute": False,
        "cap_s": float("inf"),
        "time_limit_s": 30.0,
        "workers": 1,
    }
    first, second = ((2, 1), _probe_models(ctx, cand, [2, 1])), ((1, 3), _probe_models(ctx, cand, [1, 3]))
    alone = [RP.solve_split(per, caps, ms, counts, 5, **kw)[0] for ms, per in (first, second)]
    assert sum(map(sum, alone[1].recompute)) < sum(map(sum, alone[0].recompute))  # (the memory binds apart)
    builds = []
    build = RP._split_model
    monkeypatch.setattr(RP, "_split_model", lambda *a, **k: builds.append(1) or build(*a, **k))
    models = {}
    shared = [RP.solve_split(per, caps, ms, counts, 5, models=models, **kw)[0] for ms, per in (first, second)]
    assert shared == alone and len(builds) == 1


@pytest.mark.parametrize(
    ("ms", "cap", "status", "time_s"),
    [((82, 81, 12, 6), 1.310676, "optimal", 1.310562), ((83, 81, 12, 4), 1.310431, "infeasible", None)],
)
def test_a_choice_close_to_its_cap_is_settled_with_presolve(monkeypatch, ms, cap, status, time_s):
    """Seed-1 job 31 of the bench suite (qwen3-235b on four GPU types), its pipelined replica shape of 33 stages
    whose best plan is the job's: two of its micro-batch choices, within 0.01% of their caps. The quick solve
    without presolve (replica_partition._solve_choice) does not settle them; the solve with presolve that follows
    does, with the same status, time and split as a solve with presolve only."""
    import planner.search.replica_partition as RP

    counts = ((1, 4), (2, 8), (0, 3), (3, 2))
    ctx, cand, caps, kw = job31_shape(33, counts)
    per = _probe_models(ctx, cand, ms)
    kw = {**kw, "cap_s": cap, "time_limit_s": 600.0, "workers": 1}
    presolved = []
    real = RP._solve_time_then_ties

    def spied(solver, *args):
        presolved.append(solver.parameters.cp_model_presolve)
        return real(solver, *args)

    monkeypatch.setattr(RP, "_solve_time_then_ties", spied)
    split, got, bound = RP.solve_split(per, caps, ms, counts, 1024, **kw)
    assert presolved == [False, True]  # the quick solve left it open
    assert got == status
    if time_s is not None:
        assert bound == pytest.approx(time_s, rel=1e-5) and split is not None
    monkeypatch.setattr(RP, "FIXED_QUICK_WORK", 0.0)
    assert RP.solve_split(per, caps, ms, counts, 1024, **kw) == (split, got, bound)
    assert presolved == [False, True, True]


@pytest.mark.parametrize(("gbs", "memory_gib"), [(7, None), (9, 5.8)])
def test_a_group_alone_proves_a_choice_infeasible_only_where_the_choice_is(gbs, memory_gib):
    """replica_partition.GroupBounds relaxes a micro-batch choice to one replica group on a split of its own. For
    every fixed choice of a two-group shape (on the small GPU as it is, and on one where fewer micro-batches in
    flight change what fits): just above the choice's own optimum no group exceeds the cap (each group alone is
    part of the choice's model), and just below the slowest group's own optimum one does, once every group has been
    solved (each call solves at most one group it does not know yet)."""
    from planner.search.replica_partition import GroupBounds, choice_scale, solve_split

    job = replica_job(gbs, memory_gib=memory_gib)
    opts = SearchOptions()
    ctx = MixedContext(job, opts, None, cost_source(job), group_order(job.cluster))
    counts = ((0, 2), (1, 1))
    cand = ReplicaCandidate(1, 1, 2, 1, 1, "none", counts, 0.0)
    caps = [ctx.capacity(g) for g, _ in counts]
    kw = {"partial_recompute": True, "even_layers": False, "uniform_recompute": False}
    checked = 0
    for m0 in range(1, gbs // 2 + 1):
        ms = (m0, gbs - 2 * m0)
        per = _probe_models(ctx, cand, list(ms))
        full = solve_split(per, caps, ms, counts, gbs, cap_s=math.inf, time_limit_s=60.0, workers=1, **kw)
        alone = [  # in the choice's time unit, as GroupBounds solves them
            solve_split([per[g]], [caps[g]], (m,), [counts[g]], counts[g][1] * m, cap_s=math.inf,
                        time_limit_s=60.0, workers=1, scale=choice_scale(per, ms), **kw)
            for g, m in enumerate(ms)
        ]  # fmt: skip
        if full[1] != "optimal":
            continue
        assert all(a[1] == "optimal" and a[2] <= full[2] for a in alone)
        above = GroupBounds(caps, counts, lambda g, m: -g, 1, kw)
        assert not any(above.exceeds(ms, per, full[2] * (1 + 1e-3), 60.0) for _ in counts)
        slowest = max(a[2] for a in alone)
        below = GroupBounds(caps, counts, lambda g, m: -g, 1, kw)
        assert any(below.exceeds(ms, per, slowest * (1 - 1e-3), 60.0) for _ in counts)
        full_below = solve_split(per, caps, ms, counts, gbs, cap_s=slowest * (1 - 1e-3), time_limit_s=60.0,
                                 workers=1, **kw)  # fmt: skip
        assert full_below[1] == "infeasible"
        checked += 1
    assert checked >= 2


def test_a_group_alone_settles_the_suite_choices_whose_presolve_was_slow(monkeypatch):
    """Seed-1 job 31 of the bench suite, its 32-stage replica shape under the cut its search reaches (1.310676 s):
    the four choices that give the second group 81 micro-batches, each proved infeasible by CP-SAT's presolve of
    the whole choice (0.3-0.5 s), are settled by that group alone, solved once."""
    import planner.search.replica_partition as RP

    ctx, cand, caps, kw = job31_shape(32, ((1, 4), (2, 8), (0, 3), (3, 3)))
    solved = []
    real = RP.solve_split
    monkeypatch.setattr(RP, "solve_split", lambda per, *a, **k: solved.append(len(per)) or real(per, *a, **k))
    bounds = RP.GroupBounds(caps, cand.counts, lambda g, m: m * (g == 1), 1, kw)
    for ms in ((82, 81, 10, 6), (82, 81, 11, 5), (82, 81, 12, 4), (82, 81, 13, 3)):
        assert bounds.exceeds(ms, _probe_models(ctx, cand, ms), 1.310676, 600.0)
    assert solved == [1]
    assert not bounds.exceeds((82, 81, 10, 6), _probe_models(ctx, cand, (82, 81, 10, 6)), 1.34, 600.0)


@pytest.mark.parametrize("workers", [1, 4])
def test_time_then_ties_is_the_least_tiebreak_among_the_fastest(workers):
    """Many assignments share the least time; the two-step solve proves that time and returns the one with the
    least tie-break, the lexicographic optimum found by enumerating every assignment."""
    cp = cp_sat()
    m = cp.CpModel()
    xs = [m.new_int_var(0, 4, f"x{i}") for i in range(4)]
    m.add(sum(xs) == 8)
    time = m.new_int_var(0, 100, "time")
    m.add_max_equality(time, [xs[0] + xs[1], xs[2] + xs[3]])
    tiebreak = sum((4 - i) * x for i, x in enumerate(xs))
    m.minimize(time)
    solver = cp.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_time_in_seconds = 30
    status, bound = _solve_time_then_ties(solver, m, time, tiebreak)
    every = [v for v in itertools.product(range(5), repeat=4) if sum(v) == 8]
    best = min((max(v[0] + v[1], v[2] + v[3]), sum((4 - i) * x for i, x in enumerate(v)), v) for v in every)
    assert status == cp.OPTIMAL and bound == best[0]
    assert tuple(solver.value(x) for x in xs) == best[2]


@pytest.mark.parametrize("model", [SMALL, SMALL_MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("shape", [(1, 1, 2, 1), (1, 1, 4, 1)])
def test_each_micro_batch_choice_bound_is_below_every_plan_with_those_counts(monkeypatch, shape, model):
    """The bound micro_batch_choices gives a micro-batch choice of a pipelined shape (each replica's work with its
    sends, its least DP tail and optimizer step, its least slowest stage: replicas.choice_floor_terms) is at most
    the fastest plan with those counts (every layer split and recompute count, each estimated), and above the
    bound from the work alone for some choice. With a leading dense layer (the MoE model) and one layer a stage,
    the tail floor is that of an MoE stage, above the least stage's."""
    import planner.cost.estimate as E

    zero, base, counts = 1, "none", ((0, 2), (1, 1))
    job = replica_job(model=model)
    shared = E.costs_by_group(job)
    monkeypatch.setattr(E, "costs_by_group", lambda job, cal=None: shared)
    ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
    tp, cp, pp, mbs = shape
    L, M = job.model.num_layers, job.training.global_batch_size // mbs
    cand = ReplicaCandidate(*shape, zero, base, counts, 0.0)
    plain = [micro_batch_work(ctx, g, tp, cp, mbs, base) for g, _ in counts]
    work, tails, bottlenecks = choice_floor_terms(ctx, cand, plain)
    if model is SMALL_MOE and pp == L:  # every stage holds one layer: all but the first hold an MoE layer
        per = _probe_models(ctx, cand, [pp] * len(counts))
        least = [min(ctx.tail_profile(sm, s, math.inf).reach[1] for s, sm in enumerate(sms)) for sms in per]
        assert all(t > x * (1 + 1e-6) for t, x in zip(tails, least)), (tails, least)
    choices, _ = micro_batch_choices(M, counts, work, pp, float("inf"), tails, bottlenecks)
    loose = dict((ms, b) for b, ms in micro_batch_choices(M, counts, plain, pp, float("inf"))[0])
    tighter = 0
    for bound, ms in choices:
        best = float("inf")
        for layers in compositions(L, pp):
            recs_per_replica = list(itertools.product(*[range(n + 1) for n in layers]))
            for recs in itertools.product(recs_per_replica, repeat=len(counts)):
                dims = _replica_dims(job, shape, zero, counts, layers, list(recs), list(ms), base)
                est = estimate_replicas(job, dims, 0.0)
                if est.fits:
                    best = min(best, est.iteration_time_s)
        assert bound <= best * (1 + 1e-9), (ms, bound, best)
        tighter += bound > loose[ms] * (1 + 1e-6)
    assert choices and tighter


def test_micro_batch_range_holds_every_choice_below_the_bound():
    counts, work, pp = ((0, 2), (1, 3)), [1.0, 1.5], 2
    for beat in (20.0, 30.0, float("inf")):
        choices, complete = micro_batch_choices(40, counts, work, pp, beat)
        ranges = micro_batch_range(40, counts, work, pp, beat)
        assert complete
        for _, ms in choices:
            assert all(lo <= m <= hi for m, (lo, hi) in zip(ms, ranges))
            assert max(max((m + pp - 1) * w / pp, w) for m, w in zip(ms, work)) < beat


@pytest.mark.parametrize("memory_gib", [6.0, 5.5])
@pytest.mark.parametrize("zero", [0, 1, 3])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 1, 2, 1), (1, 1, 2, 2)])
def test_the_pipeline_floor_of_a_replica_shape_is_below_every_plan_of_it(monkeypatch, shape, zero, memory_gib):
    """replicas.pipeline_floor bounds every layer split, recompute and micro-batch split of the shape (on a roomy
    GPU and on one so tight that some shapes fit only by recomputing), and proves the shape infeasible only when no plan
    fits; the cheaper throughput_floor (no memory) is positive and below it."""
    import planner.cost.estimate as E

    job = replica_job(memory_gib=memory_gib)
    shared = E.costs_by_group(job)
    monkeypatch.setattr(E, "costs_by_group", lambda job, cal=None: shared)
    ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
    base, counts = "none", ((0, 2), (1, 1))
    if job.training.global_batch_size // shape[3] < sum(d for _, d in counts):
        pytest.skip("fewer micro-batches than replicas")
    cand = ReplicaCandidate(*shape, zero, base, counts, 0.0)
    floor, cheap = pipeline_floor(ctx, cand), throughput_floor(ctx, cand)
    expected = brute_force(job, shape, zero, counts, base)
    assert floor <= expected * (1 + 1e-9)
    assert 0 < cheap <= floor * (1 + 1e-6)  # (the pipeline floor's bisection stops within 1e-6 of its root)
    if expected < float("inf"):
        assert floor > 0
    if (shape, zero) == ((1, 1, 2, 1), 3):  # fits on both GPUs, on the 5.5 GiB one only by recomputing
        assert expected < float("inf")


def test_integer_reach_is_the_least_time_whole_micro_batch_counts_reach():
    """replicas.integer_reach against every choice of whole counts m_g >= 1 (shared by a group's d_g replicas)
    with sum_g d_g m_g >= M: the least slowest (m_g - 1) T_g + rest_g. The continuous reach is below it where the
    counts cannot balance, as with one replica of a slow group next to a fast one."""
    import random

    rng = random.Random(3)
    cases = [(5, [(1, 1.0, 0.0), (1, 10.0, 0.0)])]
    for _ in range(300):
        cases.append(
            (
                rng.randint(1, 30),
                [(rng.randint(1, 4), rng.uniform(0.1, 3), rng.uniform(0, 5)) for _ in range(rng.randint(1, 3))],
            )
        )
    below = 0
    for M, terms in cases:
        best = min(
            max((m - 1) * T + rest for m, (_, T, rest) in zip(ms, terms))
            for ms in itertools.product(range(1, M + 1), repeat=len(terms))
            if sum(d * m for m, (d, _, _) in zip(ms, terms)) >= M
        )
        assert integer_reach(M, terms) == pytest.approx(best, rel=1e-12), (M, terms)
        rate = sum(d / T for d, T, _ in terms)
        continuous = (M - sum(d for d, _, _ in terms) + sum(d * r / T for d, T, r in terms)) / rate
        below += max([continuous] + [r for _, _, r in terms]) < best * (1 - 1e-9)
    assert below


def test_the_shape_bound_of_a_model_with_dense_and_moe_layers_counts_each_layer_at_its_kind(monkeypatch):
    """An MoE model with a dense first layer: the shape bound (replicas._shapes, from micro_batch_work) and the
    pipeline floor are below every plan of the shape (brute force), and the shape bound is above what it was
    with every layer at the cheaper dense layer's floor (L * per_layer_bound)."""
    import planner.cost.estimate as E
    from planner.search.mixed_context import end_costs, per_layer_bound

    job = replica_job(model=SMALL_MOE)
    shared = E.costs_by_group(job)
    monkeypatch.setattr(E, "costs_by_group", lambda job, cal=None: shared)
    ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
    found, cut_short = _shapes(ctx, float("inf"), float("inf"))
    assert not cut_short
    checked = tighter = 0
    for bound, (tp, cp, pp, mbs, base, counts, ep), work in found:
        if (tp, cp, mbs, ep, base) != (1, 1, 1, 1, "none") or pp > 2 or len(counts) != 2:
            continue
        for g, w in zip((g for g, _ in counts), work):
            one_kind = job.model.num_layers * per_layer_bound(ctx, g, tp, cp, mbs, base) + sum(
                end_costs(ctx, (g, tp), (g, tp), cp, mbs)
            )
            assert w == micro_batch_work(ctx, g, tp, cp, mbs, base)
            tighter += w > one_kind * (1 + 1e-9)
        expected = brute_force(job, (tp, cp, pp, mbs), 1, counts, base)
        cand = ReplicaCandidate(tp, cp, pp, mbs, 1, base, counts, bound)
        floor, cheap = pipeline_floor(ctx, cand), throughput_floor(ctx, cand)
        assert bound <= expected * (1 + 1e-9) and floor <= expected * (1 + 1e-9), (pp, counts)
        assert cheap <= floor * (1 + 1e-6), (pp, counts)
        checked += expected < float("inf")
    assert checked and tighter


def test_the_micro_batch_enumeration_stops_at_its_budgets(monkeypatch):
    """Four replica groups and 3,000 micro-batches, where only the choices that leave the last (slow) replica one
    micro-batch beat the bound: billions of partial choices, millions below the bound. The enumeration goes
    straight to the counts that leave the later groups below the bound (rest_floor), stops past MAX_CHOICES
    choices or MAX_VISITS partial ones, and says it is incomplete (the shape then stays open) instead of walking
    them all."""
    from planner.search import replica_partition

    counts, work = ((0, 1), (1, 1), (2, 1), (3, 1)), [1e-6, 1e-6, 1e-6, 1.0]
    choices, complete = micro_batch_choices(3000, counts, work, 1, 1.5)
    assert not complete
    assert len(choices) == replica_partition.MAX_CHOICES + 1  # the one past the budget ends the walk
    assert all(ms[-1] == 1 for _, ms in choices)
    monkeypatch.setattr(replica_partition, "MAX_VISITS", 100)
    choices, complete = micro_batch_choices(3000, counts, work, 1, 1.5)
    assert not complete
    assert 0 < len(choices) < 100 and all(ms[-1] == 1 for _, ms in choices)


def test_the_micro_batch_enumeration_lists_every_choice_below_the_bound():
    """micro_batch_choices (which steps the second-to-last group's count through the values the last group's
    count divides) against a plain walk over every count, on random small shapes."""
    import random

    def every_choice(M, counts, work, pp, beat, tails=None, slowest=None):
        d = [c for _, c in counts]
        tails, slowest = tails or [0.0] * len(d), slowest or [0.0] * len(d)
        found = []
        for ms in itertools.product(*(range(1, M + 1) for _ in d[:-1])):
            left = M - sum(di * mi for di, mi in zip(d, ms))
            if left >= d[-1] and left % d[-1] == 0:
                full = (*ms, left // d[-1])
                # (m + pp - 1) w / pp, or (m - 1) t + w where the slowest stage's floor t is above w / pp
                b = max((m - 1) * max(w / pp, t) + w + r for m, w, r, t in zip(full, work, tails, slowest))
                if b < beat:
                    found.append((b, full))
        return sorted(found)

    rng = random.Random(3)
    checked = 0
    for _ in range(90):
        n = rng.choice([2, 3, 4])
        counts = tuple((i, rng.randint(1, 6)) for i in range(n))
        M = rng.randint(n, 24 if n == 4 else 40)
        work = [rng.uniform(0.1, 1.0) for _ in range(n)]
        pp, beat = rng.randint(1, 4), rng.choice([float("inf"), rng.uniform(1.0, 10.0)])
        terms = (None, None)
        if rng.random() < 0.5:  # with each replica's least DP tail and least slowest stage
            terms = ([rng.uniform(0.0, 0.5) for _ in range(n)], [w / pp * rng.uniform(0.8, 1.5) for w in work])
        if rng.random() < 0.3:  # the bound at a choice's own bound: the tie is left out, as with any bound
            bounds = every_choice(M, counts, work, pp, float("inf"), *terms)
            beat = rng.choice(bounds)[0] if bounds else beat
        choices, complete = micro_batch_choices(M, counts, work, pp, beat, *terms)
        assert complete
        assert [ms for _, ms in choices] == [ms for _, ms in every_choice(M, counts, work, pp, beat, *terms)]
        checked += bool(choices)
    assert checked > 20


def test_a_pipelined_replica_plan_is_proven_by_the_exact_pass():
    """A 4-type job of the bench suite (scripts/bench_hetero.py --suite, seed 0, job 51) whose best plan runs
    pipelined replicas (pp 3) on three GPU types: the first look at the replica shapes evaluates them
    heuristically, the replica search proper solves their splits exactly, so the plan is proven optimal (a
    variable shadowing once skipped the exact pass and left it "heuristic")."""
    from planner.search.mixed_pipelines import search_hetero
    from planner.search.space import SearchOptions

    job = suite_job("qwen3-4b", [("mi355x", 21, 8), ("h100-sxm", 21, 8), ("gb300", 1, 72), ("h20", 6, 8)], 32768, 512)
    result = search_hetero(job, top=1, time_limit_s=600, options=SearchOptions())
    assert result.stop_reason == "proven" and result.gap == 0.0
    best = result.plans[0]
    assert getattr(best.candidate, "pp", 1) > 1 and hasattr(best.candidate, "counts")


def test_the_exact_pass_shared_with_another_side_finds_what_one_side_does(monkeypatch):
    """search_replicas' exact pass with every other pipelined shape solved on another side (replicas.ExactShare:
    in the CLI the other process, with its own context and caches; here a fresh context) finds the same plans, with
    the same proofs and open bounds, as the pass on one side; and what the other side proved is absorbed, so a
    later pass solves nothing again. The 4-type suite job of the test above: two pipelined shapes to solve."""
    import time

    from planner.search import mixed_pipelines, replicas

    job = suite_job("qwen3-4b", [("mi355x", 21, 8), ("h100-sxm", 21, 8), ("gb300", 1, 72), ("h20", 6, 8)], 32768, 512)

    def context():
        return MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))

    class OtherSide:
        def __init__(self):
            self.given = []

        def start(self, items, *args):
            self.given.append([cand for _, cand, _, _ in items])
            self.args = (items, *args)

        def finish(self):  # (what the other process runs: its share's own context)
            return mixed_pipelines._exact_part(SimpleNamespace(ctx=context()), *self.args)

    def answer(rs):
        return [(c.key, e.iteration_time_s, exact) for c, e, exact in rs.found], rs.low, rs.unexplored

    one = replicas.search_replicas(context(), float("inf"), time.monotonic() + 600, 1)
    other, ctx = OtherSide(), context()
    shared = replicas.search_replicas(ctx, float("inf"), time.monotonic() + 600, 1, share=other)
    assert len(other.given) == 1 and other.given[0]
    assert answer(shared) == answer(one)
    assert any(exact and getattr(c, "pp", 1) > 1 for c, _, exact in shared.found)
    solves = []
    real = replicas._exact_shape
    monkeypatch.setattr(replicas, "_exact_shape", lambda *a: solves.append(a[1]) or real(*a))
    again = replicas.search_replicas(ctx, float("inf"), time.monotonic() + 600, 1)
    assert answer(again) == answer(one) and solves == []


def test_a_proven_shape_is_not_solved_again_below_a_lower_cut(monkeypatch):
    """replicas._exact_once keeps what the exact pass proved about a shape: asked again with the same or a lower
    cut (a later pass of the replica search), it answers from memory, with the plan the exact split gives below
    that cut, and without a second solve; asked with a higher cut it solves again."""
    from planner.search import replicas

    job = replica_job()
    ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
    shape, base, counts = (1, 1, 2, 1), "none", ((0, 2), (1, 1))
    work = [micro_batch_work(ctx, g, 1, 1, 1, base) for g, _ in counts]
    cand = ReplicaCandidate(*shape, 1, base, counts, 0.0)
    calls = []
    real = replicas._exact_shape

    def counted(*args):
        calls.append(args[-2])  # the cut
        return real(*args)

    monkeypatch.setattr(replicas, "_exact_shape", counted)
    first, proven, _ = replicas._exact_once(ctx, cand, None, 120.0, 1, float("inf"), work)
    assert proven and first is not None and len(calls) == 1
    again, proven, _ = replicas._exact_once(ctx, cand, None, 120.0, 1, first.iteration_time_s * 1.5, work)
    assert proven and again is first and len(calls) == 1  # below a lower cut: the same plan, from memory
    below, proven, _ = replicas._exact_once(ctx, cand, None, 120.0, 1, first.iteration_time_s * 0.9, work)
    assert proven and below is None and len(calls) == 1  # nothing of the shape beats a cut below its best
    replicas._exact_once(ctx, cand, None, 120.0, 1, float("inf"), work)
    assert len(calls) == 1  # the same cut as the first call (inf) is answered from memory too
    ctx.caches.replica_exact.clear()
    replicas._exact_once(ctx, cand, None, 120.0, 1, first.iteration_time_s * 1.2, work)
    assert len(calls) == 2
    higher, proven, _ = replicas._exact_once(ctx, cand, None, 120.0, 1, first.iteration_time_s * 1.5, work)
    assert len(calls) == 3 and proven and higher.iteration_time_s == first.iteration_time_s  # a higher cut: solved


def test_the_first_look_is_the_same_on_a_slow_machine(monkeypatch):
    """The first look at the replica plans is bounded by a count of steps (mixed_pipelines.REPLICA_LOOK), its
    candidates split greedily (no CP-SAT with a time limit), so it finds the same plans on any machine: with a clock
    that runs 20 ms per reading (a machine many times slower, whose look a budget of seconds would cut after a few
    steps) as with one that stands still. A suite job (bench_hetero --suite, seed 0, job 8) whose look takes about
    160 steps and evaluates about 20 candidates."""
    from planner.search import mixed_pipelines, replicas

    job = suite_job("gpt3-5b", [("mi250x", 19, 8), ("h800", 71, 8)], 16384, 256)

    def look(tick: float):
        clock = {"now": 0.0}

        def monotonic() -> float:
            clock["now"] += tick
            return clock["now"]

        monkeypatch.setattr(replicas, "time", SimpleNamespace(monotonic=monotonic))
        ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
        rs = replicas.search_replicas(ctx, float("inf"), 3600.0, 1, exact_pass=False, look=mixed_pipelines.REPLICA_LOOK)
        return [(cand, est.iteration_time_s, exact) for cand, est, exact in rs.found], rs.low, rs.unexplored

    still, slow = look(0.0), look(0.02)
    assert len(still[0]) > 5
    assert slow == still


def test_the_shape_enumeration_works_out_only_ep_degrees_some_replica_count_takes():
    """replicas._ep_reachable (the EP degrees whose per-layer costs the shape enumeration works out) against every
    replica count up to the most: ep_error accepts ep with some d <= most_d exactly where the rule says so."""
    from planner.parallel import ep_error
    from planner.search.replicas import _ep_reachable

    model = SimpleNamespace(moe=SimpleNamespace(num_experts=2**10))
    for ep, cp, most_d in itertools.product([1, 2, 4, 8, 16, 32, 64, 128, 256], [1, 2, 4, 8, 16], range(0, 40)):
        some = any(ep_error(model, ep, d, cp) is None for d in range(1, most_d + 1))
        assert _ep_reachable(ep, cp, most_d) == some, (ep, cp, most_d)


def shapes_one_by_one(ctx, beat: float) -> list:
    """Every replica shape whose bound is below ``beat``, its bound worked out for each one (no enumeration cut):
    every TP, CP, micro-batch, baseline recompute mode, depth, set of two or more groups (each fitting a whole
    replica) and EP degree every replica count takes."""
    from planner.parallel import (
        baseline_recompute_modes,
        cp_options,
        ep_error,
        micro_batch_options,
        node_group_tp_options,
        seq_shard_error,
    )

    job = ctx.job
    m, t = job.model, job.training
    groups = ctx.order
    out = []
    for tp in node_group_tp_options(m, (job.cluster[g].gpus_per_node for g in groups)):
        for cp in cp_options(t, max(job.cluster[g].num_gpus for g in groups)):
            if seq_shard_error(t, cp, tp):
                continue
            for mbs in micro_batch_options(t, 1, ctx.opts.max_micro_batch):
                M = t.global_batch_size // mbs
                for base in baseline_recompute_modes(t, ctx.opts.op_recompute):
                    for pp in range(1, m.num_layers + 1):
                        fit = {g: job.cluster[g].num_gpus // (tp * cp * pp) for g in groups}
                        for k in range(2, len(groups) + 1):
                            for used in itertools.combinations(groups, k):
                                counts = tuple((g, fit[g]) for g in used)
                                D = sum(d for _, d in counts)
                                if min(fit[g] for g in used) < 1 or D > M:
                                    continue
                                for ep in range(1, m.moe.num_experts + 1):
                                    if any(ep_error(m, ep, d, cp) for _, d in counts):
                                        continue
                                    work = tuple(micro_batch_work(ctx, g, tp, cp, mbs, base, ep) for g in used)
                                    rate = sum(d * pp / w for (_, d), w in zip(counts, work))
                                    bound = max((M + (pp - 1) * D) / rate, max(work))
                                    if bound < beat:
                                        out.append((bound, (tp, cp, pp, mbs, base, counts, ep), work))
    return sorted(out, key=lambda x: (x[0], x[1]))


def _moe_on_three_types() -> MixedContext:
    """The mixed context of an 8-layer MoE model with 8 experts on L4, A100-40GB and H100 nodes (the shape
    enumeration tests)."""
    job = parse_job(
        {
            "model": {**SMALL_MOE, "num_layers": 8},
            "cluster": [
                {"gpu": "l4", "nodes": 2, "gpus_per_node": 8},
                {"gpu": "a100-40gb", "nodes": 1, "gpus_per_node": 8},
                {"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 4},
            ],
            "training": {"seq_length": 4096, "global_batch_size": 64},
        }
    )
    return MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))


def test_the_shape_enumeration_keeps_every_shape_below_the_bound():
    """replicas._shapes skips TPs, micro-batches, depths, group sets and EP degrees by bounds on the shapes' own
    bounds: on an MoE model with 8 experts on three GPU types it lists exactly the shapes below the bound that
    working out each one's bound lists, for bounds that keep all, half and a few of them, and with ``keep`` (a first
    look) the first ``keep`` of them."""
    from planner.search.replicas import _first

    ctx = _moe_on_three_types()
    every = shapes_one_by_one(ctx, float("inf"))
    assert len({s[6] for _, s, _ in every}) >= 3 and len({s[2] for _, s, _ in every}) >= 4  # EP degrees, depths
    for beat in (float("inf"), every[len(every) // 2][0], every[10][0]):
        expected = [x for x in every if x[0] < beat]
        found, cut_short = _shapes(ctx, float("inf"), beat)
        assert not cut_short and sorted(found, key=lambda x: (x[0], x[1])) == expected
        for keep in (1, 7, len(expected) // 3):
            assert _shapes(ctx, float("inf"), beat, keep)[0] == _first(expected, keep)


def test_a_first_look_serves_later_enumerations_below_its_last_kept_bound(monkeypatch):
    """replicas.shapes after a first look (``keep``): a later call below the keep-th shape's bound reads the look's
    shapes (no enumeration: _shapes is not called) and gets exactly what a fresh enumeration lists; a call above it
    enumerates again."""
    import planner.search.replicas as R

    ctx = _moe_on_three_types()
    every = shapes_one_by_one(ctx, float("inf"))
    keep = len(every) // 2
    look, _ = R.shapes(ctx, float("inf"), float("inf"), keep)
    assert look == every[:keep]
    calls = []
    enumerate_ = R._shapes

    def counted(*args):
        calls.append(args)
        return enumerate_(*args)

    monkeypatch.setattr(R, "_shapes", counted)
    for beat in (every[keep - 1][0], every[keep // 2][0], every[3][0]):
        found, cut_short = R.shapes(ctx, float("inf"), beat)
        assert not cut_short and sorted(found, key=lambda x: (x[0], x[1])) == [x for x in every if x[0] < beat]
    assert not calls
    above = next(x[0] for x in every if x[0] > every[keep - 1][0])
    found, _ = R.shapes(ctx, float("inf"), above)
    assert len(calls) == 1 and sorted(found, key=lambda x: (x[0], x[1])) == [x for x in every if x[0] < above]


def test_a_copied_split_model_is_the_model_and_leaves_it_alone():
    """_copy_model (clone without OR-Tools' per-model aliasing): the same proto as CpModel.clone, solvable with
    the base model's variables, and what is added to the copy stays out of the base, which the next choice copies."""
    cp_model = cp_sat()
    base = cp_model.CpModel()
    x, y = base.NewIntVar(0, 10, "x"), base.NewIntVar(0, 10, "y")
    base.Add(x + y >= 7)
    copy = _copy_model(base)
    assert str(copy.Proto()) == str(base.clone().Proto())
    found = []
    for least in (3, 5):
        m = _copy_model(base)
        z = m.new_int_var(0, 100, "z")
        m.add(z >= 2 * x + y)
        m.add(x >= least)
        m.minimize(z)
        solver = cp_model.CpSolver()
        assert solver.Solve(m) == cp_model.OPTIMAL
        found.append((solver.Value(x), solver.Value(y), solver.Value(z)))
    assert found == [(3, 4, 10), (5, 2, 12)]
    assert len(base.Proto().variables) == 2 and len(base.Proto().constraints) == 1


def test_a_later_pass_reads_the_choices_a_solve_proved(monkeypatch):
    """A pipelined shape asked again (a later pass of the replica search) takes each micro-batch choice's split that
    a solve proved from ctx.caches.replica_choices instead of solving it again, and gets the same plan and proof."""
    import planner.cost.estimate as E
    import planner.search.replica_partition as RP

    job = replica_job()
    shared = E.costs_by_group(job)
    monkeypatch.setattr(E, "costs_by_group", lambda job, cal=None: shared)
    ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
    shape, base, counts = (1, 1, 2, 1), "none", ((0, 2), (1, 1))
    work = [micro_batch_work(ctx, g, 1, 1, 1, base) for g, _ in counts]
    cand = ReplicaCandidate(*shape, 1, base, counts, 0.0)
    solved = []
    solve = RP.solve_split

    def counted(per, caps, ms, *args, **kw):
        if all(isinstance(m, int) for m in ms):  # a choice's solve (not the one with the counts as variables)
            solved.append(ms)
        return solve(per, caps, ms, *args, **kw)

    monkeypatch.setattr(RP, "solve_split", counted)
    first = _exact_shape(ctx, cand, None, 120.0, 1, float("inf"), work)
    assert solved and ctx.caches.replica_choices[cand.key]
    solved.clear()
    again = _exact_shape(ctx, cand, None, 120.0, 1, float("inf"), work)
    assert not solved
    assert again[1:] == first[1:] and again[0].iteration_time_s == first[0].iteration_time_s


def test_a_proven_search_reports_its_replica_plan_optimal():
    """A replica shape's heuristic plan that the shape's own bound closes (no split of it is faster) is the proven best
    when every other part of the space is bounded above it: the search stops proven and reports the plan optimal,
    not feasible (seed-0 suite job 16: DeepSeek-V2 on four types, its best plan a replica plan)."""
    from invariants import check_proof

    from planner.search.mixed_pipelines import search_hetero

    groups = [("a10", 1, 8), ("gb300", 1, 72), ("gb200", 1, 72), ("v100-32gb", 4, 8)]
    job = suite_job("deepseek-v2", groups, 16384, 1024, "fp16")
    result = search_hetero(job, top=1, time_limit_s=120, processes=1)
    assert result.stop_reason == "proven" and result.gap == 0.0
    assert isinstance(result.plans[0].candidate, ReplicaCandidate)
    assert result.plans[0].status == "optimal"
    assert check_proof(result) == []


def test_the_look_ahead_works_out_the_looks_own_floors_in_its_order(monkeypatch):
    """replicas.look_ahead (the other process's side of the first look) works out throughput floors in the order
    the look does (a subsequence of it: the look cuts what its plans rule out), each the look's own value; and a
    look taking in its floors as they come (a floor per ZeRO stage it takes out of line, from a fresh context's
    look_ahead: the other process's own caches) finds what it finds alone, with the same bounds. The suite job of
    the test above."""
    import time

    from planner.search import mixed_pipelines, replicas

    job = suite_job("gpt3-5b", [("mi250x", 19, 8), ("h800", 71, 8)], 16384, 256)

    made = []  # every context made, kept alive: the floors are counted by id(ctx), which a freed one's could reuse

    def context():
        made.append(MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster)))
        return made[-1]

    class Board:  # (lockstep.Board, in this process)
        def __init__(self, shapes):
            self.shapes, self.numbers = shapes, {replicas.AHEAD_FRONT: 0.0}

        def receive(self):
            return self.shapes

        def stopped(self):
            return False

        def __getitem__(self, i):
            return self.numbers[i]

    class Ahead:  # (replicas.LookAhead, as mixed_pipelines._LookAhead without a second process)
        def start(self, found_shapes):
            self.board = Board(found_shapes)
            self.sent = replicas.look_ahead(SimpleNamespace(ctx=context()), self.board)

        def front(self, key):
            self.board.numbers[replicas.AHEAD_FRONT] = key

        def take_in(self, ctx):
            ctx.caches.replica_throughput.update(next(self.sent, []))

    def look(ctx, ahead=None):
        deadline = time.monotonic() + 3600
        rs = replicas.search_replicas(
            ctx, float("inf"), deadline, 1, exact_pass=False, look=mixed_pipelines.REPLICA_LOOK, ahead=ahead
        )
        return [(cand.key, est.iteration_time_s, exact) for cand, est, exact in rs.found], rs.low, rs.unexplored

    order, by = [], {}  # the floors worked out: in order, and how many by context
    real = replicas.throughput_floor

    def counted(ctx, cand):
        if cand.key not in ctx.caches.replica_throughput:
            order.append(cand.key)
            by[id(ctx)] = by.get(id(ctx), 0) + 1
        return real(ctx, cand)

    monkeypatch.setattr(replicas, "throughput_floor", counted)
    alone_ctx = context()
    alone = look(alone_ctx)
    looked = list(order)  # the floors the look worked out, in its order
    assert len(looked) > 20 and alone[0]
    found, _ = replicas.shapes(context(), float("inf"), float("inf"), mixed_pipelines.REPLICA_LOOK)
    ahead = [k for batch in replicas.look_ahead(SimpleNamespace(ctx=context()), Board(sorted(found))) for k in batch]
    floors = dict(ahead)
    assert [key for key, _ in ahead if key in set(looked)] == looked
    assert all(floors[key] == alone_ctx.caches.replica_throughput[key] for key in looked)
    helped, ctx = Ahead(), context()
    assert look(ctx, helped) == alone
    assert by.get(id(ctx), 0) < len(looked)  # (it took in floors worked out on the other side)
