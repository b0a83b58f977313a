"""torchtitan, the importer: a 0.2 TOML file or an emitted 0.3 ``plan_config.py`` (parsed with ``ast``, never
imported) read back into a job dict with a `layout` (planner/spec.py), `planner import`; the config fields and
defaults it checks keys against. The registry entries and file names are planner/emit/torchtitan.py's.

Read in the PyPI wheels torchtitan 0.3.0 and 0.2.2 (repo pytorch/torchtitan):

- 0.3.0 ``torchtitan/config/configs.py``: ``ParallelismConfig`` and ``TrainingConfig`` fields and defaults;
  ``torchtitan/models/<llama3|qwen3|deepseek_v3>/config_registry.py``: what each registry function sets;
  ``torchtitan/distributed/activation_checkpoint.py``: ``FullAC``, ``SelectiveAC`` (per-op), ``MemoryBudgetAC``.
- 0.2.2 ``torchtitan/config/job_config.py``: the TOML sections and their defaults (unknown keys fail in
  ``_dict_to_dataclass``); selective_ac_option N checkpoints every N-th layer of a rank; ``[quantize.linear.float8]``
  recipe_name (tensorwise, rowwise, rowwise_with_gw_hp; unset: torchao's default, tensorwise), as the older
  ``[float8]`` section (converter "float8") has it.
- 0.3.0 ``torchtitan/components/quantization/float8.py``: ``Float8LinearConverter.Config`` recipe_name (rowwise,
  the default, or rowwise_with_gw_hp; later torchtitan also takes tensorwise).
- Both: ``torchtitan/distributed/parallel_dims.py`` (dp_replicate * dp_shard * cp * tp * pp == world; FSDP over
  dp_shard * cp; efsdp = dp_shard * cp * tp / ep); ``torchtitan/distributed/pipeline_parallel.py`` (schedule
  names, module_fqns_per_model_part, the default split); ``torchtitan/trainer.py`` (global batch a multiple of
  local batch x dp).
"""

from __future__ import annotations

import ast
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.emit.deepspeed_import import one_group_cluster
from planner.emit.torchtitan import OUTPUT_FQN, REGISTRY, TOML_FILE
from planner.errors import SpecError, did_you_mean
from planner.frameworks import FRAMEWORKS, implementation_settings

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
# Float8 recipe_name values torchtitan takes; those the planner models are its training.fp8_recipe of the same name
# (Framework.fp8_recipes)
FLOAT8_RECIPE_NAMES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
FLOAT8_DEFAULT = {"0.2": "tensorwise", "0.3": "rowwise"}  # recipe_name unset (0.2.2 None; 0.3.0 "rowwise")


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
    fp8_recipe: str | None = None  # training.fp8_recipe when fp8 (the Float8 converter's recipe_name)
    # The loss's memory (training.cross_entropy): torchtitan's loss is torch cross_entropy over the
    # upcast logits, 10 bytes per logit (unfused), unless torch.compile compiles it ([compile] components with "loss",
    # the default list: the upcast and log-softmax fuse, the 16-bit logits and their gradient stay, 4 bytes, as a fused
    # loss) or 0.3's ChunkedLossWrapper runs it (components/loss.py: lm_head and loss per sequence chunk, 8 by default,
    # so a chunk's 10 bytes per logit are an eighth of the logits'); both read as fused (4 bytes per logit at most).
    lean_loss: bool = False  # the loss is compiled or chunked: training.cross_entropy fused


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
    recipe = _toml_float8_recipe(doc, "quantize.linear.float8" in converters) if fp8 else None
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
    comp = doc.get("compile") or {}
    if not isinstance(comp, dict):
        raise SpecError("compile", f"expected a table, got {type(comp).__name__}")
    compiled_loss = bool(comp.get("enable", False)) and "loss" in comp.get("components", ["model", "loss"])
    return _Found("0.2", par, train, mode, found_model, fp8, recipe, compiled_loss)


def _toml_float8_recipe(doc: dict[str, Any], nested: bool) -> str:
    """The FP8 recipe of a 0.2 TOML: recipe_name of [quantize.linear.float8] (converter quantize.linear.float8), or
    of the older [float8] section (converter float8); unset is torchao's default, tensorwise."""
    path = "quantize.linear.float8" if nested else "float8"
    section: Any = doc
    for i, key in enumerate(path.split(".")):
        section = section.get(key)
        if section is None:
            return _float8_recipe(None, f"{path}.recipe_name", "0.2")
        if not isinstance(section, dict):
            raise SpecError(".".join(path.split(".")[: i + 1]), f"expected a table, got {type(section).__name__}")
    return _float8_recipe(section.get("recipe_name"), f"{path}.recipe_name", "0.2")


def _float8_recipe(name: Any, field: str, version: str) -> str:
    """training.fp8_recipe of a Float8 recipe_name (None: the version's default); bad input names ``field``."""
    if name is None:
        return FLOAT8_DEFAULT[version]
    if name not in FLOAT8_RECIPE_NAMES:
        raise SpecError(field, f"expected {', '.join(FLOAT8_RECIPE_NAMES)}, got {name!r}")
    if name not in FRAMEWORKS["torchtitan"].fp8_recipes:
        raise SpecError(
            field, f"{name!r}: the planner models the tensorwise and rowwise Float8 recipes (training.fp8_recipe)"
        )
    return name


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
    model_spec_node: ast.AST | None = None
    loss_node: ast.AST | None = None  # cfg.loss, if plan() sets it
    compile_node: ast.AST | None = None  # cfg.compile, if plan() sets it
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
                model_spec, model_spec_node = ast.unparse(val), val
            elif name == "cfg.loss":
                loss_node = val
            elif name == "cfg.compile":
                compile_node = val
            elif owner == "cfg":
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
    recipe = _module_float8_recipe(model_spec_node, consts) if fp8 else None
    # the registry functions all set ChunkedLossWrapper (config_registry.py), as `planner emit` does
    chunked = loss_node is None or "ChunkedLossWrapper" in ast.unparse(loss_node)
    return _Found("0.3", par, train, ac, found_model, fp8, recipe, chunked or _compiles_loss(compile_node))


def _compiles_loss(node: ast.AST | None) -> bool:
    """Whether a 0.3 ``cfg.compile = CompileConfig(...)`` compiles the loss (enable=True; components, default
    ["model", "loss"], names it)."""
    if not isinstance(node, ast.Call):
        return False
    kw = {k.arg: k.value for k in node.keywords}
    enabled = isinstance(kw.get("enable"), ast.Constant) and kw["enable"].value is True
    try:
        components = ast.literal_eval(kw["components"]) if "components" in kw else ("model", "loss")
    except ValueError:
        return False  # not a literal: nothing read
    return enabled and "loss" in components


def _module_float8_recipe(node: ast.AST | None, consts: dict[str, Any]) -> str:
    """The FP8 recipe of the Float8LinearConverter.Config(...) in a model_spec expression: its recipe_name keyword,
    else 0.3.0's default (rowwise), as for a registry function's own converter (llama3_405b: node None)."""
    field = "Float8LinearConverter.Config.recipe_name"
    for call in ast.walk(node) if node is not None else ():
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("Float8LinearConverter.Config"):
            for kw in call.keywords:
                if kw.arg == "recipe_name":
                    return _float8_recipe(_value(kw.value, consts, field), field, "0.3")
            return _float8_recipe(None, field, "0.3")
    return _float8_recipe(None, field, "0.3")


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
        layout["recompute"] = "op"  # per-op selective checkpointing
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
    cluster, _ = one_group_cluster(world_size, gpu, gpus_per_node)
    return {
        "model": model,
        "cluster": cluster,
        "training": {
            "seq_length": seq,
            "global_batch_size": gbs,
            "precision": "fp8" if f.fp8 else "bf16",
            "cross_entropy": "fused" if f.lean_loss else "unfused",  # compiled or chunked: 4 bytes per logit at most
            **implementation_settings(FRAMEWORKS["torchtitan"]),  # DTensor TP, torchao Float8Linear
            **({"fp8_recipe": f.fp8_recipe} if f.fp8 else {}),  # the config's own Float8 recipe
        },
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
