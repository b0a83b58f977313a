"""`plan` against brute-force enumeration of the same space on small jobs: same best predicted time."""

import itertools

import pytest
from strategies import SMALL_MOE

from planner.cost.estimate import evaluate_plans
from planner.cost.provider import AnalyticCosts
from planner.cost.stage import StageModel, StagePlan
from planner.frameworks import FRAMEWORKS
from planner.load import parse_job
from planner.search.homogeneous import _finalize_dims, search
from planner.search.partition import solve_partition
from planner.search.quick import RESOLUTION
from planner.search.space import SearchOptions, dims_for, enumerate_candidates


def job(model, gpus_per_node=4, nodes=2, gpu="a100-40gb", seq=2048, gbs=16, attention="flash"):
    return parse_job(
        {
            "model": model,
            "cluster": [{"gpu": gpu, "nodes": nodes, "gpus_per_node": gpus_per_node}],
            "training": {"seq_length": seq, "global_batch_size": gbs, "attention": attention},
        }
    )


def compositions(total, parts, step):
    """All (n_0..n_{p-1}) with n_i >= step, multiples of step, summing to total."""
    if parts == 1:
        if total >= step and total % step == 0:
            yield (total,)
        return
    for first in range(step, total - step * (parts - 1) + 1, step):
        for rest in compositions(total - first, parts - 1, step):
            yield (first,) + rest


def brute_force_best(j, opts):
    costs = AnalyticCosts(j.cluster[0], j.training.precision)
    cands, _, _ = enumerate_candidates(j, costs, opts)

    best = float("inf")
    for c in cands:
        sm = StageModel(j, dims_for(j, c), costs)
        for split in compositions(j.model.num_layers, c.pp, c.vpp):
            first = 0
            kinds = []
            for n in split:
                moe = j.model.moe_layers_before(first + n) - j.model.moe_layers_before(first)
                kinds.append((n, moe))
                first += n
            for rec in itertools.product(*[range(n + 1) for n in split]):
                plans = []
                for (n, moe), r in zip(kinds, rec):
                    rm = min(r, moe)
                    plans.append(StagePlan(dense=n - moe, moe=moe, r_dense=r - rm, r_moe=rm))
                est = evaluate_plans(j, _finalize_dims(j, c, plans), sm, plans, opts.memory_margin)
                if est.fits and est.iteration_time_s < best:
                    best = est.iteration_time_s
    return best


SMALL_GPT = {
    "name": "gpt-small",
    "num_layers": 8,
    "hidden_size": 1024,
    "ffn_hidden_size": 4096,
    "num_attention_heads": 16,
    "vocab_size": 32000,
    "mlp": "gelu",
}
SMALL_MOE = SMALL_MOE
TIGHT_GPU = {
    "memory_gib": 5.5,
    "peak_tflops_bf16": 312,
    "hbm_tbps": 2.0,
    "intra_node_gbps": 300,
    "inter_node_gbps": 200,
}


@pytest.mark.parametrize(
    "case",
    [
        dict(model=SMALL_GPT, gbs=8),
        # memory-bound: the optimum recomputes 2 of 6 layers
        dict(
            model={**SMALL_GPT, "num_layers": 6},
            gpu={**TIGHT_GPU, "memory_gib": 6.0},
            gbs=4,
            seq=8192,
            attention="eager",
        ),
        dict(model=SMALL_MOE, gbs=8, nodes=1),
    ],
)
def test_plan_matches_brute_force(case):
    j = job(**case)
    opts = SearchOptions(zero_stages=(0, 1, 3), max_micro_batch=2)
    result = search(j, top=1, time_limit_s=120, options=opts)
    expected = brute_force_best(j, opts)
    assert result.plans, "brute force found a plan the search missed" if expected < float("inf") else "no plan"
    assert result.complete and result.plans[0].status == "optimal"
    got = result.plans[0].time
    assert got == pytest.approx(expected, rel=RESOLUTION)


def test_memory_bound_case_uses_partial_recompute():
    # flash attention: selective recompute saves nothing, so memory is won by fully recomputing some layers (with an
    # eager attention, recomputing its cheap, large scores wins instead)
    j = job(
        model={**SMALL_GPT, "num_layers": 6}, gpu={**TIGHT_GPU, "memory_gib": 4.5}, gbs=4, seq=4096, attention="flash"
    )
    best = search(j, top=1, time_limit_s=60, options=SearchOptions(zero_stages=(0, 1, 3), max_micro_batch=2)).plans[0]
    rec = best.estimate.dims.stage_recompute
    assert rec is not None and 0 < sum(rec) < j.model.num_layers


def test_nothing_fits_is_reported_empty():
    j = job(SMALL_GPT, gpu={**TIGHT_GPU, "memory_gib": 0.5}, gbs=8)
    assert search(j, top=3, time_limit_s=30).plans == []


@pytest.mark.parametrize(
    "opts",
    [
        SearchOptions(partial_recompute=False, allow_cross_node_tp=True),
        SearchOptions(framework=FRAMEWORKS["megatron"], allow_cross_node_tp=True),
    ],
)
def test_cp_sat_models_stay_valid_without_free_recompute_counts(opts):
    """Regression (fuzz seed 1, case 3): hinting a shared constant twice made the CP-SAT model invalid, so
    every solve came back 'unknown' and plans were reported as merely feasible."""
    model = {
        "name": "fuzz",
        "num_layers": 6,
        "hidden_size": 3328,
        "ffn_hidden_size": 13312,
        "num_attention_heads": 104,
        "num_kv_heads": 26,
        "vocab_size": 30480,
        "mlp": "gelu",
        "dropout": True,
        "tie_embeddings": True,
    }
    j = parse_job(
        {
            "model": model,
            "cluster": [{"gpu": "a100-40gb", "nodes": 6, "gpus_per_node": 8}],
            "training": {
                "seq_length": 4096,
                "global_batch_size": 436,
                "attention": "eager",
                "precision": "fp16",
                "optimizer": "sgd",
            },
        }
    )
    result = search(j, top=3, time_limit_s=60, options=opts)
    assert result.plans and result.complete
    assert all(p.status == "optimal" for p in result.plans)


def test_cp_sat_loads_without_pandas_and_leaves_the_real_pandas_importable():
    """partition.cp_sat imports OR-Tools' cp_model with a stand-in for pandas (its import only reads two names):
    the solver works, pandas stays unloaded, and a later `import pandas` gets the real library."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from planner.search.partition import cp_sat\n"
        "cp = cp_sat()\n"
        "m = cp.CpModel(); x = m.new_int_var(0, 9, 'x'); m.maximize(x)\n"
        "s = cp.CpSolver(); assert s.solve(m) == cp.OPTIMAL and s.value(x) == 9\n"
        "print('pandas' in sys.modules)\n"
        "import pandas\n"
        "print(hasattr(pandas, 'DataFrame'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_cp_sat_falls_back_to_the_real_pandas_where_the_stand_in_falls_short():
    """Should OR-Tools read more of pandas at import than the stand-in has, cp_sat imports it again for real."""
    import subprocess
    import sys

    code = (
        "import sys, types\n"
        "import planner.search.partition as p\n"
        "orig = types.ModuleType\n"
        "class Short(types.ModuleType):\n"
        "    def __setattr__(self, name, value):\n"
        "        if name != 'Series': super().__setattr__(name, value)\n"
        "p.types = types.SimpleNamespace(ModuleType=Short)\n"
        "cp = p.cp_sat()\n"
        "print(cp.CpModel is not None, 'pandas' in sys.modules, hasattr(sys.modules.get('pandas'), 'DataFrame'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "True"]


def test_search_runs_without_full_collections_and_restores_the_collector():
    """run_search keeps the cyclic collector's oldest generation out of the search (planner.search
    _older_objects_frozen) and leaves the collector as it found it, also where the search fails."""
    import gc

    import planner.search as search_pkg
    from planner.search import run_search

    before = gc.get_threshold()
    seen = []

    def progress(*_):
        seen.append((gc.get_threshold(), gc.get_freeze_count() > 0))

    run_search(job(SMALL_GPT), SearchOptions(), top=1, time_limit_s=30, progress=progress)
    assert seen and all(t == (*before[:2], search_pkg.NO_FULL_COLLECTION) and frozen for t, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    with pytest.raises(ValueError):
        run_search(job(SMALL_GPT), SearchOptions(), top=1, time_limit_s=30, progress=_fail)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def _fail(*_):
    raise ValueError("stop")


def test_frameworks_without_partial_recompute_checkpoint_every_layer():
    """DeepSpeed and torchtitan recompute all of a stage's layers or none (activation_checkpoint_interval 1, full
    activation checkpointing), one setting for every stage: the CP-SAT model under them gives each stage all its
    layers recomputed or none, all stages alike, and finds such plans; a job that fits only with recompute (and
    not in DeepSpeed's pipeline without it) gets a plan under --framework deepspeed that recomputes every layer
    (recompute full), no faster than the unrestricted best."""
    j = job(model={**SMALL_GPT, "num_layers": 6}, gpu={**TIGHT_GPU, "memory_gib": 4.5}, gbs=4, seq=8192)
    costs = AnalyticCosts(j.cluster[0], j.training.precision)
    capacity = j.cluster[0].gpu.memory_gib * (1 - SearchOptions().memory_margin)
    recomputing = 0
    for name in ("deepspeed", "torchtitan"):
        opts = SearchOptions(zero_stages=(0, 1, 3), max_micro_batch=2, framework=FRAMEWORKS[name]).for_job(j)
        cands, _, _ = enumerate_candidates(j, costs, opts)
        for c in cands:
            sm = StageModel(j, dims_for(j, c), costs)
            res = solve_partition(
                sm, capacity, partial_recompute=opts.partial_recompute, time_limit_s=30, uniform_recompute=True
            )
            if res.plans is None:
                continue
            rec = {p.recomputed == p.layers for p in res.plans}
            assert all(p.recomputed in (0, p.layers) for p in res.plans) and len(rec) == 1, (name, c)
            recomputing += rec == {True}
    assert recomputing
    opts = SearchOptions(zero_stages=(0, 1, 3), max_micro_batch=2, framework=FRAMEWORKS["deepspeed"])
    best = search(j, top=1, time_limit_s=60, options=opts).plans[0]
    assert best.estimate.fits and best.estimate.dims.recompute == "full" and best.estimate.dims.stage_recompute is None
    free = search(j, top=1, time_limit_s=60, options=SearchOptions(zero_stages=(0, 1, 3), max_micro_batch=2))
    assert free.plans[0].time <= best.time * (1 + 1e-9)


def _memory_bound_stage_models() -> tuple[list[StageModel], float]:
    """The stage model of every candidate of a memory-bound job (recompute counts to place), and its GPUs' capacity:
    models whose guarded solves (partition._solve) need conflicts."""
    j = job(
        model={**SMALL_GPT, "num_layers": 6}, gpu={**TIGHT_GPU, "memory_gib": 6.0}, gbs=4, seq=8192, attention="eager"
    )
    costs = AnalyticCosts(j.cluster[0], j.training.precision)
    capacity = j.cluster[0].gpu.memory_gib * (1 - SearchOptions().memory_margin)
    opts = SearchOptions(zero_stages=(0, 1, 3), max_micro_batch=2).for_job(j)
    cands, _, _ = enumerate_candidates(j, costs, opts)
    return [StageModel(j, dims_for(j, c), costs) for c in cands], capacity


def _solvers_made(monkeypatch, partition) -> list:
    """Every CP-SAT solver partition.new_solver makes from here on, in order."""
    made = []
    real_new_solver = partition.new_solver

    def kept(*args, **kwargs):
        made.append(real_new_solver(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(partition, "new_solver", kept)
    return made


def test_a_solve_past_its_conflict_limit_goes_on_without_presolve_to_the_same_optimum(monkeypatch):
    """A presolved solve with a plan to beat, stopped by PRESOLVED_CONFLICTS, is solved again without presolve
    (partition._solve): with the limit at 0, every candidate of a memory-bound job (recompute counts to place) that
    needs a conflict takes the second pass, and gets the same status, objective and bound within PRECISION as the
    plain solve; without a cap (no plan to beat) none does."""
    import planner.search.partition as partition

    sms, capacity = _memory_bound_stage_models()
    solvers = _solvers_made(monkeypatch, partition)
    plain, limited, uncapped = [], [], []
    calls = {}
    for out, limit, cap in ((plain, partition.PRESOLVED_CONFLICTS, 3600.0), (limited, 0, 3600.0), (uncapped, 0, None)):
        monkeypatch.setattr(partition, "PRESOLVED_CONFLICTS", limit)
        solvers.clear()
        for sm in sms:
            out.append(solve_partition(sm, capacity, partial_recompute=True, time_limit_s=30, objective_cap_s=cap))
        calls[cap, limit] = len(solvers)
    assert calls[3600.0, 0] > len(sms)  # (the second pass ran)
    assert calls[None, 0] == len(sms)
    assert len(plain) == len(limited) > 0
    for a, b in zip(plain, limited):
        assert a.status == b.status
        if a.plans is not None:
            assert b.objective_s == pytest.approx(a.objective_s, rel=partition.PRECISION)
            assert b.bound_s == pytest.approx(a.bound_s, rel=partition.PRECISION)


def test_a_solve_reports_the_deterministic_time_of_both_its_passes_the_same_in_every_run(monkeypatch):
    """PartitionResult.work_s (what the mixed search counts a solve's work by, mixed_pipelines.SOLVE_UNITS) is the
    CP-SAT deterministic time of every pass the solve ran: with PRESOLVED_CONFLICTS at 0 the guarded solves of a
    memory-bound job take a second pass, and work_s is the sum of both solvers' times (not the first's, nor the
    answering one's alone); with one worker it is the same when solved again."""
    import planner.search.partition as partition

    sms, capacity = _memory_bound_stage_models()
    made = _solvers_made(monkeypatch, partition)
    monkeypatch.setattr(partition, "PRESOLVED_CONFLICTS", 0)
    two_pass = 0
    for sm in sms:
        runs = []
        for _ in range(2):
            made.clear()
            res = solve_partition(sm, capacity, partial_recompute=True, time_limit_s=30, objective_cap_s=3600.0)
            assert res.work_s == pytest.approx(sum(s.ResponseProto().deterministic_time for s in made), abs=1e-12)
            two_pass += len(made) == 2 and min(s.ResponseProto().deterministic_time for s in made) > 0
            runs.append(res.work_s)
        assert runs[0] == runs[1]
    assert two_pass > 0  # (some solves ran both passes, each with deterministic time of its own)


def test_a_cap_narrows_the_bottleneck_and_tail_domains_and_keeps_every_optimum():
    """A capped model's T (with two or more micro-batches), D and O end at what the cap implies
    (partition._capped_tops), below the horizon where the cap is, and that excludes no point that meets the cap:
    with the cap at each candidate's uncapped optimum, the capped solve finds that optimum; just below it, none."""
    import planner.search.partition as partition

    sms, capacity = _memory_bound_stage_models()
    solved, narrowed = 0, set()
    for sm in sms:
        free = solve_partition(sm, capacity, partial_recompute=True, time_limit_s=30)
        if free.plans is None:
            continue
        solved += 1
        cap = free.objective_s
        at = solve_partition(sm, capacity, partial_recompute=True, time_limit_s=30, objective_cap_s=cap)
        assert at.status == free.status == "optimal"
        assert at.objective_s == pytest.approx(free.objective_s, rel=partition.PRECISION)
        below = solve_partition(
            sm, capacity, partial_recompute=True, time_limit_s=30, objective_cap_s=cap * (1 - 10 * partition.PRECISION)
        )
        assert below.plans is None
        built = partition.build_partition_model(sm, capacity, partial_recompute=True, objective_cap_s=cap)
        tops = {v.name: list(v.domain)[-1] for v in built.model.Proto().variables if v.name in ("T", "D", "O")}
        narrowed.update(name for name, top in tops.items() if top < built.scale.big_t)
        if sm.dims.vpp * sm.mb == 1:
            assert tops["T"] == built.scale.big_t  # (T is not in a one-micro-batch objective)
    assert solved > 0 and narrowed == {"T", "D", "O"}
