"""torchtitan (emitters.md section 3), the emitter: a plan as a 0.3 Python config module (``plan_config.py``, the
default) or a 0.2 TOML file (``plan.toml``). The importer (either read back into a job, `planner import`) is
planner/emit/torchtitan_import.py, with the config fields and defaults it checks keys against; ``read`` here
forwards to it.

Every key below was read in the PyPI wheels torchtitan 0.3.0 and 0.2.2 (repo pytorch/torchtitan, tag v0.2.2 and
the 0.3 release):

- 0.3.0 ``torchtitan/config/configs.py``: ``ParallelismConfig`` and ``TrainingConfig`` fields;
  ``torchtitan/trainer.py`` ``Trainer.Config`` (``activation_checkpoint``, ``model_spec``, ``loss``, ``compile``) and
  its ``__post_init__`` (local batch divisible by the PP micro-batch; PP needs ``training.disable_cuda_graphs``);
  ``torchtitan/config/manager.py``: ``--module M --config F`` imports ``M.config_registry`` else ``M`` and calls F;
  ``torchtitan/distributed/activation_checkpoint.py``: ``FullAC.Config``, ``SelectiveAC.Config``, ``None``;
  ``torchtitan/components/quantization/float8.py``: ``Float8LinearConverter.Config``, given to ``model_registry``
  (``recipe_name``: "rowwise" (the default) or "rowwise_with_gw_hp": 0.3.0 has no tensorwise Float8 recipe);
  ``torchtitan/models/<llama3|qwen3|deepseek_v3>/config_registry.py`` and ``__init__.py``: the registry functions
  and flavors (llama3_8b/70b/405b: "8B"/"70B"/"405B"; qwen3_30b_a3b: "30B-A3B"; deepseek_v3_671b: "671B") and how
  a llama3 model config is built (``Llama3Model.Config``, ``_build_llama3_layers``, ``llama3_configs``).
- 0.2.2 ``torchtitan/config/job_config.py``: the TOML sections ``[model]`` (name, flavor, converters),
  ``[training]``, ``[parallelism]`` (no enable_sequence_parallel: TP always shards norms along the sequence),
  ``[activation_checkpoint]`` (mode, selective_ac_option), ``[quantize.linear.float8]`` (recipe_name: None, the
  default, is torchao's tensorwise Float8LinearConfig(); or tensorwise, rowwise, rowwise_with_gw_hp), ``[compile]``,
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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError

VERSIONS = ("0.3", "0.2")
CONFIG_MODULE = "plan_config"  # 0.3: plan_config.py with plan()
MODEL_MODULE = "plan_model"  # 0.2: registers a custom llama3 flavor (experimental.custom_import)
TOML_FILE = "plan.toml"
CUSTOM_FLAVOR = "planner"
REDO = "re-plan with `planner plan JOB --framework torchtitan`"
OUTPUT_FQN = {"0.3": "lm_head", "0.2": "output"}
# Training.fp8_recipe -> the Float8 linear converter's recipe_name, by version; None: write none (the default).
# 0.3.0 torchtitan/components/quantization/float8.py Float8LinearConverter.Config.recipe_name:
#   Literal["rowwise", "rowwise_with_gw_hp"] = "rowwise" (no tensorwise: a tensorwise plan is refused for 0.3);
# 0.2.2 torchtitan/config/job_config.py Float8Linear ([quantize.linear.float8]) recipe_name:
#   Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] | None = None, and None runs torchao's default
#   Float8LinearConfig(), tensorwise (0.2.2 components/quantization/float8.py: "Float8 tensorwise scaled training").
FLOAT8_RECIPE_NAMES = {"0.3": {"rowwise": "rowwise"}, "0.2": {"tensorwise": None, "rowwise": "rowwise"}}


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

    check_runnable("torchtitan", plan, "torchtitan")
    version = version_of(options)
    check_torchtitan(plan)
    if version == "0.2" and plan.tp > 1 and not plan.sequence_parallel:
        raise Inexpressible(
            f"plans[{plan.plan_rank - 1}].layout.sequence_parallel",
            "torchtitan 0.2.2 always runs sequence parallelism with TP (no switch), which this plan has off; emit "
            "for torchtitan 0.3 (the default --framework-version)",
        )
    float8_recipe(plan, version)  # Inexpressible (exit 4) for an FP8 recipe this version has no recipe_name for
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
    """torchtitan's rules that planner/frameworks.py does not hold (emitters.md 3.3 and 5): Inexpressible (exit 4).
    check_runnable, which ``render`` runs first, holds the others: EP within dp_shard * cp * tp
    (parallel_dims.py), at least as many micro-batches as stages (torch Schedule1F1B), no fp16."""
    field = f"plans[{plan.plan_rank - 1}].layout"
    if plan.pp > 1:
        # Met by construction (settings, module_fqns): the local batch is micro-batch x micro-batches, so the PP
        # micro-batch divides it (Trainer.Config.__post_init__); 1F1B gets one model part per rank and
        # Interleaved1F1B vpp >= 2 (pipeline_parallel.py _get_pipeline_metadata).
        n = plan.num_microbatches
        rounds = max(1, n // plan.pp)
        if plan.vpp > 1 and n % rounds:  # torch ScheduleInterleaved1F1B
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


def float8_recipe(plan: LaunchPlan, version: str) -> str | None:
    """The plan's FP8 recipe (training.fp8_recipe) when it trains in fp8, else None. A recipe ``version`` has no
    recipe_name for is refused (Inexpressible, exit 4): tensorwise under 0.3 (FLOAT8_RECIPE_NAMES)."""
    t = plan.training
    if t.precision != "fp8":
        return None
    names = FLOAT8_RECIPE_NAMES[version]
    if t.fp8_recipe not in names:
        if version == "0.3" and t.fp8_recipe == "tensorwise":
            why = (
                "torchtitan 0.3.0's Float8LinearConverter has no tensorwise recipe (recipe_name: rowwise, the "
                "default, or rowwise_with_gw_hp): set training.fp8_recipe to rowwise and " + REDO + ", or emit for "
                "torchtitan 0.2 (--framework-version 0.2), whose [quantize.linear.float8] runs tensorwise"
            )
        else:
            why = f"torchtitan {version} has no {t.fp8_recipe} Float8 recipe ({', '.join(sorted(names))}); {REDO}"
        raise Inexpressible("job.training.fp8_recipe", why)
    return t.fp8_recipe


@dataclass(frozen=True)
class ModelSource:
    registry: Registry | None  # None: a llama3-architecture model built from the plan's dimensions
    fp8: bool
    fp8_recipe: str | None = None  # training.fp8_recipe when fp8 (float8_recipe)


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
            return ModelSource(entry, plan.training.precision == "fp8", float8_recipe(plan, version))
    why = None
    if m.moe is not None:
        why = "an MoE model outside torchtitan's registry (llama3, qwen3 30B-A3B, deepseek_v3 671B here)"
    elif m.mla is not None:
        why = "multi-head latent attention outside torchtitan's registry (its deepseek_v3 671B here)"
    elif m.mlp != "swiglu":
        why = f"a {m.mlp} MLP (torchtitan's dense models are llama-style SwiGLU)"
    elif m.head_dim is not None and m.head_dim * m.num_attention_heads != m.hidden_size:
        why = f"head_dim {m.head_dim} != hidden_size / heads (torchtitan derives head_dim from them)"
    if why:
        raise Inexpressible(
            "job.model",
            f"torchtitan has no model for {m.name}: {why}; emit it for megatron or deepspeed instead",
        )
    return ModelSource(None, plan.training.precision == "fp8", float8_recipe(plan, version))


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
    """full (every layer: FullAC / mode full), op (per-op selective: SelectiveAC / mode selective with
    selective_ac_option "op") or none. The planner's selective recompute only drops eager attention's s^2
    activations; torchtitan's attention is always fused (SDPA/flex), which never keeps them, so none matches it."""
    if plan.recompute == "full" or (plan.recompute_layers and plan.recompute_layers >= max(plan.stage_layers)):
        return "full"
    return "op" if plan.recompute == "op" else "none"


def config_module(plan: LaunchPlan, model: ModelSource) -> str:
    """plan_config.py for torchtitan 0.3 (emitters.md 3.4, the emitted-module form): plan() starts from a registry
    function and sets the plan's fields; tyro re-validates the returned config (Trainer.Config.__post_init__)."""
    s = settings(plan, "0.3")
    imports = ["from torchtitan.trainer import Trainer"]
    lines: list[str] = []
    ac = recompute_mode(plan)
    if ac in ("full", "op"):
        name = "FullAC" if ac == "full" else "SelectiveAC"
        imports.append(f"from torchtitan.distributed.activation_checkpoint import {name}")
    converters = ""
    if model.fp8:
        imports.append("from torchtitan.components.quantization import Float8LinearConverter")
        imports.append("from torchtitan.config import CompileConfig")
        name = FLOAT8_RECIPE_NAMES["0.3"][model.fp8_recipe]
        recipe = f"recipe_name={_py(name)}, " if name is not None else ""
        float8 = f'Float8LinearConverter.Config({recipe}filter_fqns=["lm_head"], model_compile_enabled=True)'
        converters = f", converters=[{float8}]"
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
    ac_config = {"full": "FullAC.Config()", "op": "SelectiveAC.Config()"}.get(ac, "None")
    lines.append(f"    cfg.activation_checkpoint = {ac_config}")
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
    ac = recompute_mode(plan)
    lines += ["", "[activation_checkpoint]", f"mode = {_toml('selective' if ac == 'op' else ac)}"]
    if ac == "op":
        lines.append('selective_ac_option = "op"')
    if model.fp8:
        name = FLOAT8_RECIPE_NAMES["0.2"][model.fp8_recipe]
        lines += [
            "",
            "[quantize.linear.float8]",
            *([f"recipe_name = {_toml(name)}"] if name is not None else []),
            'filter_fqns = ["output"]',
            "",
            "[compile]",
            "enable = true",
            'components = ["model", "loss"]',
        ]
    elif plan.training.cross_entropy == "fused":  # the plan priced a fused loss: 0.2's compiled one holds as much
        lines += ["", "[compile]", "enable = true", 'components = ["loss"]']
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
    if version == "0.2" and not model.fp8 and plan.training.cross_entropy == "fused":
        out.append(
            'Loss: [compile] components ["loss"] compiles torchtitan\'s cross-entropy, which keeps the 16-bit logits '
            "and their gradient (4 bytes per logit, the plan's training.cross_entropy: fused) instead of eager "
            "PyTorch's fp32 copies (10); the model itself runs eager."
        )
    if model.fp8:
        name = FLOAT8_RECIPE_NAMES[version][model.fp8_recipe]
        where = "Float8LinearConverter.Config" if version == "0.3" else "[quantize.linear.float8]"
        how = f'{where} recipe_name "{name}"' if name is not None else f"{where} without recipe_name, torchao's default"
        out.append(
            f"fp8: Float8 linear layers (torchao) with torch.compile, {model.fp8_recipe} scaling as the plan's "
            f"training.fp8_recipe ({how}); they need an SM89+ GPU (H100 or newer)."
        )
    return out


def read(
    path: Path,
    *,
    world_size: int | None = None,
    gpu: str | None = None,
    gpus_per_node: int | None = None,
    model: str | None = None,
) -> dict:
    """A job dict from a torchtitan 0.2 TOML or an emitted 0.3 ``plan_config.py``: planner/emit/torchtitan_import.py
    ``read``."""
    from planner.emit import torchtitan_import

    return torchtitan_import.read(path, world_size=world_size, gpu=gpu, gpus_per_node=gpus_per_node, model=model)
