"""What each training framework can run: the one place for per-framework limits (`planner plan --framework`).

Sources: shared/reference/emitters.md (sections 1.4, 2.2-2.3, 3.3, 4.4), read against the frameworks' code.
Stock Megatron-LM, DeepSpeed and torchtitan each have ONE parallel shape for all pipeline stages (one TP degree,
one micro-batch, one recompute setting); all three accept uneven per-stage layer counts (Megatron
``--pipeline-model-parallel-layout``, DeepSpeed a custom ``_partition_layers``, torchtitan
``module_fqns_per_model_part``) and keep PP outermost, so stage s can be placed on a chosen node type.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import Inexpressible, SpecError


@dataclass(frozen=True)
class Framework:
    name: str
    per_stage_tp: bool  # stages may use different TP degrees (heterogeneous meshes)
    uneven_layers: bool  # stages may hold different layer counts
    per_stage_recompute: bool  # a different number of fully recomputed layers per stage
    partial_recompute: bool  # some layers of a stage fully recomputed, the others not (Megatron --recompute-num-layers)
    zero_with_pp: frozenset  # ZeRO stages usable with pp > 1
    zero_without_pp: frozenset  # ZeRO stages usable with pp == 1
    interleaving: bool  # interleaved (virtual-pipeline) 1F1B schedule
    context_parallel: bool
    expert_parallel: bool
    fsdp_with_ep: bool = True  # ZeRO-3 (FSDP) together with expert parallelism
    sequence_parallel_without_pp: bool = True  # TP with sequence parallelism when there is no pipeline
    selective_recompute: bool = True  # selective (attention-core) recompute as a setting of its own
    ep_within_shard: bool = False  # EP divides the FSDP shard * CP * TP ranks (torchtitan's MoE mesh)
    microbatches_cover_pp: bool = False  # a pipeline needs at least as many micro-batches as stages
    recompute_per_chunk: bool = False  # a stage's recompute count is per interleaved chunk: a multiple of vpp
    cp_needs_fsdp: bool = False  # FSDP shards over the CP ranks whenever cp > 1: with CP only ZeRO-3 is as planned
    op_recompute: bool = False  # per-op selective checkpointing (torchtitan's SAC "op" policy: recompute: op)
    tp_backward_overlap: bool = True  # Training.tp_backward_overlap: its TP backward collectives run under wgrad GEMMs
    fp8_saved_inputs: bool = True  # Training.fp8_saved_inputs: its FP8 linears keep FP8 inputs (Transformer Engine)
    fp8_recipe: str = "delayed"  # Training.fp8_recipe its FP8 runs take unless the job says (Transformer Engine)
    fp8_recipes: frozenset = frozenset({"delayed", "tensorwise"})  # the FP8 recipes it has a setting for
    fp32_params: bool = False  # Training.fp32_params: fp32 parameters as the master copy (PyTorch FSDP)
    precisions: frozenset = frozenset({"bf16", "fp16", "fp8"})
    grad_dtypes: frozenset = frozenset({"fp32", "bf16"})  # the Training.grad_dtype values it has a setting for
    grad_dtype: str = "fp32"  # Training.grad_dtype its runs take unless the job says (fp32 main grads)
    # the ZeRO stages at which it runs bf16+fp32 gradients (DeepSpeed's BF16_Optimizer), with bf16 parameters
    fp32_accumulation_zero: frozenset = frozenset()

    def zero_stages(self, pp: int) -> frozenset:
        return self.zero_with_pp if pp > 1 else self.zero_without_pp

    def rejects(
        self,
        *,
        pp: int = 1,
        vpp: int = 1,
        zero: int | None = None,
        cp: int = 1,
        ep: int = 1,
        tp: int = 1,
        dp: int | None = None,
        recompute: str | None = None,
        microbatches: int | None = None,
        sequence_parallel: bool | None = None,
    ) -> tuple[str, str] | None:
        """(layout field, why) when these degrees are not runnable by this framework, None when they are; a degree
        not given is not asked about. The one rule set `plan --framework` and `emit` share."""
        if zero is not None and zero not in self.zero_stages(pp):
            ok = ", ".join(map(str, sorted(self.zero_stages(pp))))
            where = "with pipeline parallelism" if pp > 1 else "without pipeline parallelism"
            return "zero_stage", f"runs ZeRO stage {ok} {where}, not {zero}"
        if vpp > 1 and not self.interleaving:
            return "vpp", f"has no interleaved pipeline schedule (vpp {vpp})"
        if cp > 1 and not self.context_parallel:
            return "cp", f"has no context parallelism (cp {cp})"
        if ep > 1 and not self.expert_parallel:
            return "ep", f"has no expert parallelism (ep {ep})"
        if ep > 1 and zero == 3 and not self.fsdp_with_ep:
            return "zero_stage", "runs ZeRO-3 (FSDP) only without expert parallelism"
        if tp > 1 and pp == 1 and sequence_parallel and not self.sequence_parallel_without_pp:
            return "sequence_parallel", "runs TP without a pipeline only as AutoTP, which has no sequence parallelism"
        if recompute == "selective" and not self.selective_recompute:
            return "recompute", "has no selective (attention-core) recompute setting"
        if recompute == "op" and not self.op_recompute:
            return "recompute", "has no per-op selective checkpointing (recompute: op is torchtitan's SAC policy)"
        if self.ep_within_shard and ep > 1 and dp is not None and zero is not None:
            shard = dp if zero == 3 else 1
            if (shard * cp * tp) % ep:
                return "ep", f"needs ep ({ep}) to divide the FSDP shard * cp * tp ranks ({shard} * {cp} * {tp})"
        if self.cp_needs_fsdp and cp > 1 and zero is not None and zero != 3:
            why = f"shards weights over the context-parallel ranks whenever cp > 1 (cp {cp}): ZeRO-3 only"
            return "zero_stage", why
        if self.microbatches_cover_pp and microbatches is not None and pp > 1 and microbatches < pp:
            return "num_microbatches", f"needs at least as many micro-batches ({microbatches}) as stages ({pp})"
        return None

    def grad_rejects(self, grad_dtype: str, precision: str, zero: int | None = None) -> tuple[str, str] | None:
        """(field, why) when this framework cannot keep ``grad_dtype`` gradients in ``precision`` training (at ZeRO
        stage ``zero``, when given), None when it can; as ``rejects``, ``why`` follows the framework's name. The
        field is the job's training.grad_dtype, or the layout's zero_stage when only the stage is wrong."""
        if grad_dtype not in self.grad_dtypes:
            ok = ", ".join(sorted(self.grad_dtypes))
            return "training.grad_dtype", f"has no {grad_dtype} gradient buffers ({ok})"
        if grad_dtype == "bf16+fp32" and precision != "bf16":
            return "training.grad_dtype", "accumulates bf16+fp32 gradients with bf16 parameters only"
        if grad_dtype == "bf16+fp32" and zero is not None and zero not in self.fp32_accumulation_zero:
            ok = " or ".join(map(str, sorted(self.fp32_accumulation_zero)))
            return "zero_stage", f"runs bf16+fp32 gradients (BF16_Optimizer) at ZeRO stage {ok} only, not {zero}"
        return None

    def allows(self, **degrees) -> bool:
        """Whether these degrees are runnable by this framework (``rejects`` finds nothing)."""
        return self.rejects(**degrees) is None


FRAMEWORKS = {
    # One TP/CP/EP/DP, micro-batch and recompute setting for every stage (emitters.md 1.4); the distributed
    # optimizer is ZeRO-1; Megatron/torch FSDP (ZeRO-3) is not combined with PP here.
    "megatron": Framework(
        "megatron",
        per_stage_tp=False,
        uneven_layers=True,
        per_stage_recompute=False,
        partial_recompute=True,
        zero_with_pp=frozenset({0, 1}),
        zero_without_pp=frozenset({0, 1, 3}),
        interleaving=True,
        context_parallel=True,
        expert_parallel=True,
        fsdp_with_ep=False,  # --use-torch-fsdp2 needs ep == 1 (emitters.md 1.2)
        recompute_per_chunk=True,  # --recompute-num-layers counts within one model chunk (megatron/core/recompute)
    ),
    # PipelineEngine: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" (emitters.md 2.2); no
    # interleaved schedule, no ring-attention CP, no MoE EP inside the pipeline engine.
    "deepspeed": Framework(
        "deepspeed",
        per_stage_tp=False,
        uneven_layers=True,
        per_stage_recompute=False,
        partial_recompute=False,  # activation_checkpoint_interval checkpoints every k-th layer, not a count
        zero_with_pp=frozenset({0, 1}),
        zero_without_pp=frozenset({0, 1, 2, 3}),
        interleaving=False,
        context_parallel=False,
        expert_parallel=False,
        # AutoTP (tensor_parallel.autotp_size) all-reduces: no sequence parallelism without a pipeline; eager
        # attention's selective recompute has no DeepSpeed setting (activation_checkpointing is per layer)
        sequence_parallel_without_pp=False,
        selective_recompute=False,
        # bf16 runs 16-bit gradients (its ZeRO optimizer, or DDP_BFLOAT16) unless data_types.grad_accum_dtype is
        # fp32, which engine.py _do_optimizer_sanity_check takes (BF16_Optimizer) at ZeRO stage 1 only and refuses
        # without ZeRO: `plan --framework deepspeed` prices 16-bit gradients unless the job says otherwise, and an
        # fp32 (Megatron main_grad) plan made without it runs with 16-bit ones (emit notes say so)
        grad_dtypes=frozenset({"fp32", "bf16", "bf16+fp32"}),
        grad_dtype="bf16",
        fp32_accumulation_zero=frozenset({1}),
    ),
    # FSDP2 shards fully (ZeRO-3) or replicates (ZeRO-0), with or without PP; Interleaved1F1B is available.
    "torchtitan": Framework(
        "torchtitan",
        per_stage_tp=False,
        uneven_layers=True,
        per_stage_recompute=False,
        partial_recompute=False,  # activation checkpointing is full, selective (per op / every N-th layer) or none
        zero_with_pp=frozenset({0, 3}),
        zero_without_pp=frozenset({0, 3}),
        interleaving=True,
        context_parallel=True,
        expert_parallel=True,
        # the MoE mesh unflattens dp_shard*cp*tp by ep (emitters.md 3.3); torch's 1F1B/Interleaved1F1B need
        # micro-batches >= stages; no fp16 mixed precision (training.mixed_precision_param: bfloat16 or float32)
        ep_within_shard=True,
        microbatches_cover_pp=True,
        op_recompute=True,  # activation_checkpoint mode selective, selective_ac_option "op" (0.3: SelectiveAC)
        cp_needs_fsdp=True,  # parallel_dims.fsdp_enabled: dp_shard * cp > 1
        tp_backward_overlap=False,  # DTensor ColwiseParallel/RowwiseParallel: every TP collective on the critical path
        fp8_saved_inputs=False,  # torchao Float8Linear saves the 16-bit input
        # torchao Float8Linear, dynamic scaling only: torchtitan 0.3's Float8LinearConverter runs rowwise (its
        # recipe_name: rowwise, the default, or rowwise_with_gw_hp); 0.2's [quantize.linear.float8] also tensorwise
        fp8_recipe="rowwise",
        fp8_recipes=frozenset({"tensorwise", "rowwise"}),
        # FSDP2 MixedPrecisionPolicy(param_dtype=bfloat16): fp32 sharded parameters, cast when all-gathered
        fp32_params=True,
        precisions=frozenset({"bf16", "fp8"}),
        # FSDP2 reduces gradients in fp32 into fp32 shards: training.mixed_precision_reduce takes "float32" only
        # (torchtitan config/configs.py, 0.3.0)
        grad_dtypes=frozenset({"fp32"}),
    ),
}


FRAMEWORKS["megatron-bridge"] = Framework(**{**FRAMEWORKS["megatron"].__dict__, "name": "megatron-bridge"})


def get_framework(name: str | None) -> Framework | None:
    """The Framework for ``--framework NAME`` (None: no restriction)."""
    if name is None:
        return None
    fw = FRAMEWORKS.get(name.strip().lower())
    if fw is None:
        raise SpecError("--framework", f"unknown framework '{name}'; choose one of {', '.join(sorted(FRAMEWORKS))}")
    return fw


def check_runnable(framework: str, plan, target: str | None = None) -> None:
    """Raise errors.Inexpressible (exit 4) when ``framework`` cannot run ``plan`` (a planner.emit.LaunchPlan): the
    rules of ``Framework.rejects``, which the search obeys under `--framework`, and what one global shape cannot
    say. ``target`` names the emit target in the message (default: the framework)."""
    fw = FRAMEWORKS[framework]
    name = target or framework
    redo = f"re-plan with `planner plan JOB --framework {name}`"
    field = f"plans[{plan.plan_rank - 1}].layout"
    found = fw.rejects(
        pp=plan.pp,
        vpp=plan.vpp,
        zero=plan.zero_stage,
        cp=plan.cp,
        ep=plan.ep,
        tp=plan.tp,
        dp=plan.dp,
        # with flash attention selective recompute is none (baseline_recompute_modes): nothing to express
        recompute="none" if plan.training.fused_attention and plan.recompute == "selective" else plan.recompute,
        microbatches=plan.num_microbatches,
        sequence_parallel=plan.sequence_parallel,
    )
    if found is not None:
        raise Inexpressible(f"{field}.{found[0]}", f"{name} {found[1]}; {redo}")
    if plan.training.precision not in fw.precisions:
        raise Inexpressible("job.training.precision", f"{name} has no {plan.training.precision} training")
    t = plan.training
    found = fw.grad_rejects(t.grad_dtype, t.precision, plan.zero_stage)
    if found is not None:
        where = f"job.{found[0]}" if found[0].startswith("training.") else f"{field}.{found[0]}"
        fix = "set training.grad_dtype to one it has, then " if where.startswith("job.") else ""
        raise Inexpressible(where, f"{name} {found[1]}; {fix}{redo}")
    if plan.training.precision == "fp8" and plan.training.fp8_recipe not in fw.fp8_recipes:
        ok = ", ".join(sorted(fw.fp8_recipes))
        raise Inexpressible(
            "job.training.fp8_recipe", f"{name} has no {plan.training.fp8_recipe} FP8 recipe ({ok}); {redo}"
        )
    if not plan.even_split and not fw.uneven_layers:
        raise Inexpressible(f"{field}.stages", f"{name} splits layers evenly over stages; {redo}")
    partial = plan.recompute != "full" and 0 < plan.recompute_layers < max(plan.stage_layers)
    if partial and not fw.partial_recompute:
        raise Inexpressible(
            f"{field}.stages",
            f"{name} recomputes all layers of a stage or none ({plan.recompute_layers} of {max(plan.stage_layers)} "
            f"planned); {redo}",
        )
    if partial and fw.recompute_per_chunk and plan.recompute_layers % plan.vpp:
        raise Inexpressible(
            f"{field}.stages",
            f"{name} counts recomputed layers per model chunk: {plan.recompute_layers} per stage do not split over "
            f"{plan.vpp} chunks; {redo}",
        )
    if plan.recompute_layers and plan.recompute == "selective" and not plan.training.fused_attention:
        # Megatron: one --recompute-granularity; with flash attention selective recompute is a no-op to drop
        raise Inexpressible(
            f"{field}.recompute",
            f"{name} takes one recompute granularity: selective on some layers and full on others is not a setting; "
            f"{redo}",
        )


def check_training(
    fw: Framework | None, precision: str, fp8_recipe: str | None = None, grad_dtype: str | None = None
) -> None:
    """Bad input for `plan --framework`: a precision, an FP8 recipe of fp8 training, or gradient buffers the
    framework cannot train with (no layout changes that)."""
    if fw is None:
        return
    found = None if grad_dtype is None else fw.grad_rejects(grad_dtype, precision)
    if found is not None:
        raise SpecError(found[0], f"{fw.name} {found[1]}; change the job")
    if precision not in fw.precisions:
        ok = ", ".join(sorted(fw.precisions))
        raise SpecError("training.precision", f"{fw.name} has no {precision} training ({ok}); change the job")
    if precision == "fp8" and fp8_recipe is not None and fp8_recipe not in fw.fp8_recipes:
        ok = ", ".join(sorted(fw.fp8_recipes))
        raise SpecError("training.fp8_recipe", f"{fw.name} has no {fp8_recipe} FP8 recipe ({ok}); change the job")


# Training settings that are properties of a framework's implementation (Framework fields of the same names).
IMPLEMENTATION_SETTINGS = ("tp_backward_overlap", "fp8_saved_inputs", "fp8_recipe", "fp32_params", "grad_dtype")


def implementation_settings(fw: Framework) -> dict[str, bool | str]:
    """The Training settings (IMPLEMENTATION_SETTINGS) as ``fw`` runs them."""
    return {k: getattr(fw, k) for k in IMPLEMENTATION_SETTINGS}


def priced_for(job, fw: Framework | None):
    """``job`` priced as ``fw`` runs it: each IMPLEMENTATION_SETTINGS field the job leaves unstated takes the
    framework's value."""
    if fw is None:
        return job
    t = job.training
    update = {
        k: v for k, v in implementation_settings(fw).items() if k not in t.model_fields_set and getattr(t, k) != v
    }
    if not update:
        return job
    return job.model_copy(update={"training": t.model_copy(update=update)})
