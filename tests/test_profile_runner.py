"""`planner profile run`'s back end (planner/profile/runner.py): one layer of a job's model measured with PyTorch
on the CPU at tiny shapes, written as a Profile the cost model reads in place of its analytic layer time.

Timings are not checked against any wall-clock threshold: only the Profile's structure, and that the estimate
uses exactly the measured numbers (at a measured micro-batch) or their log-log interpolation (between two)."""

import math
import sys

import pytest

from planner.cost.estimate import estimate
from planner.errors import SpecError
from planner.load import load_profile, parse_job
from planner.profile.measured import shape_of
from planner.profile.runner import default_tps, profile_yaml, run_profile
from planner.profile.schema import Profile

TINY = {
    "name": "tiny",
    "num_layers": 2,
    "hidden_size": 64,
    "ffn_hidden_size": 128,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "vocab_size": 1000,
}
JOB = {
    "model": TINY,
    "cluster": [{"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8}],
    "training": {"seq_length": 32, "global_batch_size": 16},
    "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1, "recompute": "none"},
}
FAST = {"device": "cpu", "warmup": 1, "repeats": 3, "threads": 1}


def job_with(**changes):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in JOB.items()}
    for key, value in changes.items():
        section, field = key.split("__")
        raw[section][field] = value
    return parse_job(raw)


def with_profile(job, profile):
    cluster = (job.cluster[0].model_copy(update={"profile": profile}),)
    return job.model_copy(update={"cluster": cluster})


def test_missing_torch_is_one_spec_error(monkeypatch):
    from planner.profile import runner

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(SpecError) as err:
        runner.run_profile(parse_job(JOB), **FAST)
    assert err.value.field == "torch" and "pip install 'planner[profile]'" in err.value.message


def test_parse_ints_reads_the_cli_lists():
    from planner.profile.runner import parse_ints

    assert parse_ints("4, 1,2,2", "--micro-batches") == (1, 2, 4)
    for bad in ("", "1,x", "0,1"):
        with pytest.raises(SpecError) as err:
            parse_ints(bad, "--micro-batches")
        assert err.value.field == "--micro-batches"


# ---------------------------------------------------------------------------------------------------------------
# with torch

try:
    import torch
except ImportError:  # CI installs it (pip install 'planner[profile]'); the tests above run without it
    torch = None
needs_torch = pytest.mark.skipif(
    torch is None, reason="planner profile run needs torch (pip install 'planner[profile]')"
)


@needs_torch
def test_a_dense_layer_profile_has_one_point_per_grid_cell_and_validates(tmp_path):
    job = parse_job(JOB)
    calls = []
    warnings = []
    profile = run_profile(
        job,
        micro_batches=(4, 1, 2),
        tps=(1, 2),
        progress=lambda d, t: calls.append((d, t)),
        warn=warnings.append,
        **FAST,
    )
    assert isinstance(profile, Profile) and profile.gpu == "h100-sxm"
    assert profile.model == shape_of(job.model)
    cells = [(p.kind, p.tp, p.seq_length, p.micro_batch_size, p.precision) for p in profile.layers]
    assert cells == [("layer", tp, 32, mb, "bf16") for tp in (1, 2) for mb in (1, 2, 4)]  # sorted, job's precision
    assert all(p.forward_s > 0 and p.backward_s > 0 for p in profile.layers)
    assert calls == [(i, 6) for i in range(1, 7)]
    assert any("CPU" in w for w in warnings)  # a CPU measurement says it is not the GPU's
    prov = profile.provenance
    assert prov.tool == "planner profile run" and prov.gpu.startswith("cpu") and prov.torch == torch.__version__
    assert prov.date and "--micro-batches 1,2,4" in prov.command
    # round trip through the YAML file the job's `profile:` names
    path = tmp_path / "tiny.yaml"
    path.write_text(profile_yaml(profile))
    assert load_profile(path) == profile


@needs_torch
def test_default_grid_is_the_job_seq_and_the_tp_degrees_that_shard_the_heads():
    job = parse_job(JOB)
    assert default_tps(job) == (1, 2, 4)  # 4 heads, 2 kv-heads (replicated at tp 4), 8 GPUs a node
    profile = run_profile(job, micro_batches=(1,), **FAST)
    assert [(p.tp, p.seq_length) for p in profile.layers] == [(1, 32), (2, 32), (4, 32)]


@needs_torch
def test_the_estimate_uses_the_measured_layer_and_interpolates_between_points():
    job = parse_job(JOB)
    profile = run_profile(job, micro_batches=(1, 4), tps=(1,), **FAST)
    f1, f4 = (p.forward_s for p in profile.layers)
    b1, b4 = (p.backward_s for p in profile.layers)

    measured = estimate(with_profile(job, profile))
    dense = measured.stages[0].layer_times_s["dense"]
    assert math.isclose(dense["forward"], f1, rel_tol=1e-12) and math.isclose(dense["backward"], b1, rel_tol=1e-12)
    assert measured.cost_sources[0]["layer"] == "measured"

    mid = estimate(with_profile(job_with(layout__micro_batch_size=2), profile)).stages[0].layer_times_s["dense"]
    assert min(f1, f4) <= mid["forward"] <= max(f1, f4)
    assert min(b1, b4) <= mid["backward"] <= max(b1, b4)
    assert math.isclose(mid["forward"], math.sqrt(f1 * f4), rel_tol=1e-9)  # log-log: 2 is the midpoint of 1 and 4


@needs_torch
def test_an_moe_model_gets_attention_mlp_and_moe_parts_the_estimate_adds_up():
    moe = dict(TINY, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32, "shared_experts": 1,
                          "first_dense_layers": 1})  # fmt: skip
    job = job_with(model__moe=moe["moe"])
    profile = run_profile(job, micro_batches=(1, 2), tps=(1,), **FAST)
    assert [(p.kind, p.micro_batch_size) for p in profile.layers] == [
        (kind, mb) for kind in ("attention", "mlp", "moe") for mb in (1, 2)
    ]
    assert profile.model.num_experts == 4 and profile.model.top_k == 2
    at = {p.kind: p for p in profile.layers if p.micro_batch_size == 1}
    times = estimate(with_profile(job, profile)).stages[0].layer_times_s
    assert math.isclose(times["dense"]["forward"], at["attention"].forward_s + at["mlp"].forward_s, rel_tol=1e-12)
    assert math.isclose(times["moe"]["forward"], at["attention"].forward_s + at["moe"].forward_s, rel_tol=1e-12)
    assert math.isclose(times["moe"]["backward"], at["attention"].backward_s + at["moe"].backward_s, rel_tol=1e-12)


@needs_torch
def test_gelu_eager_attention_and_dropout_build_and_run():
    job = job_with(model__mlp="gelu", model__dropout=True, training__attention="eager")
    profile = run_profile(job, micro_batches=(1,), tps=(4,), **FAST)
    assert profile.model.mlp == "gelu" and [p.tp for p in profile.layers] == [4]


@needs_torch
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tps": (3,)}, "--tp"),
        ({"micro_batches": ()}, "--micro-batches"),
        ({"micro_batches": (0,)}, "--micro-batches"),
        ({"repeats": 0}, "--repeats"),
        ({"device": "tpu"}, "--device"),
        ({"precision": "fp8"}, "--precision"),
        ({"group": 1}, "--group"),
    ],
)
def test_bad_arguments_are_spec_errors(kwargs, field):
    with pytest.raises(SpecError) as err:
        run_profile(parse_job(JOB), **{**FAST, **kwargs})
    assert err.value.field == field


@needs_torch
def test_fp8_jobs_and_relu_models_are_refused():
    with pytest.raises(SpecError) as err:
        run_profile(job_with(training__precision="fp8"), **FAST)
    assert err.value.field == "training.precision" and "bf16" in err.value.message
    with pytest.raises(SpecError) as err:
        run_profile(job_with(model__mlp="relu"), **FAST)
    assert err.value.field == "model.mlp"


@needs_torch
@pytest.mark.skipif(torch is not None and torch.cuda.is_available(), reason="a CUDA machine has CUDA")
def test_cuda_without_a_gpu_is_a_spec_error():
    with pytest.raises(SpecError) as err:
        run_profile(parse_job(JOB), **{**FAST, "device": "cuda"})
    assert err.value.field == "--device" and "--device cpu" in err.value.message
