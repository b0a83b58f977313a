"""ParallelDims: the one place that owns every rule about parallel degrees and the quantities derived from them.

Rank order follows Megatron-LM's default ``tp-cp-ep-dp-pp`` (TP fastest-varying), so a TP group is a run of
consecutive ranks, a CP group has stride tp, a DP group stride tp*cp and a PP group stride tp*cp*dp.
EP is carved out of DP*CP (Megatron convention): an expert's EP group is a subset of the DP*CP ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import SpecError
from planner.spec import Job, Layout, ModelSpec, Training

RANK_ORDER = "tp-cp-ep-dp-pp"


def balanced_split(total: int, parts: int) -> list[int]:
    """``total`` items over ``parts`` bins as evenly as possible, larger bins last (DeepSpeed partition_balanced)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i >= parts - extra else 0) for i in range(parts)]


@dataclass(frozen=True)
class ParallelDims:
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    micro_batch_size: int
    sequence_parallel: bool
    zero_stage: int
    recompute: str
    tp_comm_overlap: bool
    stage_layers: tuple[int, ...]
    stage_recompute: tuple[int, ...] | None  # fully recomputed layers per stage (partial recompute)
    world: int
    model: ModelSpec
    training: Training

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_layout(cls, layout: Layout, job: Job) -> "ParallelDims":
        world = job.num_gpus
        per_replica = layout.tp * layout.pp * layout.cp
        if layout.dp is None:
            if world % per_replica:
                raise SpecError(
                    "layout", f"tp*pp*cp = {per_replica} does not divide the cluster's {world} GPUs"
                )
            dp = world // per_replica
        else:
            dp = layout.dp
        sp = layout.sequence_parallel if layout.sequence_parallel is not None else layout.tp > 1
        recompute_counts = None
        if layout.stages is not None:
            stages = tuple(s.layers for s in layout.stages)
            if any(s.recompute_layers for s in layout.stages):
                recompute_counts = tuple(s.recompute_layers or 0 for s in layout.stages)
        elif job.model.num_layers % (layout.pp * layout.vpp) == 0:
            stages = tuple([job.model.num_layers // layout.pp] * layout.pp)
        else:
            raise SpecError(
                "layout.pp",
                f"num_layers ({job.model.num_layers}) is not divisible by pp*vpp ({layout.pp}*{layout.vpp}); "
                "choose degrees that divide it or list per-stage layer counts in layout.stages",
            )
        return cls(
            tp=layout.tp, pp=layout.pp, dp=dp, cp=layout.cp, ep=layout.ep, vpp=layout.vpp,
            micro_batch_size=layout.micro_batch_size, sequence_parallel=bool(sp and layout.tp > 1),
            zero_stage=layout.zero_stage, recompute=layout.recompute,
            tp_comm_overlap=bool(layout.tp_comm_overlap and layout.tp > 1), stage_layers=stages,
            stage_recompute=recompute_counts,
            world=world, model=job.model, training=job.training,
        )

    # ------------------------------------------------------------------ rules
    def check(self) -> "ParallelDims":
        """Raise SpecError (exit 2) naming the first rule the degrees break."""
        m, t = self.model, self.training
        used = self.tp * self.pp * self.dp * self.cp
        if used != self.world:
            raise SpecError(
                "layout",
                f"tp*pp*dp*cp = {self.tp}*{self.pp}*{self.dp}*{self.cp} = {used} but the cluster has {self.world} GPUs",
            )
        if m.num_attention_heads % self.tp:
            raise SpecError("layout.tp", f"num_attention_heads ({m.num_attention_heads}) is not divisible by tp ({self.tp})")
        if m.kv_heads % self.tp and self.tp % m.kv_heads:
            raise SpecError("layout.tp", f"num_kv_heads ({m.kv_heads}) and tp ({self.tp}) must divide one another")
        if len(self.stage_layers) != self.pp:
            raise SpecError("layout.stages", f"{len(self.stage_layers)} stages listed but pp = {self.pp}")
        if sum(self.stage_layers) != m.num_layers:
            raise SpecError("layout.stages", f"stage layers sum to {sum(self.stage_layers)}, the model has {m.num_layers}")
        if min(self.stage_layers) < 1:
            raise SpecError("layout.stages", "every pipeline stage needs at least one layer")
        if self.vpp > 1:
            if self.pp == 1:
                raise SpecError("layout.vpp", "interleaving (vpp > 1) needs pp > 1")
            bad = [n for n in self.stage_layers if n % self.vpp]
            if bad:
                raise SpecError("layout.vpp", f"stage layer counts {sorted(set(bad))} are not divisible by vpp ({self.vpp})")
            if self.num_microbatches % self.pp:
                raise SpecError(
                    "layout.vpp",
                    f"the interleaved schedule needs micro-batches per replica ({self.num_microbatches}) divisible by pp ({self.pp})",
                )
        if t.global_batch_size % (self.micro_batch_size * self.dp):
            raise SpecError(
                "layout.micro_batch_size",
                f"global_batch_size ({t.global_batch_size}) is not divisible by micro_batch_size*dp "
                f"({self.micro_batch_size}*{self.dp})",
            )
        if t.seq_length % self.cp or (self.cp > 1 and t.seq_length % (2 * self.cp)):
            raise SpecError("layout.cp", f"seq_length ({t.seq_length}) must be divisible by 2*cp ({2 * self.cp}) for load-balanced context parallelism")
        if self.sequence_parallel and t.seq_length // self.cp % self.tp:
            raise SpecError("layout.sequence_parallel", f"the sequence shard ({t.seq_length // self.cp}) is not divisible by tp ({self.tp})")
        if self.ep > 1:
            if m.moe is None:
                raise SpecError("layout.ep", "expert parallelism needs an MoE model (model.moe)")
            if (self.dp * self.cp) % self.ep:
                raise SpecError("layout.ep", f"ep ({self.ep}) must divide dp*cp ({self.dp * self.cp})")
            if m.moe.num_experts % self.ep:
                raise SpecError("layout.ep", f"num_experts ({m.moe.num_experts}) is not divisible by ep ({self.ep})")
        return self

    # ------------------------------------------------------------------ derived quantities
    @property
    def num_microbatches(self) -> int:
        """Micro-batches per replica per iteration (gradient-accumulation steps)."""
        return self.training.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def tokens_per_microbatch(self) -> int:
        """Tokens one GPU processes per micro-batch (its CP shard of the sequence)."""
        return self.micro_batch_size * self.training.seq_length // self.cp

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the expert parameters: DP*CP ranks not used by EP."""
        return self.dp * self.cp // self.ep

    @staticmethod
    def spans(tp: int, cp: int, ep: int, gpus_per_node: int) -> dict[str, tuple[int, int]]:
        """(group size, members per node) of the TP, CP and EP groups, which do not depend on DP or PP."""
        out = {}
        for dim, size, stride in (("tp", tp, 1), ("cp", cp, tp), ("ep", ep, tp * cp)):
            out[dim] = (size, max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1)
        return out

    def group_span(self, dim: str, gpus_per_node: int) -> tuple[int, int]:
        """(group size, GPUs of the group that share one node) for a parallel dimension under RANK_ORDER."""
        size = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "ep": self.ep, "pp": self.pp}[dim]
        stride = {"tp": 1, "cp": self.tp, "ep": self.tp * self.cp, "dp": self.tp * self.cp, "pp": self.tp * self.cp * self.dp}[dim]
        per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
        return size, per_node

    def as_dict(self) -> dict:
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep, "vpp": self.vpp,
            "micro_batch_size": self.micro_batch_size, "sequence_parallel": self.sequence_parallel,
            "zero_stage": self.zero_stage, "recompute": self.recompute, "tp_comm_overlap": self.tp_comm_overlap,
            "stages": [
                {"layers": n, **({"recompute_layers": self.stage_recompute[i]} if self.stage_recompute else {})}
                for i, n in enumerate(self.stage_layers)
            ],
            "num_microbatches": self.num_microbatches,
        }
