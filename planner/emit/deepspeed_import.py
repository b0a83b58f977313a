"""DeepSpeed, the importer: a ``ds_config.json`` (and the ``deepspeed_partition.py`` `planner emit` writes beside
it) read back into a job dict with a `layout` (planner/spec.py), `planner import`. ``one_group_cluster`` is shared
with the torchtitan importer (planner/emit/torchtitan_import.py).

Read in deepspeed 0.19.8 (the PyPI sdist; repo deepspeedai/DeepSpeed):

- ``deepspeed/runtime/config.py``: the batch triple (``_set_batch_related_parameters``, ``_batch_assertion``), the
  removed keys (``_reject_removed_config_keys``), ``get_pipeline_config`` (``pipeline.stages``).
- ``deepspeed/runtime/zero/config.py``: ``DeepSpeedZeroConfig`` (pydantic, extra="forbid": unknown keys fail).
- ``deepspeed/runtime/precision_config.py``: ``bf16`` / ``fp16`` (both enabled is an error).
- ``docs/_pages/config-json.md``: the ``activation_checkpointing`` keys.
- ``deepspeed/runtime/tensor_parallel/config.py`` and ``deepspeed/utils/groups.py``: ``tensor_parallel.autotp_size``
  (AutoTP: a 2-D DP x TP mesh over the whole world, not inside a pipeline).
- ``deepspeed/runtime/pipe/engine.py``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism".
- shared/reference/emitters.md 2.2: "auto" is a Hugging Face Trainer placeholder DeepSpeed does not resolve.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from planner.emit.deepspeed import CONFIG_FILE, PARTITION_FILE
from planner.errors import SpecError, did_you_mean
from planner.frameworks import FRAMEWORKS

# deepspeed/runtime/zero/config.py DeepSpeedZeroConfig (0.19.8): field names and their aliases
ZERO_KEYS = frozenset(
    {
        "allgather_bucket_size",
        "allgather_partitions",
        "allgather_sequential",
        "compute_grad_norm",
        "contiguous_gradients",
        "cpu_offload",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "elastic_checkpoint",
        "enable_sanity_checks",
        "gather_16bit_weights_on_model_save",
        "ignore_unused_parameters",
        "leaf_module",
        "legacy_stage1",
        "load_from_fp32_weights",
        "log_trace_cache_warnings",
        "max_live_parameters",
        "max_reuse_distance",
        "memory_efficient_linear",
        "model_persistence_threshold",
        "module_granularity_threshold",
        "offload_optimizer",
        "offload_param",
        "overlap_comm",
        "override_module_apply",
        "param_persistence_threshold",
        "parameter_alignment",
        "pipeline_loading_checkpoint",
        "prefetch_bucket_size",
        "reduce_bucket_size",
        "reduce_scatter",
        "round_robin_gradients",
        "save_muon_momentum_buffer_in_memory",
        "stage",
        "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold",
        "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold",
        "stage3_prefetch_bucket_size",
        "stage3_use_all_reduce_for_fetch_params",
        "sub_group_size",
        "use_all_reduce_for_fetch_params",
        "use_multi_rank_bucket_allreduce",
        "zenflow",
        "zero_hpz_partition_size",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_weights",
    }
)
# deepspeed/runtime/config.py _reject_removed_config_keys: these raise DeepSpeedConfigError
REMOVED_KEYS = ("amp", "compression_training", "nebula", "quantize_training")
# activation_checkpointing keys that switch something on (docs/_pages/config-json.md)
CHECKPOINTING_ON = (
    "partition_activations",
    "cpu_checkpointing",
    "contiguous_memory_optimization",
    "number_checkpoints",
)


def read(
    path: Path,
    *,
    world_size: int | None = None,
    gpu: str | None = None,
    gpus_per_node: int | None = None,
    model: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    seq_length: int | None = None,
) -> dict:
    """A job dict (planner/spec.py) from a ds_config.json. The JSON has no model, cluster or sequence length, so
    ``model``, ``gpu``, ``world_size`` and ``seq_length`` are required; pp comes from ``pipeline.stages`` (a number)
    else ``pp``; tp from ``tensor_parallel.autotp_size`` else ``tp``. A ``deepspeed_partition.py`` beside the file
    (as `planner emit` writes it) adds the per-stage layer counts and, with a pipeline, TP and sequence parallelism.
    Bad input raises SpecError naming the JSON key (exit 2)."""
    from planner.io import load_json

    path = Path(path)
    raw = load_json(path, field=CONFIG_FILE)
    if not isinstance(raw, dict):
        raise SpecError(CONFIG_FILE, f"expected a JSON object of DeepSpeed settings, got {type(raw).__name__}")
    _no_auto(raw, "")
    for key in REMOVED_KEYS:
        if key in raw:
            raise SpecError(key, "removed from DeepSpeed (DeepSpeedConfigError in deepspeed/runtime/config.py)")
    side = _partition_facts(path.parent / PARTITION_FILE)

    pipe = _section(raw, "pipeline")
    if pipe is not None and isinstance(pipe.get("stages"), int) and not isinstance(pipe["stages"], bool):
        pp_found = _positive(pipe["stages"], "pipeline.stages")
        _agree("pipeline.stages", pp_found, pp, "--pp")
        pp = pp_found
    elif pp is None:
        if side.get("PP") is not None:
            pp = side["PP"]
        elif pipe is not None:
            raise SpecError("--pp", "the pipeline section does not give the number of stages: give --pp")
        else:
            pp = 1
    pp = _positive(pp, "--pp")

    tps = _section(raw, "tensor_parallel")
    autotp = tps.get("autotp_size") if tps is not None else None
    if autotp is not None:
        autotp = _count(autotp, "tensor_parallel.autotp_size")
    if autotp is not None and autotp > 1:
        if pp > 1:
            raise SpecError(
                "tensor_parallel.autotp_size",
                "AutoTP builds a 2-D data x tensor-parallel mesh over the whole world (deepspeed/utils/groups.py) "
                "and does not run inside a pipeline; drop it and give the model-parallel degree with --tp",
            )
        _agree("tensor_parallel.autotp_size", autotp, tp, "--tp")
        tp = autotp
    elif pp > 1 and side.get("TP") is not None:
        _agree(f"{PARTITION_FILE}: TP", side["TP"], tp, "--tp")
        tp = side["TP"]
    elif tp is None:
        tp = 1
    tp = _positive(tp, "--tp")

    if model is None:
        raise SpecError("--model", "a ds_config.json does not name the model: give a preset name or a config path")
    if seq_length is None:
        raise SpecError("--seq-length", "a ds_config.json does not hold the sequence length: give --seq-length")
    cluster, world = one_group_cluster(world_size, gpu, gpus_per_node)
    if world % (tp * pp):
        raise SpecError("--world-size", f"{world} GPUs are not a multiple of tp*pp = {tp}*{pp}")
    dp = world // (tp * pp)
    tbs, mbs, gas = _batch(raw, dp)

    zero = _section(raw, "zero_optimization") or {}
    for key in zero:
        if key not in ZERO_KEYS:
            raise SpecError(
                f"zero_optimization.{key}",
                "unknown key (DeepSpeedZeroConfig forbids extra keys)" + did_you_mean(str(key), ZERO_KEYS),
            )
    stage = zero.get("stage", 0)
    if isinstance(stage, str) and stage.strip().isdigit():
        stage = int(stage)  # pydantic coerces "3" to the enum
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
        raise SpecError("zero_optimization.stage", f"expected 0, 1, 2 or 3, got {stage!r}")
    if pp > 1 and stage >= 2:
        raise SpecError(
            "zero_optimization.stage",
            f"ZeRO-{stage} with a {pp}-stage pipeline: DeepSpeed's PipelineEngine runs ZeRO 0 or 1 only "
            "(deepspeed/runtime/pipe/engine.py)",
        )

    precision = _read_precision(raw)
    layout: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": 1,
        "ep": 1,
        "vpp": 1,
        "micro_batch_size": mbs,
        "sequence_parallel": bool(pp > 1 and tp > 1 and side.get("SEQUENCE_PARALLEL", False)),
        "zero_stage": stage,
        "recompute": _read_recompute(raw, pipe),
    }
    stages = side.get("STAGE_LAYERS")
    if stages is not None and pp > 1:
        if len(stages) != pp:
            raise SpecError(PARTITION_FILE, f"STAGE_LAYERS has {len(stages)} stages, the config {pp}")
        if len(set(stages)) > 1:
            layout["stages"] = [{"layers": n} for n in stages]
    return {
        "model": model,
        "cluster": cluster,
        "training": {
            "seq_length": seq_length,
            "global_batch_size": tbs,
            "precision": precision,
            "grad_dtype": _read_grad_dtype(raw, precision, stage),
        },
        "layout": layout,
    }


def _no_auto(node: Any, where: str) -> None:
    """ "auto" is a Hugging Face Trainer placeholder that DeepSpeed itself does not resolve (emitters.md 2.2:
    bf16.enabled "auto" silently disables bf16). DeepSpeed's own pipeline.stages default "auto" is allowed."""
    if isinstance(node, dict):
        for key, value in node.items():
            _no_auto(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _no_auto(value, f"{where}[{i}]")
    elif isinstance(node, str) and node.strip().lower() == "auto" and where != "pipeline.stages":
        raise SpecError(
            where,
            '"auto" is filled in by the Hugging Face Trainer, not by DeepSpeed; write the number or switch '
            "(DeepSpeed reads it as given)",
        )


def _section(raw: dict, key: str) -> dict | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, dict):
        raise SpecError(key, f"expected a JSON object, got {type(value).__name__}")
    return value


def _count(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(field, f"expected a non-negative integer, got {value!r}")
    return value


def _positive(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(field, f"expected a positive integer, got {value!r}")
    return value


def _agree(field: str, found: int, given: int | None, flag: str) -> None:
    if given is not None and given != found:
        raise SpecError(field, f"is {found} but {flag} says {given}")


def one_group_cluster(world_size: int | None, gpu: str | None, gpus_per_node: int | None) -> tuple[list[dict], int]:
    """One node group of ``world_size`` GPUs (gpus_per_node defaults to the GPU's, or the world when smaller)."""
    from planner.catalog import resolve_gpu

    if world_size is None:
        raise SpecError("--world-size", "a framework config does not hold the number of GPUs: give --world-size")
    world = _positive(world_size, "--world-size")
    if gpu is None:
        raise SpecError("--gpu", "a framework config does not name the GPU: give --gpu (e.g. h100-sxm)")
    if gpus_per_node is None:
        gpus_per_node = min(resolve_gpu(gpu, field="--gpu").gpus_per_node, world)
    gpn = _positive(gpus_per_node, "--gpus-per-node")
    if world % gpn:
        raise SpecError("--world-size", f"{world} GPUs do not fill whole nodes of {gpn}: give --gpus-per-node")
    return [{"gpu": gpu, "nodes": world // gpn, "gpus_per_node": gpn}], world


def _batch(raw: dict, dp: int) -> tuple[int, int, int]:
    """(train_batch_size, micro-batch, gradient_accumulation_steps) as DeepSpeedConfig derives them
    (``_set_batch_related_parameters``: a missing one from the other two, floor division; one alone with
    accumulation 1), then its assertion against the DP size."""
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    tbs, mbs, gas = (None if raw.get(k) is None else _positive(raw[k], k) for k in keys)
    if tbs is not None and mbs is not None and gas is None:
        gas = tbs // mbs // dp
    elif tbs is not None and gas is not None and mbs is None:
        mbs = tbs // dp // gas
    elif mbs is not None and gas is not None and tbs is None:
        tbs = mbs * gas * dp
    elif tbs is not None and mbs is None and gas is None:
        mbs, gas = tbs // dp, 1
    elif mbs is not None and tbs is None and gas is None:
        tbs, gas = mbs * dp, 1
    elif tbs is None and mbs is None:
        raise SpecError("train_batch_size", "give train_batch_size or train_micro_batch_size_per_gpu")
    if not mbs or not gas or tbs != mbs * gas * dp:
        raise SpecError(
            "train_batch_size",
            f"{tbs} is not train_micro_batch_size_per_gpu {mbs} x gradient_accumulation_steps {gas} x "
            f"data-parallel size {dp} (DeepSpeed's batch rule, deepspeed/runtime/config.py)",
        )
    return tbs, mbs, gas


def _read_precision(raw: dict) -> str:
    on = {}
    for key in ("bf16", "fp16"):
        section = _section(raw, key)
        enabled = (section or {}).get("enabled", False)
        if not isinstance(enabled, bool):
            raise SpecError(f"{key}.enabled", f"expected true or false, got {enabled!r}")
        on[key] = enabled
    if on["bf16"] and on["fp16"]:
        raise SpecError("bf16.enabled", "bf16 and fp16 are both enabled (DeepSpeed asserts against it)")
    if not (on["bf16"] or on["fp16"]):
        raise SpecError(
            "bf16.enabled",
            "neither bf16 nor fp16 is enabled: the planner models 16-bit mixed-precision training; enable one",
        )
    return "bf16" if on["bf16"] else "fp16"


# DeepSpeed's DtypeEnum spellings (deepspeed/runtime/config.py) of the gradient accumulation dtypes
ACCUM_DTYPES = {
    **dict.fromkeys(("fp32", "float32", "float", "torch.float32"), "fp32"),
    **dict.fromkeys(("bf16", "bfloat16", "torch.bfloat16"), "bf16"),
    **dict.fromkeys(("fp16", "float16", "half", "torch.float16"), "fp16"),
}


def _read_grad_dtype(raw: dict, precision: str, stage: int) -> str:
    """training.grad_dtype of what DeepSpeed runs (engine.py get_data_types, _do_optimizer_sanity_check): without
    ``data_types.grad_accum_dtype``, or with the model's own dtype, 16-bit gradients (the framework's grad_dtype,
    "bf16": 2 bytes, reduced in 16 bits); fp32 where Framework.grad_rejects lets DeepSpeed run bf16+fp32 (bf16 at
    ZeRO stage 1) is BF16_Optimizer. Every other mix is refused: ZeRO 0 raises in DeepSpeed itself, and ZeRO 2-3's
    sharded fp32 accumulation is not a buffer the planner models."""
    deepspeed = FRAMEWORKS["deepspeed"]
    section = _section(raw, "data_types") or {}
    value = section.get("grad_accum_dtype")
    if value is None:
        return deepspeed.grad_dtype
    name = ACCUM_DTYPES.get(str(value).strip().lower())
    if name is None:
        raise SpecError("data_types.grad_accum_dtype", f"expected fp32, bf16 or fp16 (DtypeEnum), got {value!r}")
    if name == precision:
        return deepspeed.grad_dtype
    if name == "fp32" and deepspeed.grad_rejects("bf16+fp32", precision, stage) is None:
        return "bf16+fp32"
    raise SpecError(
        "data_types.grad_accum_dtype",
        f"{name} accumulation of {precision} gradients at ZeRO stage {stage}: the planner models 16-bit gradients "
        "and BF16_Optimizer's fp32 accumulation (bf16 with ZeRO stage 1); DeepSpeed raises at stage 0",
    )


def _read_recompute(raw: dict, pipe: dict | None) -> str:
    """full when the pipeline checkpoints layers (activation_checkpoint_interval > 0) or the
    activation_checkpointing section switches something on; else none (DeepSpeed has no selective setting)."""
    interval = (pipe or {}).get("activation_checkpoint_interval", 0)
    if interval is not None and _count(interval, "pipeline.activation_checkpoint_interval") > 0:
        return "full"
    ckpt = _section(raw, "activation_checkpointing") or {}
    return "full" if any(ckpt.get(k) for k in CHECKPOINTING_ON) else "none"


def _partition_facts(path: Path) -> dict[str, Any]:
    """PP, TP, SEQUENCE_PARALLEL and STAGE_LAYERS of a deepspeed_partition.py beside the config, read statically
    (never imported): module-level assignments of literals."""
    if not path.is_file():
        return {}
    from planner.io import read_text

    try:
        tree = ast.parse(read_text(path, field=PARTITION_FILE), filename=str(path))
    except SyntaxError as exc:
        raise SpecError(PARTITION_FILE, f"not valid Python (line {exc.lineno}): {exc.msg}")
    facts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("PP", "TP", "DP", "SEQUENCE_PARALLEL", "STAGE_LAYERS"):
                try:
                    facts[name] = ast.literal_eval(node.value)
                except ValueError:
                    raise SpecError(f"{PARTITION_FILE}: {name}", "expected a literal value")
    for name in ("PP", "TP"):
        if name in facts:
            _positive(facts[name], f"{PARTITION_FILE}: {name}")
    if "STAGE_LAYERS" in facts:
        layers = facts["STAGE_LAYERS"]
        if not isinstance(layers, (tuple, list)) or not layers:
            raise SpecError(f"{PARTITION_FILE}: STAGE_LAYERS", "expected a tuple of layer counts")
        facts["STAGE_LAYERS"] = [_positive(n, f"{PARTITION_FILE}: STAGE_LAYERS") for n in layers]
    return facts
