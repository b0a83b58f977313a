"""Interleaving (virtual pipeline stages, vpp > 1) in mixed pipelines: the degree rules of a mixed layout with
vpp (the homogeneous rule, planner.parallel.vpp_error: stages of whole chunks, micro-batches in rounds of pp;
replicas keep vpp = 1), its pricing through the stage models (bubble, in-flight micro-batches, per-chunk sends on
the links between groups, the pipeline a ring), the search against brute force, the bounds on the way, the
independent checker (tests/invariants_mixed.py) and a plan that `planner estimate` re-prices to its time."""

import copy
import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from invariants_mixed import check_mixed_plan
from test_bounds import candidate_plans
from test_hetero import SMALL, SMALL_GPU, brute_force_best, compositions, interleaving_degrees, one_gpu_node_groups

import planner.search.mixed_pipelines as mixed_pipelines
from planner.cost.estimate import estimate, hetero_stage_models, neighbour_links
from planner.cost.provider import cost_source
from planner.cost.schedule import pipeline_time
from planner.cost.stage import StageModel
from planner.errors import SpecError
from planner.gate import layout_input
from planner.load import parse_job
from planner.parallel import dims_from_layout, group_order
from planner.search.mixed_context import MixedContext
from planner.search.mixed_pipeline_bounds import refined_bound, schedule_bound
from planner.search.mixed_pipelines import HETERO_ZERO, search_hetero
from planner.search.space import SearchOptions
from planner.spec import Layout

ROOT = Path(__file__).resolve().parents[1]
EXACT = 1e-6  # the search's best time against the brute-force minimum, relative
SLACK = 1 + 1e-9  # float rounding between a bound and the estimator
OPTS = SearchOptions(zero_stages=HETERO_ZERO, max_micro_batch=2)


def tiny_job(layers: int = 4, nodes: int = 2, gbs: int = 4, memory_gib: float = 6.0, links=None):
    """Two groups of one-GPU nodes (TP 1 only): a plan's parallelism is DP, CP, PP and interleaving."""
    model = {**SMALL, "num_layers": layers}
    return one_gpu_node_groups(model, nodes=nodes, memory_gib=memory_gib, gbs=gbs, links=links)


def stages_layout(vpp: int, layers=(2, 2), dp: int = 1, mbs: int = 1, **extra) -> Layout:
    return Layout.model_validate(
        {
            "dp": dp,
            "pp": len(layers),
            "vpp": vpp,
            "micro_batch_size": mbs,
            "zero_stage": 1,
            "recompute": "none",
            "stages": [{"group": i % 2, "tp": 1, "layers": n, "gpus": dp} for i, n in enumerate(layers)],
            **extra,
        }
    )


# ----------------------------------------------------------------------------------------------- degree rules


def test_mixed_layouts_take_vpp_by_the_homogeneous_rule():
    """vpp > 1 is accepted when every stage holds whole chunks and the micro-batches come in rounds of pp; it
    carries into every stage's model and the layout JSON, shrinks the bubble to 1/vpp (the same stage times
    through planner/cost/schedule.py), keeps more micro-batches in flight and sends once per chunk."""
    job = tiny_job()
    one = estimate(job, stages_layout(1), capacity_margin=0.05)
    two = estimate(job, stages_layout(2), capacity_margin=0.05)
    assert two.dims.vpp == 2 and all(two.dims.stage_dims(s).vpp == 2 for s in range(2))
    assert two.to_json()["layout"]["vpp"] == 2 and one.to_json()["layout"]["vpp"] == 1
    times = [st.microbatch_time_s for st in two.stages]
    steady, bubble = pipeline_time(times, 2, two.dims.num_microbatches)
    assert two.time_breakdown_s["pipeline_bubble"] == pytest.approx(bubble, rel=1e-12)
    assert bubble == pytest.approx((sum(times) - max(times)) / 2, rel=1e-12)
    for a, b in zip(one.stages, two.stages):
        # one send each way per chunk (the two groups' NICs and the link between them run at one rate here)
        assert b.time_s["pp_comm"] == pytest.approx(2 * a.time_s["pp_comm"])
        assert b.time_s["compute"] == pytest.approx(a.time_s["compute"])
        assert b.peak_bytes > a.peak_bytes  # more micro-batches in flight (memory.inflight_microbatches)


@pytest.mark.parametrize(
    "gbs, layout, why",
    [
        (4, stages_layout(2, layers=(3, 1)), r"stage layer counts \[1, 3\] are not divisible by vpp \(2\)"),
        (3, stages_layout(2), r"micro-batches per replica \(3\) divisible by pp \(2\)"),
        (4, stages_layout(4, layers=(4,)), r"needs pp > 1"),
    ],
)
def test_mixed_vpp_rules_name_the_field(gbs, layout, why):
    """The rules of planner.parallel.vpp_error, each naming layout.vpp: whole chunks per stage, micro-batches in
    rounds of pp, a pipeline."""
    job = tiny_job(gbs=gbs)
    with pytest.raises(SpecError, match=why) as exc:
        dims_from_layout(layout, job).check()
    assert exc.value.field == "layout.vpp"
    assert dims_from_layout(stages_layout(2), tiny_job(gbs=4)).check().vpp == 2  # the control: accepted


def test_replicas_keep_vpp_one():
    job = tiny_job()
    lay = Layout.model_validate(
        {
            "vpp": 2,
            "micro_batch_size": 1,
            "zero_stage": 1,
            "recompute": "none",
            "replicas": [
                {"count": 1, "micro_batches": 2, "stages": [{"group": g, "tp": 1, "layers": 4, "gpus": 1}]}
                for g in range(2)
            ],
        }
    )
    with pytest.raises(SpecError, match="replicas need vpp = 1") as exc:
        dims_from_layout(lay, job)
    assert exc.value.field == "layout.vpp"


def job_yaml(layout: dict, layers: int = 4) -> str:
    raw = {
        "model": {**SMALL, "num_layers": layers},
        "cluster": [
            {"gpu": {**SMALL_GPU, "memory_gib": 6.0}, "nodes": 2, "gpus_per_node": 1},
            {"gpu": {**SMALL_GPU, "name": "small-b", "memory_gib": 9.0, "peak_tflops_bf16": 200}, "nodes": 2,
             "gpus_per_node": 1},
        ],
        "training": {"seq_length": 2048, "global_batch_size": 4, "attention": "flash"},
        "layout": layout,
    }  # fmt: skip
    return yaml.safe_dump(raw, sort_keys=False)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "planner", *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def test_cli_estimate_rejects_a_bad_mixed_vpp_with_exit_2(tmp_path):
    """`planner estimate` of a mixed layout whose stages are not whole chunks: exit 2, one line naming layout.vpp
    (no traceback); the same layout with whole chunks prices."""
    bad = tmp_path / "bad.yaml"
    lay = stages_layout(2, layers=(3, 1)).model_dump(exclude_none=True)
    bad.write_text(job_yaml(lay))
    proc = cli("estimate", bad)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "layout.vpp" in lines[0] and "Traceback" not in proc.stderr
    good = tmp_path / "good.yaml"
    good.write_text(job_yaml(stages_layout(2).model_dump(exclude_none=True)))
    proc = cli("estimate", good, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["layout"]["vpp"] == 2


def test_interleaved_mixed_pipeline_is_a_ring_of_group_links():
    """With vpp > 1 the last stage's chunks feed the first stage's next chunks: on a two-group pipeline both
    stages send to and receive from the other group, every chunk over the link between the groups."""
    job = tiny_job(links=[{"groups": [0, 1], "gbps": 10}])
    costs = cost_source(job)
    for vpp in (1, 2):
        dims = dims_from_layout(stages_layout(vpp), job).check()
        sms = [StageModel(job, dims.stage_dims(s), costs(g)) for s, g in enumerate(dims.stage_groups)]
        links = neighbour_links(job, dims.stage_groups, sms)
        if vpp == 1:
            assert links[0][0] is None and links[1][1] is None  # a line: no neighbour before 0 or after 1
            continue
        assert all(prev is not None and nxt is not None for prev, nxt in links)
        priced = hetero_stage_models(job, dims, costs)
        for sm, (prev, nxt) in zip(priced, links):
            assert sm.pp_time == pytest.approx(vpp * (prev.p2p(sm.send_bytes) + nxt.p2p(sm.send_bytes)))


def test_schedule_bound_is_the_schedule():
    """The bounds' schedule term (mixed_pipeline_bounds.schedule_bound) is planner/cost/schedule.pipeline_time
    at the stages' largest and summed times, for 1F1B and interleaved schedules."""
    rng = random.Random(3)
    for _ in range(200):
        times = [rng.uniform(0.1, 2.0) for _ in range(rng.randint(1, 6))]
        m, v = rng.randint(1, 9), rng.choice((1, 2, 3, 4))
        assert schedule_bound(max(times), sum(times), m, v) == pytest.approx(sum(pipeline_time(times, v, m)))


# ----------------------------------------------------------------------------------------------- searches


def only_vpp_one(monkeypatch):
    """The mixed-pipeline search restricted to vpp = 1 (what it searched before interleaving)."""
    monkeypatch.setattr(mixed_pipelines, "vpp_options", lambda ctx, mb, max_pp: [1])


CASES = [
    dict(layers=4, nodes=2, gbs=4),
    dict(layers=6, nodes=2, gbs=4),
]


@pytest.mark.parametrize("case", CASES)
def test_mixed_pipeline_search_with_vpp_matches_brute_force(case, monkeypatch):
    """Every dp, cp, micro-batch, ZeRO stage, per-group stage count, group order, vpp, layer split in whole chunks
    and recompute count, each evaluated by the estimator (tests/test_hetero.brute_force_best, its vpp rule
    written there): the search's best time is the minimum."""
    job = tiny_job(**case)
    result = search_hetero(job, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False)
    expected = brute_force_best(job, OPTS)
    assert result.plans and result.complete and result.plans[0].status == "optimal"
    assert result.plans[0].time == pytest.approx(expected, rel=EXACT)


def test_the_optimum_interleaves_and_beats_vpp_one(monkeypatch):
    """On the first case the best plan runs vpp > 1, faster than the best plan with vpp = 1 (the brute force
    restricted to vpp = 1 agrees with the search restricted to it)."""
    job = tiny_job(**CASES[0])
    result = search_hetero(job, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False)
    assert result.plans[0].estimate.dims.vpp > 1
    only_vpp_one(monkeypatch)
    flat = search_hetero(job, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False)
    assert flat.plans and flat.plans[0].estimate.dims.vpp == 1
    assert flat.plans[0].time == pytest.approx(brute_force_best(job, OPTS, vpps=(1,)), rel=EXACT)
    assert result.plans[0].time < flat.plans[0].time * (1 - EXACT)


def test_frameworks_without_interleaving_keep_vpp_one():
    """--framework deepspeed has no interleaved schedule (planner/frameworks.py): its mixed plans keep vpp = 1;
    megatron interleaves."""
    from planner.frameworks import FRAMEWORKS

    job = tiny_job(**CASES[0])
    for name, interleaves in (("deepspeed", False), ("megatron", True)):
        opts = SearchOptions(zero_stages=HETERO_ZERO, max_micro_batch=2, framework=FRAMEWORKS[name])
        res = search_hetero(job, top=3, time_limit_s=60, options=opts, single_type=False, replicas=False)
        assert res.plans
        vpps = {p.estimate.dims.vpp for p in res.plans}
        assert (max(vpps) > 1) == interleaves, (name, vpps)


def brute_candidate(job, c, ctx) -> float:
    """Best fitting time of one candidate over its valid splits (whole chunks) and recompute counts."""
    fitting = [est.iteration_time_s for _, _, est in candidate_plans(job, c, ctx, 0.05) if est.fits]
    return min(fitting, default=float("inf"))


BOUND_JOB = dict(layers=6, nodes=2, gbs=8, links=[{"groups": [0, 1], "gbps": 25}])


@pytest.fixture(scope="module")
def every_candidate():
    """Every mixed-pipeline candidate of BOUND_JOB with the bounds on the way to it (tests/test_bounds.py's walk)."""
    from test_bounds import candidates_with_bounds

    job = tiny_job(**BOUND_JOB)
    ctx = MixedContext(job, OPTS, None, cost_source(job), group_order(job.cluster))
    return job, ctx, candidates_with_bounds(ctx)


def test_candidates_take_vpp_exactly_where_check_accepts_it(every_candidate):
    """The search proposes a vpp at a depth exactly where HeteroDims.check() accepts it with some split (the rule
    lives in planner/parallel.py); every candidate passes check() with its most even split in whole chunks."""
    job, _, found = every_candidate
    L = job.model.num_layers
    shapes = {}
    for _, _, c in found:
        shapes.setdefault((c.dp, c.cp, c.mbs, c.zero, c.recompute, c.groups), set()).add(c.vpp)
        chunks = [L // c.vpp // c.pp + (1 if i < L // c.vpp % c.pp else 0) for i in range(c.pp)]
        assert c.dims(job, tuple(c.vpp * n for n in chunks)).check().vpp == c.vpp
    assert any(len(v) > 1 for v in shapes.values())
    for (dp, cp, mbs, zero, base, groups), vpps in shapes.items():
        c = mixed_pipelines.HeteroCandidate(dp, cp, mbs, zero, base, groups, 0.0)
        accepted = set()
        for vpp in range(1, L + 1):
            for split in compositions(L, c.pp):
                try:
                    dataclasses.replace(c.dims(job, split), vpp=vpp).check()
                except SpecError:
                    continue
                accepted.add(vpp)
                break
        assert vpps == accepted, (groups, dp, mbs)


def check_candidate_bounds(job, ctx, sample, above: float | None = None) -> int:
    """Every bound on the way to each sampled (bounds, family, candidate) and its refined bound are at most the
    candidate's best plan (brute force); the refined bound probed at that best time (``above`` None: it must not
    exceed it) or just above it (``above``: the factor; it must not reach it: an invalid prune would). Returns the
    candidates that have a plan that fits."""
    cache: dict = {}
    fitting = 0
    for bounds, fam, c in sample:
        best = brute_candidate(job, c, ctx)
        what = f"{c.groups} dp{c.dp} cp{c.cp} vpp{c.vpp} mbs{c.mbs} z{c.zero} {c.recompute}"
        assert all(b <= best * SLACK for b in bounds), what
        sms = mixed_pipelines._stage_models(ctx, c, cache)
        assert refined_bound(ctx, fam, c, sms) <= best * SLACK, what
        if best < float("inf"):
            fitting += 1
            if above is None:
                assert refined_bound(ctx, fam, c, sms, best) <= best * SLACK, what
            else:
                assert refined_bound(ctx, fam, c, sms, best * above) < best * above, what
    return fitting


def test_mixed_pipeline_bounds_hold_for_vpp_plans(every_candidate):
    """Every bound on the way to a mixed-pipeline candidate with vpp > 1 (_TpChoiceNode, family boxes, the
    candidate's refined bound, also probed at its best time) is at most the best plan of that candidate."""
    job, ctx, found = every_candidate
    L = job.model.num_layers
    assert {c.vpp for _, _, c in found} >= {1, 2, 3}
    rng = random.Random(11)
    sample = rng.sample([x for x in found if x[2].vpp > 1], 30)
    for _, _, c in sample:
        assert c.vpp in interleaving_degrees(L, c.pp, job.training.global_batch_size // (c.mbs * c.dp))
    assert check_candidate_bounds(job, ctx, sample)


def test_mixed_pipeline_bounds_hold_for_vpp_plans_of_a_model_with_dense_and_moe_layers():
    """An MoE model with a dense first layer and an MoE layer every other layer after it, interleaved: the refined
    bound (its two layer kinds, its memory and its DP tail counted for a stage's layers as the cost model counts
    them) is at most each candidate's best plan, and probed just above it does not reach it."""
    from test_bounds import MOE6, candidates_with_bounds

    model = {**MOE6, "num_layers": 6, "moe": {**MOE6["moe"], "moe_layer_freq": 2}}
    job = one_gpu_node_groups(model, nodes=2, memory_gib=6.0, gbs=8, links=[{"groups": [0, 1], "gbps": 25}])
    ctx = MixedContext(job, OPTS, None, cost_source(job), group_order(job.cluster))
    found = [x for x in candidates_with_bounds(ctx) if x[2].vpp > 1]
    rng = random.Random(5)
    assert check_candidate_bounds(job, ctx, rng.sample(found, min(30, len(found))), above=1.001)


# ----------------------------------------------------------------------------------------------- CLI and checker


MIXED_JOB = job_yaml(None).replace("layout: null\n", "")


@pytest.fixture(scope="module")
def vpp_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixed-vpp") / "job.yaml"
    path.write_text(MIXED_JOB)
    # Megatron-LM runs interleaved pipelines with uneven stages (and no replicas that differ): the plan is a mixed
    # pipeline
    proc = cli("plan", path, "--json", "--top", "1", "--no-timing", "--time-limit", "60", "--framework", "megatron")
    assert proc.returncode == 0, proc.stderr
    return path, json.loads(proc.stdout)


def test_vpp_plan_reestimates_to_its_time(vpp_plan, tmp_path):
    """`planner plan --framework megatron` finds an interleaved mixed pipeline; `planner estimate` of its layout
    gives the time the plan reports."""
    _, doc = vpp_plan
    plan = doc["plans"][0]
    assert plan["layout"]["vpp"] > 1 and plan["layout"]["stages"]
    again = tmp_path / "again.yaml"
    again.write_text(MIXED_JOB + "layout: " + json.dumps(layout_input(plan["layout"])) + "\n")
    proc = cli("estimate", again, "--json")
    assert proc.returncode == 0, proc.stderr
    est = json.loads(proc.stdout)
    assert est["fits"] and est["layout"]["vpp"] == plan["layout"]["vpp"]
    assert est["iteration_time_s"] == plan["estimate"]["iteration_time_s"]


def test_mixed_checker_accepts_vpp_plans_and_catches_broken_vpp(vpp_plan):
    """tests/invariants_mixed.py checks interleaving by its own rule (stages of whole chunks, micro-batches in
    rounds of the stage count, a pipeline of two or more stages, no replicas): an interleaved plan passes, a broken
    vpp is caught."""
    _, doc = vpp_plan
    job = parse_job(yaml.safe_load(MIXED_JOB))
    good = doc["plans"][0]
    assert good["layout"]["vpp"] > 1 and check_mixed_plan(job, good, 0.05) == []

    def broken(edit):
        p = copy.deepcopy(good)
        edit(p["layout"])
        return check_mixed_plan(job, p, 0.05)

    layers = [s["layers"] for s in good["layout"]["stages"]]
    odd = next(v for v in range(2, 9) if any(n % v for n in layers))
    assert any("whole chunks" in v for v in broken(lambda lay: lay.update(vpp=odd)))
    assert any("not a positive integer" in v for v in broken(lambda lay: lay.update(vpp=0)))

    def rounds(lay):  # a micro-batch count that is not a multiple of the stages (batch kept consistent)
        lay["num_microbatches"] += 1

    assert any("rounds" in v or "micro-batches not a multiple" in v for v in broken(rounds))

    def as_replicas(lay):
        stages = lay.pop("stages")
        lay["replicas"] = [{"count": lay["dp"], "micro_batches": lay["num_microbatches"], "stages": stages}]

    assert any("replicas with vpp" in v for v in broken(as_replicas))
