"""Megatron-LM and Megatron-Bridge emitters (planner/emit/megatron.py, megatron_bridge.py): golden flag files, the
rules that refuse a plan (exit 4), the import of Megatron-LM launch scripts and args files (megatron_import.py,
shell_script.py), and the round trip render -> read on every fixture plan Megatron can run. Regenerate the golden
files with UPDATE_GOLDEN=1."""

from __future__ import annotations

import copy
import inspect
import os
import shlex
from pathlib import Path

import pytest
from emit_fixtures import flag_values as argv_flag_values
from emit_fixtures import load, runnable

from planner.emit import EmitOptions, LaunchPlan, megatron, megatron_bridge, megatron_import
from planner.errors import Inexpressible, SpecError
from planner.frameworks import check_runnable
from planner.load import parse_job

ROOT = Path(__file__).resolve().parent
CONFIGS = ROOT / "fixtures" / "configs" / "megatron"
GOLDEN = ROOT / "golden" / "emit"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

# Plan 1 of these fixtures has a golden file per target (stems named explicitly: other fixtures come and go).
GOLDEN_STEMS = (
    "llama3-70b-h100-megatron",  # uneven 19/21/21/19, CP 8: the layout flag
    "llama3-70b-h100",
    "mixtral-h100-megatron",  # MoE, EP 4 with TP 2
    "llama3-405b-3types-megatron",  # 64 stages over three GPU types, one TP
    "llama3-70b-h100-vpp2-cp4",  # even split with vpp 2, CP 4, ZeRO-0
)


def plan_of(doc: dict, rank: int = 1, target: str = "megatron") -> LaunchPlan:
    plan = LaunchPlan.of(doc, rank, target)
    check_runnable("megatron", plan, target)
    return plan


def render(doc: dict, rank: int = 1):
    return megatron.render(plan_of(doc, rank), EmitOptions())


def variant(stem: str, rank: int = 1, *, job=None, model=None, training=None, **layout) -> dict:
    """A copy of a fixture whose plan ``rank`` (and job) is changed: layout keys, stages' recompute_layers
    (``recompute_layers=r``), job.model / job.training fields."""
    doc = copy.deepcopy(load(stem))
    lay = doc["plans"][rank - 1]["layout"]
    r = layout.pop("recompute_layers", None)
    lay.update(layout)
    if r is not None:
        for s in lay["stages"]:
            s["recompute_layers"] = r
    doc["job"]["layout"] = None  # the job's own fixed layout is not the plan's; changed fields could break it
    if job:
        doc["job"].update(job)
    if model:
        doc["job"]["model"].update(model)
    if training:
        doc["job"]["training"].update(training)
    return doc


def flag_values(bundle, flag: str) -> list[str] | None:
    return argv_flag_values(bundle.program[1:], flag)


def check_golden(path: Path, text: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; regenerate with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs; regenerate with UPDATE_GOLDEN=1 after checking the change"


# --------------------------------------------------------------------------------------------- golden files


@pytest.mark.parametrize("stem", GOLDEN_STEMS)
def test_golden_megatron_args(stem):
    bundle = render(load(stem))
    check_golden(GOLDEN / "megatron" / stem / megatron.ARGS_FILE, bundle.files[megatron.ARGS_FILE])
    # the program is pretrain_gpt.py and the same flags, one per line in the file
    assert bundle.program[0] == "pretrain_gpt.py"
    assert shlex.split(bundle.files[megatron.ARGS_FILE]) == bundle.program[1:]
    assert bundle.workdir == '"${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout}"'
    assert any("--mock-data" in n and "NullTokenizer" in n for n in bundle.notes)


@pytest.mark.parametrize("stem", GOLDEN_STEMS)
def test_golden_bridge_overrides(stem):
    doc = load(stem)
    bundle = megatron_bridge.render(plan_of(doc, 1, "megatron-bridge"), EmitOptions())
    text = bundle.files[megatron_bridge.OVERRIDES_FILE]
    check_golden(GOLDEN / "megatron-bridge" / stem / megatron_bridge.OVERRIDES_FILE, text)
    assert bundle.program[:3] == ["scripts/training/run_recipe.py", "--recipe", "vanilla_gpt_pretrain_config"]
    assert bundle.program[3:] == text.splitlines()
    assert bundle.workdir == '"${MEGATRON_BRIDGE:?set MEGATRON_BRIDGE to your Megatron-Bridge checkout}"'
    assert any("vanilla_gpt_pretrain_config" in n for n in bundle.notes)


# --------------------------------------------------------------------------------------------- mapping


def test_uneven_split_uses_the_layout_never_the_vpp_flag():
    bundle = render(load("llama3-70b-h100-megatron"))
    assert flag_values(bundle, "--pipeline-model-parallel-layout") == ["Et*19|(t*21|)*2t*19L"]
    assert flag_values(bundle, "--num-virtual-stages-per-pipeline-rank") is None
    assert flag_values(bundle, "--context-parallel-size") == ["8"]
    assert bundle.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_even_split_with_vpp_uses_virtual_stages():
    bundle = render(load("llama3-70b-h100-vpp2-cp4"))
    assert flag_values(bundle, "--num-virtual-stages-per-pipeline-rank") == ["2"]
    assert flag_values(bundle, "--pipeline-model-parallel-layout") is None
    assert flag_values(bundle, "--use-distributed-optimizer") is None  # ZeRO-0
    assert flag_values(bundle, "--overlap-grad-reduce") == []


def test_uneven_split_with_vpp_orders_chunks_by_vpp_rank_then_pp_rank():
    doc = variant("llama3-70b-h100-megatron", vpp=1)
    doc["plans"][0]["layout"]["stages"] = [{"layers": 18}, {"layers": 22}, {"layers": 22}, {"layers": 18}]
    doc["plans"][0]["layout"]["vpp"] = 2
    bundle = render(doc)
    (layout,) = flag_values(bundle, "--pipeline-model-parallel-layout")
    assert megatron.parse_layout(layout) == [9, 11, 11, 9, 9, 11, 11, 9]
    assert flag_values(bundle, "--num-virtual-stages-per-pipeline-rank") is None


def test_layout_strings_parse_like_megatron():
    # emitters.md 1.4: both examples validate in Megatron (pp 4; pp 4 with vpp 2)
    assert megatron.parse_layout("Et*7|t*9|t*9|t*7L") == [7, 9, 9, 7]
    assert megatron.parse_layout("Et*3|(t*4|)*6t*5L") == [3, 4, 4, 4, 4, 4, 4, 5]
    for chunks in ([1, 1, 2, 3, 3, 2], [19, 21, 21, 19], [5, 0, 7], [4, 4, 4, 4], [9]):
        assert megatron.parse_layout(megatron.layout_string(chunks)) == chunks
    for bad in ("t*4|t*4L", "Et*4|t*4", "Et*4|x*4L", "Et|m|L"):
        with pytest.raises(SpecError) as err:
            megatron.parse_layout(bad)
        assert err.value.field == "--pipeline-model-parallel-layout"


def test_moe_flags_and_expert_parallel():
    bundle = render(load("mixtral-h100-megatron"))
    assert flag_values(bundle, "--num-experts") == ["8"]
    assert flag_values(bundle, "--moe-router-topk") == ["2"]
    assert flag_values(bundle, "--moe-ffn-hidden-size") == ["14336"]
    assert flag_values(bundle, "--expert-model-parallel-size") == ["4"]
    assert flag_values(bundle, "--expert-tensor-parallel-size") == ["2"]
    assert flag_values(bundle, "--moe-layer-freq") == ["1"]
    assert flag_values(bundle, "--sequence-parallel") == []
    assert flag_values(bundle, "--moe-grouped-gemm") == []


def test_moe_dense_layers_and_shared_experts():
    moe = {
        "num_experts": 8,
        "top_k": 2,
        "expert_ffn_hidden_size": 14336,
        "shared_experts": 2,
        "moe_layer_freq": 2,
        "first_dense_layers": 3,
    }
    doc = variant("mixtral-h100-megatron", model={"moe": moe})
    plan = plan_of(doc)
    bundle = megatron.render(plan, EmitOptions())
    (pattern,) = flag_values(bundle, "--moe-layer-freq")
    expected = [1 if plan.model.is_moe_layer(i) else 0 for i in range(32)]
    assert megatron.eval_pattern(pattern) == expected
    assert flag_values(bundle, "--moe-shared-expert-intermediate-size") == [str(2 * 14336)]
    bridge = megatron_bridge.render(plan, EmitOptions())
    assert f"model.moe_layer_freq=[{','.join(map(str, expected))}]" in bridge.program
    assert "model.moe_shared_expert_intermediate_size=28672" in bridge.program


def test_top1_routing_puts_the_softmax_first():
    moe = {"num_experts": 8, "top_k": 1, "expert_ffn_hidden_size": 14336}
    plan = plan_of(variant("mixtral-h100-megatron", model={"moe": moe}))
    assert flag_values(megatron.render(plan, EmitOptions()), "--moe-router-pre-softmax") == []
    assert "model.moe_router_pre_softmax=true" in megatron_bridge.render(plan, EmitOptions()).program


@pytest.mark.parametrize(
    "dense,freq,layers", [(0, 1, 8), (1, 1, 8), (3, 2, 32), (2, 3, 10), (5, 4, 6), (0, 3, 7), (6, 2, 6)]
)
def test_moe_pattern_strings(dense, freq, layers):
    from planner.spec import ModelSpec

    model = ModelSpec(
        num_layers=layers,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        vocab_size=100,
        moe={
            "num_experts": 4,
            "top_k": 1,
            "expert_ffn_hidden_size": 32,
            "moe_layer_freq": freq,
            "first_dense_layers": dense,
        },
    )
    expected = [1 if model.is_moe_layer(i) else 0 for i in range(layers)]
    assert megatron.eval_pattern(megatron.pattern_string(model)) == expected
    form = megatron_import.pattern_form(expected, "p")
    if not any(expected):  # every layer dense
        assert form == (layers, 1)
    else:
        assert form == (dense, freq if expected.count(1) > 1 else layers - dense)


def test_recompute_block_counts_per_model_chunk():
    # 40 + 40 layers, pp 2, vpp 2 (64 micro-batches): 4 recomputed layers per stage = 2 per chunk
    doc = variant("llama3-70b-h100-megatron", 2, vpp=2, recompute_layers=4)
    bundle = render(doc, 2)
    assert flag_values(bundle, "--recompute-granularity") == ["full"]
    assert flag_values(bundle, "--recompute-method") == ["block"]
    assert flag_values(bundle, "--recompute-num-layers") == ["2"]
    assert flag_values(bundle, "--num-virtual-stages-per-pipeline-rank") == ["2"]


def test_recompute_full_and_selective():
    full = render(variant("llama3-70b-h100-megatron", 2, recompute="full"), 2)
    assert [
        flag_values(full, f) for f in ("--recompute-granularity", "--recompute-method", "--recompute-num-layers")
    ] == [
        ["full"],
        ["uniform"],
        ["1"],
    ]
    sel = render(variant("llama3-70b-h100-megatron", 2, recompute="selective"), 2)
    assert flag_values(sel, "--recompute-granularity") == ["selective"]
    assert flag_values(sel, "--recompute-method") is None


def test_selective_with_partial_full_recompute_drops_selective_under_flash():
    bundle = render(variant("llama3-70b-h100-megatron", 2, recompute="selective", recompute_layers=3), 2)
    assert flag_values(bundle, "--recompute-granularity") == ["full"]
    assert flag_values(bundle, "--recompute-num-layers") == ["3"]
    assert any("selectively" in n for n in bundle.notes)


def test_zero3_is_torch_fsdp2_without_cuda_device_max_connections():
    doc = variant("llama3-70b-h100-megatron", 2, pp=1, tp=4, cp=4, dp=32, zero_stage=3)
    doc["plans"][1]["layout"]["stages"] = [{"layers": 80}]
    doc["plans"][1]["placement"]["stages"] = doc["plans"][1]["placement"]["stages"][:1]
    bundle = render(doc, 2)
    for flag in ("--use-torch-fsdp2", "--no-gradient-accumulation-fusion"):
        assert flag_values(bundle, flag) == []
    assert flag_values(bundle, "--ckpt-format") == ["torch_dist"]
    assert flag_values(bundle, "--use-distributed-optimizer") is None
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in bundle.env  # FSDP asserts it is not 1


def test_precision_and_grad_flags():
    fp8 = render(variant("llama3-70b-h100-megatron", training={"precision": "fp8", "grad_dtype": "bf16"}))
    assert flag_values(fp8, "--bf16") == []
    assert flag_values(fp8, "--fp8-format") == ["hybrid"]
    assert flag_values(fp8, "--fp8-recipe") == ["delayed"]
    assert flag_values(fp8, "--grad-reduce-in-bf16") == []
    fp16 = render(variant("llama3-70b-h100-megatron", training={"precision": "fp16"}))
    assert flag_values(fp16, "--fp16") == [] and flag_values(fp16, "--bf16") is None
    assert flag_values(fp16, "--accumulate-allreduce-grads-in-fp32") == []
    bridge = megatron_bridge.render(
        plan_of(variant("llama3-70b-h100-megatron", training={"grad_dtype": "bf16"}), 1, "megatron-bridge"),
        EmitOptions(),
    )
    assert "mixed_precision=bf16_mixed_bf16_grad_reduce" in bridge.program


def test_model_shape_flags():
    doc = variant(
        "llama3-70b-h100-megatron",
        model={"num_kv_heads": None, "head_dim": 64, "tie_embeddings": True, "dropout": True, "mlp": "gelu"},
        training={"attention": "eager"},
    )
    bundle = render(doc)
    assert flag_values(bundle, "--group-query-attention") is None
    assert flag_values(bundle, "--kv-channels") == ["64"]  # 64 x 64 heads != hidden 8192
    assert flag_values(bundle, "--untie-embeddings-and-output-weights") is None
    assert flag_values(bundle, "--swiglu") is None
    assert flag_values(bundle, "--hidden-dropout") == ["0.1"]
    assert flag_values(bundle, "--attention-backend") == ["unfused"]


def test_attention_kernel_selects_the_backend():
    """flash3 (cuDNN fused attention) is --attention-backend fused; flash keeps Megatron's auto."""
    assert flag_values(
        render(variant("llama3-70b-h100-megatron", training={"attention": "flash3"})), "--attention-backend"
    ) == ["fused"]
    assert (
        flag_values(render(variant("llama3-70b-h100-megatron", training={"attention": "flash"})), "--attention-backend")
        is None
    )


def test_tp_comm_overlap():
    bundle = render(variant("llama3-70b-h100-megatron", tp_comm_overlap=True))
    assert flag_values(bundle, "--tp-comm-overlap") == []
    bridge = megatron_bridge.render(
        plan_of(variant("llama3-70b-h100-megatron", tp_comm_overlap=True), 1, "megatron-bridge"), EmitOptions()
    )
    assert any("CommOverlapConfig" in n for n in bridge.notes)


# --------------------------------------------------------------------------------------------- environment


def with_gpu(doc: dict, *names: str) -> dict:
    for group, name in zip(doc["job"]["cluster"], names):
        group["gpu"] = name
    return doc


def test_cuda_device_max_connections_by_arch():
    assert megatron.gpu_arch("h100-sxm") == (9, 0)
    assert megatron.gpu_arch("a100-80gb") == (8, 0)
    assert megatron.gpu_arch("b200") == (10, 0)
    assert megatron.gpu_arch("gb200") == (10, 0)
    assert megatron.gpu_arch("l40s") == (8, 9)
    assert megatron.gpu_arch("my-custom-gpu") is None
    blackwell = render(with_gpu(load("llama3-70b-h100-megatron"), "b200"))
    assert blackwell.env == {}
    # mixed plan: any stage before Blackwell needs it
    mixed = render(with_gpu(load("llama3-405b-3types-megatron"), "b200", "b200", "a100-40gb"))
    assert mixed.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    # no TP and no CP: not needed
    solo = variant("llama3-70b-h100-megatron", 2, tp=1, cp=1, dp=256, sequence_parallel=False)
    assert render(solo, 2).env == {}


# --------------------------------------------------------------------------------------------- refusals (exit 4)


def refused(doc: dict, rank: int = 1, target: str = "megatron") -> Inexpressible:
    plan = LaunchPlan.of(doc, rank, target)
    module = megatron if target == "megatron" else megatron_bridge
    with pytest.raises(Inexpressible) as err:
        check_runnable("megatron", plan, target)
        module.render(plan, EmitOptions())
    return err.value


def test_recompute_count_not_divisible_by_vpp():
    err = refused(load("mixtral-h100-megatron"), 2)  # 1 layer per stage, vpp 8
    assert err.field == "plans[1].layout.stages"
    assert "`planner plan JOB --framework megatron`" in err.message
    bridge = refused(load("mixtral-h100-megatron"), 2, "megatron-bridge")
    assert "`planner plan JOB --framework megatron-bridge`" in bridge.message


def test_tied_embeddings_with_zero3_run_as_megatron_fsdp():
    # torch FSDP2 refuses tied embeddings (validate_args); Megatron-FSDP shards the same three states without that rule
    bundle = render(load("gpt-13b-a100-deepspeed"), 2)
    assert flag_values(bundle, "--use-torch-fsdp2") is None
    assert flag_values(bundle, "--use-megatron-fsdp") == []
    assert flag_values(bundle, "--data-parallel-sharding-strategy") == ["optim_grads_params"]
    assert flag_values(bundle, "--use-distributed-optimizer") == []
    assert flag_values(bundle, "--ckpt-format") == ["fsdp_dtensor"]
    assert flag_values(bundle, "--untie-embeddings-and-output-weights") is None
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in bundle.env
    assert any("Megatron-FSDP" in n for n in bundle.notes)
    bridge = megatron_bridge.render(plan_of(load("gpt-13b-a100-deepspeed"), 2, "megatron-bridge"), EmitOptions())
    for override in ("ddp.use_megatron_fsdp=true", "checkpoint.ckpt_format=fsdp_dtensor"):
        assert override in bridge.program


def test_zero2_refused_by_the_framework_rules():
    err = refused(load("gpt-13b-a100-deepspeed"), 1)
    assert err.field == "plans[0].layout.zero_stage"


def test_interleaving_needs_microbatches_in_rounds_of_pp():
    # pp 8, vpp 2: 12 micro-batches per replica are not rounds of 8, and 4 are fewer than 8
    doc = variant("llama3-70b-h100-vpp2-cp4", 1, num_microbatches=12)
    err = refused(doc)
    assert err.field == "plans[0].layout.vpp" and "--framework megatron" in err.message
    few = variant("llama3-70b-h100-vpp2-cp4", 1, num_microbatches=4)
    assert refused(few).field == "plans[0].layout.vpp"


def test_sequence_and_context_parallel_rules():
    sp = variant("llama3-70b-h100-megatron", 2, training={"seq_length": 8200})  # 8200 / cp 4 = 2050, not / tp 4
    assert refused(sp, 2).field == "plans[1].layout.sequence_parallel"
    cp = variant("llama3-70b-h100-megatron", 2, training={"seq_length": 8196})  # 8196 % (2*4) != 0
    assert refused(cp, 2).field == "plans[1].layout.cp"


def test_model_and_training_settings_megatron_cannot_run():
    relu = refused(variant("llama3-70b-h100-megatron", model={"mlp": "relu"}))
    assert relu.field == "job.model.mlp"
    grads = refused(variant("llama3-70b-h100-megatron", training={"grad_dtype": "bf16+fp32"}))
    assert grads.field == "job.training.grad_dtype"
    fp8 = refused(with_gpu(variant("llama3-70b-h100-megatron", training={"precision": "fp8"}), "a100-80gb"))
    assert fp8.field == "job.training.precision"
    for err in (relu, grads, fp8):
        assert "`planner plan JOB --framework megatron`" in err.message


def test_per_stage_recompute_refused_before_render():
    with pytest.raises(Inexpressible):
        LaunchPlan.of(load("llama3-70b-h100"), 2, "megatron")


# --------------------------------------------------------------------------------------------- round trip


def runnable_plans():
    return [pytest.param(load(stem), rank, id=f"{stem}-{rank}") for stem, rank in runnable("megatron")]


VARIANTS = [
    pytest.param(variant("llama3-70b-h100-megatron", 2, vpp=2, recompute_layers=4), 2, id="block-recompute-vpp"),
    pytest.param(variant("llama3-70b-h100-megatron", 2, recompute="full"), 2, id="full-recompute"),
    pytest.param(variant("llama3-70b-h100-megatron", 2, recompute="selective"), 2, id="selective"),
    pytest.param(variant("llama3-70b-h100-megatron", 1, recompute_layers=5), 1, id="uneven-block-recompute"),
    pytest.param(variant("llama3-70b-h100-megatron", 2, zero_stage=0, tp_comm_overlap=True), 2, id="zero0-tpoverlap"),
    pytest.param(variant("mixtral-h100-megatron", 2, vpp=1, recompute_layers=1), 2, id="moe-pp-recompute"),
]


def normalized(plan: LaunchPlan) -> dict:
    recompute = plan.recompute
    counts = None
    if recompute != "full" and plan.recompute_layers:
        counts = [plan.recompute_layers] * plan.pp
        if recompute == "selective":  # selective is dropped under a partial full recompute (flash attention)
            recompute = "none"
    return {
        "tp": plan.tp,
        "pp": plan.pp,
        "dp": plan.dp,
        "cp": plan.cp,
        "ep": plan.ep,
        "vpp": plan.vpp,
        "micro_batch_size": plan.micro_batch_size,
        "sequence_parallel": plan.tp > 1 and (plan.sequence_parallel or plan.ep > 1),
        "zero_stage": plan.zero_stage,
        "recompute": recompute,
        "tp_comm_overlap": plan.tp_comm_overlap,
        "stage_layers": list(plan.stage_layers),
        "recompute_counts": counts,
    }


def read_back(layout: dict, pp: int, num_layers: int) -> dict:
    stages = layout.get("stages")
    got = {k: layout[k] for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "sequence_parallel")}
    got.update(zero_stage=layout["zero_stage"], recompute=layout["recompute"])
    got["tp_comm_overlap"] = layout["tp_comm_overlap"]
    got["stage_layers"] = [s["layers"] for s in stages] if stages else [num_layers // pp] * pp
    counts = [s.get("recompute_layers") for s in stages] if stages else None
    got["recompute_counts"] = counts if counts and any(c is not None for c in counts) else None
    return got


@pytest.mark.parametrize("doc,rank", runnable_plans() + VARIANTS)
def test_round_trip(doc, rank, tmp_path):
    plan = plan_of(doc, rank)
    bundle = megatron.render(plan, EmitOptions())
    path = tmp_path / megatron.ARGS_FILE
    path.write_text(bundle.files[megatron.ARGS_FILE])
    group = plan.job.cluster[plan.stage_group(0)]
    job = megatron.read(path, world_size=plan.world_size, gpu=group.gpu.name, gpus_per_node=plan.gpus_per_node)
    assert read_back(job["layout"], plan.pp, plan.model.num_layers) == normalized(plan)
    parsed = parse_job(job)  # a valid job: the layout passes the planner's own rules
    assert parsed.model.num_layers == plan.model.num_layers
    assert parsed.model.kv_heads == plan.model.kv_heads
    assert parsed.model.moe == plan.model.moe
    assert parsed.training.seq_length == plan.training.seq_length
    assert parsed.training.global_batch_size == plan.global_batch_size
    assert parsed.training.precision == plan.training.precision


def test_round_trip_through_a_torchrun_script(tmp_path):
    plan = plan_of(load("llama3-70b-h100-megatron"))
    bundle = megatron.render(plan, EmitOptions())
    script = tmp_path / "run.sh"
    script.write_text(
        "#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"
        f"torchrun --nnodes {plan.nodes} --nproc-per-node {plan.gpus_per_node} \\\n"
        f"  {shlex.join(bundle.program)}\n"
    )
    job = megatron.read(script, gpu="h100-sxm")
    assert job["cluster"] == [{"gpu": "h100-sxm", "nodes": 64, "gpus_per_node": 8}]
    assert read_back(job["layout"], plan.pp, 80) == normalized(plan)


# --------------------------------------------------------------------------------------------- importer


def test_read_forwards_to_the_importer_with_its_parameters():
    # `planner import` and scripts/validate_emitters.py pass only the options the signature of planner.emit.<fw>.read
    # names, so the emitter module's read keeps the importer's parameters exactly
    assert inspect.signature(megatron.read) == inspect.signature(megatron_import.read)


def test_import_llama3_script_with_arrays_and_variables():
    job = megatron.read(CONFIGS / "train_llama3_8b_distributed.sh", gpu="h100-sxm")
    assert job["cluster"] == [{"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8}]
    assert job["model"] == {
        "num_layers": 32,
        "hidden_size": 4096,
        "ffn_hidden_size": 14336,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "vocab_size": 128256,
        "mlp": "swiglu",
        "tie_embeddings": False,
        "dropout": False,
    }
    assert job["training"] == {
        "seq_length": 8192,
        "global_batch_size": 128,
        "precision": "bf16",
        "optimizer": "adam",
        "attention": "flash3",  # --attention-backend fused: cuDNN fused attention
        "grad_dtype": "fp32",
    }
    assert job["layout"] == {
        "tp": 2,
        "pp": 2,
        "dp": 4,
        "cp": 1,
        "ep": 1,
        "vpp": 1,
        "micro_batch_size": 1,
        "sequence_parallel": True,
        "zero_stage": 1,
        "recompute": "selective",
        "tp_comm_overlap": False,
    }
    parse_job(job)
    named = megatron.read(CONFIGS / "train_llama3_8b_distributed.sh", gpu="h100-sxm", model="llama3-8b")
    assert named["model"] == "llama3-8b"
    assert parse_job(named).model.name == "llama3-8b"


def test_import_flat_torchrun_script_with_uneven_pipeline_and_recompute():
    job = megatron.read(CONFIGS / "pretrain_llama2_70b.sh", gpu="h100-sxm")
    assert job["cluster"] == [{"gpu": "h100-sxm", "nodes": 8, "gpus_per_node": 8}]
    lay = job["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["cp"], lay["vpp"]) == (8, 4, 2, 1, 2)
    assert lay["stages"] == [{"layers": n, "recompute_layers": 4} for n in (18, 22, 22, 18)]
    assert (lay["recompute"], lay["zero_stage"], lay["tp_comm_overlap"]) == ("none", 1, True)
    assert job["training"]["precision"] == "fp8" and job["training"]["grad_dtype"] == "bf16"
    assert job["model"]["vocab_size"] == 32000
    parse_job(job)


def test_import_args_file_with_moe_and_layout():
    job = megatron.read(CONFIGS / "mixtral_8x7b_args.txt", gpu="h100-sxm", world_size=64)
    assert job["model"]["moe"] == {
        "num_experts": 8,
        "top_k": 2,
        "expert_ffn_hidden_size": 14336,
        "shared_experts": 0,
        "moe_layer_freq": 1,
        "first_dense_layers": 0,
    }
    lay = job["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["ep"]) == (2, 4, 8, 8)
    assert [s["layers"] for s in lay["stages"]] == [7, 9, 9, 7]
    parse_job(job)


def write(tmp_path, text: str, name: str = "args.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


LAYOUT = "--pipeline-model-parallel-layout"
BASE = (
    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
    "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 64 --bf16 "
)


def test_import_defaults_follow_megatron(tmp_path):
    job = megatron.read(write(tmp_path, BASE + "--swiglu"), gpu="a100-80gb", world_size=8)
    assert job["model"]["ffn_hidden_size"] == 10880  # int(8h/3/64)*64
    assert job["model"]["tie_embeddings"] is True and job["model"]["dropout"] is True
    assert "num_kv_heads" not in job["model"]
    assert job["layout"]["dp"] == 8 and job["layout"]["zero_stage"] == 0 and job["layout"]["recompute"] == "none"
    plain = megatron.read(write(tmp_path, BASE.replace("--global-batch-size 64 ", "")), gpu="a100-80gb", world_size=8)
    assert plain["model"]["ffn_hidden_size"] == 4 * 4096
    assert plain["training"]["global_batch_size"] == 8  # micro-batch x DP
    # --num-query-groups without --group-query-attention is ignored (emitters.md 1.2)
    mha = megatron.read(write(tmp_path, BASE + "--num-query-groups 8"), gpu="a100-80gb", world_size=8)
    assert "num_kv_heads" not in mha["model"]


def test_import_moe_pattern_and_shared_experts(tmp_path):
    text = BASE + (
        "--num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 1024 --moe-shared-expert-intermediate-size 2048 "
        "--moe-layer-freq '([0]*2+[1]*30)' --expert-model-parallel-size 4"
    )
    job = megatron.read(write(tmp_path, text), gpu="h100-sxm", world_size=8)
    assert job["model"]["moe"] == {
        "num_experts": 16,
        "top_k": 4,
        "expert_ffn_hidden_size": 1024,
        "shared_experts": 2,
        "moe_layer_freq": 1,
        "first_dense_layers": 2,
    }
    parse_job(job)
    with pytest.raises(SpecError) as err:
        megatron.read(write(tmp_path, text.replace("([0]*2+[1]*30)", "([1]*2+[0]*30)")), gpu="h100-sxm", world_size=8)
    assert err.value.field == "--moe-layer-freq"


def test_import_world_size_sources(tmp_path):
    env = write(tmp_path, f"WORLD_SIZE=16\npython pretrain_gpt.py {BASE}\n", "run.sh")
    assert megatron.read(env, gpu="h100-sxm")["cluster"] == [{"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8}]
    given = megatron.read(env, gpu="h100-sxm", world_size=32, gpus_per_node=4)
    assert given["cluster"] == [{"gpu": "h100-sxm", "nodes": 8, "gpus_per_node": 4}]
    standalone = write(tmp_path, f"torchrun --standalone --nproc_per_node=4 pretrain_gpt.py {BASE}\n", "s.sh")
    assert megatron.read(standalone, gpu="h100-sxm")["cluster"][0] == {
        "gpu": "h100-sxm",
        "nodes": 1,
        "gpus_per_node": 4,
    }


BAD_INPUTS = [
    (BASE, {"world_size": None}, "--world-size"),
    (BASE, {"gpu": None}, "--gpu"),
    (BASE, {"world_size": 8, "gpu": "no-such-gpu"}, "--gpu"),
    (BASE, {"world_size": 12, "gpu": "h100-sxm"}, "--world-size"),
    (BASE + "--tensor-parallel-size 2", {}, "--tensor-parallel-size"),
    (BASE + "--num-layer 4", {}, "--num-layer"),
    (BASE.replace("--num-layers 32", "--num-layers abc"), {}, "--num-layers"),
    (BASE.replace("--num-layers 32", "--num-layers"), {}, "--num-layers"),
    (BASE + "--tensor-model-parallel-size $TP", {}, "--tensor-model-parallel-size"),
    (BASE + "--multi-latent-attention --group-query-attention --num-query-groups 8", {}, "--group-query-attention"),
    (BASE + "--sequence-parallel true", {}, "--sequence-parallel"),
    (BASE + "--recompute-granularity full", {}, "--recompute-method"),
    (BASE + "--recompute-granularity partial", {}, "--recompute-granularity"),
    (BASE + "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*16|t*15L'", {}, LAYOUT),
    (BASE.replace("--bf16 ", ""), {}, "--bf16"),
    (BASE + "--fp16", {}, "--fp16"),
    (BASE.replace("--seq-length 4096 ", ""), {}, "--seq-length"),
    (BASE.replace("--vocab-size 32000 ", ""), {}, "--vocab-size"),
    (BASE.replace("--micro-batch-size 1 ", ""), {}, "--micro-batch-size"),
    (BASE + "--expert-tensor-parallel-size 1 --tensor-model-parallel-size 2", {}, "--expert-tensor-parallel-size"),
    (BASE + "--pipeline-model-parallel-size 3", {"world_size": 24}, "--pipeline-model-parallel-size"),
    (BASE + "--use-megatron-fsdp", {}, "--data-parallel-sharding-strategy"),
    (BASE + "--num-layers-per-virtual-pipeline-stage 4 --num-virtual-stages-per-pipeline-rank 2", {}, None),
]


@pytest.mark.parametrize(
    "text,kwargs,field", BAD_INPUTS, ids=[f"{n}-{c[2] or 'flag'}" for n, c in enumerate(BAD_INPUTS)]
)
def test_import_bad_input_names_the_flag(tmp_path, text, kwargs, field):
    kwargs = {"world_size": 8, "gpu": "h100-sxm", **kwargs}
    with pytest.raises(SpecError) as err:
        megatron.read(write(tmp_path, text), **kwargs)
    if field is not None:
        assert err.value.field == field, err.value
    else:
        assert err.value.field.startswith("--"), err.value


def test_import_preset_disagreement_and_missing_file(tmp_path):
    with pytest.raises(SpecError) as err:
        megatron.read(write(tmp_path, BASE), gpu="h100-sxm", world_size=8, model="llama3-70b")
    assert err.value.field == "--num-layers"
    with pytest.raises(SpecError) as err:
        megatron.read(tmp_path / "missing.sh", gpu="h100-sxm", world_size=8)
    assert err.value.field == "config"
    with pytest.raises(SpecError) as err:
        megatron.read(write(tmp_path, "#!/bin/bash\necho hello\n"), gpu="h100-sxm", world_size=8)


def test_import_ignores_flags_that_do_not_shape_the_plan(tmp_path):
    noise = " ".join(sorted(megatron_import.KNOWN_OTHER - {"--bf16"}))
    # store_true flags given without values; a few value flags get one (the reader takes any following words)
    job = megatron.read(write(tmp_path, BASE + noise + " --lr 1e-4 --data-path a b c"), gpu="h100-sxm", world_size=8)
    assert job["layout"]["tp"] == 1 and job["training"]["precision"] == "bf16"


def test_import_reads_control_flow_bodies_and_array_elements_with_spaces(tmp_path):
    # the style of Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh: flags appended inside if-blocks, array
    # elements holding a flag and its value, a quoted array expansion
    script = write(
        tmp_path,
        """#!/bin/bash
GPUS_PER_NODE=8
NUM_NODES=${NUM_NODES:-1}
DTYPE="fp8"
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32   # Llama-ish
    --seq-length 4096 --vocab-size 32000
)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --bf16)
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=(
        "--fp8-format hybrid"
        "--fp8-amax-history-len 1024"
    )
fi
PARALLEL_ARGS=(
    "--pipeline-model-parallel-size 2"
    "--pipeline-model-parallel-layout 'Et*15|t*17L'"
)
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES pretrain_gpt.py \\
    ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${DTYPE_ARGS[@]} "${PARALLEL_ARGS[@]}"
""",
        "train.sh",
    )
    job = megatron.read(script, gpu="h100-sxm")
    assert job["training"]["precision"] == "fp8"
    assert job["cluster"] == [{"gpu": "h100-sxm", "nodes": 1, "gpus_per_node": 8}]
    assert job["layout"]["stages"] == [{"layers": 15}, {"layers": 17}]
    assert job["layout"]["dp"] == 4
    parse_job(job)


def test_bridge_keys_for_interleaving_recompute_and_fsdp():
    vpp = megatron_bridge.render(plan_of(load("llama3-70b-h100-vpp2-cp4"), 1, "megatron-bridge"), EmitOptions())
    assert "model.virtual_pipeline_model_parallel_size=2" in vpp.program
    assert not any(o.startswith("model.pipeline_model_parallel_layout") for o in vpp.program)
    assert "ddp.use_distributed_optimizer=false" in vpp.program  # ZeRO-0
    block = megatron_bridge.render(
        plan_of(variant("llama3-70b-h100-megatron", 2, vpp=2, recompute_layers=4), 2, "megatron-bridge"), EmitOptions()
    )
    for override in (
        "model.recompute_granularity=full",
        "model.recompute_method=block",
        "model.recompute_num_layers=2",
    ):
        assert override in block.program
    doc = variant("llama3-70b-h100-megatron", 2, pp=1, tp=4, cp=4, dp=32, zero_stage=3)
    doc["plans"][1]["layout"]["stages"] = [{"layers": 80}]
    doc["plans"][1]["placement"]["stages"] = doc["plans"][1]["placement"]["stages"][:1]
    fsdp = megatron_bridge.render(plan_of(doc, 2, "megatron-bridge"), EmitOptions())
    for override in ("dist.use_torch_fsdp2=true", "model.gradient_accumulation_fusion=false"):
        assert override in fsdp.program
    assert fsdp.env == {}
    fp8 = megatron_bridge.render(
        plan_of(variant("llama3-70b-h100-megatron", training={"precision": "fp8"}), 1, "megatron-bridge"),
        EmitOptions(),
    )
    assert "mixed_precision=bf16_with_fp8_delayed_scaling_mixed" in fp8.program
