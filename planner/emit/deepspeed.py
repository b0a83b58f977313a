"""DeepSpeed (emitters.md section 2), the emitter: a plan as ``ds_config.json`` (and ``deepspeed_partition.py`` when it
pipelines). The importer (a ``ds_config.json`` read back into a job, `planner import`) is
planner/emit/deepspeed_import.py; ``read`` here forwards to it.

Every key below was read in deepspeed 0.19.8 (the PyPI sdist; repo deepspeedai/DeepSpeed), file by file:

- ``deepspeed/runtime/config.py``: the batch triple (``_set_batch_related_parameters``, ``_batch_assertion``:
  train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * DP world size),
  ``get_pipeline_config`` (the ``pipeline`` section is merged into its defaults; ``stages`` is not read by the
  engine: the PP degree comes from ``PipelineModule(num_stages=...|topology=...)``).
- ``deepspeed/runtime/zero/config.py``: ``DeepSpeedZeroConfig`` (its defaults: the 5e8 buckets).
- ``deepspeed/runtime/precision_config.py``: ``bf16`` / ``fp16`` (both enabled is an error).
- ``deepspeed/runtime/config.py`` ``data_types.grad_accum_dtype`` and ``deepspeed/runtime/engine.py``
  ``_do_optimizer_sanity_check``: bf16 with fp32 accumulation is BF16_Optimizer at ZeRO stage 1 only (ZeRO 0
  raises, ZeRO 2-3 ignore it); without the key gradients stay in the model's 16-bit dtype.
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

What DeepSpeed cannot run (ZeRO-2/3 with a pipeline, AutoTP with sequence parallelism, selective recompute) is
refused by planner/frameworks.py ``check_runnable``, which ``render`` runs first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.emit.bundle import Bundle, EmitOptions
from planner.emit.launch_plan import LaunchPlan
from planner.errors import SpecError

CONFIG_FILE = "ds_config.json"
PARTITION_FILE = "deepspeed_partition.py"
BUCKET = 500_000_000  # DeepSpeedZeroConfig's default reduce/allgather bucket (5e8 elements)


def render(plan: LaunchPlan, options: EmitOptions) -> Bundle:
    """``ds_config.json`` for the user's DeepSpeed training script (``train.py --deepspeed_config ds_config.json``),
    plus ``deepspeed_partition.py`` (the planned layer split and PP x TP x DP topology) when the plan pipelines."""
    from planner.frameworks import check_runnable
    from planner.io import dumps_json

    check_runnable("deepspeed", plan, "deepspeed")
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


def _recompute(plan: LaunchPlan) -> str:
    """none | selective | full as DeepSpeed sees it: all layers recomputed is full (partial counts are refused by
    check_runnable), and selective with flash attention is none (planner/parallel.py baseline_recompute_modes)."""
    if plan.recompute == "full" or (plan.recompute_layers and plan.recompute_layers >= max(plan.stage_layers)):
        return "full"
    if plan.recompute == "selective" and not plan.training.fused_attention:
        return "selective"
    return "none"


def config(plan: LaunchPlan) -> dict[str, Any]:
    """The ds_config.json contents: only numbers and switches, never "auto"."""
    cfg: dict[str, Any] = {**batch_section(plan), **precision_section(plan)}
    cfg["zero_optimization"] = zero_section(plan)
    if plan.training.grad_dtype == "bf16+fp32":
        # engine.py get_data_types / _do_optimizer_sanity_check: bf16 parameters with fp32 gradient accumulation
        # at ZeRO stage 1 select BF16_Optimizer (check_runnable refuses every other stage and precision)
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
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


# Training.fp8_recipe -> the Transformer Engine recipe the model's fp8_autocast takes (transformer_engine/common/
# recipe/__init__.py: DelayedScaling, Float8CurrentScaling; transformer_engine/pytorch fp8_autocast(enabled, ...,
# fp8_recipe), renamed autocast(enabled, recipe) in newer releases). check_runnable refuses the others
# (Framework.fp8_recipes).
TE_RECIPES = {
    "delayed": "transformer_engine.common.recipe.DelayedScaling()",
    "tensorwise": "transformer_engine.common.recipe.Float8CurrentScaling()",
}
TE_RECIPE_TEXT = {
    "delayed": "Transformer Engine's delayed scaling (also its default when no recipe is given)",
    "tensorwise": "per-tensor current scaling (Transformer Engine's default is delayed scaling: pass it explicitly; "
    "newer releases spell it `autocast(enabled=True, recipe=...)`)",
}


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
    grads = plan.training.grad_dtype
    if grads == "bf16+fp32":
        out.append(
            "Gradients: data_types.grad_accum_dtype fp32 with bf16 and ZeRO-1 runs DeepSpeed's BF16_Optimizer, which "
            "adds each micro-batch's bf16 gradients into an fp32 buffer that ZeRO-1 does not shard, as planned."
        )
    elif grads == "fp32":
        out.append(
            f"Gradients: the plan prices fp32 gradient buffers (training.grad_dtype fp32); DeepSpeed keeps "
            f"{'fp16' if plan.training.precision == 'fp16' else 'bf16'} ones and reduces them in 16 bits, which "
            "needs less memory and traffic than planned. For fp32 accumulation plan with training.grad_dtype "
            "bf16+fp32 (BF16_Optimizer, ZeRO-1)."
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
        recipe = plan.training.fp8_recipe
        out.append(
            "fp8: DeepSpeed has no fp8 setting; ds_config.json runs bf16 and the model's Transformer Engine layers "
            "(fp8_autocast) must do the fp8 GEMMs the plan assumes, with the plan's recipe (training.fp8_recipe "
            f"{recipe}): `fp8_autocast(enabled=True, fp8_recipe={TE_RECIPES[recipe]})`, "
            f"{TE_RECIPE_TEXT[recipe]}."
        )
    return out


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
    """A job dict from a ds_config.json: planner/emit/deepspeed_import.py ``read``."""
    from planner.emit import deepspeed_import

    return deepspeed_import.read(
        path,
        world_size=world_size,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        model=model,
        tp=tp,
        pp=pp,
        seq_length=seq_length,
    )
