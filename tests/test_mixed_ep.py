"""Expert parallelism in mixed-GPU plans (mixed pipelines and replicas on different GPU types): the degree rules
of a mixed layout with ep > 1, the searches against brute force with EP, a plan that the estimator re-prices to
its reported time, and the independent checker (tests/invariants_mixed.py) on EP plans."""

import ast
import copy
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from invariants_mixed import check_mixed_plan
from test_hetero import SMALL, SMALL_GPU, brute_force_best, one_gpu_node_groups
from test_replica_exact import brute_force

import planner.search.mixed_pipelines as mixed_pipelines
import planner.search.replicas as replicas
from planner.cost.estimate import estimate
from planner.cost.provider import cost_source
from planner.errors import SpecError
from planner.gate import layout_input
from planner.load import parse_job
from planner.parallel import dims_from_layout, group_order
from planner.search.mixed_context import MixedContext
from planner.search.mixed_pipelines import HETERO_ZERO, search_hetero
from planner.search.replicas import ReplicaCandidate, _exact_shape, micro_batch_work
from planner.search.space import SearchOptions
from planner.spec import Layout

ROOT = Path(__file__).resolve().parents[1]
EXACT = 1e-6  # the search's best time against the brute-force minimum, relative

# A small MoE model whose routed experts dominate its weights: splitting them over EP ranks frees memory.
MOE = {
    "name": "moe-tiny",
    "num_layers": 3,
    "hidden_size": 1024,
    "ffn_hidden_size": 2816,
    "num_attention_heads": 8,
    "num_kv_heads": 2,
    "vocab_size": 32000,
    "mlp": "swiglu",
    "moe": {"num_experts": 16, "top_k": 2, "expert_ffn_hidden_size": 4096},
}
OPTS = SearchOptions(zero_stages=HETERO_ZERO, max_micro_batch=2)


def tiny_job(nodes: int = 4, memory_gib: float = 6.0, gbs: int = 4, model=MOE):
    """Two groups of one-GPU nodes (TP 1 only): a plan's parallelism is DP, PP and EP."""
    return one_gpu_node_groups(model, nodes=nodes, memory_gib=memory_gib, gbs=gbs)


def without_ep(monkeypatch):
    """Both mixed searches restricted to ep = 1 (what they searched before EP)."""
    monkeypatch.setattr(mixed_pipelines, "ep_options", lambda ctx, dp, cp: [1])
    monkeypatch.setattr(replicas, "_ep_superset", lambda model: [1])


# ----------------------------------------------------------------------------------------------- degree rules


def stages_layout(ep: int, dp: int = 2, cp: int = 1, **extra) -> Layout:
    return Layout.model_validate(
        {
            "dp": dp,
            "pp": 2,
            "cp": cp,
            "ep": ep,
            "micro_batch_size": 1,
            "zero_stage": 1,
            "recompute": "none",
            "stages": [
                {"group": 1, "tp": 1, "layers": 2, "gpus": dp * cp},
                {"group": 0, "tp": 1, "layers": 1, "gpus": dp * cp},
            ],
            **extra,
        }
    )


def test_mixed_layouts_take_ep_by_the_homogeneous_rule():
    """ep > 1 is accepted on an MoE model when it divides every stage's dp*cp ranks and the experts (the rule of
    planner.parallel.ep_error); it carries into the stage models and the layout JSON; vpp stays 1."""
    job = tiny_job()
    est = estimate(job, stages_layout(ep=2), capacity_margin=0.05)
    assert est.dims.ep == 2 and all(est.dims.stage_dims(s).ep == 2 for s in range(2))
    assert est.to_json()["layout"]["ep"] == 2
    assert all(st.time_s["ep_comm"] > 0 for st in est.stages)  # every stage runs MoE layers' all-to-alls
    # experts split over 2 ranks: every stage holds less than with ep = 1
    one = estimate(job, stages_layout(ep=1), capacity_margin=0.05)
    assert all(a.peak_bytes < b.peak_bytes for a, b in zip(est.stages, one.stages))
    for bad, why in (
        (stages_layout(ep=4), r"must divide dp\*cp \(2\)"),  # 4 does not divide 2*1
        (stages_layout(ep=3, dp=3), "not divisible by ep"),  # 16 experts over 3
    ):
        with pytest.raises(SpecError, match=why) as exc:
            dims_from_layout(bad, job).check()
        assert exc.value.field == "layout.ep"
    assert dims_from_layout(stages_layout(ep=4, dp=2, cp=2), job).check().ep == 4  # ep divides dp*cp = 4
    dense = tiny_job(model={**SMALL, "num_layers": 3})
    with pytest.raises(SpecError, match="needs an MoE model"):
        dims_from_layout(stages_layout(ep=2), dense).check()
    with pytest.raises(SpecError) as exc:
        dims_from_layout(stages_layout(ep=2, vpp=3), job)
    assert exc.value.field == "layout.vpp"


def test_each_replica_entry_carves_ep_out_of_its_own_ranks():
    """With replicas, each entry's EP groups lie within its own count*cp ranks (their all-to-alls run in step
    with the entry's micro-batches): ep must divide every entry's count*cp, not only their total."""
    job = tiny_job()

    def layout(ep, counts):
        return Layout.model_validate(
            {
                "ep": ep,
                "micro_batch_size": 1,
                "zero_stage": 1,
                "recompute": "none",
                "replicas": [
                    {
                        "count": c,
                        "micro_batches": 1,
                        "stages": [{"group": g, "tp": 1, "layers": 3, "gpus": c}],
                    }
                    for g, c in enumerate(counts)
                ],
            }
        )

    est = estimate(job, layout(2, (2, 2)), capacity_margin=0.05)
    assert est.dims.replicas[0].ep == 2 and est.to_json()["layout"]["ep"] == 2
    with pytest.raises(SpecError, match=r"must divide dp\*cp \(3\) of layout.replicas\[0\]") as exc:
        dims_from_layout(layout(2, (3, 1)), job).check()  # their total, 4, would take ep 2; each entry does not
    assert exc.value.field == "layout.ep"


# ----------------------------------------------------------------------------------------------- searches


@pytest.mark.parametrize(
    "case",
    [
        # memory-bound: with ep = 1 only a plan that recomputes fits (8x slower); the optimum runs ep = 4
        dict(nodes=4, memory_gib=6.0, gbs=4),
        dict(nodes=2, memory_gib=10.0, gbs=4),
    ],
)
def test_mixed_pipeline_search_with_ep_matches_brute_force(case, monkeypatch):
    """Every dp, cp, ep, micro-batch, ZeRO stage, per-group TP and stage count, group order, layer split and
    recompute count, each evaluated by the estimator (tests/test_hetero.brute_force_best, its EP degrees written
    there): the search's best time is the minimum, and it uses EP."""
    job = tiny_job(**case)
    result = search_hetero(job, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False)
    expected = brute_force_best(job, OPTS)
    assert result.plans and result.complete and result.plans[0].status == "optimal"
    assert result.plans[0].time == pytest.approx(expected, rel=EXACT)
    assert result.plans[0].estimate.dims.ep > 1
    without_ep(monkeypatch)
    ep1 = search_hetero(job, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False)
    assert ep1.plans and ep1.plans[0].time > expected * (1 + EXACT)


def test_mixed_pipeline_bounds_hold_for_ep_plans():
    """Every bound on the way to a mixed-pipeline candidate with EP (_TpChoiceNode, family boxes, the candidate's
    refined bound, also probed at its best time) is at most the best plan of that candidate (tests/test_bounds.py's
    check, on an MoE job where EP moves memory and time)."""
    from test_bounds import assert_bounds_hold, candidates_with_bounds

    job = tiny_job(nodes=2, memory_gib=10.0)
    ctx = MixedContext(job, OPTS, None, cost_source(job), group_order(job.cluster))
    found = candidates_with_bounds(ctx)
    assert {c.ep for _, _, c in found} == {1, 2}  # dp <= 2 on two one-GPU nodes per group
    rng = random.Random(7)
    sample = rng.sample([x for x in found if x[2].ep > 1], 30) + rng.sample([x for x in found if x[2].ep == 1], 10)
    assert_bounds_hold(ctx, sample)


def test_exact_replica_shape_with_ep_is_the_brute_force_optimum(monkeypatch):
    """A pipelined replica shape with ep = 2 (two replicas per group, so ep divides each entry's count): the exact
    split (planner/search/replica_partition.py) is the brute-force optimum; with ep = 1 nothing fits."""
    import planner.cost.estimate as E

    model = {**MOE, "num_layers": 4, "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 2048}}
    job = parse_job(
        {
            "model": model,
            "cluster": [
                {"gpu": SMALL_GPU, "nodes": 1, "gpus_per_node": 4},
                {"gpu": "a100-40gb", "nodes": 1, "gpus_per_node": 4},
            ],
            "training": {"seq_length": 4096, "global_batch_size": 8, "attention": "eager"},
        }
    )
    shared = E.costs_by_group(job)  # one cost source for the brute force's many estimates (its caches)
    monkeypatch.setattr(E, "costs_by_group", lambda job, cal=None: shared)
    ctx = MixedContext(job, SearchOptions(), None, cost_source(job), group_order(job.cluster))
    shape, base, counts, zero = (1, 1, 2, 1), "none", ((0, 2), (1, 2)), 1
    found = {}
    for ep in (1, 2):
        work = [micro_batch_work(ctx, g, 1, 1, 1, base, ep) for g, _ in counts]
        cand = ReplicaCandidate(*shape, zero, base, counts, 0.0, ep)
        est, proven, open_s = _exact_shape(ctx, cand, None, 120.0, 1, float("inf"), work)
        assert proven and open_s == float("inf")
        found[ep] = (est, brute_force(job, shape, zero, counts, base, ep))
    assert found[1] == (None, float("inf"))
    est, expected = found[2]
    assert est is not None and est.dims.replicas[0].ep == 2
    assert est.iteration_time_s == pytest.approx(expected, rel=EXACT)


MIXED_JOB = """
model:
  name: moe-small
  num_layers: 4
  hidden_size: 1024
  ffn_hidden_size: 2816
  num_attention_heads: 16
  num_kv_heads: 4
  vocab_size: 32000
  mlp: swiglu
  moe: {num_experts: 16, top_k: 2, expert_ffn_hidden_size: 1408}
cluster:
  - {gpu: h100-sxm, nodes: 2, gpus_per_node: 4}
  - {gpu: a100-80gb, nodes: 2, gpus_per_node: 4}
training: {seq_length: 4096, global_batch_size: 32, attention: flash}
"""


def planner_cli(*args) -> str:
    proc = subprocess.run([sys.executable, "-m", "planner", *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def mixed_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixed-ep") / "job.yaml"
    path.write_text(MIXED_JOB)
    doc = json.loads(planner_cli("plan", path, "--json", "--top", "1", "--no-timing", "--time-limit", "60"))
    return path, doc


def test_mixed_moe_plan_uses_ep_and_reestimates_to_its_time(mixed_moe, monkeypatch, tmp_path):
    """2 nodes of H100 + 2 of A100-80GB, a small MoE model: the best plan runs EP and is at least as fast as the
    best plan without EP, and `planner estimate` of its layout gives the time the plan reports."""
    path, doc = mixed_moe
    plan = doc["plans"][0]
    assert plan["layout"]["ep"] > 1
    job = parse_job(__import__("yaml").safe_load(MIXED_JOB))
    without_ep(monkeypatch)
    ep1 = search_hetero(job, top=1, time_limit_s=60, single_type=False)
    assert ep1.plans and all(p.estimate.dims.as_dict()["ep"] == 1 for p in ep1.plans)
    assert plan["estimate"]["iteration_time_s"] <= ep1.plans[0].time * (1 + EXACT)
    again = tmp_path / "again.yaml"
    again.write_text(MIXED_JOB + "layout: " + json.dumps(layout_input(plan["layout"])) + "\n")
    est = json.loads(planner_cli("estimate", again, "--json"))
    assert est["fits"] and est["layout"]["ep"] == plan["layout"]["ep"]
    assert est["iteration_time_s"] == plan["estimate"]["iteration_time_s"]


def test_mixed_checker_accepts_ep_plans_and_catches_broken_ep(mixed_moe):
    """tests/invariants_mixed.py checks EP by its own rule (a divisor of the experts and of each pipeline entry's
    count*cp), importing nothing from planner: an EP plan passes, a broken ep is caught."""
    path, doc = mixed_moe
    tree = ast.parse((ROOT / "tests" / "invariants_mixed.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [name for name in imported if name.split(".")[0] == "planner"]
    job = parse_job(__import__("yaml").safe_load(MIXED_JOB))
    good = doc["plans"][0]
    assert good["layout"]["ep"] > 1 and check_mixed_plan(job, good, 0.05) == []

    def broken(ep):
        p = copy.deepcopy(good)
        p["layout"]["ep"] = ep
        return check_mixed_plan(job, p, 0.05)

    assert broken(3)  # 16 experts do not split over 3 ranks
    pipes = good["layout"].get("replicas") or [{"count": good["layout"]["dp"]}]
    assert broken(2 * max(r["count"] for r in pipes) * good["layout"]["cp"])  # more than a stage's ranks
    assert broken(0)
    dense = parse_job({**__import__("yaml").safe_load(MIXED_JOB), "model": {**SMALL, "num_layers": 4}})
    assert any("without experts" in v for v in check_mixed_plan(dense, good, 0.05))


def test_a_stage_of_an_all_moe_model_holds_no_more_layers_than_its_moe_layers_fit():
    """The memory cap of the mixed bounds (StageModel.most_layers) counts only the layer kinds the model has: an
    all-MoE model has no lighter dense layer to fill a stage with; a model with a few dense layers fills with
    at most that many."""
    from planner.cost.stage import StageModel

    job = tiny_job()
    dims = mixed_pipelines.pipeline_dims(job, (0, 0, 0), (1, 1, 1), 1, 1, 1, 1, "none")
    sm = StageModel(job, dims.stage_dims(0), cost_source(job)(0))
    memory = sm.allocated_memory(False, False)

    def lean(kind):
        return memory.per_layer(kind, 1) + min(0.0, memory.per_recomputed(kind, 1))

    assert lean("dense") < lean("moe")
    room = 1.5 * lean("moe")  # the old cap, room / lean("dense"), held 2 or more of the 3 MoE layers
    assert room / lean("dense") >= 2
    assert sm.most_layers(room, 1) == 1
    dense_first = {**MOE, "moe": {**MOE["moe"], "first_dense_layers": 1}}
    mixed = parse_job({**job.model_dump(mode="json", exclude_none=True), "model": dense_first})
    sm = StageModel(mixed, dims.stage_dims(0), cost_source(mixed)(0))
    assert sm.most_layers(room, 1) == 1 + min(2, int((room - lean("dense")) / lean("moe")))
