"""DeepSpeed emitter and importer (planner/emit/deepspeed.py, deepspeed_import.py): golden ds_config.json files,
DeepSpeed's batch rule, no "auto", the refusals (exit 4), the round trip plan -> ds_config.json -> job, and reading
configs as DeepSpeed's docs write them. Regenerate the golden files with UPDATE_GOLDEN=1."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import pytest
import yaml
from emit_fixtures import check_golden_folder, job_shape, load, plan_shape, runnable

from planner.catalog import resolve_model
from planner.emit import EmitOptions, deepspeed_import, emit
from planner.emit import deepspeed as ds
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError
from planner.io import write_folder
from planner.load import parse_job
from planner.parallel import dims_from_layout

HERE = Path(__file__).parent
CONFIGS = HERE / "fixtures" / "configs" / "deepspeed"
GOLDEN = HERE / "golden" / "emit" / "deepspeed"
GOLDEN_PLANS = {"gpt-13b-a100-deepspeed": 2, "gpt-13b-a100-40gb-deepspeed-pp": 1}  # fixture stem -> plan rank


RUNNABLE = runnable("deepspeed")


def write_bundle(plan: LaunchPlan, folder: Path) -> dict[str, str]:
    files = ds.render(plan, EmitOptions()).files
    write_folder(folder, files)
    return files


def model_arg(plan: LaunchPlan, folder: Path) -> str:
    """The plan's model as `--model` takes it: its preset name, else a model YAML file."""
    try:
        if resolve_model(plan.model.name) == plan.model:
            return plan.model.name
    except SpecError:
        pass
    path = folder / "model.yaml"
    path.write_text(yaml.safe_dump(plan.model.model_dump(exclude_none=True)))
    return str(path)


def read_back(plan: LaunchPlan, folder: Path, **given) -> dict:
    group = plan.job.cluster[0]
    args = dict(
        world_size=plan.world_size,
        gpu=group.gpu.name,
        gpus_per_node=group.gpus_per_node,
        model=model_arg(plan, folder),
        seq_length=plan.training.seq_length,
    )
    return ds.read(folder / "ds_config.json", **{**args, **given})


# ---------------------------------------------------------------------------------------------------------------
# emit


@pytest.mark.parametrize("stem", sorted(GOLDEN_PLANS))
def test_golden_files(stem):
    files = ds.render(LaunchPlan.of(load(stem), GOLDEN_PLANS[stem], "deepspeed"), EmitOptions()).files
    check_golden_folder(GOLDEN / stem, files, stem)


def test_fixtures_cover_pipelines_and_zero_3():
    shapes = {(s, r): LaunchPlan.of(load(s), r, "deepspeed") for s, r in RUNNABLE}
    assert any(p.pp > 1 and not p.even_split for p in shapes.values())
    assert any(p.pp == 1 and p.zero_stage == 3 for p in shapes.values())


@pytest.mark.parametrize("stem, rank", RUNNABLE)
def test_batch_rule_holds_and_auto_never_appears(stem, rank):
    doc = load(stem)
    plan = LaunchPlan.of(doc, rank, "deepspeed")
    files = emit(doc, "deepspeed", rank)
    cfg = json.loads(files["ds_config.json"])
    dp = plan.world_size // (plan.tp * plan.pp)  # DeepSpeed's DP size: the mpu's, world / (tp * pp)
    assert cfg["train_batch_size"] == (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp)
    assert cfg["train_batch_size"] == plan.global_batch_size
    assert all('"auto"' not in text.lower() for text in files.values())
    assert files["ds_config.json"] == json.dumps(cfg, sort_keys=True, indent=2) + "\n"
    assert cfg["zero_optimization"]["stage"] == plan.zero_stage
    if plan.pp > 1:
        assert cfg["pipeline"]["stages"] == plan.pp and cfg["zero_optimization"]["stage"] <= 1
        assert "tensor_parallel" not in cfg
    elif plan.tp > 1:
        assert cfg["tensor_parallel"] == {"autotp_size": plan.tp}


def test_program_and_notes():
    bundle = ds.render(LaunchPlan.of(load("gpt-13b-a100-deepspeed"), 1, "deepspeed"), EmitOptions())
    assert bundle.program == ["train.py", "--deepspeed_config", "ds_config.json"]
    assert bundle.workdir is None and bundle.env == {}
    assert any("train.py" in note and "your DeepSpeed training script" in note for note in bundle.notes)


def test_pipeline_partition_module(tmp_path):
    plan = LaunchPlan.of(load("gpt-13b-a100-40gb-deepspeed-pp"), 1, "deepspeed")
    assert plan.pp == 6 and not plan.even_split
    files = write_bundle(plan, tmp_path)
    source = files["deepspeed_partition.py"]
    compile(source, "deepspeed_partition.py", "exec")
    space: dict = {}
    exec(source, space)  # our own generated file: pure Python until a DeepSpeed helper is called
    assert space["STAGE_LAYERS"] == plan.stage_layers and (space["PP"], space["TP"], space["DP"]) == (6, 2, 2)
    bounds = space["parts"](1, 2)
    assert bounds[0] == 0 and bounds[-1] == 1 + sum(plan.stage_layers) + 2
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    assert sizes == [plan.stage_layers[0] + 1, *plan.stage_layers[1:-1], plan.stage_layers[-1] + 2]
    assert any("deepspeed_partition.py" in note for note in ds.render(plan, EmitOptions()).notes)


def test_full_recompute_and_fp16():
    doc = copy.deepcopy(load("gpt-13b-a100-deepspeed"))
    doc["job"]["training"]["precision"] = "fp16"
    doc["plans"][1]["layout"]["recompute"] = "full"
    cfg = json.loads(emit(doc, "deepspeed", 2)["ds_config.json"])
    assert cfg["fp16"]["enabled"] is True and cfg["fp16"]["loss_scale"] == 0 and "bf16" not in cfg
    assert cfg["activation_checkpointing"]["number_checkpoints"] == 40
    zero = cfg["zero_optimization"]
    h = 5120  # the Hugging Face Trainer's values for "auto" on a hidden size of 5120
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (h * h, int(0.9 * h * h))
    assert zero["stage3_param_persistence_threshold"] == 10 * h

    pipe = copy.deepcopy(load("gpt-13b-a100-40gb-deepspeed-pp"))
    pipe["plans"][0]["layout"]["recompute"] = "full"
    cfg = json.loads(emit(pipe, "deepspeed", 1)["ds_config.json"])
    assert cfg["pipeline"]["activation_checkpoint_interval"] == 1
    assert cfg["activation_checkpointing"]["partition_activations"] is False  # SP already shards them


# ---------------------------------------------------------------------------------------------------------------
# refusals (exit 4), through planner.emit.emit so check_runnable and the emitter's own rules are both covered


def test_pipeline_with_zero_2_is_refused():
    doc = copy.deepcopy(load("gpt-13b-a100-40gb-deepspeed-pp"))
    doc["plans"][0]["layout"]["zero_stage"] = 2
    with pytest.raises(Inexpressible, match=r"--framework deepspeed") as info:
        emit(doc, "deepspeed")
    assert info.value.field == "plans[0].layout.zero_stage"
    plan = LaunchPlan.of(doc, 1, "deepspeed")  # render alone refuses it too: it runs check_runnable first
    with pytest.raises(Inexpressible, match=r"runs ZeRO stage 0, 1 with pipeline parallelism, not 2"):
        ds.render(plan, EmitOptions())


def test_autotp_with_sequence_parallelism_is_refused():
    doc = copy.deepcopy(load("gpt-13b-a100-deepspeed"))
    lay = doc["plans"][0]["layout"]
    lay.update(tp=2, dp=16, sequence_parallel=True, micro_batch_size=2, num_microbatches=8)
    with pytest.raises(Inexpressible, match=r"AutoTP.*no sequence parallelism.*--framework deepspeed") as info:
        emit(doc, "deepspeed")
    assert info.value.field == "plans[0].layout.sequence_parallel"
    lay["sequence_parallel"] = False
    cfg = json.loads(emit(doc, "deepspeed")["ds_config.json"])
    assert cfg["tensor_parallel"] == {"autotp_size": 2} and cfg["train_batch_size"] == 2 * 8 * 16


def test_selective_recompute_with_eager_attention_is_refused():
    doc = copy.deepcopy(load("gpt-13b-a100-deepspeed"))
    doc["plans"][0]["layout"]["recompute"] = "selective"
    assert "activation_checkpointing" not in json.loads(emit(doc, "deepspeed")["ds_config.json"])  # flash: none
    doc["job"]["training"]["attention"] = "eager"
    with pytest.raises(Inexpressible, match="selective") as info:
        emit(doc, "deepspeed")
    assert info.value.field == "plans[0].layout.recompute"


@pytest.mark.parametrize("change, field", [({"vpp": 2}, "vpp"), ({"cp": 2}, "cp")])
def test_framework_limits_are_refused(change, field):
    doc = copy.deepcopy(load("gpt-13b-a100-40gb-deepspeed-pp"))
    doc["plans"][0]["layout"].update(change)
    with pytest.raises(Inexpressible, match="--framework deepspeed") as info:
        emit(doc, "deepspeed")
    assert info.value.field.endswith(field)


# ---------------------------------------------------------------------------------------------------------------
# round trip and import


def test_read_forwards_to_the_importer_with_its_parameters():
    # `planner import` and scripts/validate_emitters.py pass only the options the signature of planner.emit.<fw>.read
    # names, so the emitter module's read keeps the importer's parameters exactly
    assert inspect.signature(ds.read) == inspect.signature(deepspeed_import.read)


@pytest.mark.parametrize("stem, rank", RUNNABLE)
def test_round_trip(stem, rank, tmp_path):
    plan = LaunchPlan.of(load(stem), rank, "deepspeed")
    write_bundle(plan, tmp_path)
    assert job_shape(read_back(plan, tmp_path), tmp_path) == plan_shape(plan)


def test_round_trip_of_full_recompute_and_autotp(tmp_path):
    doc = copy.deepcopy(load("gpt-13b-a100-deepspeed"))
    lay = doc["plans"][1]["layout"]
    lay.update(tp=2, dp=16, sequence_parallel=False, micro_batch_size=2, num_microbatches=8, recompute="full")
    plan = LaunchPlan.of(doc, 2, "deepspeed")
    write_bundle(plan, tmp_path)
    assert job_shape(read_back(plan, tmp_path), tmp_path) == plan_shape(plan)


def test_import_of_a_zero_3_bf16_config():
    raw = ds.read(CONFIGS / "zero3-bf16.json", world_size=32, gpu="a100-80gb", model="llama3-8b", seq_length=4096)
    assert raw["cluster"] == [{"gpu": "a100-80gb", "nodes": 4, "gpus_per_node": 8}]
    # DeepSpeed keeps bf16 gradients without data_types.grad_accum_dtype
    assert raw["training"] == {"seq_length": 4096, "global_batch_size": 512, "precision": "bf16", "grad_dtype": "bf16"}
    lay = raw["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["micro_batch_size"], lay["zero_stage"]) == (1, 1, 32, 4, 3)
    assert lay["recompute"] == "none" and lay["sequence_parallel"] is False
    job = parse_job(raw)
    assert dims_from_layout(job.layout, job).check().num_microbatches == 4


def test_import_derives_a_missing_batch_number_as_deepspeed_does(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(
        json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}})
    )
    raw = ds.read(path, world_size=32, gpu="h100-sxm", model="llama3-8b", seq_length=2048, tp=2)
    assert raw["layout"]["dp"] == 16 and raw["training"]["global_batch_size"] == 256
    assert raw["layout"]["tp"] == 2 and raw["layout"]["micro_batch_size"] == 2


BASE = {
    "train_batch_size": 256,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"zero_optimization": {"stage": 2, "overlap_com": True}}, "zero_optimization.overlap_com", "overlap_comm"),
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage", "0, 1, 2 or 3"),
        ({"train_batch_size": "auto"}, "train_batch_size", '"auto"'),
        ({"bf16": {"enabled": "auto"}}, "bf16.enabled", '"auto"'),
        (
            {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}},
            "zero_optimization.reduce_bucket_size",
            "auto",
        ),
        ({"train_batch_size": 250}, "train_batch_size", "batch rule"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps", "positive integer"),
        ({"train_micro_batch_size_per_gpu": True}, "train_micro_batch_size_per_gpu", "positive integer"),
        ({"fp16": {"enabled": True}}, "bf16.enabled", "both enabled"),
        ({"bf16": {"enabled": False}}, "bf16.enabled", "neither"),
        ({"amp": {"enabled": True}}, "amp", "removed"),
        ({"pipeline": {"stages": 2}, "train_batch_size": 128}, "zero_optimization.stage", "PipelineEngine"),
        ({"pipeline": {"stages": "auto"}}, "--pp", "--pp"),
        ({"tensor_parallel": {"autotp_size": 2}, "pipeline": {"stages": 2}}, "tensor_parallel.autotp_size", "pipeline"),
        ({"zero_optimization": []}, "zero_optimization", "JSON object"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, change, field, message):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({**BASE, **change}))
    with pytest.raises(SpecError, match=message) as info:
        ds.read(path, world_size=32, gpu="h100-sxm", model="llama3-8b", seq_length=2048)
    assert info.value.field == field


@pytest.mark.parametrize(
    "given, field",
    [
        ({"model": None}, "--model"),
        ({"seq_length": None}, "--seq-length"),
        ({"world_size": None}, "--world-size"),
        ({"gpu": None}, "--gpu"),
        ({"world_size": 30}, "--world-size"),
        ({"world_size": 12, "gpus_per_node": 8}, "--world-size"),
        ({"tp": 4, "world_size": 6}, "--world-size"),
    ],
)
def test_missing_or_wrong_arguments_name_the_flag(tmp_path, given, field):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(BASE))
    args = {"world_size": 32, "gpu": "h100-sxm", "model": "llama3-8b", "seq_length": 2048, **given}
    with pytest.raises(SpecError) as info:
        ds.read(path, **args)
    assert info.value.field == field


def test_arguments_that_contradict_the_config_are_refused(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({**BASE, "tensor_parallel": {"autotp_size": 2}}))
    with pytest.raises(SpecError, match="--tp says 4") as info:
        ds.read(path, world_size=32, gpu="h100-sxm", model="llama3-8b", seq_length=2048, tp=4)
    assert info.value.field == "tensor_parallel.autotp_size"


def test_malformed_json_is_bad_input(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 8,')
    with pytest.raises(SpecError, match="invalid JSON"):
        ds.read(path, world_size=8, gpu="h100-sxm", model="llama3-8b", seq_length=2048)
    path.write_text("[1, 2]")
    with pytest.raises(SpecError, match="JSON object") as info:
        ds.read(path, world_size=8, gpu="h100-sxm", model="llama3-8b", seq_length=2048)
    assert info.value.field == "ds_config.json"
