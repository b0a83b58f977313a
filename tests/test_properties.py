"""Property tests: on random small jobs `search` never raises, and every plan it returns passes the independent
checker (tests/invariants.py).

Profiles: ``ci`` (default, ~200 examples in all, well under a minute, derandomized: the same examples on every run,
so that a landing never depends on what a random draw finds) and ``fuzz`` (many more, random). Select with
``HYPOTHESIS_PROFILE=fuzz python -m pytest tests/test_properties.py``; scripts/fuzz.py is the seeded,
non-hypothesis version for 10,000-case runs.
"""

import os

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from invariants import check_layout, check_plan, gpus_used
from strategies import cases, mixed_cases, raw_jobs, run_case, run_mixed_case

from planner.errors import SpecError
from planner.load import parse_job

settings.register_profile(
    "ci",
    max_examples=100,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    max_examples=5000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _parse(raw):
    try:
        return parse_job(raw)
    except SpecError:
        assume(False)


@given(raw_jobs())
@settings(max_examples=max(1, settings().max_examples // 2))
def test_generated_jobs_parse(raw):
    """The generator makes valid jobs (a guard that the search property below really searches)."""
    job = parse_job(raw)
    assert job.num_gpus <= 64 and 1 <= job.model.num_layers <= 16


@given(cases())
def test_search_never_raises_and_plans_pass_invariants(case):
    raw, opts = case
    _parse(raw)
    job, result, doc, violations = run_case(raw, opts, top=3, time_limit_s=10)
    event("plans found" if result.plans else "nothing fits")
    event("MoE" if job.model.moe is not None else "dense")
    event(f"{job.num_gpus} GPUs" if job.num_gpus <= 2 else "> 2 GPUs")
    assert not violations, "\n".join(violations)
    if result.complete and not result.plans:
        # a complete search that found nothing: the trivially smallest layout does not fit either, so
        # nothing remains to check here, but the document must be empty and well-formed
        assert doc["plans"] == []


@given(cases(), st.data())
@settings(max_examples=max(1, settings().max_examples // 2))
def test_checker_catches_broken_plans(case, data):
    """The checker is not vacuous: corrupting one field of a real plan is reported."""
    raw, opts = case
    _parse(raw)
    job, result, doc, violations = run_case(raw, opts, top=1, time_limit_s=10)
    assume(doc["plans"])
    assert not violations
    plan = doc["plans"][0]
    lay = plan["layout"]
    how = data.draw(st.sampled_from(["dp", "layers", "mbs", "peak", "fits", "rank", "placement", "ep"]))
    if how == "dp":
        lay["dp"] += 1
    elif how == "layers":
        lay["stages"][0]["layers"] += 1
    elif how == "mbs":
        lay["micro_batch_size"] += 1
    elif how == "peak":
        plan["estimate"]["stages"][-1]["peak_memory_gib"] = job.cluster[0].gpu.memory_gib + 1
    elif how == "fits":
        plan["estimate"]["fits"] = False
    elif how == "rank":
        plan["rank"] = 2
    elif how == "placement":
        plan["placement"]["stages"][0]["first_rank"] = 1
    elif how == "ep":
        lay["ep"] = 2 if job.model.moe is None else job.model.moe.num_experts + 1  # never a divisor
    assert check_plan(job, doc, opts.memory_margin)


def test_checker_rules_by_hand():
    job = parse_job(
        {
            "model": {
                "num_layers": 8,
                "hidden_size": 1024,
                "ffn_hidden_size": 4096,
                "num_attention_heads": 16,
                "num_kv_heads": 4,
                "vocab_size": 32000,
            },
            "cluster": [{"gpu": "a100-80gb", "nodes": 2, "gpus_per_node": 8}],
            "training": {"seq_length": 2048, "global_batch_size": 64},
        }
    )
    good = {
        "tp": 4,
        "pp": 2,
        "dp": 2,
        "cp": 1,
        "ep": 1,
        "vpp": 2,
        "micro_batch_size": 2,
        "num_microbatches": 16,
        "sequence_parallel": True,
        "zero_stage": 1,
        "recompute": "none",
        "tp_comm_overlap": False,
        "stages": [{"layers": 4}, {"layers": 4}],
    }
    assert check_layout(job, good, allow_cross_node_tp=False) == []
    bad = {
        "tp": 3,
        "dp": 4,
        "cp": 3,
        "ep": 2,
        "vpp": 3,
        "micro_batch_size": 3,
        "zero_stage": 4,
        "recompute": "some",
        "stages": [{"layers": 2}, {"layers": 6, "recompute_layers": 7}],
    }
    for key, value in bad.items():
        lay = {**good, key: value}
        assert check_layout(job, lay), key
    assert check_layout(job, {**good, "tp": 16, "dp": 1}, allow_cross_node_tp=False)
    assert check_layout(job, {**good, "stages": [{"layers": 8}]})
    assert check_layout(job, {**good, "stages": [{"layers": 0}, {"layers": 8}]})


def test_checker_idle_gpu_accounting():
    job = parse_job(
        {
            "model": {
                "num_layers": 4,
                "hidden_size": 512,
                "ffn_hidden_size": 2048,
                "num_attention_heads": 8,
                "vocab_size": 32000,
            },
            "cluster": [{"gpu": "a100-80gb", "nodes": 7, "gpus_per_node": 4}],
            "training": {"seq_length": 1024, "global_batch_size": 24},
        }
    )
    assert gpus_used(job, {"world_size": 28}) == (28, [])
    assert gpus_used(job, {"world_size": 24, "idle_gpus": 4}) == (24, [])
    assert gpus_used(job, {"world_size": 26, "idle_gpus": 2})[1]  # not a whole node
    assert gpus_used(job, {"world_size": 0, "idle_gpus": 28})[1]  # everything idle
    lay = {
        "tp": 4,
        "pp": 1,
        "dp": 6,
        "cp": 1,
        "ep": 1,
        "vpp": 1,
        "micro_batch_size": 1,
        "num_microbatches": 4,
        "sequence_parallel": True,
        "zero_stage": 1,
        "recompute": "none",
        "tp_comm_overlap": False,
        "stages": [{"layers": 4}],
    }
    assert check_layout(job, lay, world=24) == []
    assert check_layout(job, lay)  # 24 != 28 when no GPU is reported idle


@given(mixed_cases())
@settings(max_examples=max(1, settings().max_examples // 4))
def test_mixed_gpu_plans_pass_invariants(case):
    """Clusters of 2-3 GPU types: every plan (mixed pipelines and replicas on different types) passes the
    independent mixed-plan checker (tests/invariants_mixed.py): degree rules per stage, the batch split over
    replicas, GPUs per group, and each stage's memory within its own GPU."""
    raw, opts = case
    _parse(raw)
    job, result, doc, violations = run_mixed_case(raw, opts, top=3, time_limit_s=5)
    event("plans found" if result.plans else "nothing fits")
    event("replicas" if any(p["layout"].get("replicas") for p in doc["plans"]) else "mixed pipelines only")
    assert not violations, "\n".join(violations)
