"""DeepSpeed (emitters.md section 2): a plan as ``ds_config.json`` (and ``deepspeed_partition.py`` when it pipelines),
and a ``ds_config.json`` read back into a job.

Every key below was read in deepspeed 0.19.8 (the PyPI sdist; repo deepspeedai/DeepSpeed), file by file:

- ``deepspeed/runtime/config.py``: the batch triple (``_set_batch_related_parameters``, ``_batch_assertion``:
  train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * DP world size), the removed
  keys, ``get_pipeline_config`` (the ``pipeline`` section is merged into its defaults; ``stages`` is not read by the
  engine: the PP degree comes from ``PipelineModule(num_stages=...|topology=...)``).
- ``deepspeed/runtime/zero/config.py``: ``DeepSpeedZeroConfig`` (pydantic, extra="forbid": unknown keys fail).
- ``deepspeed/runtime/precision_config.py``: ``bf16`` / ``fp16`` (both enabled is an error).
- ``deepspeed/runtime/activation_checkpointing/config.py`` and ``docs/_pages/config-json.md``: the
  ``activation_checkpointing`` keys (read only when the model calls ``deepspeed.checkpointing.checkpoint``).
- ``deepspeed/runtime/tensor_parallel/config.py``: ``tensor_parallel.autotp_size`` (AutoTP training);
  ``deepspeed/utils/groups.py`` ``_init_tp_mesh_device``: AutoTP builds a 2-D (DP, TP) mesh over the whole world,
  so it is not combined with a pipeline; ``deepspeed/module_inject/layers.py``: AutoTP all-reduces layer outputs
  (no sequence parallelism).
- ``deepspeed/runtime/pipe/engine.py``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism";
  micro_batches = gradient_accumulation_steps; ``activation_checkpoint_interval`` seeds the module's.
- ``deepspeed/runtime/pipe/module.py`` / ``topology.py``: ``PipelineModule._partition_layers`` sets ``parts``;
  ``PipeModelDataParallelTopology(num_pp, num_mp, num_dp)`` (axes pipe, data, model: PP outermost).
- Hugging Face ``transformers/integrations/deepspeed.py`` ``trainer_config_finalize``: the values it fills for
  "auto" bucket sizes (hidden^2, 0.9 hidden^2, 10 hidden), which we write as numbers.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError, did_you_mean

CONFIG_FILE = "ds_config.json"
PARTITION_FILE = "deepspeed_partition.py"
REDO = "re-plan with `planner plan JOB --framework deepspeed`"

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
BUCKET = 500_000_000  # DeepSpeedZeroConfig's default reduce/allgather bucket (5e8 elements)


# ---------------------------------------------------------------------------------------------------------------
# emit


def render(plan: LaunchPlan, options: EmitOptions) -> Bundle:
    """``ds_config.json`` for the user's DeepSpeed training script (``train.py --deepspeed_config ds_config.json``),
    plus ``deepspeed_partition.py`` (the planned layer split and PP x TP x DP topology) when the plan pipelines."""
    from planner.frameworks import check_runnable
    from planner.io import dumps_json

    check_runnable("deepspeed", plan, "deepspeed")
    check_deepspeed(plan)
    files = {CONFIG_FILE: dumps_json(config(plan))}
    if plan.pp > 1:
        files[PARTITION_FILE] = partition_module(plan)
    return Bundle(
        files=files,
        program=["train.py", "--deepspeed_config", CONFIG_FILE],
        env={},
        workdir=None,
        notes=notes(plan),
    )


def check_deepspeed(plan: LaunchPlan) -> None:
    """DeepSpeed's own rules that planner/frameworks.py does not hold (Inexpressible, exit 4)."""
    field = f"plans[{plan.plan_rank - 1}].layout"
    if plan.pp > 1 and plan.zero_stage >= 2:  # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__
        raise Inexpressible(
            f"{field}.zero_stage",
            f"DeepSpeed's PipelineEngine runs ZeRO stage 0 or 1 (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline "
            f'parallelism"), the plan has pp {plan.pp} with ZeRO-{plan.zero_stage}; {REDO}',
        )
    if plan.pp == 1 and plan.tp > 1 and plan.sequence_parallel:
        # AutoTP (deepspeed/module_inject/layers.py) all-reduces: every TP rank keeps whole activations
        raise Inexpressible(
            f"{field}.sequence_parallel",
            f"DeepSpeed's own tensor parallelism (AutoTP, tensor_parallel.autotp_size) has no sequence parallelism, "
            f"and the plan's memory counts on it (tp {plan.tp}, pp 1); {REDO} (or pick a plan with tp 1, or one "
            "that pipelines: with a pipeline the model's own Megatron-style layers run TP and SP)",
        )
    if _recompute(plan) == "selective":
        raise Inexpressible(
            f"{field}.recompute",
            "DeepSpeed checkpoints whole layers (pipeline.activation_checkpoint_interval, deepspeed.checkpointing); "
            f"it has no selective (attention-only) recompute setting, which this plan uses with eager attention; "
            f"{REDO}",
        )


def _recompute(plan: LaunchPlan) -> str:
    """none | selective | full as DeepSpeed sees it: all layers recomputed is full (partial counts are refused by
    check_runnable), and selective with flash attention is none (planner/parallel.py baseline_recompute_modes)."""
    if plan.recompute == "full" or (plan.recompute_layers and plan.recompute_layers >= max(plan.stage_layers)):
        return "full"
    if plan.recompute == "selective" and plan.training.attention != "flash":
        return "selective"
    return "none"


def config(plan: LaunchPlan) -> dict[str, Any]:
    """The ds_config.json contents: only numbers and switches, never "auto"."""
    cfg: dict[str, Any] = {**batch_section(plan), **precision_section(plan)}
    cfg["zero_optimization"] = zero_section(plan)
    if _recompute(plan) == "full":
        cfg["activation_checkpointing"] = checkpointing_section(plan)
    if plan.pp > 1:
        cfg["pipeline"] = pipeline_section(plan)
    elif plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}  # deepspeed/runtime/tensor_parallel/config.py
    return cfg


def batch_section(plan: LaunchPlan) -> dict[str, int]:
    """train_batch_size = micro-batch * gradient_accumulation_steps * DP size (deepspeed/runtime/config.py
    ``_batch_assertion``; the DP size is the mpu's, world / (tp * pp)). With a pipeline the engine runs
    gradient_accumulation_steps micro-batches per step (deepspeed/runtime/pipe/engine.py)."""
    tbs, mbs, gas = plan.global_batch_size, plan.micro_batch_size, plan.num_microbatches
    if tbs != mbs * gas * plan.dp:
        raise SpecError(
            f"plans[{plan.plan_rank - 1}].layout.micro_batch_size",
            f"global batch {tbs} is not micro-batch {mbs} x {gas} micro-batches x dp {plan.dp}",
        )
    return {"train_batch_size": tbs, "train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": gas}


def precision_section(plan: LaunchPlan) -> dict[str, Any]:
    """bf16 / fp16 (deepspeed/runtime/precision_config.py). fp16 gets dynamic loss scaling (loss_scale 0) with
    DeepSpeed's defaults written out. fp8 has no DeepSpeed key: the config runs bf16 and the model's own
    Transformer Engine layers do the fp8 GEMMs (see the notes)."""
    if plan.training.precision == "fp16":
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    return {"bf16": {"enabled": True}}


def zero_section(plan: LaunchPlan) -> dict[str, Any]:
    """zero_optimization (deepspeed/runtime/zero/config.py). Bucket sizes for ZeRO-3 follow what the Hugging Face
    Trainer fills in for "auto" (transformers integrations/deepspeed.py: hidden^2, 0.9 hidden^2, 10 hidden)."""
    stage = plan.zero_stage
    if stage == 0:
        return {"stage": 0}
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "allgather_partitions": True,
        "allgather_bucket_size": BUCKET,
        "reduce_bucket_size": BUCKET,
    }
    if stage == 3:
        h = plan.model.hidden_size
        zero.update(
            {
                "reduce_bucket_size": h * h,
                "stage3_prefetch_bucket_size": int(0.9 * h * h),
                "stage3_param_persistence_threshold": 10 * h,
                "stage3_max_live_parameters": 1_000_000_000,
                "stage3_max_reuse_distance": 1_000_000_000,
                "stage3_gather_16bit_weights_on_model_save": True,
                "sub_group_size": 1_000_000_000,
            }
        )
    return zero


def checkpointing_section(plan: LaunchPlan) -> dict[str, Any]:
    """activation_checkpointing (docs/_pages/config-json.md): partition the checkpointed inputs over the TP group
    when there is one and sequence parallelism does not already shard them (as Megatron's
    --distribute-saved-activations); number_checkpoints = the layers a GPU checkpoints (the buffer size of
    contiguous_memory_optimization)."""
    partition = plan.tp > 1 and not plan.sequence_parallel
    return {
        "partition_activations": partition,
        "contiguous_memory_optimization": partition,
        "cpu_checkpointing": False,
        "number_checkpoints": max(plan.stage_layers),
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }


def pipeline_section(plan: LaunchPlan) -> dict[str, Any]:
    """pipeline (deepspeed/runtime/config.py get_pipeline_config): ``stages`` written as the number (DeepSpeed's
    default is the string "auto" and the engine takes the degree from the PipelineModule; the number documents it
    and `planner import` reads it); ``activation_checkpoint_interval`` 1 checkpoints every layer (full recompute,
    deepspeed/runtime/pipe/engine.py), 0 none."""
    return {
        "stages": plan.pp,
        "activation_checkpoint_interval": 1 if _recompute(plan) == "full" else 0,
    }


def partition_module(plan: LaunchPlan) -> str:
    """deepspeed_partition.py: the plan's per-stage layer counts, PipelineModule ``parts`` boundaries for them, the
    PP x TP x DP topology, and a PipelineModule subclass that uses the planned split (DeepSpeed's partition
    methods balance layer counts or parameters; an explicit split needs ``_partition_layers`` overridden:
    deepspeed/runtime/pipe/module.py). Pure Python until a DeepSpeed helper is called."""
    layers = repr(tuple(plan.stage_layers))
    return f'''"""Pipeline split of plan #{plan.plan_rank}, written by `planner emit` (import it in train.py).

DeepSpeed's PipelineModule puts layer specs parts[s] .. parts[s+1]-1 on pipeline stage s
(deepspeed/runtime/pipe/module.py). Its own partition methods balance layer counts or parameters; this module gives
the planned split instead:

    from deepspeed_partition import pipeline_module_class, topology
    PlannedPipelineModule = pipeline_module_class(num_before=1, num_after=2)
    model = PlannedPipelineModule(layers=specs, topology=topology(), loss_fn=loss_fn)

``specs`` is your layer list: ``num_before`` specs before the transformer layers (the embedding), the transformer
layers ({sum(plan.stage_layers)}), then ``num_after`` specs (final norm, output head). The topology puts pipe outermost
(PipeModelDataParallelTopology axes pipe, data, model), so stage s runs on the node block the plan placed it on.
With TP > 1 the transformer layers themselves must be tensor-parallel (Megatron-style layers over the topology's
model-parallel group, with sequence parallelism as SEQUENCE_PARALLEL says).
"""

PP = {plan.pp}
TP = {plan.tp}
DP = {plan.dp}
SEQUENCE_PARALLEL = {plan.sequence_parallel}
STAGE_LAYERS = {layers}  # transformer layers of each pipeline stage


def parts(num_before: int = 1, num_after: int = 2) -> list[int]:
    """PipelineModule.parts: the first spec index of every stage, then the number of specs. Stage 0 also holds the
    ``num_before`` leading specs, the last stage the ``num_after`` trailing ones."""
    bounds = [0]
    for count in STAGE_LAYERS:
        bounds.append(bounds[-1] + count)
    bounds = [num_before + b for b in bounds]
    bounds[0] = 0
    bounds[-1] += num_after
    return bounds


def topology():
    """PipeModelDataParallelTopology(num_pp=PP, num_mp=TP, num_dp=DP) (deepspeed/runtime/pipe/topology.py)."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    return PipeModelDataParallelTopology(num_pp=PP, num_mp=TP, num_dp=DP)


def pipeline_module_class(num_before: int = 1, num_after: int = 2):
    """A PipelineModule subclass whose stages hold STAGE_LAYERS transformer layers each."""
    from deepspeed.runtime.pipe.module import PipelineModule

    class PlannedPipelineModule(PipelineModule):
        def _partition_layers(self, method="uniform"):
            bounds = parts(num_before, num_after)
            if bounds[-1] != len(self._layer_specs):
                raise ValueError(
                    f"deepspeed_partition: {{len(self._layer_specs)}} layer specs, expected {{bounds[-1]}} "
                    f"({{num_before}} + {{sum(STAGE_LAYERS)}} transformer layers + {{num_after}})"
                )
            if self.num_stages != PP:
                raise ValueError(f"deepspeed_partition: the module has {{self.num_stages}} stages, the plan {{PP}}")
            self.parts = bounds
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=bounds[stage], stop=bounds[stage + 1])

    return PlannedPipelineModule
'''


def notes(plan: LaunchPlan) -> list[str]:
    out = [
        "`train.py` stands for your DeepSpeed training script: it must call `deepspeed.initialize(..., "
        "config='ds_config.json')` (or take `--deepspeed_config`, as here) and build the model and data; edit the "
        "program line in launch.sh if yours is named differently.",
        f"The batch: {plan.global_batch_size} sequences = micro-batch {plan.micro_batch_size} x "
        f"{plan.num_microbatches} gradient-accumulation steps x {plan.dp} data-parallel ranks; DeepSpeed checks "
        "this against the data-parallel size of the `mpu` it is given.",
    ]
    if plan.pp > 1:
        out.append(
            f"Pipeline: build the model as a PipelineModule with the planned split and topology from "
            f"`deepspeed_partition.py` (stages hold {', '.join(map(str, plan.stage_layers))} layers); DeepSpeed "
            f"runs ZeRO-{plan.zero_stage} with it and {plan.num_microbatches} micro-batches per step "
            "(gradient_accumulation_steps)."
        )
        if plan.tp > 1:
            out.append(
                f"TP {plan.tp} inside the pipeline is the model's own (Megatron-DeepSpeed style layers on the "
                "topology's model-parallel group"
                + (", with sequence parallelism" if plan.sequence_parallel else "")
                + "): DeepSpeed's AutoTP builds a 2-D DP x TP mesh and is not combined with a PipelineModule, so "
                "ds_config.json has no tensor_parallel section."
            )
    elif plan.tp > 1:
        out.append(
            f"TP {plan.tp} is DeepSpeed AutoTP (`tensor_parallel.autotp_size`): pass `deepspeed.initialize` an mpu "
            f"whose data-parallel size is {plan.dp} (e.g. deepspeed.utils.groups after the TP mesh is built), or "
            "DeepSpeed checks the batch against the whole world."
        )
    if _recompute(plan) == "full":
        out.append(
            "Activation checkpointing: "
            + (
                "pipeline.activation_checkpoint_interval 1 checkpoints every layer."
                if plan.pp > 1
                else "the model must checkpoint every transformer layer (deepspeed.checkpointing.checkpoint, which "
                "the activation_checkpointing section configures, or the model's own gradient checkpointing)."
            )
        )
    if plan.training.precision == "fp8":
        out.append(
            "fp8: DeepSpeed has no fp8 setting; ds_config.json runs bf16 and the model's Transformer Engine layers "
            "(fp8_autocast) must do the fp8 GEMMs the plan assumes."
        )
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
    cluster, world = _cluster(world_size, gpu, gpus_per_node)
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
        "training": {"seq_length": seq_length, "global_batch_size": tbs, "precision": _read_precision(raw)},
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


def _cluster(world_size: int | None, gpu: str | None, gpus_per_node: int | None) -> tuple[list[dict], int]:
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
