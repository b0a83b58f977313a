"""What each training framework can run: the one place for per-framework limits (`planner plan --framework`).

Sources: shared/reference/emitters.md (sections 1.4, 2.2-2.3, 3.3, 4.4), read against the frameworks' code.
Stock Megatron-LM, DeepSpeed and torchtitan each have ONE parallel shape for all pipeline stages (one TP degree,
one micro-batch, one recompute setting); all three accept uneven per-stage layer counts (Megatron
``--pipeline-model-parallel-layout``, DeepSpeed a custom ``_partition_layers``, torchtitan
``module_fqns_per_model_part``) and keep PP outermost, so stage s can be placed on a chosen node type.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import SpecError


@dataclass(frozen=True)
class Framework:
    name: str
    per_stage_tp: bool  # stages may use different TP degrees (heterogeneous meshes)
    uneven_layers: bool  # stages may hold different layer counts
    per_stage_recompute: bool  # a different number of fully recomputed layers per stage
    zero_with_pp: frozenset  # ZeRO stages usable with pp > 1
    zero_without_pp: frozenset  # ZeRO stages usable with pp == 1
    interleaving: bool  # interleaved (virtual-pipeline) 1F1B schedule
    context_parallel: bool
    expert_parallel: bool

    def zero_stages(self, pp: int) -> frozenset:
        return self.zero_with_pp if pp > 1 else self.zero_without_pp

    def allows(self, *, pp: int = 1, vpp: int = 1, zero: int | None = None, cp: int = 1, ep: int = 1) -> bool:
        """Whether these degrees are runnable by this framework; a degree not given is not asked about."""
        return (
            (zero is None or zero in self.zero_stages(pp))
            and (vpp == 1 or self.interleaving)
            and (cp == 1 or self.context_parallel)
            and (ep == 1 or self.expert_parallel)
        )


FRAMEWORKS = {
    # One TP/CP/EP/DP, micro-batch and recompute setting for every stage (emitters.md 1.4); the distributed
    # optimizer is ZeRO-1; Megatron/torch FSDP (ZeRO-3) is not combined with PP here.
    "megatron": Framework(
        "megatron",
        per_stage_tp=False,
        uneven_layers=True,
        per_stage_recompute=False,
        zero_with_pp=frozenset({0, 1}),
        zero_without_pp=frozenset({0, 1, 3}),
        interleaving=True,
        context_parallel=True,
        expert_parallel=True,
    ),
    # PipelineEngine: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" (emitters.md 2.2); no
    # interleaved schedule, no ring-attention CP, no MoE EP inside the pipeline engine.
    "deepspeed": Framework(
        "deepspeed",
        per_stage_tp=False,
        uneven_layers=True,
        per_stage_recompute=False,
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
        zero_with_pp=frozenset({0, 3}),
        zero_without_pp=frozenset({0, 3}),
        interleaving=True,
        context_parallel=True,
        expert_parallel=True,
    ),
}


def get_framework(name: str | None) -> Framework | None:
    """The Framework for ``--framework NAME`` (None: no restriction)."""
    if name is None:
        return None
    fw = FRAMEWORKS.get(name.strip().lower())
    if fw is None:
        raise SpecError("--framework", f"unknown framework '{name}'; choose one of {', '.join(sorted(FRAMEWORKS))}")
    return fw
