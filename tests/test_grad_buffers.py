"""Gradient buffers (Training.grad_dtype) through the rule set, the search, the emitters and the DeepSpeed importer.

bf16+fp32 is DeepSpeed's BF16_Optimizer: 16-bit .grad plus an fp32 accumulation buffer that is never sharded, so it
runs at ZeRO 0-1 only (planner.parallel.grad_zero_error); DeepSpeed selects it for bf16 with
``data_types.grad_accum_dtype: fp32`` at ZeRO stage 1 only (Framework.grad_rejects), Megatron and torchtitan have no
such buffer. Without the key DeepSpeed keeps 16-bit gradients, which its importer reads as grad_dtype bf16."""

from __future__ import annotations

import copy
import json

import pytest
from emit_fixtures import load, runnable
from test_emit_deepspeed import read_back, write_bundle

from planner.cost.estimate import estimate
from planner.emit import deepspeed as ds
from planner.emit import emit
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError
from planner.frameworks import FRAMEWORKS, get_framework, priced_for
from planner.load import parse_job
from planner.parallel import grad_zero_error
from planner.search import run_search
from planner.search.space import SearchOptions
from planner.spec import Layout

JOB = {
    "model": "llama3-8b",
    "cluster": [{"gpu": "a100-80gb", "nodes": 2, "gpus_per_node": 8}],
    "training": {"seq_length": 4096, "global_batch_size": 256, "precision": "bf16", "grad_dtype": "bf16+fp32"},
}


def job(**training):
    raw = copy.deepcopy(JOB)
    raw["training"].update(training)
    return parse_job(raw)


def test_the_rule_allows_zero_0_and_1_only_for_bf16_fp32():
    t = job().training
    assert [z for z in range(4) if grad_zero_error(t, z) is None] == [0, 1]
    assert all(grad_zero_error(job(grad_dtype=g).training, z) is None for g in ("fp32", "bf16") for z in range(4))


@pytest.mark.parametrize("framework, stages", [(None, {0, 1}), ("deepspeed", {1})])
def test_the_search_plans_bf16_fp32_only_where_it_runs(framework, stages):
    opts = SearchOptions(framework=get_framework(framework))
    result = run_search(job(), opts, top=5, time_limit_s=60)
    assert result.plans
    assert {p.estimate.dims.zero_stage for p in result.plans} <= stages


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_frameworks_without_the_buffer_refuse_the_job(framework):
    with pytest.raises(SpecError, match="no bf16\\+fp32 gradient buffers") as info:
        run_search(job(), SearchOptions(framework=get_framework(framework)), top=1, time_limit_s=5)
    assert info.value.field == "training.grad_dtype"


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge"])
def test_emit_names_the_target_that_has_no_such_buffer(target):
    stem, rank = runnable(target)[0]
    doc = copy.deepcopy(load(stem))
    doc["job"]["training"]["grad_dtype"] = "bf16+fp32"
    with pytest.raises(Inexpressible, match=f": {target} has no bf16\\+fp32 gradient buffers") as refused:
        emit(doc, target, rank)
    assert refused.value.field == "job.training.grad_dtype"


def test_torchtitan_reduces_in_fp32_only():
    with pytest.raises(SpecError, match="torchtitan has no bf16 gradient buffers") as info:
        run_search(job(grad_dtype="bf16"), SearchOptions(framework=get_framework("torchtitan")), top=1, time_limit_s=5)
    assert info.value.field == "training.grad_dtype"
    stem, rank = runnable("torchtitan")[0]
    doc = copy.deepcopy(load(stem))
    doc["job"]["training"]["grad_dtype"] = "bf16"
    with pytest.raises(Inexpressible, match="no bf16 gradient buffers") as refused:
        emit(doc, "torchtitan", rank)
    assert refused.value.field == "job.training.grad_dtype"


def test_deepspeed_prices_its_16_bit_gradients_unless_the_job_says():
    raw = copy.deepcopy(JOB)
    del raw["training"]["grad_dtype"]
    unstated = parse_job(raw)
    priced = priced_for(unstated, FRAMEWORKS["deepspeed"])
    assert unstated.training.grad_dtype == "fp32" and priced.training.grad_dtype == "bf16"
    layout = Layout(tp=2, dp=8, zero_stage=1)
    grads = [estimate(j, layout).stages[0].memory_bytes["gradients"] for j in (unstated, priced)]
    assert grads[1] == grads[0] / 2  # 2 bytes per parameter, not 4
    for stated in ("fp32", "bf16+fp32"):
        assert priced_for(job(grad_dtype=stated), FRAMEWORKS["deepspeed"]).training.grad_dtype == stated


def test_deepspeed_needs_bf16_parameters_for_fp32_accumulation():
    found = FRAMEWORKS["deepspeed"].grad_rejects("bf16+fp32", "fp16")
    assert found is not None and found[0] == "training.grad_dtype"
    assert FRAMEWORKS["deepspeed"].grad_rejects("bf16+fp32", "bf16", 0)[0] == "zero_stage"
    assert FRAMEWORKS["deepspeed"].grad_rejects("bf16+fp32", "bf16", 1) is None


# ---------------------------------------------------------------------------------------------------------------
# the DeepSpeed emitter and importer


def bf16_fp32_doc(zero: int) -> dict:
    doc = copy.deepcopy(load("gpt-13b-a100-40gb-deepspeed-pp"))
    doc["job"]["training"].update(precision="bf16", grad_dtype="bf16+fp32")
    doc["plans"][0]["layout"]["zero_stage"] = zero
    return doc


def test_deepspeed_writes_fp32_accumulation_at_zero_1(tmp_path):
    plan = LaunchPlan.of(bf16_fp32_doc(1), 1, "deepspeed")
    cfg = json.loads(write_bundle(plan, tmp_path)["ds_config.json"])
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["zero_optimization"]["stage"] == 1
    assert any("BF16_Optimizer" in n for n in ds.notes(plan))
    assert read_back(plan, tmp_path)["training"]["grad_dtype"] == "bf16+fp32"  # the round trip keeps it


def test_deepspeed_refuses_fp32_accumulation_without_zero_1():
    with pytest.raises(Inexpressible, match="ZeRO stage 1 only, not 0") as info:
        emit(bf16_fp32_doc(0), "deepspeed")
    assert info.value.field == "plans[0].layout.zero_stage"


def test_deepspeed_keeps_16_bit_gradients_of_other_plans():
    doc = bf16_fp32_doc(1)
    doc["job"]["training"]["grad_dtype"] = "fp32"
    files = emit(doc, "deepspeed")
    assert "data_types" not in json.loads(files["ds_config.json"])


@pytest.mark.parametrize(
    "data_types, precision, zero, grad_dtype",
    [
        (None, "bf16", 1, "bf16"),
        ({"grad_accum_dtype": "bf16"}, "bf16", 0, "bf16"),
        ({"grad_accum_dtype": "float32"}, "bf16", 1, "bf16+fp32"),
        ({"grad_accum_dtype": "fp16"}, "fp16", 2, "bf16"),
        ({"grad_accum_dtype": "fp32"}, "bf16", 0, "raises at stage 0"),
        ({"grad_accum_dtype": "fp32"}, "bf16", 3, "bf16 with ZeRO stage 1"),
        ({"grad_accum_dtype": "fp32"}, "fp16", 1, "bf16 with ZeRO stage 1"),
        ({"grad_accum_dtype": "int4"}, "bf16", 1, "expected fp32, bf16 or fp16"),
    ],
)
def test_the_importer_reads_what_deepspeed_runs(tmp_path, data_types, precision, zero, grad_dtype):
    cfg = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 1,
        precision: {"enabled": True},
        "zero_optimization": {"stage": zero},
    }
    if data_types is not None:
        cfg["data_types"] = data_types
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    read = lambda: ds.read(path, world_size=8, gpu="a100-80gb", model="llama3-8b", seq_length=4096)  # noqa: E731
    if grad_dtype in ("bf16", "bf16+fp32"):
        assert read()["training"]["grad_dtype"] == grad_dtype
        return
    with pytest.raises(SpecError, match=grad_dtype) as info:
        read()
    assert info.value.field == "data_types.grad_accum_dtype"


def test_list_frameworks_says_which_gradients_each_keeps():
    from planner.report.catalog import _framework_row

    rows = {name: _framework_row(fw) for name, fw in FRAMEWORKS.items()}
    assert rows["deepspeed"]["gradients"][0] == "bf16" and rows["deepspeed"]["fp32_accumulation_zero"] == [1]
    assert rows["torchtitan"]["gradients"] == ["fp32"]
    assert rows["megatron"]["gradients"] == ["fp32", "bf16"]
