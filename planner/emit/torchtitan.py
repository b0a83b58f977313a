"""torchtitan (emitters.md section 3): a plan as a 0.3 Python config module (``plan_config.py``, the default) or a
0.2 TOML file (``plan.toml``), and either read back into a job.

Every key below was read in the PyPI wheels torchtitan 0.3.0 and 0.2.2 (repo pytorch/torchtitan, tag v0.2.2 and
the 0.3 release):

- 0.3.0 ``torchtitan/config/configs.py``: ``ParallelismConfig`` and ``TrainingConfig`` fields;
  ``torchtitan/trainer.py`` ``Trainer.Config`` (``activation_checkpoint``, ``model_spec``, ``loss``, ``compile``) and
  its ``__post_init__`` (local batch divisible by the PP micro-batch; PP needs ``training.disable_cuda_graphs``);
  ``torchtitan/config/manager.py``: ``--module M --config F`` imports ``M.config_registry`` else ``M`` and calls F;
  ``torchtitan/distributed/activation_checkpoint.py``: ``FullAC.Config``, ``SelectiveAC.Config``, ``None``;
  ``torchtitan/components/quantization/float8.py``: ``Float8LinearConverter.Config``, given to ``model_registry``;
  ``torchtitan/models/<llama3|qwen3|deepseek_v3>/config_registry.py`` and ``__init__.py``: the registry functions
  and flavors (llama3_8b/70b/405b: "8B"/"70B"/"405B"; qwen3_30b_a3b: "30B-A3B"; deepseek_v3_671b: "671B") and how
  a llama3 model config is built (``Llama3Model.Config``, ``_build_llama3_layers``, ``llama3_configs``).
- 0.2.2 ``torchtitan/config/job_config.py``: the TOML sections ``[model]`` (name, flavor, converters),
  ``[training]``, ``[parallelism]`` (no enable_sequence_parallel: TP always shards norms along the sequence),
  ``[activation_checkpoint]`` (mode, selective_ac_option), ``[quantize.linear.float8]``, ``[compile]``,
  ``[experimental]`` custom_import (imported by ``torchtitan/train.py`` before the model is looked up);
  ``torchtitan/models/llama3/__init__.py`` ``llama3_args`` (``TransformerModelArgs``);
  ``torchtitan/distributed/activation_checkpoint.py``: selective_ac_option N checkpoints every N-th layer of a rank.
- Both: ``torchtitan/distributed/parallel_dims.py`` (dp_replicate * dp_shard * cp * tp * pp == world; FSDP is on
  when dp_shard > 1 or cp > 1; efsdp = dp_shard * cp * tp / ep); ``torchtitan/distributed/pipeline_parallel.py``
  (module_fqns_per_model_part names tok_embeddings, layers.<i>, norm and the output: ``lm_head`` in 0.3, ``output``
  in 0.2; loop-style schedules give rank r the parts r, r+pp, ...; the default split); torch 2.13
  ``torch/distributed/pipelining/schedules.py`` (Schedule1F1B needs micro-batches >= stages; Interleaved1F1B needs
  micro-batches divisible by its rounds).
"""

from __future__ import annotations

import ast
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError, did_you_mean

VERSIONS = ("0.3", "0.2")
CONFIG_MODULE = "plan_config"  # 0.3: plan_config.py with plan()
MODEL_MODULE = "plan_model"  # 0.2: registers a custom llama3 flavor (experimental.custom_import)
TOML_FILE = "plan.toml"
CUSTOM_FLAVOR = "planner"
REDO = "re-plan with `planner plan JOB --framework torchtitan`"
OUTPUT_FQN = {"0.3": "lm_head", "0.2": "output"}


@dataclass(frozen=True)
class Registry:
    """A torchtitan model registry entry that is exactly a planner preset."""

    module: str  # torchtitan.models.<module>
    function: str  # 0.3 config_registry function
    flavor: str  # model_registry flavor (0.2: [model] flavor)


# planner preset -> torchtitan entry (dimensions compared against both catalogs)
REGISTRY = {
    "llama3-8b": Registry("llama3", "llama3_8b", "8B"),
    "llama3-70b": Registry("llama3", "llama3_70b", "70B"),
    "llama3-405b": Registry("llama3", "llama3_405b", "405B"),
    "qwen3-30b-a3b": Registry("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    "deepseek-v3": Registry("deepseek_v3", "deepseek_v3_671b", "671B"),
}
# what the 0.3 registry functions set themselves (config_registry.py), for reading a module that leaves them
REGISTRY_BASE = {
    "llama3_8b": {"training.local_batch_size": 1, "training.seq_len": 8192, "ac": "selective"},
    "llama3_70b": {
        "training.local_batch_size": 8,
        "training.seq_len": 8192,
        "parallelism.tensor_parallel_degree": 8,
        "ac": "full",
    },
    "llama3_405b": {
        "training.local_batch_size": 2,
        "training.seq_len": 8192,
        "parallelism.tensor_parallel_degree": 8,
        "ac": "full",
        "fp8": True,
    },
    "qwen3_30b_a3b": {"training.local_batch_size": 2, "training.seq_len": 4096, "ac": "full"},
    "deepseek_v3_671b": {
        "training.local_batch_size": 4,
        "training.seq_len": 4096,
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "parallelism.expert_parallel_degree": 2,
        "ac": "selective",
    },
}
# 0.3.0 ParallelismConfig / TrainingConfig fields (torchtitan/config/configs.py) with their defaults
PARALLELISM_03 = {
    "data_parallel_replicate_degree": 1,
    "data_parallel_shard_degree": -1,
    "fsdp_reshard_after_forward": "default",
    "enable_fsdp_symm_mem": False,
    "tensor_parallel_degree": 1,
    "enable_sequence_parallel": True,
    "spmd_backend": "spmd_types",
    "pipeline_parallel_degree": 1,
    "module_fqns_per_model_part": None,
    "pipeline_parallel_first_stage_less_layers": 1,
    "pipeline_parallel_last_stage_less_layers": 1,
    "pipeline_parallel_layers_per_stage": None,
    "pipeline_parallel_schedule": "1F1B",
    "pipeline_parallel_schedule_csv": "",
    "pipeline_parallel_microbatch_size": 1,
    "context_parallel_degree": 1,
    "context_parallel_load_balancer": "headtail",
    "context_parallel_ptrr_mask_key": None,
    "expert_parallel_degree": 1,
}
TRAINING_03 = {
    "local_batch_size": 8,
    "global_batch_size": -1,
    "seq_len": 2048,
    "max_norm": 1.0,
    "steps": 10000,
    "enable_cpu_offload": False,
    "disable_cuda_graphs": False,
    "dtype": "float32",
    "mixed_precision_param": "bfloat16",
    "mixed_precision_reduce": "float32",
    "gc_freq": 50,
    "gc_debug": False,
}
# 0.2.2 TOML sections read here (torchtitan/config/job_config.py), with their defaults
PARALLELISM_02 = {
    "data_parallel_replicate_degree": 1,
    "data_parallel_shard_degree": -1,
    "fsdp_reshard_after_forward": "default",
    "tensor_parallel_degree": 1,
    "disable_loss_parallel": False,
    "enable_async_tensor_parallel": False,
    "pipeline_parallel_degree": 1,
    "module_fqns_per_model_part": None,
    "pipeline_parallel_first_stage_less_layers": 1,
    "pipeline_parallel_last_stage_less_layers": 1,
    "pipeline_parallel_layers_per_stage": None,
    "pipeline_parallel_schedule": "1F1B",
    "pipeline_parallel_schedule_csv": "",
    "pipeline_parallel_microbatch_size": 1,
    "pipeline_parallel_expert_parallel_overlap": True,
    "context_parallel_degree": 1,
    "context_parallel_load_balancer": "headtail",
    "context_parallel_rotate_method": "allgather",
    "expert_parallel_degree": 1,
    "expert_tensor_parallel_degree": 1,
    "expert_parallel_comm_backend": "standard",
}
TRAINING_02 = {
    "dataset": "c4_test",
    "dataset_path": None,
    "local_batch_size": 8,
    "global_batch_size": -1,
    "seq_len": 2048,
    "max_norm": 1.0,
    "steps": 10000,
    "enable_cpu_offload": False,
    "dtype": "float32",
    "mixed_precision_param": "bfloat16",
    "mixed_precision_reduce": "float32",
    "gc_freq": 50,
    "gc_debug": False,
    "dataloader": None,
}
AC_02 = {
    "mode": "selective",
    "selective_ac_option": "2",
    "per_op_sac_force_recompute_mm_shapes_by_fqns": None,
    "early_stop": False,
    "memory_budget": 0.5,
    "visualize_memory_budget_pareto": False,
    "preserve_rng_state": True,
    "determinism_check": "default",
    "debug": False,
}
MODEL_02 = {
    "name": "llama3",
    "flavor": "debugmodel",
    "hf_assets_path": None,
    "tokenizer_path": None,
    "converters": [],
    "print_after_conversion": False,
}
# torch.distributed.pipelining schedule names (case-insensitive) and whether each holds one stage per rank
SCHEDULES = {
    "1f1b": True,
    "gpipe": True,
    "interleaved1f1b": False,
    "loopedbfs": False,
    "interleavedzerobubble": False,
    "zbvzerobubble": False,
    "dualpipev": False,
}
PLANNER_SCHEDULES = ("1f1b", "interleaved1f1b")  # what the planner's pipeline model is


# ---------------------------------------------------------------------------------------------------------------
# emit


def version_of(options: EmitOptions) -> str:
    """ "0.3" (default) or "0.2" from --framework-version (0.3.0 and 0.2.2 spelled out are accepted)."""
    raw = options.framework_version
    if raw is None:
        return "0.3"
    key = str(raw).strip().lower().removeprefix("v")
    for version in VERSIONS:
        if key == version or key.startswith(version + "."):
            return version
    raise SpecError(
        "--framework-version",
        f"unknown torchtitan version '{raw}'; choose 0.3 (Python config, the default) or 0.2 (TOML)",
    )


def render(plan: LaunchPlan, options: EmitOptions) -> Bundle:
    """0.3: plan_config.py (``python -m torchtitan.train --module plan_config --config plan``); 0.2: plan.toml
    (``--job.config_file plan.toml``), with plan_model.py when the model is not a registry flavor."""
    from planner.frameworks import check_runnable

    version = version_of(options)
    check_runnable("torchtitan", plan, "torchtitan")
    check_torchtitan(plan)
    if version == "0.2" and plan.tp > 1 and not plan.sequence_parallel:
        raise Inexpressible(
            f"plans[{plan.plan_rank - 1}].layout.sequence_parallel",
            "torchtitan 0.2.2 always runs sequence parallelism with TP (no switch), which this plan has off; emit "
            "for torchtitan 0.3 (the default --framework-version)",
        )
    model = model_source(plan, version)
    if version == "0.3":
        files = {f"{CONFIG_MODULE}.py": config_module(plan, model)}
        program = ["-m", "torchtitan.train", "--module", CONFIG_MODULE, "--config", "plan"]
    else:
        files = {TOML_FILE: config_toml(plan, model)}
        if model.registry is None:
            files[f"{MODEL_MODULE}.py"] = model_module_02(plan)
        program = ["-m", "torchtitan.train", "--job.config_file", TOML_FILE]
    return Bundle(files=files, program=program, env={}, workdir=None, notes=notes(plan, version, model))


def degrees(plan: LaunchPlan) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree): FSDP2 shards fully (ZeRO-3: shard = dp) or
    replicates (ZeRO-0: replicate = dp); torchtitan/config/configs.py ParallelismConfig."""
    return (1, plan.dp) if plan.zero_stage == 3 else (plan.dp, 1)


def check_torchtitan(plan: LaunchPlan) -> None:
    """torchtitan's rules that planner/frameworks.py does not hold (emitters.md 3.3 and 5): Inexpressible (exit 4)."""
    field = f"plans[{plan.plan_rank - 1}].layout"
    replicate, shard = degrees(plan)
    dense = shard * plan.cp * plan.tp
    if plan.ep > 1 and dense % plan.ep:
        # torchtitan/distributed/parallel_dims.py: efsdp = dp_shard * cp * tp / ep must be a whole mesh dimension
        raise Inexpressible(
            f"{field}.ep",
            f"torchtitan borrows expert-parallel ranks from FSDP, CP and TP: ep {plan.ep} must divide "
            f"dp_shard*cp*tp = {shard}*{plan.cp}*{plan.tp} = {dense} (ZeRO-{plan.zero_stage} makes dp_shard "
            f"{shard}); {REDO}",
        )
    if plan.pp > 1:
        # Met by construction (settings, module_fqns): the local batch is micro-batch x micro-batches, so the PP
        # micro-batch divides it (Trainer.Config.__post_init__); 1F1B gets one model part per rank and
        # Interleaved1F1B vpp >= 2 (pipeline_parallel.py _get_pipeline_metadata).
        single = plan.vpp == 1
        n = plan.num_microbatches
        if single and n < plan.pp:  # torch Schedule1F1B
            raise Inexpressible(
                f"{field}.pp",
                f"torch's Schedule1F1B needs at least as many micro-batches as stages ({n} < {plan.pp}); {REDO}",
            )
        rounds = max(1, n // plan.pp)
        if not single and n % rounds:  # torch ScheduleInterleaved1F1B
            raise Inexpressible(
                f"{field}.vpp",
                f"torch's ScheduleInterleaved1F1B needs the micro-batches ({n}) to be a multiple of its rounds "
                f"({rounds} = max(1, {n} // pp {plan.pp})); {REDO}",
            )
        if any(layers % plan.vpp for layers in plan.stage_layers):
            raise Inexpressible(
                f"{field}.stages",
                f"every stage's layers must split into {plan.vpp} equal model parts ({plan.stage_layers}); {REDO}",
            )
    if plan.training.precision == "fp16":  # TrainingConfig.mixed_precision_param is bfloat16 or float32
        raise Inexpressible(
            "job.training.precision",
            "torchtitan trains in bf16 mixed precision (mixed_precision_param bfloat16|float32), not fp16; plan "
            "the job with precision bf16",
        )


@dataclass(frozen=True)
class ModelSource:
    registry: Registry | None  # None: a llama3-architecture model built from the plan's dimensions
    fp8: bool


def model_source(plan: LaunchPlan, version: str) -> ModelSource:
    """The torchtitan model of the plan's model: a registry entry when the model is exactly that preset, else a
    dense SwiGLU model built with llama3's architecture (torchtitan has no other way to take dimensions)."""
    from planner.catalog import resolve_model

    m = plan.model
    entry = REGISTRY.get(m.name)
    if entry is not None:
        try:
            preset = resolve_model(m.name)
        except SpecError:
            preset = None
        if preset is not None and _shape(preset) == _shape(m):
            return ModelSource(entry, plan.training.precision == "fp8")
    why = None
    if m.moe is not None:
        why = "an MoE model outside torchtitan's registry (llama3, qwen3 30B-A3B, deepseek_v3 671B here)"
    elif m.mlp != "swiglu":
        why = f"a {m.mlp} MLP (torchtitan's dense models are llama-style SwiGLU)"
    elif m.head_dim is not None and m.head_dim * m.num_attention_heads != m.hidden_size:
        why = f"head_dim {m.head_dim} != hidden_size / heads (torchtitan derives head_dim from them)"
    if why:
        raise Inexpressible(
            "job.model",
            f"torchtitan has no model for {m.name}: {why}; emit it for megatron or deepspeed instead",
        )
    return ModelSource(None, plan.training.precision == "fp8")


def _shape(model) -> dict:
    return model.model_dump(exclude={"name", "source"})


def model_dims(plan: LaunchPlan) -> dict[str, Any]:
    """The dimensions a custom model is built from (also what `planner import` reads back)."""
    m = plan.model
    return {
        "name": m.name,
        "n_layers": m.num_layers,
        "dim": m.hidden_size,
        "n_heads": m.num_attention_heads,
        "n_kv_heads": m.kv_heads,
        "ffn_hidden": m.ffn_hidden_size,
        "vocab_size": m.vocab_size,
        "tie_embeddings": m.tie_embeddings,
    }


def module_fqns(plan: LaunchPlan, version: str) -> list[list[str]]:
    """module_fqns_per_model_part: one list per model part in torchtitan's order (part v*pp + r is rank r's v-th
    chunk, as loop-style schedules assign them), holding the chunk's layers; the first part also holds
    tok_embeddings, the last norm and the output (lm_head in 0.3, output in 0.2)."""
    parts: list[list[str]] = []
    first = 0
    for count in plan.chunk_layers():
        parts.append([f"layers.{i}" for i in range(first, first + count)])
        first += count
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", OUTPUT_FQN[version]]
    return parts


def settings(plan: LaunchPlan, version: str) -> dict[str, dict[str, Any]]:
    """The parallelism and training fields (0.3 field names; the 0.2 TOML uses the same names). Without PP the
    micro-batch is the local batch and torchtitan accumulates gradients over the micro-batches; with PP the local
    batch is all micro-batches of an iteration, which the schedule splits into pipeline micro-batches."""
    replicate, shard = degrees(plan)
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": plan.tp,
    }
    if version == "0.3":
        par["enable_sequence_parallel"] = bool(plan.sequence_parallel and plan.tp > 1)
    par["pipeline_parallel_degree"] = plan.pp
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan.vpp > 1 else "1F1B"
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch_size
        par["module_fqns_per_model_part"] = module_fqns(plan, version)
    par["context_parallel_degree"] = plan.cp
    par["expert_parallel_degree"] = plan.ep
    local = plan.micro_batch_size * (plan.num_microbatches if plan.pp > 1 else 1)
    train: dict[str, Any] = {
        "local_batch_size": local,
        "global_batch_size": plan.global_batch_size,
        "seq_len": plan.training.seq_length,
        "dtype": "float32",  # fp32 master weights; bf16 compute through FSDP2's MixedPrecisionPolicy
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
    }
    if version == "0.3":
        train["disable_cuda_graphs"] = plan.pp > 1 or plan.ep > 1  # Trainer.Config._validate_cuda_graphs
    return {"parallelism": par, "training": train}


def recompute_mode(plan: LaunchPlan) -> str:
    """full (every layer: FullAC / mode full) or none. The planner's selective recompute only drops eager
    attention's s^2 activations; torchtitan's attention is always fused (SDPA/flex), which never keeps them, so
    none matches it (torchtitan's own selective AC recomputes more than the plan counts on)."""
    if plan.recompute == "full" or (plan.recompute_layers and plan.recompute_layers >= max(plan.stage_layers)):
        return "full"
    return "none"


def config_module(plan: LaunchPlan, model: ModelSource) -> str:
    """plan_config.py for torchtitan 0.3 (emitters.md 3.4, the emitted-module form): plan() starts from a registry
    function and sets the plan's fields; tyro re-validates the returned config (Trainer.Config.__post_init__)."""
    s = settings(plan, "0.3")
    imports = ["from torchtitan.trainer import Trainer"]
    lines: list[str] = []
    ac = recompute_mode(plan)
    if ac == "full":
        imports.append("from torchtitan.distributed.activation_checkpoint import FullAC")
    converters = ""
    if model.fp8:
        imports.append("from torchtitan.components.quantization import Float8LinearConverter")
        imports.append("from torchtitan.config import CompileConfig")
        converters = ', converters=[Float8LinearConverter.Config(filter_fqns=["lm_head"], model_compile_enabled=True)]'
    if model.registry is not None:
        reg = model.registry
        imports.append(f"from torchtitan.models.{reg.module} import model_registry")
        imports.append(f"from torchtitan.models.{reg.module}.config_registry import {reg.function}")
        lines += [
            f"    cfg = {reg.function}()",
            f"    cfg.model_spec = model_registry({_py(reg.flavor)}{converters})",
        ]
    else:
        imports += [
            "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
            "from torchtitan.models import llama3",
            "from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
            "from torchtitan.models.common.config_utils import decoder_vocab_size",
            "from torchtitan.models.llama3.config_registry import llama3_8b",
        ]
        lines += [
            "    cfg = llama3_8b()  # optimizer, data and checkpoint settings; the model is replaced below",
            f"    cfg.model_spec = llama3.model_registry(FLAVOR{converters})",
            "    cfg.loss = ChunkedLossWrapper.Config(",
            "        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(cfg.model_spec)),",
            "    )",
        ]
    lines.append("    p = cfg.parallelism")
    for key, value in s["parallelism"].items():
        shown = "MODULE_FQNS_PER_MODEL_PART" if key == "module_fqns_per_model_part" else _py(value)
        lines.append(f"    p.{key} = {shown}")
    lines.append("    t = cfg.training")
    lines += [f"    t.{key} = {_py(value)}" for key, value in s["training"].items()]
    lines.append("    cfg.activation_checkpoint = " + ("FullAC.Config()" if ac == "full" else "None"))
    if model.fp8:
        lines.append('    cfg.compile = CompileConfig(enable=True, components=["model", "loss"])')
    lines.append("    return cfg")

    out = [
        f'"""torchtitan 0.3 config of plan #{plan.plan_rank} ({_summary(plan)}), written by `planner emit`.',
        "",
        "Run: python -m torchtitan.train --module plan_config --config plan  (with this folder on PYTHONPATH)",
        '"""',
        "",
        *sorted(imports),
        "",
    ]
    if model.registry is None:
        out += _custom_model_03(plan)
    if plan.pp > 1:
        out += ["# model parts in torchtitan's order: part v*pp + r is the v-th chunk of pipeline rank r"]
        out += ["MODULE_FQNS_PER_MODEL_PART = ["]
        out += [f"    {_py(part)}," for part in s["parallelism"]["module_fqns_per_model_part"]]
        out += ["]", "", ""]
    if out[-2:] != ["", ""]:
        out.append("")
    out += ["def plan() -> Trainer.Config:", *lines, ""]
    return "\n".join(out)


def _custom_model_03(plan: LaunchPlan) -> list[str]:
    """A llama3-architecture model config with the plan's dimensions, registered as a llama3 flavor
    (torchtitan/models/llama3/__init__.py builds its flavors the same way; its layer builder is module-private)."""
    dims = model_dims(plan)
    init = "_EMBEDDING_SKIP_INIT" if dims["tie_embeddings"] else "_EMBEDDING_INIT"
    rope_len = max(131072, plan.training.seq_length)
    return [
        "# the model's dimensions (llama3 architecture: RMSNorm, SwiGLU, RoPE); `planner import` reads them back",
        f"MODEL = {_py(dims)}",
        f"FLAVOR = {_py(CUSTOM_FLAVOR)}",
        "",
        "",
        'def _model_config(attn_backend: str, tp_gemm_backend: str = "default") -> llama3.Llama3Model.Config:',
        '    dim, vocab, heads = MODEL["dim"], MODEL["vocab_size"], MODEL["n_heads"]',
        "    return llama3.Llama3Model.Config(",
        "        dim=dim,",
        "        vocab_size=vocab,",
        '        enable_weight_tying=MODEL["tie_embeddings"],',
        f"        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=llama3.{init}),",
        "        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),",
        "        lm_head=Linear.Config(",
        "            in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)",
        "        ),",
        "        layers=llama3._build_llama3_layers(",
        "            fuse_qkv=True,",
        '            n_layers=MODEL["n_layers"],',
        "            dim=dim,",
        "            n_heads=heads,",
        '            n_kv_heads=MODEL["n_kv_heads"],',
        '            hidden_dim=MODEL["ffn_hidden"],',
        f"            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len={rope_len}, theta=10000.0),",
        "            attn_backend=attn_backend,",
        "            tp_gemm_backend=tp_gemm_backend,",
        "        ),",
        "    )",
        "",
        "",
        "llama3.llama3_configs[FLAVOR] = _model_config",
        "",
        "",
    ]


def config_toml(plan: LaunchPlan, model: ModelSource) -> str:
    """plan.toml for torchtitan 0.2.2 (torchtitan/config/job_config.py sections)."""
    s = settings(plan, "0.2")
    reg = model.registry
    lines = [
        f"# torchtitan 0.2.2 config of plan #{plan.plan_rank} ({_summary(plan)}), written by `planner emit`.",
        f"# Run: python -m torchtitan.train --job.config_file {TOML_FILE}",
        "",
        "[job]",
        f'description = "planner plan #{plan.plan_rank}"',
        "",
        "[model]",
        f"name = {_toml(reg.module if reg else 'llama3')}",
        f"flavor = {_toml(reg.flavor if reg else CUSTOM_FLAVOR)}",
        'hf_assets_path = "./assets/hf/tokenizer"  # edit: your tokenizer / HF assets folder',
    ]
    if model.fp8:
        lines.append('converters = ["quantize.linear.float8"]')
    for section in ("training", "parallelism"):
        lines += ["", f"[{section}]"]
        for key, value in s[section].items():
            if key == "module_fqns_per_model_part":  # one model part a line
                lines += [f"{key} = [", *(f"    {_toml(part)}," for part in value), "]"]
            else:
                lines.append(f"{key} = {_toml(value)}")
    lines += ["", "[activation_checkpoint]", f"mode = {_toml(recompute_mode(plan))}"]
    if model.fp8:
        lines += [
            "",
            "[quantize.linear.float8]",
            'filter_fqns = ["output"]',
            "",
            "[compile]",
            "enable = true",
            'components = ["model", "loss"]',
        ]
    if reg is None:
        lines += [
            "",
            "[experimental]",
            f"custom_import = {_toml(MODEL_MODULE)}  # registers the {CUSTOM_FLAVOR} flavor",
        ]
    return "\n".join(lines) + "\n"


def model_module_02(plan: LaunchPlan) -> str:
    """plan_model.py for 0.2.2: adds the plan's model as a llama3 flavor (llama3_args, TransformerModelArgs). The
    SwiGLU width is hidden_dim = multiple_of * ceil(int(ffn_dim_multiplier * int(8 * dim / 3)) / multiple_of)
    (torchtitan/models/llama3/model/model.py FeedForward), so multiple_of = the wanted width gives it exactly."""
    dims = model_dims(plan)
    base = int(2 * 4 * dims["dim"] / 3)
    ffn = dims["ffn_hidden"]
    multiplier = None if base <= ffn else ffn / base
    return "\n".join(
        [
            f'"""The model of plan #{plan.plan_rank} as a torchtitan 0.2.2 llama3 flavor, written by `planner emit`.',
            "",
            "plan.toml imports it (experimental.custom_import); `planner import` reads MODEL back.",
            '"""',
            "",
            "from torchtitan.models.llama3 import TransformerModelArgs, llama3_args",
            "",
            f"MODEL = {_py(dims)}",
            f"FLAVOR = {_py(CUSTOM_FLAVOR)}",
            "",
            "llama3_args[FLAVOR] = TransformerModelArgs(",
            '    dim=MODEL["dim"],',
            '    n_layers=MODEL["n_layers"],',
            '    n_heads=MODEL["n_heads"],',
            '    n_kv_heads=MODEL["n_kv_heads"],',
            '    vocab_size=MODEL["vocab_size"],',
            '    multiple_of=MODEL["ffn_hidden"],',
            f"    ffn_dim_multiplier={_py(multiplier)},",
            f"    max_seq_len={max(131072, plan.training.seq_length)},",
            ")",
            "",
        ]
    )


def _py(value: Any) -> str:
    """A Python literal with double-quoted strings (the emitted modules' style)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal form for {value!r}")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _summary(plan: LaunchPlan) -> str:
    return (
        f"{plan.model.name}, {plan.world_size} GPUs: tp {plan.tp} pp {plan.pp} vpp {plan.vpp} dp {plan.dp} "
        f"cp {plan.cp} ep {plan.ep}, ZeRO-{plan.zero_stage}"
    )


def notes(plan: LaunchPlan, version: str, model: ModelSource) -> list[str]:
    replicate, shard = degrees(plan)
    out = [
        f"torchtitan {version}: "
        + (
            "`plan_config.py` holds `plan()`, which starts from a torchtitan registry config and sets the plan's "
            "parallelism, batch and checkpointing; edit data, tokenizer (`hf_assets_path`), optimizer and steps "
            "there."
            if version == "0.3"
            else "`plan.toml` sets the plan's parallelism, batch and checkpointing; edit data, tokenizer "
            "(`hf_assets_path`), optimizer and steps there (torchtitan's defaults otherwise)."
        ),
        f"Data parallelism: ZeRO-{plan.zero_stage} is data_parallel_replicate_degree {replicate} and "
        f"data_parallel_shard_degree {shard} ("
        + ("FSDP2 shards weights, gradients and optimizer states" if plan.zero_stage == 3 else "replicated weights")
        + ").",
    ]
    if plan.pp > 1:
        out.append(
            f"Pipeline: {plan.pp} stages with {', '.join(map(str, plan.stage_layers))} layers "
            f"({'Interleaved1F1B, ' + str(plan.vpp) + ' model parts per rank' if plan.vpp > 1 else '1F1B'}), given "
            f"as explicit module_fqns_per_model_part; local_batch_size {plan.micro_batch_size * plan.num_microbatches}"
            f" is the iteration's {plan.num_microbatches} pipeline micro-batches of {plan.micro_batch_size}."
        )
    else:
        out.append(
            f"Batch: local_batch_size {plan.micro_batch_size} per data-parallel rank, accumulated "
            f"{plan.num_microbatches} times to the global batch of {plan.global_batch_size}."
        )
    if model.registry is None:
        out.append(
            f"The model ({plan.model.name}) is not in torchtitan's registry: it is built with the llama3 "
            "architecture from the plan's dimensions"
            + (
                " (through llama3's module-private layer builder of torchtitan 0.3.0); check RoPE theta and "
                "weight initialisation against your checkpoint."
                if version == "0.3"
                else " in plan_model.py (a registered llama3 flavor)"
                + ("; 0.2.2's llama3 has no tied embeddings, so they are untied." if plan.model.tie_embeddings else ".")
            )
        )
    if model.fp8:
        out.append("fp8: Float8 linear layers (torchao) with torch.compile; they need an SM89+ GPU (H100 or newer).")
    return out


# ---------------------------------------------------------------------------------------------------------------
# import


def read(
    path: Path,
    *,
    world_size: int | None = None,
    gpu: str | None = None,
    gpus_per_node: int | None = None,
    model: str | None = None,
) -> dict:
    """A job dict (planner/spec.py) from a torchtitan 0.2 TOML or our emitted 0.3 ``plan_config.py`` (parsed with
    ``ast``, never imported). The model comes from the registry entry (llama3_8b / [model] llama3 8B ->
    llama3-8b, ...) or from the dimensions `planner emit` wrote, else ``model``; the world size from the degrees
    when none is -1, else ``world_size``. Bad input raises SpecError naming the key (exit 2).

    What maps only approximately: torchtitan's per-op selective AC reads as the planner's selective recompute
    (selective_ac_option N as every N-th layer of a stage fully recomputed); training.dtype bfloat16 (no fp32
    master weights) reads as bf16 mixed precision; with PP and gradient accumulation (global batch > local batch
    x dp) torchtitan runs one pipeline flush per accumulation step, the planner one flush for all micro-batches."""
    path = Path(path)
    if path.suffix == ".toml":
        found = _read_toml(path)
    elif path.suffix == ".py":
        found = _read_module(path)
    else:
        raise SpecError("torchtitan", f"expected a 0.2 .toml file or a 0.3 .py config module, got '{path.name}'")
    return _job(found, world_size=world_size, gpu=gpu, gpus_per_node=gpus_per_node, model=model)


@dataclass
class _Found:
    version: str
    par: dict[str, Any]
    train: dict[str, Any]
    ac: str  # none | full | selective:op | selective:<N>
    model: Any  # preset name, inline model dict, or None
    fp8: bool


def _read_toml(path: Path) -> _Found:
    from planner.io import read_text

    try:
        doc = tomllib.loads(read_text(path, field=TOML_FILE))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path.name, f"invalid TOML: {exc}")
    par = _known(doc.get("parallelism"), PARALLELISM_02, "parallelism")
    train = _known(doc.get("training"), TRAINING_02, "training")
    ac = _known(doc.get("activation_checkpoint"), AC_02, "activation_checkpoint")
    mod = _known(doc.get("model"), MODEL_02, "model")
    mode = ac["mode"]
    if mode not in ("none", "full", "selective", "memory_budget"):
        raise SpecError("activation_checkpoint.mode", f"expected none, full, selective or memory_budget, got {mode!r}")
    if mode == "memory_budget":
        raise SpecError("activation_checkpoint.mode", "memory_budget (compiler-chosen recompute) has no planner form")
    if mode == "selective":
        option = str(ac["selective_ac_option"])
        if option != "op" and not option.isdigit():
            raise SpecError("activation_checkpoint.selective_ac_option", f"expected 'op' or a number, got {option!r}")
        mode = f"selective:{option}"
    converters = mod["converters"]
    if isinstance(converters, str):
        converters = [c.strip() for c in converters.split(",") if c.strip()]
    fp8 = any(c in ("float8", "quantize.linear.float8") for c in converters)
    name, flavor = mod["name"], mod["flavor"]
    found_model: Any = None
    for preset, reg in REGISTRY.items():
        if reg.module == name and reg.flavor == flavor:
            found_model = preset
    custom = (doc.get("experimental") or {}).get("custom_import")
    if found_model is None and custom:
        side = path.parent / (str(custom).replace(".", "/") + ".py")
        if side.is_file():
            found_model = _custom_model(_module_consts(side).get("MODEL"), side.name)
    return _Found("0.2", par, train, mode, found_model, fp8)


def _known(section: Any, fields: dict[str, Any], name: str) -> dict[str, Any]:
    """A TOML section over its defaults; unknown keys fail as torchtitan's _dict_to_dataclass makes them."""
    if section is None:
        return dict(fields)
    if not isinstance(section, dict):
        raise SpecError(name, f"expected a table, got {type(section).__name__}")
    for key in section:
        if key not in fields:
            raise SpecError(f"{name}.{key}", "unknown key" + did_you_mean(str(key), fields))
    return {**fields, **section}


def _module_consts(path: Path) -> dict[str, Any]:
    from planner.io import read_text

    try:
        tree = ast.parse(read_text(path, field=path.name), filename=str(path))
    except SyntaxError as exc:
        raise SpecError(path.name, f"not valid Python (line {exc.lineno}): {exc.msg}")
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return consts


def _custom_model(dims: Any, where: str) -> dict | None:
    """A planner model mapping from MODEL = {...} of an emitted module."""
    if dims is None:
        return None
    keys = ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size")
    if not isinstance(dims, dict) or any(k not in dims for k in keys):
        raise SpecError(f"{where}: MODEL", f"expected a mapping with {', '.join(keys)}")
    return {
        "name": str(dims.get("name", "custom")),
        "num_layers": dims["n_layers"],
        "hidden_size": dims["dim"],
        "ffn_hidden_size": dims["ffn_hidden"],
        "num_attention_heads": dims["n_heads"],
        "num_kv_heads": dims["n_kv_heads"],
        "vocab_size": dims["vocab_size"],
        "mlp": "swiglu",
        "tie_embeddings": bool(dims.get("tie_embeddings", False)),
    }


def _read_module(path: Path) -> _Found:
    """Our 0.3 plan_config.py, read statically: module-level literals, the registry function plan() starts from,
    and plan()'s assignments to the parallelism and training fields and activation_checkpoint."""
    from planner.io import read_text

    try:
        tree = ast.parse(read_text(path, field=path.name), filename=str(path))
    except SyntaxError as exc:
        raise SpecError(path.name, f"not valid Python (line {exc.lineno}): {exc.msg}")
    consts: dict[str, Any] = {}
    fn = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
        elif isinstance(node, ast.FunctionDef) and node.name == "plan":
            fn = node
    if fn is None:
        raise SpecError(path.name, "no function plan() (the --config function `planner emit` writes)")
    base = None
    aliases = {"cfg.parallelism": "parallelism", "cfg.training": "training"}
    sets: dict[str, Any] = {}
    model_spec = None  # the expression plan() gives cfg.model_spec, if any
    for stmt in fn.body:
        if isinstance(stmt, ast.Return):
            continue
        if not isinstance(stmt, ast.Assign):
            raise SpecError(f"{path.name}: plan()", f"line {stmt.lineno}: only plain assignments are read")
        pairs = []
        for target in stmt.targets:  # a = b = v, and a, b = v, w
            value = stmt.value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                pairs += list(zip(target.elts, value.elts))
            else:
                pairs.append((target, value))
        for tgt, val in pairs:
            name = ast.unparse(tgt)
            if isinstance(tgt, ast.Name) and isinstance(val, ast.Call) and isinstance(val.func, ast.Name):
                if tgt.id == "cfg":
                    base = val.func.id
                continue
            if isinstance(tgt, ast.Name) and ast.unparse(val) in aliases:
                aliases[tgt.id] = aliases[ast.unparse(val)]
                continue
            owner, _, attr = name.rpartition(".")
            owner = aliases.get(owner, owner)
            if owner in ("parallelism", "training"):
                sets[f"{owner}.{attr}"] = _value(val, consts, f"{owner}.{attr}")
            elif name == "cfg.activation_checkpoint":
                sets["ac"] = _ac_value(val)
            elif name == "cfg.model_spec":
                model_spec = ast.unparse(val)
            elif name in ("cfg.loss", "cfg.compile") or owner == "cfg":
                continue
            else:
                raise SpecError(f"{path.name}: plan()", f"line {stmt.lineno}: cannot read the assignment to {name}")
    if base is None:
        raise SpecError(f"{path.name}: plan()", "plan() does not start from a registry config (cfg = <function>())")
    defaults = REGISTRY_BASE.get(base, {})
    par = dict(PARALLELISM_03)
    train = dict(TRAINING_03)
    for key, value in {**defaults, **sets}.items():
        section, _, attr = key.partition(".")
        if section == "parallelism":
            if attr not in PARALLELISM_03:
                raise SpecError(key, "unknown ParallelismConfig field" + did_you_mean(attr, PARALLELISM_03))
            par[attr] = value
        elif section == "training":
            if attr not in TRAINING_03:
                raise SpecError(key, "unknown TrainingConfig field" + did_you_mean(attr, TRAINING_03))
            train[attr] = value
    ac = {**defaults, **sets}.get("ac", "selective")
    if ac == "selective":
        ac = "selective:op"  # 0.3 SelectiveAC is per-op
    found_model: Any = next((p for p, r in REGISTRY.items() if r.function == base), None)
    if "MODEL" in consts:
        found_model = _custom_model(consts["MODEL"], path.name)
    fp8 = "Float8LinearConverter" in model_spec if model_spec is not None else bool(defaults.get("fp8"))
    return _Found("0.3", par, train, ac, found_model, fp8)


def _value(node: ast.AST, consts: dict[str, Any], field: str) -> Any:
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise SpecError(field, f"expected a literal value, got `{ast.unparse(node)}`")


def _ac_value(node: ast.AST) -> str:
    text = ast.unparse(node)
    if text == "None":
        return "none"
    for name, mode in (("FullAC", "full"), ("SelectiveAC", "selective"), ("MemoryBudgetAC", "memory_budget")):
        if text.startswith(f"{name}.Config("):
            if mode == "memory_budget":
                raise SpecError(
                    "activation_checkpoint", "MemoryBudgetAC (compiler-chosen recompute) has no planner form"
                )
            return mode
    raise SpecError("activation_checkpoint", f"expected FullAC.Config(), SelectiveAC.Config() or None, got `{text}`")


def _int(value: Any, field: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SpecError(field, f"expected an integer >= {low}, got {value!r}")
    return value


def _job(f: _Found, *, world_size, gpu, gpus_per_node, model) -> dict:
    from planner.emit.deepspeed import _cluster

    p, t = f.par, f.train
    replicate = _int(p["data_parallel_replicate_degree"], "parallelism.data_parallel_replicate_degree")
    shard = p["data_parallel_shard_degree"]
    if shard != -1:
        shard = _int(shard, "parallelism.data_parallel_shard_degree")
    tp = _int(p["tensor_parallel_degree"], "parallelism.tensor_parallel_degree")
    pp = _int(p["pipeline_parallel_degree"], "parallelism.pipeline_parallel_degree")
    cp = _int(p["context_parallel_degree"], "parallelism.context_parallel_degree")
    ep = _int(p["expert_parallel_degree"], "parallelism.expert_parallel_degree")
    if shard == -1:
        if world_size is None:
            raise SpecError("--world-size", "data_parallel_shard_degree is -1 (the GPUs left over): give --world-size")
        rest = replicate * cp * tp * pp
        if _int(world_size, "--world-size") % rest:
            raise SpecError("parallelism", f"--world-size {world_size} is not a multiple of dp_replicate*cp*tp*pp")
        shard = world_size // rest
    product = replicate * shard * cp * tp * pp
    if world_size is None:
        world_size = product
    elif product != world_size:  # torchtitan/distributed/parallel_dims.py _validate
        raise SpecError(
            "parallelism",
            f"dp_replicate*dp_shard*cp*tp*pp = {replicate}*{shard}*{cp}*{tp}*{pp} = {product} but --world-size says "
            f"{world_size}",
        )
    if replicate > 1 and shard > 1:
        raise SpecError(
            "parallelism.data_parallel_replicate_degree",
            "HSDP (replicate and shard both > 1) shards over part of the data-parallel ranks: the planner's ZeRO "
            "stages shard over all of them or none",
        )
    if ep > 1 and (shard * cp * tp) % ep:
        raise SpecError("parallelism.expert_parallel_degree", f"ep {ep} does not divide dp_shard*cp*tp")
    dp = replicate * shard
    if cp > 1 and replicate > 1:
        raise SpecError(
            "parallelism.data_parallel_replicate_degree",
            "with cp > 1 torchtitan shards over the context-parallel ranks of each replica (HSDP-like): the "
            "planner's ZeRO stages shard over all data-parallel ranks or none",
        )
    zero = 3 if shard * cp > 1 else 0  # parallel_dims.fsdp_enabled: FSDP over dp_shard * cp

    if model is None:
        model = f.model
    if model is None:
        raise SpecError("--model", "the config names no model the planner knows: give --model (a preset or a path)")
    num_layers = _num_layers(model)

    local = _int(t["local_batch_size"], "training.local_batch_size")
    gbs = t["global_batch_size"]
    gbs = local * dp if gbs == -1 else _int(gbs, "training.global_batch_size")
    if gbs % (local * dp):  # torchtitan/trainer.py
        raise SpecError("training.global_batch_size", f"{gbs} is not a multiple of local_batch_size {local} x dp {dp}")
    seq = _int(t["seq_len"], "training.seq_len")
    if t["mixed_precision_param"] != "bfloat16":
        raise SpecError(
            "training.mixed_precision_param",
            f"{t['mixed_precision_param']!r}: the planner models 16-bit mixed-precision training (bfloat16)",
        )

    vpp, stage_layers = 1, [num_layers]
    if pp > 1:
        schedule = str(p["pipeline_parallel_schedule"])
        if schedule.lower() not in SCHEDULES:
            raise SpecError(
                "parallelism.pipeline_parallel_schedule",
                f"unknown schedule {schedule!r}" + did_you_mean(schedule, ["1F1B", "Interleaved1F1B", "GPipe"]),
            )
        if schedule.lower() not in PLANNER_SCHEDULES:
            raise SpecError(
                "parallelism.pipeline_parallel_schedule",
                f"{schedule}: the planner models the 1F1B and Interleaved1F1B schedules",
            )
        mbs = _int(p["pipeline_parallel_microbatch_size"], "parallelism.pipeline_parallel_microbatch_size")
        if local % mbs:
            raise SpecError(
                "parallelism.pipeline_parallel_microbatch_size", f"{mbs} does not divide local_batch_size {local}"
            )
        parts = _parts(p, f.version, pp, num_layers, SCHEDULES[schedule.lower()])
        vpp = len(parts) // pp
        if schedule.lower() == "1f1b" and vpp != 1 or schedule.lower() != "1f1b" and vpp < 2:
            raise SpecError(
                "parallelism.pipeline_parallel_schedule",
                f"{schedule} with {vpp} model parts per rank (1F1B holds one, Interleaved1F1B two or more)",
            )
        stage_layers = []
        for r in range(pp):
            chunks = [parts[v * pp + r] for v in range(vpp)]
            if len(set(chunks)) > 1:
                given = p.get("module_fqns_per_model_part") is not None
                raise SpecError(
                    "parallelism." + ("module_fqns_per_model_part" if given else "pipeline_parallel_layers_per_stage"),
                    f"pipeline rank {r} holds model parts of {chunks} layers"
                    + ("" if given else " (torchtitan's default split)")
                    + ": the planner's interleaving gives a rank's parts equal layer counts; list them in "
                    "module_fqns_per_model_part",
                )
            stage_layers.append(sum(chunks))
    else:
        mbs = local

    layout: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": cp,
        "ep": ep,
        "vpp": vpp,
        "micro_batch_size": mbs,
        "sequence_parallel": bool(tp > 1 and (f.version == "0.2" or p.get("enable_sequence_parallel", True))),
        "zero_stage": zero,
        "recompute": "none",
    }
    recompute_counts = None
    if f.ac == "full":
        layout["recompute"] = "full"
    elif f.ac == "selective:op":
        layout["recompute"] = "selective"
    elif f.ac.startswith("selective:"):
        # every N-th layer a rank runs is checkpointed (a counter over the rank's layers; 0 means every layer)
        n = int(f.ac.split(":")[1])
        if n <= 1:
            layout["recompute"] = "full"
        else:
            recompute_counts = [layers // n for layers in stage_layers]
    if len(set(stage_layers)) > 1 or recompute_counts:
        stages = [{"layers": n} for n in stage_layers]
        for stage, count in zip(stages, recompute_counts or []):
            stage["recompute_layers"] = count
        layout["stages"] = stages
    cluster, _ = _cluster(world_size, gpu, gpus_per_node)
    return {
        "model": model,
        "cluster": cluster,
        "training": {"seq_length": seq, "global_batch_size": gbs, "precision": "fp8" if f.fp8 else "bf16"},
        "layout": layout,
    }


def _num_layers(model: Any) -> int:
    from planner.catalog import resolve_model

    return resolve_model(model, base_dir=Path.cwd(), field="--model").num_layers


def _parts(p: dict[str, Any], version: str, pp: int, num_layers: int, single: bool) -> list[int]:
    """Transformer layers of each model part: from module_fqns_per_model_part (checked: every module once, in
    order), else torchtitan's default split (pipeline_parallel_layers_per_stage or 1/2 parts per rank, with the
    embedding and output weighted as first/last_stage_less_layers layers)."""
    fqns = p.get("module_fqns_per_model_part")
    key = "parallelism.module_fqns_per_model_part"
    if fqns is not None:
        if not isinstance(fqns, list) or not all(isinstance(part, list) for part in fqns) or not fqns:
            raise SpecError(key, "expected a list of lists of module names")
        if len(fqns) % pp:
            raise SpecError(key, f"{len(fqns)} model parts are not a multiple of pp {pp}")
        out = OUTPUT_FQN[version]
        flat = [name for part in fqns for name in part]
        expected = ["tok_embeddings", *(f"layers.{i}" for i in range(num_layers)), "norm", out]
        if flat != expected:
            unknown = sorted(set(flat) - set(expected))
            missing = sorted(set(expected) - set(flat))
            raise SpecError(
                key,
                "must name tok_embeddings, layers.0 .. layers."
                f"{num_layers - 1}, norm and {out} once each, in order (unknown {unknown[:4]}, missing {missing[:4]})",
            )
        return [sum(1 for name in part if name.startswith("layers.")) for part in fqns]
    first = _int(
        p["pipeline_parallel_first_stage_less_layers"], "parallelism.pipeline_parallel_first_stage_less_layers", 0
    )
    last = _int(
        p["pipeline_parallel_last_stage_less_layers"], "parallelism.pipeline_parallel_last_stage_less_layers", 0
    )
    lps = p.get("pipeline_parallel_layers_per_stage")
    if lps is not None:
        lps = _int(lps, "parallelism.pipeline_parallel_layers_per_stage")
        count = math.ceil((num_layers + first + last) / lps)
        if count % pp:
            raise SpecError(
                "parallelism.pipeline_parallel_layers_per_stage",
                f"gives {count} model parts, not a multiple of pp {pp}",
            )
    else:
        count = pp * (1 if single else 2)
    effective = num_layers + first + last
    base, extra = divmod(effective, count)
    if base == 0 or first > base or last > base:
        raise SpecError(
            "parallelism.pipeline_parallel_degree",
            f"{count} model parts for {num_layers} layers (+{first} +{last} for embedding and output) leave a part "
            "without layers",
        )
    parts, left = [], num_layers
    for i in range(count):
        share = base + (1 if i < extra else 0) - (first if i == 0 else 0) - (last if i == count - 1 else 0)
        take = min(share, left)
        parts.append(take)
        left -= take
    return parts
