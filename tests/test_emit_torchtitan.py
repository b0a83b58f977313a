"""torchtitan emitter and importer (planner/emit/torchtitan.py, torchtitan_import.py): golden 0.3 plan_config.py
and 0.2 plan.toml files, the refusals (exit 4), the round trip plan -> config -> job for both versions, and reading
0.2.2 TOML files as torchtitan's train_configs write them. Regenerate the golden files with UPDATE_GOLDEN=1."""

from __future__ import annotations

import ast
import copy
import inspect
import tomllib
from pathlib import Path

import pytest
from emit_fixtures import check_golden_folder, load, runnable
from emit_fixtures import job_shape as shared_job_shape
from emit_fixtures import plan_shape as shared_plan_shape

from planner.emit import EmitOptions, emit
from planner.emit import torchtitan as tt
from planner.emit import torchtitan_import as tt_import
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError
from planner.io import write_folder
from planner.load import parse_job
from planner.parallel import dims_from_layout

HERE = Path(__file__).parent
CONFIGS = HERE / "fixtures" / "configs" / "torchtitan"
GOLDEN = HERE / "golden" / "emit" / "torchtitan"
GOLDEN_PLANS = {"llama3-70b-h100-torchtitan": 1, "llama2-7b-a100-torchtitan": 1}  # fixture stem -> plan rank
VERSIONS = ("0.3", "0.2")


RUNNABLE = runnable("torchtitan")


def render(plan: LaunchPlan, version: str | None = None) -> dict[str, str]:
    return tt.render(plan, EmitOptions(framework_version=version)).files


def config_path(folder: Path, version: str) -> Path:
    return folder / ("plan_config.py" if version == "0.3" else "plan.toml")


def plan_shape(plan: LaunchPlan) -> tuple:
    return (*shared_plan_shape(plan), plan.training.seq_length, plan.model.num_layers, plan.model.hidden_size)


def job_shape(raw: dict, base_dir: Path | None = None) -> tuple:
    job = parse_job(raw, base_dir=base_dir)
    return (*shared_job_shape(raw, base_dir), job.training.seq_length, job.model.num_layers, job.model.hidden_size)


def read_back(plan: LaunchPlan, folder: Path, version: str) -> dict:
    group = plan.job.cluster[0]
    return tt.read(
        config_path(folder, version),
        world_size=plan.world_size,
        gpu=group.gpu.name,
        gpus_per_node=group.gpus_per_node,
    )


# ---------------------------------------------------------------------------------------------------------------
# emit


@pytest.mark.parametrize("stem", sorted(GOLDEN_PLANS))
def test_golden_files(stem):
    plan = LaunchPlan.of(load(stem), GOLDEN_PLANS[stem], "torchtitan")
    files = {**render(plan, "0.3"), **render(plan, "0.2")}
    check_golden_folder(GOLDEN / stem, files, stem)


def test_fixtures_cover_the_interesting_shapes():
    plans = [LaunchPlan.of(load(s), r, "torchtitan") for s, r in RUNNABLE]
    assert any(p.vpp > 1 for p in plans) and any(p.pp > 1 and not p.even_split for p in plans)
    assert any(p.zero_stage == 3 for p in plans) and any(p.zero_stage == 0 for p in plans)
    assert any(p.ep > 1 for p in plans) and any(p.cp > 1 for p in plans)


@pytest.mark.parametrize("stem, rank", RUNNABLE)
@pytest.mark.parametrize("version", VERSIONS)
def test_emitted_files_parse_and_carry_the_plan(stem, rank, version):
    plan = LaunchPlan.of(load(stem), rank, "torchtitan")
    files = render(plan, version)
    for name, text in files.items():
        if name.endswith(".py"):
            compile(text, name, "exec")  # valid Python; it is never imported here (torchtitan is not installed)
    if version == "0.2":
        doc = tomllib.loads(files["plan.toml"])
        par, train = doc["parallelism"], doc["training"]
        assert "enable_sequence_parallel" not in par and "disable_cuda_graphs" not in train  # not 0.2.2 keys
        for section, fields in (("parallelism", tt_import.PARALLELISM_02), ("training", tt_import.TRAINING_02)):
            assert set(doc[section]) <= set(fields)
    else:
        par, train = _plan_assignments(files["plan_config.py"])
        assert train["disable_cuda_graphs"] is (plan.pp > 1 or plan.ep > 1)
        assert par["enable_sequence_parallel"] is plan.sequence_parallel
    replicate, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    assert (replicate, shard) == ((1, plan.dp) if plan.zero_stage == 3 else (plan.dp, 1))
    assert replicate * shard * par["context_parallel_degree"] * par["tensor_parallel_degree"] * plan.pp == (
        plan.world_size
    )
    assert train["global_batch_size"] == plan.global_batch_size and train["seq_len"] == plan.training.seq_length
    if plan.pp > 1:
        parts = par["module_fqns_per_model_part"]
        assert len(parts) == plan.pp * plan.vpp
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if plan.vpp > 1 else "1F1B")
        out = "lm_head" if version == "0.3" else "output"
        flat = [name for part in parts for name in part]
        assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(plan.model.num_layers)), "norm", out]
        layers = [sum(1 for n in part if n.startswith("layers.")) for part in parts]
        owned = [sum(layers[v * plan.pp + r] for v in range(plan.vpp)) for r in range(plan.pp)]  # loop schedules
        assert tuple(owned) == plan.stage_layers
        assert train["local_batch_size"] == plan.micro_batch_size * plan.num_microbatches
        assert train["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0
    else:
        assert train["local_batch_size"] == plan.micro_batch_size


def _plan_assignments(source: str) -> tuple[dict, dict]:
    """p.<field> and t.<field> values set in plan() of an emitted plan_config.py."""
    tree = ast.parse(source)
    consts = {
        n.targets[0].id: ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id.isupper()
    }
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "plan")
    par, train = {}, {}
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Attribute):
            owner = ast.unparse(stmt.targets[0].value)
            value = stmt.value
            got = consts[value.id] if isinstance(value, ast.Name) and value.id in consts else None
            if got is None:
                try:
                    got = ast.literal_eval(value)
                except ValueError:
                    continue
            {"p": par, "t": train}.get(owner, {})[stmt.targets[0].attr] = got
    return par, train


def test_programs_and_versions():
    plan = LaunchPlan.of(load("llama3-70b-h100-torchtitan"), 1, "torchtitan")
    for given in (None, "0.3", "0.3.0", "v0.3"):
        bundle = tt.render(plan, EmitOptions(framework_version=given))
        assert bundle.program == ["-m", "torchtitan.train", "--module", "plan_config", "--config", "plan"]
        assert list(bundle.files) == ["plan_config.py"] and bundle.workdir is None
    for given in ("0.2", "0.2.2"):
        bundle = tt.render(plan, EmitOptions(framework_version=given))
        assert bundle.program == ["-m", "torchtitan.train", "--job.config_file", "plan.toml"]
        assert list(bundle.files) == ["plan.toml"]
    with pytest.raises(SpecError, match="0.3 .*0.2") as info:
        tt.render(plan, EmitOptions(framework_version="0.4"))
    assert info.value.field == "--framework-version"


def test_registry_and_custom_models():
    llama = render(LaunchPlan.of(load("llama3-70b-h100-torchtitan"), 1, "torchtitan"), "0.3")["plan_config.py"]
    assert "from torchtitan.models.llama3.config_registry import llama3_70b" in llama
    assert 'model_registry("70B")' in llama and "cfg.activation_checkpoint = None" in llama
    qwen = render(LaunchPlan.of(load("qwen3-30b-a3b-h100-torchtitan"), 2, "torchtitan"), "0.3")["plan_config.py"]
    assert "qwen3_30b_a3b()" in qwen and 'model_registry("30B-A3B")' in qwen
    custom = render(LaunchPlan.of(load("llama2-7b-a100-torchtitan"), 1, "torchtitan"), "0.2")
    assert tomllib.loads(custom["plan.toml"])["experimental"]["custom_import"] == "plan_model"
    assert "llama3_args[FLAVOR] = TransformerModelArgs(" in custom["plan_model.py"]


def test_custom_ffn_width_is_exact_in_0_2():
    """0.2.2 FeedForward: hidden = multiple_of * ceil(int(multiplier * int(8 * dim / 3)) / multiple_of)."""
    for dim, ffn in ((4096, 11008), (4096, 14336), (5120, 8192), (8192, 28672)):
        doc = copy.deepcopy(load("llama2-7b-a100-torchtitan"))
        doc["job"]["model"].update(hidden_size=dim, ffn_hidden_size=ffn, name="custom")
        source = render(LaunchPlan.of(doc, 1, "torchtitan"), "0.2")["plan_model.py"]
        call = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call))
        kw = {k.arg: k.value for k in call.keywords}
        multiple_of, multiplier = ffn, ast.literal_eval(kw["ffn_dim_multiplier"])
        hidden = int(2 * 4 * dim / 3)
        if multiplier is not None:
            hidden = int(multiplier * hidden)
        assert multiple_of * ((hidden + multiple_of - 1) // multiple_of) == ffn


def test_full_recompute_and_fp8():
    doc = copy.deepcopy(load("llama3-8b-h100-torchtitan"))
    doc["plans"][2]["layout"]["recompute"] = "full"
    doc["job"]["training"].update(precision="fp8", fp8_recipe="rowwise")  # 0.3.0's Float8 recipes are rowwise
    files03 = emit(doc, "torchtitan", 3)
    source = files03["plan_config.py"]
    assert "cfg.activation_checkpoint = FullAC.Config()" in source
    assert 'Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"]' in source
    assert 'cfg.compile = CompileConfig(enable=True, components=["model", "loss"])' in source
    doc["job"]["training"]["fp8_recipe"] = "tensorwise"  # 0.2.2's default Float8 recipe: no recipe_name
    toml = tomllib.loads(emit(doc, "torchtitan", 3, EmitOptions(framework_version="0.2"))["plan.toml"])
    assert toml["activation_checkpoint"] == {"mode": "full"}
    assert toml["model"]["converters"] == ["quantize.linear.float8"]
    assert toml["quantize"]["linear"]["float8"] == {"filter_fqns": ["output"]}


@pytest.mark.parametrize("version", VERSIONS)
def test_per_op_checkpointing_is_selective_ac_and_round_trips(version, tmp_path):
    doc = copy.deepcopy(load("llama3-8b-h100-torchtitan"))
    doc["plans"][2]["layout"]["recompute"] = "op"
    plan = LaunchPlan.of(doc, 3, "torchtitan")
    files = render(plan, version)
    if version == "0.3":
        assert "cfg.activation_checkpoint = SelectiveAC.Config()" in files["plan_config.py"]
    else:
        assert tomllib.loads(files["plan.toml"])["activation_checkpoint"] == {
            "mode": "selective",
            "selective_ac_option": "op",
        }
    write_folder(tmp_path, files)
    assert job_shape(read_back(plan, tmp_path, version), tmp_path) == plan_shape(plan)


# ---------------------------------------------------------------------------------------------------------------
# refusals (exit 4), through planner.emit.emit


def test_partial_recompute_is_refused():
    doc = copy.deepcopy(load("llama3-8b-h100-torchtitan"))
    for stage in doc["plans"][2]["layout"]["stages"]:
        stage["recompute_layers"] = 2
    with pytest.raises(Inexpressible, match="--framework torchtitan") as info:
        emit(doc, "torchtitan", 3)
    assert info.value.field == "plans[2].layout.stages"


def test_zero_1_is_refused():
    doc = copy.deepcopy(load("llama3-8b-h100-torchtitan"))
    doc["plans"][0]["layout"]["zero_stage"] = 1
    with pytest.raises(Inexpressible, match="--framework torchtitan") as info:
        emit(doc, "torchtitan")
    assert info.value.field == "plans[0].layout.zero_stage"


def test_expert_parallelism_must_divide_the_dense_ranks():
    doc = copy.deepcopy(load("qwen3-30b-a3b-h100-torchtitan"))
    lay = doc["plans"][0]["layout"]
    assert (lay["zero_stage"], lay["dp"], lay["ep"]) == (3, 2, 4)
    lay["cp"] = 1  # dp_shard * cp * tp = 2 * 1 * 1: not divisible by ep 4
    with pytest.raises(
        Inexpressible, match=r"needs ep \(4\) to divide the FSDP shard \* cp \* tp.*--framework torchtitan"
    ) as info:
        emit(doc, "torchtitan", 1)
    assert info.value.field == "plans[0].layout.ep"


def test_single_stage_schedule_needs_a_microbatch_per_stage():
    doc = copy.deepcopy(load("llama3-8b-h100-torchtitan"))
    lay = doc["plans"][2]["layout"]
    lay["micro_batch_size"], lay["num_microbatches"] = 128, 1
    doc["job"]["training"]["global_batch_size"] = 128
    with pytest.raises(Inexpressible, match="at least as many micro-batches.*--framework torchtitan") as info:
        emit(doc, "torchtitan", 3)
    assert info.value.field == "plans[2].layout.num_microbatches"


def test_models_torchtitan_has_no_config_for_are_refused():
    with pytest.raises(Inexpressible, match="torchtitan has no model for gpt-13b: a gelu MLP") as info:
        emit(load("gpt-13b-a100-deepspeed"), "torchtitan", 2)
    assert info.value.field == "job.model"
    doc = copy.deepcopy(load("llama3-8b-h100-torchtitan"))
    doc["job"]["model"].update(name="my-moe", moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 14336})
    with pytest.raises(Inexpressible, match="MoE model outside torchtitan's registry"):
        emit(doc, "torchtitan")
    doc = copy.deepcopy(load("llama3-8b-h100-torchtitan"))
    doc["job"]["model"]["num_layers"] = 30  # no longer the llama3-8b preset: built from its dimensions
    doc["plans"][0]["layout"]["stages"] = [{"layers": 30}]
    assert "MODEL = {" in emit(doc, "torchtitan")["plan_config.py"]


def test_fp16_is_refused():
    doc = copy.deepcopy(load("llama3-8b-h100-torchtitan"))
    doc["job"]["training"]["precision"] = "fp16"
    with pytest.raises(Inexpressible, match="torchtitan has no fp16 training"):
        emit(doc, "torchtitan")


# ---------------------------------------------------------------------------------------------------------------
# round trip and import


def test_read_forwards_to_the_importer_with_its_parameters():
    # `planner import` and scripts/validate_emitters.py pass only the options the signature of planner.emit.<fw>.read
    # names, so the emitter module's read keeps the importer's parameters exactly
    assert inspect.signature(tt.read) == inspect.signature(tt_import.read)


@pytest.mark.parametrize("stem, rank", RUNNABLE)
@pytest.mark.parametrize("version", VERSIONS)
def test_round_trip(stem, rank, version, tmp_path):
    plan = LaunchPlan.of(load(stem), rank, "torchtitan")
    write_folder(tmp_path, render(plan, version))
    assert job_shape(read_back(plan, tmp_path, version), tmp_path) == plan_shape(plan)


@pytest.mark.parametrize("version", VERSIONS)
def test_round_trip_of_full_recompute_and_fp8(version, tmp_path):
    doc = copy.deepcopy(load("llama3-70b-h100-torchtitan"))
    doc["plans"][0]["layout"]["recompute"] = "full"
    doc["job"]["training"].update(precision="fp8", fp8_recipe="rowwise")
    plan = LaunchPlan.of(doc, 1, "torchtitan")
    write_folder(tmp_path, render(plan, version))
    raw = read_back(plan, tmp_path, version)
    assert raw["training"]["precision"] == "fp8" and raw["model"] == "llama3-70b"
    assert raw["training"]["fp8_recipe"] == "rowwise"
    assert job_shape(raw, tmp_path) == plan_shape(plan)


def test_import_of_a_0_2_toml_like_the_llama3_train_configs():
    raw = tt.read(CONFIGS / "llama3_8b.toml", world_size=64, gpu="h100-sxm")
    assert raw["model"] == "llama3-8b"
    assert raw["cluster"] == [{"gpu": "h100-sxm", "nodes": 8, "gpus_per_node": 8}]
    assert raw["training"] == {
        "seq_length": 8192,
        "global_batch_size": 64,
        "precision": "bf16",
        "cross_entropy": "unfused",  # torchtitan's loss and DTensor TP: its own kernels, not Megatron's
        "tp_backward_overlap": False,
        "fp8_saved_inputs": False,
        "fp8_recipe": "rowwise",  # torchtitan's own implementation settings (planner/frameworks.py)
        "fp32_params": True,
        "grad_dtype": "fp32",  # FSDP2 reduces in fp32 (training.mixed_precision_reduce)
    }
    lay = raw["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["zero_stage"], lay["micro_batch_size"]) == (1, 1, 64, 3, 1)
    assert lay["recompute"] == "op"  # torchtitan's per-op selective checkpointing
    parse_job(raw)


def test_import_of_a_0_2_pipeline_with_the_default_split_and_layer_ac():
    raw = tt.read(CONFIGS / "llama3_70b_pp.toml", world_size=64, gpu="h100-sxm")
    job = parse_job(raw)
    d = dims_from_layout(job.layout, job).check()
    assert (d.tp, d.pp, d.vpp, d.dp, d.zero_stage, d.micro_batch_size) == (8, 4, 2, 2, 3, 1)
    assert d.stage_layers == (20, 20, 20, 20) and d.stage_recompute == (10, 10, 10, 10)  # every 2nd layer
    assert job.training.global_batch_size == 256


def test_import_of_a_hand_written_0_3_module(tmp_path):
    path = tmp_path / "my_config.py"
    path.write_text(
        "from torchtitan.models.llama3.config_registry import llama3_8b\n"
        "from torchtitan.distributed.activation_checkpoint import FullAC\n\n"
        "def plan():\n"
        "    cfg = llama3_8b(); p = cfg.parallelism\n"
        "    p.data_parallel_replicate_degree, p.data_parallel_shard_degree = 1, 4\n"
        "    p.tensor_parallel_degree, p.pipeline_parallel_degree = 2, 2\n"
        "    p.pipeline_parallel_schedule = 'Interleaved1F1B'\n"
        "    p.pipeline_parallel_first_stage_less_layers = p.pipeline_parallel_last_stage_less_layers = 0\n"
        "    cfg.training.local_batch_size, cfg.training.global_batch_size = 4, 512\n"
        "    cfg.training.disable_cuda_graphs = True\n"
        "    cfg.activation_checkpoint = FullAC.Config()\n"
        "    return cfg\n"
    )
    raw = tt.read(path, gpu="h100-sxm")
    job = parse_job(raw)
    d = dims_from_layout(job.layout, job).check()
    assert (d.tp, d.pp, d.vpp, d.dp, d.zero_stage, d.recompute) == (2, 2, 2, 4, 3, "full")
    assert d.world == 16 and d.micro_batch_size == 1 and job.training.seq_length == 8192  # llama3_8b's seq_len
    assert d.stage_layers == (16, 16)  # torchtitan's default split: 4 parts of 8 layers, 2 per rank


def _toml(tmp_path: Path, text: str, name: str = "plan.toml") -> Path:
    path = tmp_path / name
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n' + text)
    return path


@pytest.mark.parametrize(
    "text, field, message",
    [
        ("[parallelism]\ntensor_parallel_size = 2\n", "parallelism.tensor_parallel_size", "tensor_parallel_degree"),
        ("[training]\nlocal_batch = 2\n", "training.local_batch", "unknown key"),
        ('[parallelism]\ntensor_parallel_degree = "4"\n', "parallelism.tensor_parallel_degree", "integer"),
        ("[parallelism]\ndata_parallel_shard_degree = 4\n", "parallelism", "--world-size says 16"),
        (
            "[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 8\n",
            "parallelism.data_parallel_replicate_degree",
            "HSDP",
        ),
        (
            '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "ZBVZeroBubble"\n',
            "parallelism.pipeline_parallel_schedule",
            "1F1B and Interleaved1F1B",
        ),
        (
            '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "Interleaved2F2B"\n',
            "parallelism.pipeline_parallel_schedule",
            "unknown schedule",
        ),
        (
            "[parallelism]\npipeline_parallel_degree = 2\n"
            'module_fqns_per_model_part = [["tok_embeddings", "layers.0"], ["norm", "lm_head"]]\n',
            "parallelism.module_fqns_per_model_part",
            "output",
        ),
        (
            "[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 3\n"
            "[training]\nlocal_batch_size = 4\n",
            "parallelism.pipeline_parallel_microbatch_size",
            "does not divide",
        ),
        ("[training]\nlocal_batch_size = 4\nglobal_batch_size = 100\n", "training.global_batch_size", "multiple"),
        ('[activation_checkpoint]\nmode = "partial"\n', "activation_checkpoint.mode", "expected none"),
        ('[activation_checkpoint]\nmode = "memory_budget"\n', "activation_checkpoint.mode", "no planner form"),
        ("[parallelism\n", "plan.toml", "invalid TOML"),
    ],
)
def test_bad_tomls_name_the_key(tmp_path, text, field, message):
    with pytest.raises(SpecError, match=message) as info:
        tt.read(_toml(tmp_path, text), world_size=16, gpu="h100-sxm")
    assert info.value.field == field


def test_default_split_with_unequal_parts_per_rank_is_named(tmp_path):
    path = _toml(
        tmp_path, '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "Interleaved1F1B"\n'
    )
    with pytest.raises(SpecError, match="equal layer counts") as info:
        tt.read(path, world_size=16, gpu="h100-sxm")
    assert info.value.field == "parallelism.pipeline_parallel_layers_per_stage"


def test_missing_arguments_name_the_flag(tmp_path):
    path = _toml(tmp_path, "")
    with pytest.raises(SpecError) as info:
        tt.read(path, gpu="h100-sxm")  # data_parallel_shard_degree -1 needs the world size
    assert info.value.field == "--world-size"
    with pytest.raises(SpecError) as info:
        tt.read(path, world_size=16)
    assert info.value.field == "--gpu"
    other = tmp_path / "other.toml"
    other.write_text('[model]\nname = "llama4"\nflavor = "17bx16e"\n')
    with pytest.raises(SpecError) as info:
        tt.read(other, world_size=16, gpu="h100-sxm")
    assert info.value.field == "--model"
    assert tt.read(other, world_size=16, gpu="h100-sxm", model="llama3-8b")["model"] == "llama3-8b"
    with pytest.raises(SpecError, match=r"\.toml.*\.py") as info:
        tt.read(tmp_path / "config.yaml", world_size=16, gpu="h100-sxm")
    assert info.value.field == "torchtitan"


def test_bad_modules_are_read_statically(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "plan_config.py"
    path.write_text(f"open({str(marker)!r}, 'w')\ndef plan():\n    cfg = llama3_8b()\n    cfg.parallelism.tp = 2\n")
    with pytest.raises(SpecError, match="unknown ParallelismConfig field") as info:
        tt.read(path, world_size=8, gpu="h100-sxm")
    assert info.value.field == "parallelism.tp" and not marker.exists()  # never executed
    path.write_text("def plan(:\n")
    with pytest.raises(SpecError, match="not valid Python") as info:
        tt.read(path, world_size=8, gpu="h100-sxm")
    assert info.value.field == "plan_config.py"
    path.write_text("X = 1\n")
    with pytest.raises(SpecError, match=r"no function plan\(\)"):
        tt.read(path, world_size=8, gpu="h100-sxm")
    path.write_text("def plan():\n    cfg = llama3_8b()\n    cfg.parallelism.tensor_parallel_degree = compute()\n")
    with pytest.raises(SpecError, match="literal") as info:
        tt.read(path, world_size=8, gpu="h100-sxm")
    assert info.value.field == "parallelism.tensor_parallel_degree"


def test_fp8_of_a_module_follows_its_model_spec(tmp_path):
    path = tmp_path / "plan_config.py"
    head = "def plan():\n    cfg = llama3_405b()\n    cfg.parallelism.data_parallel_shard_degree = 64\n"
    path.write_text(head)  # llama3_405b's own model_spec has Float8 linears
    assert tt.read(path, gpu="h100-sxm")["training"]["precision"] == "fp8"
    path.write_text(head + '    cfg.model_spec = model_registry("405B")\n')
    assert tt.read(path, gpu="h100-sxm")["training"]["precision"] == "bf16"


@pytest.mark.parametrize(
    "compile_section, loss",
    [
        ('enable = false\ncomponents = ["model", "loss"]', "unfused"),
        ('enable = true\ncomponents = ["model", "loss"]', "fused"),  # torch.compile fuses the loss
        ("enable = true", "fused"),  # components default to model and loss
        ('enable = true\ncomponents = ["model"]', "unfused"),
    ],
)
def test_import_reads_a_compiled_loss_as_fused(compile_section, loss, tmp_path):
    text = (CONFIGS / "llama3_8b.toml").read_text()
    start = text.index("[compile]")
    end = text.index("\n[", start + 1)
    path = tmp_path / "job.toml"
    path.write_text(text[:start] + "[compile]\n" + compile_section + "\n" + text[end:])
    assert tt.read(path, world_size=64, gpu="h100-sxm")["training"]["cross_entropy"] == loss


def test_an_emitted_0_3_config_reads_back_with_its_chunked_loss(tmp_path):
    # torchtitan 0.3's ChunkedLossWrapper (what the registry functions and `planner emit` set) holds a chunk of the
    # logits at a time: at most a fused loss's 4 bytes per logit
    plan = LaunchPlan.of(load("llama3-70b-h100-torchtitan"), 1, "torchtitan")
    write_folder(tmp_path, render(plan, "0.3"))
    assert read_back(plan, tmp_path, "0.3")["training"]["cross_entropy"] == "fused"


@pytest.mark.parametrize("loss", ["fused", "unfused"])
def test_a_0_2_config_compiles_the_loss_the_plan_priced_fused(loss, tmp_path):
    """torchtitan 0.2's eager loss keeps 10 bytes per logit; a plan priced with a fused loss (4) gets
    [compile] components ["loss"] (torchtitan's compiled cross-entropy), and the importer reads the loss back as
    the plan had it."""
    doc = copy.deepcopy(load("llama2-7b-a100-torchtitan"))
    doc["job"]["training"]["cross_entropy"] = loss
    plan = LaunchPlan.of(doc, 1, "torchtitan")
    files = render(plan, "0.2")
    toml = files["plan.toml"]
    assert ('components = ["loss"]' in toml) == (loss == "fused")
    write_folder(tmp_path, files)
    assert read_back(plan, tmp_path, "0.2")["training"]["cross_entropy"] == loss
