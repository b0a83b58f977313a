"""training.fp8_recipe through the emitters and importers (planner/emit/): Megatron-LM --fp8-recipe, the
Megatron-Bridge mixed_precision preset, the Transformer Engine recipe the DeepSpeed notes name, torchtitan's Float8
recipe_name (0.3 Python config, 0.2 TOML); the recipes a target has no setting for (exit 4); the importers reading
the recipe back; fp8 outputs of the default recipes as they were before the recipe existed."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from emit_fixtures import flag_values, load

from planner.emit import EmitOptions, emit, megatron, megatron_bridge
from planner.emit import deepspeed as ds
from planner.emit import torchtitan as tt
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError
from planner.io import write_folder
from planner.load import parse_job

ROOT = Path(__file__).resolve().parents[1]
MEGATRON = "llama3-70b-h100-megatron"  # H100: FP8 tensor cores
TORCHTITAN = "llama3-8b-h100-torchtitan"  # plan 1: llama3-8b preset (a registry flavor), pp 1
DEEPSPEED = "gpt-13b-a100-deepspeed"


def fp8_doc(stem: str, recipe: str | None, **training) -> dict:
    """A copy of a fixture whose job trains in fp8 with ``recipe`` (None: the job leaves fp8_recipe unstated)."""
    doc = copy.deepcopy(load(stem))
    doc["job"]["training"].update(precision="fp8", **training)
    if recipe is not None:
        doc["job"]["training"]["fp8_recipe"] = recipe
    return doc


def bf16_doc(stem: str, **training) -> dict:
    doc = copy.deepcopy(load(stem))
    doc["job"]["training"].update(precision="bf16", **training)
    return doc


def megatron_bundle(doc: dict, target: str = "megatron"):
    module = megatron if target == "megatron" else megatron_bridge
    return module.render(LaunchPlan.of(doc, 1, target), EmitOptions())


def tt_files(doc: dict, version: str, rank: int = 1) -> dict[str, str]:
    return tt.render(LaunchPlan.of(doc, rank, "torchtitan"), EmitOptions(framework_version=version)).files


def refusal(doc: dict, target: str, options: EmitOptions | None = None) -> Inexpressible:
    with pytest.raises(Inexpressible) as info:
        emit(doc, target, 1, options)
    return info.value


# ---------------------------------------------------------------------------------------------------------------
# Megatron-LM: --fp8-recipe (arguments.py choices tensorwise, delayed, mxfp8, blockwise, custom)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_megatron_writes_the_plans_recipe(recipe):
    bundle = megatron_bundle(fp8_doc(MEGATRON, recipe))
    assert flag_values(bundle.program[1:], "--fp8-format") == ["hybrid"]
    assert flag_values(bundle.program[1:], "--fp8-recipe") == [recipe]
    assert f"--fp8-recipe {recipe}\n" in bundle.files[megatron.ARGS_FILE]
    (note,) = [line for line in bundle.notes if "--fp8-recipe" in line]
    assert f"`--fp8-format hybrid --fp8-recipe {recipe}`" in note
    te_class = {"delayed": "DelayedScaling", "tensorwise": "Float8CurrentScaling"}[recipe]
    assert te_class in note and "training.fp8_recipe" in note


def test_megatron_delayed_output_is_what_it_was():
    """The fp8 flags of a delayed plan are the two lines Megatron got before the recipe existed, right after --bf16,
    and a job that leaves the recipe unstated is a delayed one."""
    bf16 = megatron_bundle(bf16_doc(MEGATRON)).files[megatron.ARGS_FILE]
    before = bf16.replace("--bf16\n", "--bf16\n--fp8-format hybrid\n--fp8-recipe delayed\n")
    assert before != bf16
    for recipe in ("delayed", None):
        assert megatron_bundle(fp8_doc(MEGATRON, recipe)).files[megatron.ARGS_FILE] == before
    tensorwise = megatron_bundle(fp8_doc(MEGATRON, "tensorwise")).files[megatron.ARGS_FILE]
    assert tensorwise == before.replace("--fp8-recipe delayed\n", "--fp8-recipe tensorwise\n")


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge", "deepspeed"])
def test_rowwise_has_no_transformer_engine_recipe(target):
    stem = DEEPSPEED if target == "deepspeed" else MEGATRON
    err = refusal(fp8_doc(stem, "rowwise"), target)
    assert err.field == "job.training.fp8_recipe"
    assert "rowwise" in err.message and "delayed, tensorwise" in err.message


def test_rowwise_for_megatron_exits_4(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(fp8_doc(MEGATRON, "rowwise")))
    res = subprocess.run(
        [sys.executable, "-m", "planner", "emit", str(path), "--framework", "megatron", "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert res.returncode == 4, res.stderr
    assert res.stderr.startswith("error: job.training.fp8_recipe: ")
    assert not (tmp_path / "out").exists()


def test_megatron_settings_refuse_a_recipe_without_a_flag(monkeypatch):
    """settings() refuses an FP8 recipe with no --fp8-recipe value itself, not only through check_runnable."""
    monkeypatch.setattr("planner.frameworks.check_runnable", lambda *args, **kwargs: None)
    with pytest.raises(Inexpressible) as info:
        megatron.settings(LaunchPlan.of(fp8_doc(MEGATRON, "rowwise"), 1, "megatron"), "megatron")
    assert info.value.field == "job.training.fp8_recipe"
    assert "--fp8-recipe delayed | tensorwise" in info.value.message


# ---------------------------------------------------------------------------------------------------------------
# Megatron-Bridge: the mixed_precision preset of the recipe (training/mixed_precision.py)


@pytest.mark.parametrize(
    "recipe, preset",
    [("delayed", "bf16_with_fp8_delayed_scaling_mixed"), ("tensorwise", "bf16_with_fp8_current_scaling_mixed")],
)
def test_bridge_preset_of_the_recipe(recipe, preset):
    bundle = megatron_bundle(fp8_doc(MEGATRON, recipe), "megatron-bridge")
    assert f"mixed_precision={preset}" in bundle.program
    assert f"mixed_precision={preset}\n" in bundle.files[megatron_bridge.OVERRIDES_FILE]
    first_last = [line for line in bundle.notes if "first_last_layers_bf16" in line]
    assert bool(first_last) == (recipe == "tensorwise")  # the current-scaling preset keeps two layers in BF16
    grads = megatron_bundle(fp8_doc(MEGATRON, recipe, grad_dtype="bf16"), "megatron-bridge")
    assert f"mixed_precision={preset}_bf16_grad_reduce" in grads.program


def test_bridge_refuses_a_recipe_without_a_preset():
    s = megatron.settings(LaunchPlan.of(fp8_doc(MEGATRON, "tensorwise"), 1, "megatron-bridge"), "megatron-bridge")
    assert megatron_bridge.mixed_precision(s) == "bf16_with_fp8_current_scaling_mixed"
    with pytest.raises(Inexpressible) as info:
        megatron_bridge.mixed_precision(dataclasses.replace(s, fp8_recipe="mxfp8"))
    assert info.value.field == "job.training.fp8_recipe" and "no mixed_precision preset" in info.value.message


# ---------------------------------------------------------------------------------------------------------------
# DeepSpeed: no fp8 key; the notes name the Transformer Engine recipe of the model's fp8_autocast


@pytest.mark.parametrize(
    "recipe, te_recipe, other",
    [
        ("delayed", "DelayedScaling()", "Float8CurrentScaling"),
        ("tensorwise", "Float8CurrentScaling()", "DelayedScaling"),
    ],
)
def test_deepspeed_notes_name_the_transformer_engine_recipe(recipe, te_recipe, other):
    bundle = ds.render(LaunchPlan.of(fp8_doc(DEEPSPEED, recipe), 1, "deepspeed"), EmitOptions())
    (note,) = [line for line in bundle.notes if line.startswith("fp8:")]
    assert f"fp8_recipe=transformer_engine.common.recipe.{te_recipe}" in note
    assert f"training.fp8_recipe {recipe}" in note and other not in note
    bf16 = ds.render(LaunchPlan.of(bf16_doc(DEEPSPEED), 1, "deepspeed"), EmitOptions())
    assert bundle.files == bf16.files  # ds_config.json runs bf16 whatever the recipe


# ---------------------------------------------------------------------------------------------------------------
# torchtitan: the Float8 converter's recipe_name


def test_torchtitan_rowwise_in_every_config_form():
    doc = fp8_doc(TORCHTITAN, "rowwise")
    source = tt_files(doc, "0.3")["plan_config.py"]
    assert (
        'converters=[Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"], '
        "model_compile_enabled=True)]" in source
    )
    compile(source, "plan_config.py", "exec")
    toml = tomllib.loads(tt_files(doc, "0.2")["plan.toml"])
    assert toml["model"]["converters"] == ["quantize.linear.float8"]
    assert toml["quantize"]["linear"]["float8"] == {"recipe_name": "rowwise", "filter_fqns": ["output"]}
    custom = copy.deepcopy(doc)  # a model outside the registry: plan_model.py plus the same converter
    custom["job"]["model"]["num_layers"] = 30
    custom["plans"][0]["layout"]["stages"] = [{"layers": 30}]
    assert 'Float8LinearConverter.Config(recipe_name="rowwise"' in tt_files(custom, "0.3")["plan_config.py"]
    custom02 = tomllib.loads(tt_files(custom, "0.2")["plan.toml"])
    assert custom02["quantize"]["linear"]["float8"]["recipe_name"] == "rowwise"


def test_torchtitan_tensorwise_0_2_output_is_what_it_was():
    """0.2.2's [quantize.linear.float8] runs tensorwise without a recipe_name: the fp8 TOML is the bf16 one (less
    its loss-only [compile]) plus exactly the converter and the two sections it had before the recipe existed."""
    bf16 = tt_files(bf16_doc(TORCHTITAN), "0.2")["plan.toml"]
    loss_only = '\n[compile]\nenable = true\ncomponents = ["loss"]\n'  # bf16: the compiled loss the plan priced
    assert loss_only in bf16
    bf16 = bf16.replace(loss_only, "")  # fp8 compiles the model and the loss instead
    hf = 'hf_assets_path = "./assets/hf/tokenizer"  # edit: your tokenizer / HF assets folder\n'
    before = bf16.replace(hf, hf + 'converters = ["quantize.linear.float8"]\n') + (
        '\n[quantize.linear.float8]\nfilter_fqns = ["output"]\n\n[compile]\nenable = true\ncomponents = ["model", "loss"]\n'
    )
    assert tt_files(fp8_doc(TORCHTITAN, "tensorwise"), "0.2")["plan.toml"] == before
    readme = tt.render(
        LaunchPlan.of(fp8_doc(TORCHTITAN, "tensorwise"), 1, "torchtitan"), EmitOptions(framework_version="0.2")
    )
    (note,) = [line for line in readme.notes if line.startswith("fp8:")]
    assert "tensorwise scaling" in note and "without recipe_name" in note


def test_torchtitan_0_3_has_no_tensorwise_recipe():
    """torchtitan 0.3.0's Float8LinearConverter.Config takes recipe_name rowwise (its default) or
    rowwise_with_gw_hp: a tensorwise plan is refused for 0.3 and pointed at rowwise or 0.2."""
    err = refusal(fp8_doc(TORCHTITAN, "tensorwise"), "torchtitan")
    assert err.field == "job.training.fp8_recipe"
    assert "rowwise" in err.message and "--framework-version 0.2" in err.message
    assert "--framework torchtitan" in err.message
    emit(fp8_doc(TORCHTITAN, "tensorwise"), "torchtitan", 1, EmitOptions(framework_version="0.2"))  # 0.2: fine


@pytest.mark.parametrize("version", ["0.3", "0.2"])
def test_torchtitan_refuses_delayed(version):
    err = refusal(fp8_doc(TORCHTITAN, "delayed"), "torchtitan", EmitOptions(framework_version=version))
    assert err.field == "job.training.fp8_recipe"


# ---------------------------------------------------------------------------------------------------------------
# importers: the recipe read back


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_megatron_round_trip_of_the_recipe(recipe, tmp_path):
    plan = LaunchPlan.of(fp8_doc(MEGATRON, recipe), 1, "megatron")
    path = tmp_path / megatron.ARGS_FILE
    path.write_text(megatron.render(plan, EmitOptions()).files[megatron.ARGS_FILE])
    job = megatron.read(path, world_size=plan.world_size, gpu="h100-sxm", gpus_per_node=plan.gpus_per_node)
    assert job["training"]["precision"] == "fp8" and job["training"]["fp8_recipe"] == recipe
    assert parse_job(job).training.fp8_recipe == recipe


BASE = (
    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
    "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 64 --bf16 "
)


def read_megatron(tmp_path, flags: str) -> dict:
    path = tmp_path / "args.txt"
    path.write_text(BASE + flags)
    return megatron.read(path, world_size=8, gpu="h100-sxm")


def test_megatron_import_of_recipes(tmp_path):
    assert read_megatron(tmp_path, "--fp8-format hybrid")["training"]["fp8_recipe"] == "delayed"  # Megatron's default
    assert (
        read_megatron(tmp_path, "--fp8-format e4m3 --fp8-recipe tensorwise")["training"]["fp8_recipe"] == "tensorwise"
    )
    assert read_megatron(tmp_path, "--fp8-format=hybrid --fp8-recipe=delayed")["training"]["fp8_recipe"] == "delayed"
    bf16 = read_megatron(tmp_path, "--fp8-recipe mxfp8")["training"]  # no --fp8-format: Megatron trains bf16
    assert bf16["precision"] == "bf16" and "fp8_recipe" not in bf16
    script = megatron.read(ROOT / "tests/fixtures/configs/megatron/pretrain_llama2_70b.sh", gpu="h100-sxm")
    assert script["training"]["precision"] == "fp8" and script["training"]["fp8_recipe"] == "delayed"


@pytest.mark.parametrize("recipe", ["mxfp8", "blockwise", "custom"])
def test_megatron_import_refuses_recipes_the_planner_does_not_model(recipe, tmp_path):
    with pytest.raises(SpecError) as err:
        read_megatron(tmp_path, f"--fp8-format hybrid --fp8-recipe {recipe}")
    assert err.value.field == "--fp8-recipe"
    assert err.value.message == f"{recipe}: not modelled by the planner (its FP8 recipes: delayed, tensorwise)"


def test_megatron_import_refuses_an_unknown_recipe(tmp_path):
    with pytest.raises(SpecError) as err:
        read_megatron(tmp_path, "--fp8-format hybrid --fp8-recipe rowwise")
    assert err.value.field == "--fp8-recipe" and "invalid choice 'rowwise'" in err.value.message


@pytest.mark.parametrize("version, recipe", [("0.3", "rowwise"), ("0.2", "rowwise"), ("0.2", "tensorwise")])
def test_torchtitan_round_trip_of_the_recipe(version, recipe, tmp_path):
    plan = LaunchPlan.of(fp8_doc(TORCHTITAN, recipe), 1, "torchtitan")
    write_folder(tmp_path, tt_files(fp8_doc(TORCHTITAN, recipe), version))
    name = "plan_config.py" if version == "0.3" else "plan.toml"
    job = tt.read(tmp_path / name, world_size=plan.world_size, gpu="h100-sxm", gpus_per_node=plan.gpus_per_node)
    assert job["training"]["precision"] == "fp8" and job["training"]["fp8_recipe"] == recipe
    assert parse_job(job).training.fp8_recipe == recipe


TOML = """{top}
[model]
name = "llama3"
flavor = "8B"
converters = [{converter}]

[parallelism]
data_parallel_shard_degree = 8
{section}
"""


def read_toml(tmp_path, converter: str, section: str = "", top: str = "") -> dict:
    """The training of a 0.2 TOML with ``converter``, tables ``section`` at the end and keys ``top`` before them."""
    path = tmp_path / "plan.toml"
    path.write_text(TOML.format(converter=json.dumps(converter), section=section, top=top))
    return tt.read(path, gpu="h100-sxm")["training"]


def test_torchtitan_import_of_toml_recipes(tmp_path):
    assert read_toml(tmp_path, "quantize.linear.float8")["fp8_recipe"] == "tensorwise"  # no section: the default
    rowwise = '\n[quantize.linear.float8]\nrecipe_name = "rowwise"\n'
    assert read_toml(tmp_path, "quantize.linear.float8", rowwise)["fp8_recipe"] == "rowwise"
    old = '\n[float8]\nrecipe_name = "rowwise"\n'  # the older [float8] section (converter "float8")
    assert read_toml(tmp_path, "float8", old)["fp8_recipe"] == "rowwise"
    assert read_toml(tmp_path, "float8", '\n[float8]\nfilter_fqns = ["output"]\n')["fp8_recipe"] == "tensorwise"
    bf16 = read_toml(tmp_path, "other", rowwise)
    assert bf16["precision"] == "bf16"


@pytest.mark.parametrize(
    "converter, section, top, field, message",
    [
        ("quantize.linear.float8", '[quantize.linear.float8]\nrecipe_name = "rowwise_with_gw_hp"', "", "quantize.linear.float8.recipe_name", "models the tensorwise and rowwise"),
        ("quantize.linear.float8", '[quantize.linear.float8]\nrecipe_name = "mxfp8"', "", "quantize.linear.float8.recipe_name", "expected tensorwise, rowwise, rowwise_with_gw_hp, got 'mxfp8'"),
        ("float8", '[float8]\nrecipe_name = "delayed"', "", "float8.recipe_name", "got 'delayed'"),
        ("quantize.linear.float8", "", 'quantize = "float8"', "quantize", "expected a table"),
        ("quantize.linear.float8", "[quantize]\nlinear = 8", "", "quantize.linear", "expected a table"),
    ],
)  # fmt: skip
def test_torchtitan_import_refuses_toml_recipes(tmp_path, converter, section, top, field, message):
    with pytest.raises(SpecError) as err:
        read_toml(tmp_path, converter, "\n" + section + "\n", top)
    assert err.value.field == field and message in err.value.message


MODULE = """def plan():
    cfg = llama3_8b()
    cfg.model_spec = model_registry("8B", converters=[Float8LinearConverter.Config({kwargs})])
    cfg.parallelism.data_parallel_shard_degree = 8
"""


def read_module(tmp_path, kwargs: str) -> dict:
    path = tmp_path / "plan_config.py"
    path.write_text(MODULE.format(kwargs=kwargs))
    return tt.read(path, gpu="h100-sxm")["training"]


def test_torchtitan_import_of_module_recipes(tmp_path):
    assert read_module(tmp_path, "")["fp8_recipe"] == "rowwise"  # 0.3.0's default recipe_name
    assert read_module(tmp_path, 'recipe_name="rowwise", filter_fqns=["lm_head"]')["fp8_recipe"] == "rowwise"
    assert read_module(tmp_path, 'recipe_name="tensorwise"')["fp8_recipe"] == "tensorwise"  # later torchtitan
    path = tmp_path / "plan_config.py"
    path.write_text('RECIPE = "rowwise"\n' + MODULE.format(kwargs="recipe_name=RECIPE"))
    assert tt.read(path, gpu="h100-sxm")["training"]["fp8_recipe"] == "rowwise"
    path.write_text("def plan():\n    cfg = llama3_405b()\n    cfg.parallelism.data_parallel_shard_degree = 64\n")
    assert tt.read(path, gpu="h100-sxm")["training"]["fp8_recipe"] == "rowwise"  # its own converter, default recipe
    with pytest.raises(SpecError) as err:
        read_module(tmp_path, 'recipe_name="rowwise_with_gw_hp"')
    assert err.value.field == "Float8LinearConverter.Config.recipe_name"
    with pytest.raises(SpecError) as err:
        read_module(tmp_path, "recipe_name=pick()")
    assert err.value.field == "Float8LinearConverter.Config.recipe_name" and "literal" in err.value.message
