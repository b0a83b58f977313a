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


def tp_heads_error(model: ModelSpec, tp: int) -> str | None:
    """Why ``tp`` cannot shard the attention heads (None when it can): heads split evenly over TP ranks, and
    kv-heads either split evenly or are replicated (tp a multiple of kv-heads)."""
    if model.num_attention_heads % tp:
        return f"num_attention_heads ({model.num_attention_heads}) is not divisible by tp ({tp})"
    if model.kv_heads % tp and tp % model.kv_heads:
        return f"num_kv_heads ({model.kv_heads}) and tp ({tp}) must divide one another"
    return None


def check_tp_heads(model: ModelSpec, tp: int, field: str) -> None:
    err = tp_heads_error(model, tp)
    if err:
        raise SpecError(field, err)


def check_batch(training: Training, micro_batch_size: int, dp: int) -> None:
    """The global batch splits into micro-batches over the DP replicas."""
    if training.global_batch_size % (micro_batch_size * dp):
        raise SpecError(
            "layout.micro_batch_size",
            f"global_batch_size ({training.global_batch_size}) is not divisible by micro_batch_size*dp "
            f"({micro_batch_size}*{dp})",
        )


def cp_error(training: Training, cp: int) -> str | None:
    """Why ``cp`` cannot split the sequence (None when it can): load-balanced context parallelism cuts the
    sequence into 2*cp chunks (Megatron-LM / Transformer Engine ring attention)."""
    if cp > 1 and training.seq_length % (2 * cp):
        return (f"seq_length ({training.seq_length}) must be divisible by 2*cp ({2 * cp}) for load-balanced "
                "context parallelism")
    return None


def check_cp(training: Training, cp: int) -> None:
    err = cp_error(training, cp)
    if err:
        raise SpecError("layout.cp", err)


def dims_from_layout(layout: Layout, job: Job):
    """ReplicaDims for ``layout.replicas``, HeteroDims when the layout places stages on node groups
    (``stages[].group``), else ParallelDims."""
    if layout.replicas is not None:
        return ReplicaDims.from_layout(layout, job)
    if layout.stages and any(s.placed for s in layout.stages):
        return HeteroDims.from_layout(layout, job)
    return ParallelDims.from_layout(layout, job)


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
    microbatches: int | None = None  # replicas that run their own count (ReplicaDims); else from the batch

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
        check_tp_heads(m, self.tp, "layout.tp")
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
        check_batch(t, self.micro_batch_size, self.dp)
        check_cp(t, self.cp)
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
        if self.microbatches is not None:
            return self.microbatches
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


# ---------------------------------------------------------------------------------------------------------------
# Heterogeneous layouts: one pipeline template, stage s on node group g_s with its own TP degree, replicated dp times.


def group_order(cluster) -> list[int]:
    """Node-group indices by GPU memory descending, ties in listing order: the roomiest group first (the order in
    which searches list groups; a pipeline may run its groups in any order, each group's stages consecutive)."""
    return sorted(range(len(cluster)), key=lambda g: (-cluster[g].gpu.memory_gib, g))


@dataclass(frozen=True)
class HeteroDims:
    """Degrees of a heterogeneous plan. ep = vpp = 1; CP, micro-batch, micro-batch count, ZeRO stage (sharded
    over each stage's own DP*CP group) and the baseline recompute mode are shared by all stages."""

    stage_groups: tuple[int, ...]
    stage_tp: tuple[int, ...]
    dp: int
    micro_batch_size: int
    zero_stage: int
    recompute: str
    stage_layers: tuple[int, ...]
    stage_recompute: tuple[int, ...] | None
    cluster: tuple
    model: ModelSpec
    training: Training
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    tp_comm_overlap: bool = False
    micro_batches: int | None = None  # one replica of a ReplicaDims: its own micro-batch count
    dp_total: int | None = None       # ... and the DP size its gradients are synchronized (and ZeRO-sharded) over

    @classmethod
    def from_layout(cls, layout: Layout, job: Job) -> "HeteroDims":
        stages = layout.stages
        if not all(s.placed for s in stages):
            raise SpecError("layout.stages", "either every stage names its group, tp and gpus, or none does")
        for key in ("ep", "vpp"):
            if getattr(layout, key) != 1:
                raise SpecError(f"layout.{key}", f"heterogeneous layouts (stages on node groups) need {key} = 1")
        if layout.dp is None:
            raise SpecError("layout.dp", "a heterogeneous layout must state dp")
        if layout.pp != len(stages):
            raise SpecError("layout.pp", f"pp ({layout.pp}) must equal the number of stages listed ({len(stages)})")
        return cls.from_stages(stages, layout.dp, layout, job, "layout.stages")

    @classmethod
    def from_stages(cls, stages, dp: int, layout: Layout, job: Job, field: str, **extra) -> "HeteroDims":
        """A pipeline of placed stages replicated ``dp`` times; rules only the written stages can break (``gpus``
        is derived everywhere else)."""
        for i, s in enumerate(stages):
            if not s.placed:
                raise SpecError(f"{field}[{i}]", "a placed stage names its group, tp and gpus")
            if s.group >= len(job.cluster):
                raise SpecError(f"{field}[{i}].group", f"no node group {s.group}; the cluster has {len(job.cluster)}")
            if s.gpus != s.tp * layout.cp * dp:
                raise SpecError(f"{field}[{i}].gpus", f"gpus ({s.gpus}) must equal tp*cp*{'count' if extra else 'dp'} "
                                f"({s.tp}*{layout.cp}*{dp})")
        rec = tuple(s.recompute_layers or 0 for s in stages)
        return cls(
            stage_groups=tuple(s.group for s in stages), stage_tp=tuple(s.tp for s in stages), dp=dp,
            micro_batch_size=layout.micro_batch_size, zero_stage=layout.zero_stage, recompute=layout.recompute,
            stage_layers=tuple(s.layers for s in stages), stage_recompute=rec if any(rec) else None,
            cluster=job.cluster, model=job.model, training=job.training, cp=layout.cp, **extra,
        )

    # ------------------------------------------------------------------ rules
    def check(self, field: str = "layout.stages") -> "HeteroDims":
        """Raise SpecError naming the first rule a heterogeneous layout breaks."""
        m, t = self.model, self.training
        for i, (g, tp) in enumerate(zip(self.stage_groups, self.stage_tp)):
            gpn = self.cluster[g].gpus_per_node
            if gpn % tp:
                raise SpecError(f"{field}[{i}].tp", f"tp ({tp}) must divide gpus_per_node ({gpn}) of group {g}")
            check_tp_heads(m, tp, f"{field}[{i}].tp")
            if tp > 1 and t.seq_length // self.cp % tp:
                raise SpecError(f"{field}[{i}].tp",
                                f"the sequence shard ({t.seq_length // self.cp}) is not divisible by tp ({tp})")
        check_cp(t, self.cp)
        runs = [g for i, g in enumerate(self.stage_groups) if i == 0 or self.stage_groups[i - 1] != g]
        if len(runs) != len(set(runs)):
            raise SpecError(field, f"the stages of each node group must be consecutive (groups in pipeline order: "
                            f"{runs})")
        for g, used in self.gpus_by_group().items():
            if used > self.cluster[g].num_gpus:
                raise SpecError(field, f"stages on group {g} need {used} GPUs (sum of tp*cp*dp), "
                                f"the group has {self.cluster[g].num_gpus}")
        if sum(self.stage_layers) != m.num_layers:
            raise SpecError(field, f"stage layers sum to {sum(self.stage_layers)}, the model has {m.num_layers}")
        if self.micro_batches is None:
            check_batch(t, self.micro_batch_size, self.dp)
        return self

    # ------------------------------------------------------------------ derived quantities
    @property
    def pp(self) -> int:
        return len(self.stage_layers)

    @property
    def world(self) -> int:
        """GPUs the plan uses (the rest of the cluster stays idle)."""
        return sum(tp * self.cp * self.dp for tp in self.stage_tp)

    @property
    def num_microbatches(self) -> int:
        if self.micro_batches is not None:
            return self.micro_batches
        return self.training.global_batch_size // (self.micro_batch_size * self.dp)

    def gpus_by_group(self) -> dict[int, int]:
        used = {g: 0 for g in range(len(self.cluster))}
        for g, tp in zip(self.stage_groups, self.stage_tp):
            used[g] += tp * self.cp * self.dp
        return used

    def stage_dims(self, s: int) -> ParallelDims:
        """The homogeneous dims stage ``s`` prices itself with: its own TP, the shared pp/dp/cp/micro-batch/ZeRO."""
        tp = self.stage_tp[s]
        return ParallelDims(
            tp=tp, pp=self.pp, dp=self.dp_total or self.dp, cp=self.cp, ep=1, vpp=1,
            micro_batch_size=self.micro_batch_size, sequence_parallel=tp > 1, zero_stage=self.zero_stage,
            recompute=self.recompute, tp_comm_overlap=False, stage_layers=self.stage_layers,
            stage_recompute=self.stage_recompute, world=tp * self.cp * self.pp * (self.dp_total or self.dp),
            model=self.model, training=self.training, microbatches=self.micro_batches,
        )

    def as_dict(self) -> dict:
        """The plan-JSON layout; top-level ``tp`` is the largest stage TP (the per-stage ``tp`` is authoritative)."""
        return {
            "tp": max(self.stage_tp), "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": 1, "vpp": 1,
            "micro_batch_size": self.micro_batch_size, "sequence_parallel": max(self.stage_tp) > 1,
            "zero_stage": self.zero_stage, "recompute": self.recompute, "tp_comm_overlap": False,
            "stages": [
                {"group": g, "tp": tp, "gpus": tp * self.cp * self.dp, "layers": n,
                 **({"recompute_layers": self.stage_recompute[i]} if self.stage_recompute else {})}
                for i, (g, tp, n) in enumerate(zip(self.stage_groups, self.stage_tp, self.stage_layers))
            ],
            "num_microbatches": self.num_microbatches,
        }


# ---------------------------------------------------------------------------------------------------------------
# Heterogeneous data parallelism: replicas of different pipelines, each running its own number of micro-batches.


@dataclass(frozen=True)
class ReplicaDims:
    """Several pipelines (each a HeteroDims: ``dp`` = its replica count, its own micro-batch count) training one
    model together. They share the layer split, each stage's TP degree, CP, the micro-batch size, the ZeRO stage
    and the baseline recompute mode, so that stage s holds the same parameter shards in every replica: its
    gradients are synchronized (and ZeRO-sharded) over the stage-s GPUs of all replicas, across node groups when
    the replicas sit on different ones. Placement and recompute counts may differ per replica."""

    replicas: tuple[HeteroDims, ...]

    @classmethod
    def from_layout(cls, layout: Layout, job: Job) -> "ReplicaDims":
        if layout.stages is not None:
            raise SpecError("layout.stages", "give either layout.stages or layout.replicas, not both")
        for key in ("ep", "vpp"):
            if getattr(layout, key) != 1:
                raise SpecError(f"layout.{key}", f"layouts with replicas need {key} = 1")
        total = sum(r.count for r in layout.replicas)
        if layout.dp is not None and layout.dp != total:
            raise SpecError("layout.dp", f"dp ({layout.dp}) must equal the replicas' total count ({total})")
        pp = len(layout.replicas[0].stages)
        if "pp" in layout.model_fields_set and layout.pp != pp:
            raise SpecError("layout.pp", f"pp ({layout.pp}) must equal the number of stages of each replica ({pp})")
        reps = tuple(
            HeteroDims.from_stages(r.stages, r.count, layout, job, f"layout.replicas[{i}].stages",
                                   micro_batches=r.micro_batches, dp_total=total)
            for i, r in enumerate(layout.replicas))
        return cls(reps)

    def check(self) -> "ReplicaDims":
        first = self.replicas[0]
        for i, r in enumerate(self.replicas):
            field = f"layout.replicas[{i}].stages"
            r.check(field)
            if r.pp != first.pp:
                raise SpecError(field, f"every replica needs the same number of stages ({r.pp} here, {first.pp} in replica 0)")
            if r.stage_layers != first.stage_layers:
                raise SpecError(field, "every replica needs the same layers per stage (stage s of each replica holds "
                                f"the same parameters): {list(r.stage_layers)} here, {list(first.stage_layers)} in replica 0")
            if r.stage_tp != first.stage_tp:
                raise SpecError(field, "every replica needs the same tp per stage (their gradients are reduced shard "
                                f"by shard): {list(r.stage_tp)} here, {list(first.stage_tp)} in replica 0")
        for g, used in self.gpus_by_group().items():
            if used > self.cluster[g].num_gpus:
                raise SpecError("layout.replicas", f"the replicas need {used} GPUs of group {g}, "
                                f"the group has {self.cluster[g].num_gpus}")
        t = self.training
        sequences = self.micro_batch_size * sum(r.dp * r.num_microbatches for r in self.replicas)
        if sequences != t.global_batch_size:
            raise SpecError("layout.replicas", f"micro_batch_size * sum(count * micro_batches) = {sequences} sequences, "
                            f"but global_batch_size is {t.global_batch_size}")
        return self

    # ------------------------------------------------------------------ shared degrees and totals
    @property
    def pp(self) -> int:
        return self.replicas[0].pp

    @property
    def micro_batch_size(self) -> int:
        return self.replicas[0].micro_batch_size

    @property
    def training(self) -> Training:
        return self.replicas[0].training

    @property
    def cluster(self) -> tuple:
        return self.replicas[0].cluster

    @property
    def dp(self) -> int:
        return sum(r.dp for r in self.replicas)

    @property
    def world(self) -> int:
        return sum(r.world for r in self.replicas)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches of the busiest replica."""
        return max(r.num_microbatches for r in self.replicas)

    def gpus_by_group(self) -> dict[int, int]:
        used = {g: 0 for g in range(len(self.cluster))}
        for r in self.replicas:
            for g, n in r.gpus_by_group().items():
                used[g] += n
        return used

    def as_dict(self) -> dict:
        """The plan-JSON layout: the shared degrees, and one entry per replica."""
        out = self.replicas[0].as_dict()
        out.pop("stages")
        out["dp"] = self.dp
        out["num_microbatches"] = self.num_microbatches
        out["replicas"] = [
            {"count": r.dp, "micro_batches": r.num_microbatches,
             "stages": r.as_dict()["stages"]}
            for r in self.replicas
        ]
        return out
