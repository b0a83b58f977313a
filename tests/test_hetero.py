"""Heterogeneous plans (stages on different GPU types): search vs brute force, per-stage memory, estimate of a
hetero layout file, the --framework restriction, and the plan JSON schema."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from planner.cost.estimate import costs_by_group, evaluate_stages, with_group_sends
from planner.cost.memory import GIB
from planner.cost.stage import StageModel, split_kinds
from planner.load import parse_job
from planner.parallel import group_order, tp_heads_error
from planner.search.mixed_pipelines import HETERO_ZERO, HeteroCandidate, search_hetero
from planner.search.quick import RESOLUTION
from planner.search.space import SearchOptions, divisors

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "name": "gpt-small",
    "num_layers": 6,
    "hidden_size": 1024,
    "ffn_hidden_size": 4096,
    "num_attention_heads": 16,
    "vocab_size": 32000,
    "mlp": "gelu",
}
SMALL_GPU = {
    "memory_gib": 6.0,
    "peak_tflops_bf16": 312,
    "hbm_tbps": 2.0,
    "intra_node_gbps": 300,
    "inter_node_gbps": 200,
    "name": "small-gpu",
}
OPTS = SearchOptions(zero_stages=HETERO_ZERO, max_micro_batch=2)


def one_gpu_node_groups(model: dict, *, nodes: int, memory_gib: float, gbs: int, links=None):
    """A job on two groups of one-GPU nodes (TP 1 only), the second slower and roomier (tests/test_mixed_ep.py,
    tests/test_mixed_vpp.py)."""
    raw = {
        "model": model,
        "cluster": [
            {"gpu": {**SMALL_GPU, "memory_gib": memory_gib}, "nodes": nodes, "gpus_per_node": 1},
            {
                "gpu": {**SMALL_GPU, "name": "small-b", "memory_gib": memory_gib * 1.5, "peak_tflops_bf16": 200},
                "nodes": nodes,
                "gpus_per_node": 1,
            },
        ],
        "training": {"seq_length": 2048, "global_batch_size": gbs, "attention": "flash"},
    }
    if links:
        raw["links"] = links
    return parse_job(raw)


def small_job():
    return parse_job(
        {
            "model": SMALL,
            "cluster": [
                {"gpu": SMALL_GPU, "nodes": 1, "gpus_per_node": 4},
                {"gpu": "a100-40gb", "nodes": 1, "gpus_per_node": 4},
            ],
            "training": {"seq_length": 8192, "global_batch_size": 4, "attention": "eager"},
        }
    )


def compositions(total, parts):
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in compositions(total - first, parts - 1):
            yield (first,) + rest


def expert_degrees(model, dp, cp):
    """EP degrees of a plan (written here, not read from planner.parallel): 1, or with experts a divisor of the
    expert count that divides the dp*cp ranks of each stage."""
    if model.moe is None:
        return [1]
    return [ep for ep in divisors(model.moe.num_experts) if (dp * cp) % ep == 0]


def interleaving_degrees(L, pp, microbatches, allowed=None):
    """vpp of a mixed pipeline (written here, not read from planner.parallel): 1, or with two or more stages a
    degree whose chunks tile every stage (a divisor of the layers, at least one chunk per stage) when the
    micro-batches come in rounds of one per stage (Megatron's interleaved schedule). ``allowed``: the degrees the
    framework runs (None: all)."""
    out = [1]
    if pp >= 2 and microbatches % pp == 0:
        out += [v for v in range(2, L // pp + 1) if L % v == 0]
    return [v for v in out if allowed is None or v in allowed]


def brute_force_best(j, opts, vpps=None):
    """Every dp, cp, ep, micro-batch, ZeRO, per-group (tp, stage count), interleaving degree, layer composition (in
    whole chunks) and recompute count. ``vpps``: the interleaving degrees allowed (None: all)."""
    L, t = j.model.num_layers, j.training
    costs = costs_by_group(j)
    order = group_order(j.cluster)
    best = float("inf")
    models = {}  # a StageModel depends on the degrees only, not on the split

    def stage_model(dims, s, g):
        key = (g, dims.stage_tp[s], dims.dp, dims.cp, dims.ep, dims.micro_batch_size, dims.zero_stage, dims.recompute)
        key += (dims.pp, dims.vpp)
        if key not in models:
            models[key] = StageModel(j, dims.stage_dims(s), costs(g))
        return models[key]

    cps = [cp for cp in divisors(max(g.num_gpus for g in j.cluster)) if t.seq_length % (2 * cp) == 0]
    for dp, cp in itertools.product(divisors(t.global_batch_size), cps):
        for ep, mbs in itertools.product(
            expert_degrees(j.model, dp, cp),
            [x for x in divisors(t.global_batch_size // dp) if x <= opts.max_micro_batch],
        ):
            per_group = []
            for g in order:
                gpn, n = j.cluster[g].gpus_per_node, j.cluster[g].num_gpus
                per_group.append(
                    [None]
                    + [
                        (g, tp, k)
                        for tp in divisors(gpn)
                        if tp_heads_error(j.model, tp) is None and t.seq_length // cp % tp == 0
                        for k in range(1, n // (tp * cp * dp) + 1)
                    ]
                )
            for zero, base in itertools.product(opts.zero_stages, ["none", "selective"]):
                for choice in itertools.product(*per_group):
                    used = tuple(x for x in choice if x)
                    if not used or sum(k for _, _, k in used) > L:
                        continue
                    pp = sum(k for _, _, k in used)
                    for groups, vpp in itertools.product(  # every pipeline order of the groups, every vpp
                        itertools.permutations(used),
                        interleaving_degrees(L, pp, t.global_batch_size // (mbs * dp), vpps),
                    ):
                        cand = HeteroCandidate(dp, cp, mbs, zero, base, groups, 0.0, ep, vpp)
                        best = min(best, _best_of(j, cand, L, opts, stage_model))
    return best


def _best_of(j, c, L, opts, stage_model) -> float:
    """Every layer composition (each stage whole chunks of vpp layers) and recompute count of one candidate."""
    best = float("inf")
    sent = {}  # the stage models with their sends, by whether every layer is recomputed (the rest is per split)
    for chunks in compositions(L // c.vpp, c.pp):
        split = tuple(c.vpp * n for n in chunks)
        for rec in itertools.product(*[range(n + 1) for n in split]):
            full = all(r == n for r, n in zip(rec, split))
            dims = c.dims(j, split, None if full or not any(rec) else rec, "full" if full else c.recompute)
            if full not in sent:
                models = [stage_model(dims, s, g) for s, g in enumerate(c.stage_groups)]
                sent[full] = with_group_sends(j, c.stage_groups, models)
            sms = sent[full]
            plans = split_kinds(j, split, dims.stage_recompute, full)
            est = evaluate_stages(j, dims, sms, plans, opts.memory_margin)
            if est.fits and est.iteration_time_s < best:
                best = est.iteration_time_s
    return best


def test_hetero_search_matches_brute_force():
    j = small_job()
    result = search_hetero(j, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False)
    expected = brute_force_best(j, OPTS)
    assert result.plans and result.complete and result.plans[0].status == "optimal"
    assert result.plans[0].time == pytest.approx(expected, rel=RESOLUTION)


def test_capped_first_solves_keep_the_brute_force_optimum(monkeypatch):
    """While no plan is known a candidate is solved capped just above its bound (solve_capped) and goes back in line
    at the cap where nothing lies below it. With a cap so tight that most such solves find nothing (0.1%), and no
    solve-at-once rule (replicas=False sets it: solve_first), the search still ends at the brute-force optimum,
    proven, having put candidates back."""
    from planner.search import mixed_pipelines as mp

    monkeypatch.setattr(mp, "FIRST_CAP", 0.001)
    made = mp._PipelineSearch.__init__

    def no_solve_first(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.solve_first = False

    put_back = []
    capped = mp._PipelineSearch.solve_capped

    def counted(self, c, sms, bound, family):
        before = len(self.heap)
        capped(self, c, sms, bound, family)
        put_back.append(len(self.heap) > before)

    monkeypatch.setattr(mp._PipelineSearch, "__init__", no_solve_first)
    monkeypatch.setattr(mp._PipelineSearch, "solve_capped", counted)
    j = small_job()
    result = search_hetero(j, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False, processes=1)
    assert any(put_back)
    assert result.plans and result.complete and result.plans[0].status == "optimal"
    assert result.plans[0].time == pytest.approx(brute_force_best(j, OPTS), rel=RESOLUTION)


def test_a_four_group_moe_search_matches_brute_force():
    """Four one-GPU groups of different speed and memory, an MoE model with a dense first layer: the search opens
    the group order at its first group, then its last (_Family.open_ends, whose bounds price every later group at
    its MoE layers' seconds and the logits on the last), and its best time is still the brute-force minimum over
    every order; the optimum runs on all four groups."""
    from strategies import SMALL_MOE

    gpus = [
        {**SMALL_GPU, "name": name, "memory_gib": gib, "peak_tflops_bf16": tflops}
        for name, gib, tflops in (("a", 6.0, 312), ("b", 6.5, 200), ("c", 6.0, 400), ("d", 7.0, 150))
    ]
    j = parse_job(
        {
            "model": SMALL_MOE,
            "cluster": [{"gpu": gpu, "nodes": 1, "gpus_per_node": 1} for gpu in gpus],
            "training": {"seq_length": 4096, "global_batch_size": 4, "attention": "eager"},
        }
    )
    result = search_hetero(j, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False)
    assert result.plans and result.complete and result.plans[0].status == "optimal"
    assert result.plans[0].time == pytest.approx(brute_force_best(j, OPTS), rel=RESOLUTION)
    assert len(set(result.plans[0].estimate.dims.stage_groups)) == 4


def test_a_search_on_alternating_moe_and_dense_layers_matches_brute_force(monkeypatch):
    """An MoE model whose MoE layers alternate with its dense ones (as Llama 4 Maverick) on two one-GPU groups: the
    ordered boxes' layer-sequence check (box_sequence_holds) cuts boxes during the search, and its best time is
    still the brute-force minimum."""
    from test_bounds import alternate_job, counted_sequence_cuts

    cuts = counted_sequence_cuts(monkeypatch)
    j = alternate_job()
    result = search_hetero(j, top=1, time_limit_s=60, options=OPTS, single_type=False, replicas=False, processes=1)
    assert any(cuts)
    assert result.plans and result.complete and result.plans[0].status == "optimal"
    assert result.plans[0].time == pytest.approx(brute_force_best(j, OPTS), rel=RESOLUTION)


def test_search_keeps_plans_that_leave_a_slow_group_unused():
    """A 2-layer model on 6 H100 and 8 L4: the best plan uses the H100s alone, its stage faster than one layer on
    an L4. A bound that counted a layer on every group (used or not) once pruned it (15.1 s found, 11.6 s best)."""
    model = {
        "name": "two-layer",
        "num_layers": 2,
        "hidden_size": 3392,
        "ffn_hidden_size": 10752,
        "num_attention_heads": 53,
        "num_kv_heads": 1,
        "vocab_size": 50398,
        "mlp": "gelu",
        "dropout": False,
    }
    j = parse_job(
        {
            "model": model,
            "cluster": [
                {"gpu": "h100-sxm", "nodes": 3, "gpus_per_node": 2},
                {"gpu": "l4", "nodes": 1, "gpus_per_node": 8},
            ],
            "training": {"seq_length": 8192, "global_batch_size": 378, "attention": "eager"},
        }
    )
    opts = SearchOptions(zero_stages=HETERO_ZERO, max_micro_batch=64, memory_margin=0.0)
    result = search_hetero(j, top=1, time_limit_s=60, options=opts, single_type=False, replicas=False)
    assert result.plans and result.complete
    assert result.plans[0].time == pytest.approx(brute_force_best(j, opts), rel=RESOLUTION)


def test_objective_cap_keeps_a_plan_at_the_cap():
    """CP-SAT rounds times to whole units; a plan at (or just under) the cap must not be excluded by the rounding.
    With microsecond units this MoE stage pair (per-layer times of tens of microseconds, 157 micro-batches)
    was excluded even by a cap 0.002% above its own time."""
    from planner.search.partition import solve_partition

    moe = {
        "name": "moe-10",
        "num_layers": 10,
        "hidden_size": 768,
        "ffn_hidden_size": 3008,
        "num_attention_heads": 6,
        "num_kv_heads": 2,
        "vocab_size": 10869,
        "mlp": "gelu",
        "dropout": True,
        "moe": {"num_experts": 9, "top_k": 1, "expert_ffn_hidden_size": 320},
    }
    j = parse_job(
        {
            "model": moe,
            "cluster": [
                {"gpu": "h100-sxm", "nodes": 7, "gpus_per_node": 1},
                {"gpu": "h100-sxm", "nodes": 8, "gpus_per_node": 1},
            ],
            "links": [{"groups": [0, 1], "gbps": 50}],
            "training": {"seq_length": 1024, "global_batch_size": 314, "attention": "flash"},
        }
    )
    c = HeteroCandidate(2, 1, 1, 1, "none", ((0, 1, 3), (1, 1, 3)), 0.0)
    dims = c.dims(j)
    costs = costs_by_group(j)
    sms = with_group_sends(
        j, c.stage_groups, [StageModel(j, dims.stage_dims(s), costs(g)) for s, g in enumerate(c.stage_groups)]
    )
    caps = [j.cluster[g].gpu.memory_gib * 0.9 for g in c.stage_groups]

    def best(cap):
        res = solve_partition(sms, caps, partial_recompute=True, time_limit_s=10, objective_cap_s=cap)
        if res.plans is None:
            return None
        return evaluate_stages(j, dims, sms, res.plans, 0.1).iteration_time_s

    free = best(None)
    assert free is not None
    assert best(free) == pytest.approx(free, rel=RESOLUTION)


def test_every_stage_fits_its_own_gpu():
    j = small_job()
    result = search_hetero(j, top=5, time_limit_s=60, options=OPTS, single_type=False)
    assert result.plans
    for plan in result.plans:
        d = plan.estimate.dims
        for st in plan.estimate.stages:
            pipe = d.replicas[st.replica] if st.replica is not None else d
            cap = j.cluster[pipe.stage_groups[st.index]].gpu.memory_gib * (1 - OPTS.memory_margin)
            assert st.peak_bytes / GIB <= cap + 1e-9


def run(*args):
    proc = subprocess.run([sys.executable, "-m", "planner", *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_estimate_hetero_layout_file(tmp_path):
    job = (ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml").read_text()
    job += (
        "layout:\n  dp: 16\n  pp: 2\n  micro_batch_size: 1\n  zero_stage: 1\n  recompute: none\n  stages:\n"
        "    - {group: 0, tp: 2, layers: 24, gpus: 32}\n    - {group: 1, tp: 2, layers: 8, gpus: 32, recompute_layers: 1}\n"
    )
    path = tmp_path / "job.yaml"
    path.write_text(job)
    est = json.loads(run("estimate", path, "--json"))
    assert est["fits"] and est["iteration_time_s"] > 0
    assert [s["group"] for s in est["stages"]] == [0, 1]
    assert est["layout"]["stages"][1] == {"group": 1, "tp": 2, "layers": 8, "gpus": 32, "recompute_layers": 1}


@pytest.fixture(scope="module")
def megatron_doc():
    return json.loads(
        run(
            "plan",
            ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml",
            "--json",
            "--no-timing",
            "--top",
            "5",
            "--framework",
            "megatron",
        )
    )


def test_megatron_uses_one_tp_for_all_stages(megatron_doc):
    assert megatron_doc["plans"]
    for p in megatron_doc["plans"]:
        assert len({s["tp"] for s in p["layout"]["stages"]}) == 1
        rec = {s.get("recompute_layers", 0) for s in p["layout"]["stages"]}
        assert len(rec) == 1  # one recompute count for every stage
    s = megatron_doc["search"]
    assert (
        s["framework"] == "megatron"
        and s["unrestricted_best_s"] <= megatron_doc["plans"][0]["estimate"]["iteration_time_s"]
    )
    # the single-type baselines, searched below the best mixed plan's time: either one beats it, with the ratio,
    # or none does, and the plan's time is the bound
    best = megatron_doc["plans"][0]["estimate"]["iteration_time_s"]
    if "single_type_best_s" in s:
        assert 0 < s["single_type_best_s"] <= best * 1.0001 and s["hetero_vs_single_ratio"] >= 0.9999
    else:
        assert s["single_type_bound_s"] == round(best, 6)


def test_hetero_plan_json_validates_against_schema(megatron_doc):
    schema = json.loads(run("schema", "plan"))
    jsonschema.validate(megatron_doc, schema)
    place = megatron_doc["plans"][0]["placement"]
    assert place["idle_gpus"] == sum(g["idle_gpus"] for g in place["groups"])


def test_links_slow_down_sends_between_groups():
    """A send between stages on two node groups goes over the network between them (a `links` entry, else the
    slower NIC); a slow link raises only the boundary stages' pipeline time."""
    raw = {
        "model": SMALL,
        "training": {"seq_length": 8192, "global_batch_size": 4, "attention": "eager"},
        "cluster": [
            {"gpu": SMALL_GPU, "nodes": 1, "gpus_per_node": 4},
            {"gpu": "a100-40gb", "nodes": 1, "gpus_per_node": 4},
        ],
        "layout": {
            "dp": 1,
            "pp": 4,
            "micro_batch_size": 1,
            "zero_stage": 1,
            "recompute": "full",
            "stages": [
                {"group": 1, "tp": 2, "layers": 2, "gpus": 2},
                {"group": 1, "tp": 2, "layers": 1, "gpus": 2},
                {"group": 0, "tp": 2, "layers": 2, "gpus": 2},
                {"group": 0, "tp": 2, "layers": 1, "gpus": 2},
            ],
        },
    }
    from planner.cost.estimate import estimate

    fast = estimate(parse_job(raw))
    slow = estimate(parse_job({**raw, "links": [{"groups": [0, 1], "gbps": 10}]}))
    pp = lambda e: [st.time_s["pp_comm"] for st in e.stages]  # noqa: E731
    assert pp(slow)[0] == pp(fast)[0] and pp(slow)[3] == pp(fast)[3]
    assert pp(slow)[1] > 5 * pp(fast)[1] and pp(slow)[2] > 5 * pp(fast)[2]
    assert slow.iteration_time_s > fast.iteration_time_s


REPLICAS = """
layout:
  micro_batch_size: 1
  zero_stage: 1
  recompute: none
  replicas:
    - {count: 4, micro_batches: 40, stages: [{group: 0, tp: 4, layers: 16, gpus: 16}, {group: 0, tp: 4, layers: 16, gpus: 16}]}
    - {count: 4, micro_batches: 24, stages: [{group: 1, tp: 4, layers: 16, gpus: 16}, {group: 1, tp: 4, layers: 16, gpus: 16}]}
"""


def test_estimate_replicas_layout(tmp_path):
    """Replicas on two GPU types with their own micro-batch counts: the slowest replica sets the iteration, and
    the gradient ring over both groups runs at the slower NIC (or the `links` rate)."""
    path = tmp_path / "job.yaml"
    path.write_text((ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml").read_text() + REPLICAS)
    est = json.loads(run("estimate", path, "--json"))
    assert est["fits"] and [r["micro_batches"] for r in est["layout"]["replicas"]] == [40, 24]
    assert [(s["replica"], s["index"], s["group"]) for s in est["stages"]] == [
        (0, 0, 0),
        (0, 1, 0),
        (1, 0, 1),
        (1, 1, 1),
    ]
    # the A100 replica is slower per micro-batch and runs 24 of them; the H100 one 40
    per = {s["replica"]: s["microbatch_time_s"] for s in est["stages"]}
    assert est["iteration_time_s"] >= 24 * per[1]
    slow_link = path.read_text() + "links:\n  - {groups: [0, 1], gbps: 25}\n"
    path.write_text(slow_link)
    slow = json.loads(run("estimate", path, "--json"))
    assert slow["time_breakdown_s"]["dp_comm"] > est["time_breakdown_s"]["dp_comm"]


def test_balance_splits_the_batch_exactly():
    from planner.search.replicas import _balance

    for M, counts, slopes, offsets in (
        (256, ((0, 4), (1, 4)), [0.026, 0.065], [0.05, 0.1]),
        (2048, ((0, 9), (1, 5), (2, 3)), [0.02, 0.05, 0.06], [1.0, 2.0, 2.5]),
    ):
        ms = _balance(M, counts, slopes, offsets)
        assert sum(d * m for (_, d), m in zip(counts, ms)) == M
        times = [a * m + b for a, b, m in zip(slopes, offsets, ms)]
        # balanced: moving one micro-batch of the slowest group's replicas elsewhere cannot help by much
        assert max(times) - min(times) <= max(slopes) * max(d for _, d in counts) + 1e-9
    # 483 micro-batches cannot be split over 8 + 8 + 2 replicas (all even): no split, at once
    assert _balance(483, ((0, 8), (1, 8), (2, 2)), [0.02, 0.01, 0.02], [0.1, 0.1, 0.1]) is None


@pytest.fixture(scope="module")
def replica_doc():
    return json.loads(
        run("plan", ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml", "--json", "--no-timing", "--top", "3")
    )


def test_plan_finds_replicas_on_two_types(replica_doc):
    """DP across GPU types: the best plan of the 2x32 benchmark runs replicas on both types with different
    micro-batch counts, fits every stage's own GPU, and covers exactly the global batch."""
    best = replica_doc["plans"][0]
    lay = best["layout"]
    assert lay.get("replicas") and best["optimality"]["status"] in ("optimal", "feasible")
    assert len({r["micro_batches"] for r in lay["replicas"]}) > 1
    assert sum(r["count"] * r["micro_batches"] for r in lay["replicas"]) * lay["micro_batch_size"] == 256
    assert all(s["peak_memory_gib"] <= s["memory_capacity_gib"] for s in best["estimate"]["stages"])
    # no single-type plan beats it (the baselines stop at its time)
    assert replica_doc["search"]["single_type_bound_s"] == best["estimate"]["iteration_time_s"]
    assert "single_type_best_s" not in replica_doc["search"]
    jsonschema.validate(replica_doc, json.loads(run("schema", "plan")))


def test_mixed_checker_catches_broken_plans(replica_doc):
    """The independent checker is not vacuous: each broken copy of a real plan is caught."""
    import copy

    from invariants_mixed import check_mixed_plan

    from planner.load import load_job

    job = load_job(ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml")
    good = replica_doc["plans"][0]
    assert check_mixed_plan(job, good, 0.05) == []

    def broken(edit):
        p = copy.deepcopy(good)
        edit(p)
        return check_mixed_plan(job, p, 0.05)

    assert broken(
        lambda p: p["layout"]["replicas"][0].update(micro_batches=p["layout"]["replicas"][0]["micro_batches"] + 1)
    )
    assert broken(lambda p: p["layout"]["replicas"][1]["stages"][0].update(tp=2))
    assert broken(lambda p: p["layout"]["replicas"][0].update(count=p["layout"]["replicas"][0]["count"] * 4))
    assert broken(lambda p: p["estimate"]["stages"][0].update(peak_memory_gib=500.0))
    assert broken(lambda p: p["placement"].update(world_size=1))


def _tight_mixed_job(memory_gib: float) -> dict:
    tiny = {**SMALL_GPU, "memory_gib": memory_gib, "name": "tiny"}
    return {
        "model": SMALL,
        "training": {"seq_length": 16384, "global_batch_size": 8, "attention": "eager"},
        "cluster": [
            {"gpu": tiny, "nodes": 1, "gpus_per_node": 2},
            {"gpu": {**tiny, "memory_gib": memory_gib - 0.1}, "nodes": 1, "gpus_per_node": 2},
        ],
    }


def test_nothing_fits_on_mixed_cluster_says_what_would(tmp_path):
    """Exit 3 and one line with what would fit. (Which suggestions make it within the CLI's time budget depends on
    the machine's speed: the one below is checked with a budget no machine runs out of.)"""
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(_tight_mixed_job(4.0)))
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "plan", str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("error: nothing fits:") and "To make it fit: " in proc.stderr
    assert "already tried every stage placement" in proc.stderr and "--memory-margin" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_mixed_advice_names_the_smallest_multiple_that_fits():
    """6 GiB GPUs hold the job on twice the nodes of every group (the mixed search finds a plan there in under a
    second on this 2-core machine), not on these."""
    from planner.search.advice import hetero_suggestions

    job = parse_job(_tight_mixed_job(6.0))
    assert not search_hetero(job, top=1, time_limit_s=600, single_type=False, replicas=False).plans
    found = hetero_suggestions(job, SearchOptions(), budget_s=600.0)
    assert found[0] == "use at least 2 nodes of tiny, 2 nodes of tiny (2x every group)"


def test_replica_balance_bounds_the_choices_it_tries(monkeypatch):
    """With four or more replica groups the integer neighbourhood grows as window^(groups-1); the widening stops
    at MAX_BALANCE_CHOICES instead of running past the search's time limit (it once ran for minutes)."""
    from planner.search import replicas

    windows = []
    monkeypatch.setattr(replicas, "_balance_within", lambda M, c, s, o, window: windows.append(window))
    counts = [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert replicas._balance(10**9, counts, [1.0] * 4, [0.0] * 4) is None
    assert windows and all((2 * w + 1) ** 3 <= replicas.MAX_BALANCE_CHOICES for w in windows)
    assert replicas._balance(40, counts, [1.0, 2.0, 3.0, 4.0], [0.0] * 4) is None  # the recorder found nothing


@pytest.mark.parametrize("per_stage_tp", [True, False])
def test_candidate_counts_agree_with_one_box_per_choice(per_stage_tp):
    """The mixed search's candidate count (_count_choices: a count by used groups and stages) against the plain sum
    of _box_size over every TP choice (None: group unused) with a used group, times the used groups' orders, on
    random stage limits; with one TP for all where the framework has no per-stage TP."""
    import math
    import random
    from types import SimpleNamespace

    from planner.search.mixed_pipelines import _box_size, _count_choices

    rng = random.Random(7)
    fw = None if per_stage_tp else SimpleNamespace(per_stage_tp=False)
    for _ in range(150):
        order = list(range(rng.randint(1, 4)))
        L = rng.randint(1, 24)
        kmax = {g: {tp: rng.randint(1, 30) for tp in rng.sample([1, 2, 4, 8], rng.randint(0, 4))} for g in order}
        options = tuple((None, *sorted(kmax[g])) for g in order)
        want = 0
        for tps in itertools.product(*options):
            used = [(g, tp) for g, tp in zip(order, tps) if tp]
            if not used or (fw is not None and len({tp for _, tp in used}) > 1):
                continue
            hi = tuple(kmax[g][tp] for g, tp in used)
            want += _box_size((1,) * len(used), hi, L) * math.factorial(len(used))
        ctx = SimpleNamespace(order=order, fw=fw)
        assert _count_choices(ctx, options, kmax, L) == want
