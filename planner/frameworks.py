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

    def zero_stages(self, pp: int) -> frozenset:
        return self.zero_with_pp if pp > 1 else self.zero_without_pp

    def allows(self, *, pp: int = 1, vpp: int = 1, zero: int | None = None, cp: int = 1, ep: int = 1) -> bool:
        """Whether these degrees are runnable by this framework; a degree not given is not asked about."""
        return (
            (zero is None or zero in self.zero_stages(pp))
            and (vpp == 1 or self.interleaving)
            and (cp == 1 or self.context_parallel)
            and (ep == 1 or self.expert_parallel)
            and (ep == 1 or zero != 3 or self.fsdp_with_ep)
        )


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
    limits of FRAMEWORKS, which the search obeys under `--framework`, and the rules the framework's own parsers
    miss (emitters.md section 5). ``target`` names the emit target in the message (default: the framework)."""
    fw = FRAMEWORKS[framework]
    name = target or framework
    redo = f"re-plan with `planner plan JOB --framework {name}`"
    field = f"plans[{plan.plan_rank - 1}].layout"
    if plan.zero_stage not in fw.zero_stages(plan.pp):
        ok = ", ".join(map(str, sorted(fw.zero_stages(plan.pp))))
        with_pp = "with pipeline parallelism" if plan.pp > 1 else "without pipeline parallelism"
        raise Inexpressible(
            f"{field}.zero_stage", f"{name} runs ZeRO stage {ok} {with_pp}, not {plan.zero_stage}; {redo}"
        )
    if plan.vpp > 1 and not fw.interleaving:
        raise Inexpressible(f"{field}.vpp", f"{name} has no interleaved pipeline schedule (vpp {plan.vpp}); {redo}")
    if plan.ep > 1 and plan.zero_stage == 3 and not fw.fsdp_with_ep:
        raise Inexpressible(f"{field}.zero_stage", f"{name} runs ZeRO-3 (FSDP) only without expert parallelism; {redo}")
    if plan.cp > 1 and not fw.context_parallel:
        raise Inexpressible(f"{field}.cp", f"{name} has no context parallelism (cp {plan.cp}); {redo}")
    if plan.ep > 1 and not fw.expert_parallel:
        raise Inexpressible(f"{field}.ep", f"{name} has no expert parallelism here (ep {plan.ep}); {redo}")
    if not plan.even_split and not fw.uneven_layers:
        raise Inexpressible(f"{field}.stages", f"{name} splits layers evenly over stages; {redo}")
    partial = plan.recompute != "full" and 0 < plan.recompute_layers < max(plan.stage_layers)
    if partial and not fw.partial_recompute:
        raise Inexpressible(
            f"{field}.stages",
            f"{name} recomputes all layers of a stage or none ({plan.recompute_layers} of {max(plan.stage_layers)} "
            f"planned); {redo}",
        )
    if plan.recompute_layers and plan.recompute == "selective" and plan.training.attention != "flash":
        # Megatron: one --recompute-granularity; with flash attention selective recompute is a no-op to drop
        raise Inexpressible(
            f"{field}.recompute",
            f"{name} takes one recompute granularity: selective on some layers and full on others is not a setting; "
            f"{redo}",
        )
