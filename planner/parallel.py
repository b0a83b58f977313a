"""ParallelDims: the one place that owns every rule about parallel degrees and the quantities derived from them.

Rank order follows Megatron-LM's default ``tp-cp-ep-dp-pp`` (TP fastest-varying), so a TP group is a run of
consecutive ranks, a CP group has stride tp, a DP group stride tp*cp and a PP group stride tp*cp*dp.
EP is carved out of DP*CP (Megatron convention): an expert's EP group is a subset of the DP*CP ranks.

Every rule is written once, as a predicate that returns why a degree is rejected (``*_error``: None when it is
accepted), and every enumerator takes its degrees from the option generators built on them (``*_options``), so the
layouts a search proposes and the layouts ``check()`` accepts follow the same rules:

| rule | predicate | options |
|---|---|---|
| TP shards the heads, kv-heads divide or are replicated | tp_heads_error | tp_options, node_group_tp_options |
| TP shards the FFN and expert-FFN widths (layer profiler) | tp_ffn_error | profile/runner.py default_tps |
| TP within one node: homogeneous no larger than a node, node groups a divisor | tp_fits_node, tp_node_error | (same) |
| the sequence shard splits over TP (sequence parallelism) | seq_shard_error | (per cp, in the enumerators) |
| load-balanced CP cuts the sequence in 2*cp chunks | cp_error | cp_options |
| EP needs experts, divides dp*cp and the experts | ep_error | ep_options |
| the stages hold every layer, at least one each | layer_sum_error, (pp <= num_layers) | pp_options |
| interleaving: pp > 1, stages of whole chunks, micro-batches by pp | vpp_error | vpp_options |
| the batch splits into micro-batches over DP | batch_error | dp_options, micro_batch_options |
| flash attention makes selective recompute the same as none | | baseline_recompute_modes |
| group strides and ranks per node under RANK_ORDER | | rank_strides, ranks_per_node |
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from planner.errors import SpecError
from planner.spec import Job, Layout, ModelSpec, Training

RANK_ORDER = "tp-cp-ep-dp-pp"
CARVED_DIMS = frozenset({"ep"})  # groups carved out of the ranks of later dimensions: no factor of the world size


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in ascending order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def balanced_split(total: int, parts: int) -> list[int]:
    """``total`` items over ``parts`` bins as evenly as possible, larger bins last (DeepSpeed partition_balanced)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i >= parts - extra else 0) for i in range(parts)]


# ---------------------------------------------------------------------------------------------------------------
# Rank layout


def rank_strides(sizes: Mapping[str, int]) -> dict[str, int]:
    """Rank distance between neighbouring members of each dimension's group under RANK_ORDER: the product of the
    sizes of the dimensions before it. EP is carved out of DP*CP, so it adds no factor (it shares DP's stride).
    ``sizes`` needs only the dimensions before the last stride wanted; strides stop at the first one missing."""
    out: dict[str, int] = {}
    stride = 1
    for dim in RANK_ORDER.split("-"):
        out[dim] = stride
        if dim in CARVED_DIMS:
            continue
        if dim not in sizes:
            break
        stride *= sizes[dim]
    return out


def ranks_per_node(size: int, stride: int, gpus_per_node: int) -> int:
    """Members of a group of ``size`` ranks ``stride`` apart that share one node (1 once the stride spans a
    node)."""
    return max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1


# ---------------------------------------------------------------------------------------------------------------
# Predicates: why a degree is rejected, None when it is accepted


def tp_heads_error(model: ModelSpec, tp: int) -> str | None:
    """Why ``tp`` cannot shard the attention heads (None when it can): heads split evenly over TP ranks, and
    kv-heads either split evenly or are replicated (tp a multiple of kv-heads)."""
    if model.num_attention_heads % tp:
        return f"num_attention_heads ({model.num_attention_heads}) is not divisible by tp ({tp})"
    if model.kv_heads % tp and tp % model.kv_heads:
        return f"num_kv_heads ({model.kv_heads}) and tp ({tp}) must divide one another"
    return None


def tp_ffn_error(model: ModelSpec, tp: int) -> str | None:
    """Why ``tp`` cannot shard the MLP widths (None when it can): the FFN and expert-FFN widths split evenly over
    TP ranks (column-parallel up-projections)."""
    if model.ffn_hidden_size % tp:
        return f"ffn_hidden_size ({model.ffn_hidden_size}) is not divisible by tp ({tp})"
    if model.moe is not None and model.moe.expert_ffn_hidden_size % tp:
        return f"moe.expert_ffn_hidden_size ({model.moe.expert_ffn_hidden_size}) is not divisible by tp ({tp})"
    return None


def tp_fits_node(tp: int, gpus_per_node: int, cross_node: bool = False) -> bool:
    """The homogeneous search keeps a TP group within one node (no larger than it; the world is whole nodes)
    unless cross-node TP is allowed (``--allow-cross-node-tp``)."""
    return cross_node or tp <= gpus_per_node


def tp_node_error(tp: int, gpus_per_node: int) -> str | None:
    """Why a stage placed on a node group cannot use ``tp`` (None when it can): its TP groups tile the group's
    nodes, so tp divides gpus_per_node."""
    if gpus_per_node % tp:
        return f"tp ({tp}) must divide gpus_per_node ({gpus_per_node})"
    return None


def seq_shard_error(training: Training, cp: int, tp: int) -> str | None:
    """Why sequence parallelism cannot split the sequence shard over ``tp`` (None when it can): each CP rank's
    seq_length/cp tokens are scattered evenly over the TP ranks (Korthikanti et al. 2022)."""
    shard = training.seq_length // cp
    if shard % tp:
        return f"the sequence shard ({shard}) is not divisible by tp ({tp})"
    return None


def cp_error(training: Training, cp: int) -> str | None:
    """Why ``cp`` cannot split the sequence (None when it can): load-balanced context parallelism cuts the
    sequence into 2*cp chunks (Megatron-LM / Transformer Engine ring attention)."""
    if cp > 1 and training.seq_length % (2 * cp):
        return (
            f"seq_length ({training.seq_length}) must be divisible by 2*cp ({2 * cp}) for load-balanced "
            "context parallelism"
        )
    return None


# The ZeRO stages each gradient-buffer type (Training.grad_dtype) runs at, where not every stage: DeepSpeed's
# BF16_Optimizer (bf16+fp32) shards the optimizer state at most, never its fp32 accumulation buffer
# (deepspeed/runtime/bf16_optimizer.py; tr11-176B-ml chronicles: "it's not sharded across gpus").
GRAD_DTYPE_ZERO_STAGES = {"bf16+fp32": (0, 1)}


def grad_zero_error(training: Training, zero_stage: int) -> str | None:
    """Why the job's gradient buffers cannot run at ``zero_stage`` (None when they can): GRAD_DTYPE_ZERO_STAGES."""
    stages = GRAD_DTYPE_ZERO_STAGES.get(training.grad_dtype)
    if stages is not None and zero_stage not in stages:
        ok = " or ".join(map(str, stages))
        return (
            f"{training.grad_dtype} gradients (DeepSpeed's BF16_Optimizer) run at ZeRO stage {ok}, not "
            f"{zero_stage}; its fp32 accumulation buffer is never sharded"
        )
    return None


def ep_error(model: ModelSpec, ep: int, dp: int, cp: int) -> str | None:
    """Why ``ep`` cannot shard the experts (None when it can): it needs an MoE model, its groups are carved out
    of the DP*CP ranks, and the experts split evenly over them."""
    if ep == 1:
        return None
    if model.moe is None:
        return "expert parallelism needs an MoE model (model.moe)"
    if (dp * cp) % ep:
        return f"ep ({ep}) must divide dp*cp ({dp * cp})"
    if model.moe.num_experts % ep:
        return f"num_experts ({model.moe.num_experts}) is not divisible by ep ({ep})"
    return None


def vpp_error(vpp: int, pp: int, num_microbatches: int, stage_layers: Iterable[int]) -> str | None:
    """Why the interleaved schedule cannot run ``vpp`` model chunks per stage (None when it can): it needs a
    pipeline, every stage a whole number of chunks, and the micro-batches in rounds of pp (Megatron-LM)."""
    if vpp == 1:
        return None
    if pp == 1:
        return "interleaving (vpp > 1) needs pp > 1"
    bad = [n for n in stage_layers if n % vpp]
    if bad:
        return f"stage layer counts {sorted(set(bad))} are not divisible by vpp ({vpp})"
    if num_microbatches % pp:
        return f"the interleaved schedule needs micro-batches per replica ({num_microbatches}) divisible by pp ({pp})"
    return None


def layer_sum_error(model: ModelSpec, stage_layers: Iterable[int]) -> str | None:
    """Why the stages do not hold the model (None when their layers add up to it)."""
    total = sum(stage_layers)
    if total != model.num_layers:
        return f"stage layers sum to {total}, the model has {model.num_layers}"
    return None


def batch_error(training: Training, micro_batch_size: int, dp: int) -> str | None:
    """Why the global batch does not split into micro-batches over the DP replicas (None when it does)."""
    if training.global_batch_size % (micro_batch_size * dp):
        return (
            f"global_batch_size ({training.global_batch_size}) is not divisible by micro_batch_size*dp "
            f"({micro_batch_size}*{dp})"
        )
    return None


def interleaved_split(num_layers: int, pp: int, vpp: int) -> list[int] | None:
    """A split of the layers into ``pp`` stages of whole chunks of ``vpp`` layers, each stage at least one chunk
    (the most even one), or None when there is none: the split the search's stage counts range around."""
    if num_layers % vpp or num_layers < pp * vpp:
        return None
    return [vpp * n for n in balanced_split(num_layers // vpp, pp)]


# ---------------------------------------------------------------------------------------------------------------
# Option generators: every degree an enumerator may try, in ascending order


def tp_options(model: ModelSpec, world: int, gpus_per_node: int, cross_node: bool = False) -> list[int]:
    """TP degrees of a homogeneous plan on ``world`` GPUs: divide the world, fit a node (tp_fits_node), shard
    the heads (tp_heads_error)."""
    return [
        tp
        for tp in divisors(world)
        if tp_fits_node(tp, gpus_per_node, cross_node) and tp_heads_error(model, tp) is None
    ]


def node_group_tp_options(model: ModelSpec, gpus_per_node: Iterable[int]) -> list[int]:
    """TP degrees a stage may use on every one of these node groups (their gpus_per_node): a divisor of each
    (tp_node_error) that shards the heads (tp_heads_error)."""
    gpns = list(gpus_per_node)
    return [
        tp
        for tp in divisors(min(gpns))
        if all(tp_node_error(tp, gpn) is None for gpn in gpns) and tp_heads_error(model, tp) is None
    ]


def cp_options(training: Training, gpus: int) -> list[int]:
    """CP degrees that divide ``gpus`` and split the sequence (cp_error)."""
    return [cp for cp in divisors(gpus) if cp_error(training, cp) is None]


def dp_options(training: Training) -> list[int]:
    """Data-parallel sizes that split the global batch (batch_error at micro-batch 1)."""
    return [dp for dp in divisors(training.global_batch_size) if batch_error(training, 1, dp) is None]


def ep_options(model: ModelSpec, dp: int, cp: int) -> list[int]:
    """EP degrees at this dp and cp (ep_error); [1] for a dense model."""
    return [ep for ep in divisors(dp * cp) if ep_error(model, ep, dp, cp) is None]


def pp_options(num_layers: int, gpus: int) -> list[int]:
    """Pipeline depths that divide ``gpus`` with at least one layer per stage."""
    return [pp for pp in divisors(gpus) if pp <= num_layers]


@functools.lru_cache(maxsize=4096)
def vpp_options(num_layers: int, pp: int, num_microbatches: int) -> tuple[int, ...]:
    """Model chunks per stage: a split into whole chunks exists (interleaved_split) that the interleaved
    schedule accepts (vpp_error). Cached: the homogeneous enumeration asks once per micro-batch choice."""
    out = []
    for vpp in divisors(num_layers):
        split = interleaved_split(num_layers, pp, vpp)
        if split is not None and vpp_error(vpp, pp, num_microbatches, split) is None:
            out.append(vpp)
    return tuple(out)


def micro_batch_options(training: Training, dp: int, max_micro_batch: int) -> list[int]:
    """Micro-batch sizes up to ``max_micro_batch`` that split the global batch over ``dp`` replicas
    (batch_error); none when dp does not divide the batch."""
    if training.global_batch_size % dp:
        return []
    per_replica = training.global_batch_size // dp
    return [mbs for mbs in divisors(per_replica) if mbs <= max_micro_batch and batch_error(training, mbs, dp) is None]


def baseline_recompute_modes(training: Training, op: bool = False) -> tuple[str, ...]:
    """Recompute modes of the layers not chosen for full recompute: with flash attention selective recompute
    is the same as none (the kernel already recomputes the scores), so only none is searched. ``op``: the
    framework has per-op selective checkpointing (torchtitan), searched as one more mode."""
    modes = ("none",) if training.fused_attention else ("none", "selective")
    return (*modes, "op") if op else modes


# ---------------------------------------------------------------------------------------------------------------
# check() helpers: raise SpecError (exit 2) naming the field


def check_rule(field: str, err: str | None) -> None:
    if err:
        raise SpecError(field, err)


def check_tp_heads(model: ModelSpec, tp: int, field: str) -> None:
    check_rule(field, tp_heads_error(model, tp))


def check_batch(training: Training, micro_batch_size: int, dp: int) -> None:
    """The global batch splits into micro-batches over the DP replicas."""
    check_rule("layout.micro_batch_size", batch_error(training, micro_batch_size, dp))


def check_cp(training: Training, cp: int) -> None:
    check_rule("layout.cp", cp_error(training, cp))


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
    def from_layout(cls, layout: Layout, job: Job) -> ParallelDims:
        world = job.num_gpus
        per_replica = layout.tp * layout.pp * layout.cp
        if layout.dp is None:
            if world % per_replica:
                raise SpecError("layout", f"tp*pp*cp = {per_replica} does not divide the cluster's {world} GPUs")
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
            tp=layout.tp,
            pp=layout.pp,
            dp=dp,
            cp=layout.cp,
            ep=layout.ep,
            vpp=layout.vpp,
            micro_batch_size=layout.micro_batch_size,
            sequence_parallel=bool(sp and layout.tp > 1),
            zero_stage=layout.zero_stage,
            recompute=layout.recompute,
            tp_comm_overlap=bool(layout.tp_comm_overlap and layout.tp > 1),
            stage_layers=stages,
            stage_recompute=recompute_counts,
            world=world,
            model=job.model,
            training=job.training,
        )

    # ------------------------------------------------------------------ rules
    def check(self) -> ParallelDims:
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
        check_rule("layout.stages", layer_sum_error(m, self.stage_layers))
        if min(self.stage_layers) < 1:
            raise SpecError("layout.stages", "every pipeline stage needs at least one layer")
        check_rule("layout.vpp", vpp_error(self.vpp, self.pp, self.num_microbatches, self.stage_layers))
        check_batch(t, self.micro_batch_size, self.dp)
        check_cp(t, self.cp)
        check_rule("layout.zero_stage", grad_zero_error(t, self.zero_stage))
        if self.sequence_parallel:
            check_rule("layout.sequence_parallel", seq_shard_error(t, self.cp, self.tp))
        check_rule("layout.ep", ep_error(m, self.ep, self.dp, self.cp))
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
        sizes = {"tp": tp, "cp": cp, "ep": ep}
        strides = rank_strides(sizes)
        return {dim: (size, ranks_per_node(size, strides[dim], gpus_per_node)) for dim, size in sizes.items()}

    def group_span(self, dim: str, gpus_per_node: int) -> tuple[int, int]:
        """(group size, GPUs of the group that share one node) for a parallel dimension under RANK_ORDER."""
        return _group_spans(self.tp, self.cp, self.ep, self.dp, self.pp, gpus_per_node)[dim]

    def as_dict(self) -> dict:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "cp": self.cp,
            "ep": self.ep,
            "vpp": self.vpp,
            "micro_batch_size": self.micro_batch_size,
            "sequence_parallel": self.sequence_parallel,
            "zero_stage": self.zero_stage,
            "recompute": self.recompute,
            "tp_comm_overlap": self.tp_comm_overlap,
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
    """Degrees of a heterogeneous plan. CP, EP, interleaving (vpp), micro-batch, micro-batch count, ZeRO stage
    (sharded over each stage's own DP*CP group) and the baseline recompute mode are shared by all stages. Each
    stage's EP groups are carved out of its own DP*CP ranks (ep_error, as in ParallelDims), so they stay on the
    stage's node group; with per-stage TP the EP group's stride (tp*cp ranks, ParallelDims.spans) is the stage's
    own. Interleaving follows the homogeneous rule (vpp_error): every stage holds vpp chunks of n_s/vpp layers
    (uneven stages each a multiple of vpp, as Megatron's pipeline layout runs them) and the micro-batches come in
    rounds of pp. A mixed pipeline may interleave; the replicas of a ReplicaDims keep vpp = 1."""

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
    dp_total: int | None = None  # ... and the DP size its gradients are synchronized (and ZeRO-sharded) over

    @classmethod
    def from_layout(cls, layout: Layout, job: Job) -> HeteroDims:
        stages = layout.stages
        if not all(s.placed for s in stages):
            raise SpecError("layout.stages", "either every stage names its group, tp and gpus, or none does")
        if layout.dp is None:
            raise SpecError("layout.dp", "a heterogeneous layout must state dp")
        if layout.pp != len(stages):
            raise SpecError("layout.pp", f"pp ({layout.pp}) must equal the number of stages listed ({len(stages)})")
        dims = cls.from_stages(stages, layout.dp, layout, job, "layout.stages", vpp=layout.vpp)
        return dims.check_vpp()

    @classmethod
    def from_stages(cls, stages, dp: int, layout: Layout, job: Job, field: str, **extra) -> HeteroDims:
        """A pipeline of placed stages replicated ``dp`` times; rules only the written stages can break (``gpus``
        is derived everywhere else). ``extra``: a replica's micro_batches and dp_total, or a pipeline's vpp."""
        for i, s in enumerate(stages):
            if not s.placed:
                raise SpecError(f"{field}[{i}]", "a placed stage names its group, tp and gpus")
            if s.group >= len(job.cluster):
                raise SpecError(f"{field}[{i}].group", f"no node group {s.group}; the cluster has {len(job.cluster)}")
            if s.gpus != s.tp * layout.cp * dp:
                raise SpecError(
                    f"{field}[{i}].gpus",
                    f"gpus ({s.gpus}) must equal tp*cp*{'count' if 'micro_batches' in extra else 'dp'} "
                    f"({s.tp}*{layout.cp}*{dp})",
                )
        rec = tuple(s.recompute_layers or 0 for s in stages)
        return cls(
            stage_groups=tuple(s.group for s in stages),
            stage_tp=tuple(s.tp for s in stages),
            dp=dp,
            micro_batch_size=layout.micro_batch_size,
            zero_stage=layout.zero_stage,
            recompute=layout.recompute,
            stage_layers=tuple(s.layers for s in stages),
            stage_recompute=rec if any(rec) else None,
            cluster=job.cluster,
            model=job.model,
            training=job.training,
            cp=layout.cp,
            ep=layout.ep,
            **extra,
        )

    # ------------------------------------------------------------------ rules
    def check(self, field: str = "layout.stages") -> HeteroDims:
        """Raise SpecError naming the first rule a heterogeneous layout breaks."""
        m, t = self.model, self.training
        for i, (g, tp) in enumerate(zip(self.stage_groups, self.stage_tp)):
            err = tp_node_error(tp, self.cluster[g].gpus_per_node)
            check_rule(f"{field}[{i}].tp", err and f"{err} of group {g}")
            check_tp_heads(m, tp, f"{field}[{i}].tp")
            check_rule(f"{field}[{i}].tp", seq_shard_error(t, self.cp, tp))
        check_cp(t, self.cp)
        check_rule("layout.zero_stage", grad_zero_error(t, self.zero_stage))
        # every stage carves its EP groups out of its own dp*cp ranks (the rule does not depend on the stage's TP);
        # a replica (micro_batches set) out of its own count's: its EP all-to-alls run in step with its micro-batches
        err = ep_error(m, self.ep, self.dp, self.cp)
        check_rule("layout.ep", err and (f"{err} of {field.rsplit('.', 1)[0]}" if self.micro_batches else err))
        runs = [g for i, g in enumerate(self.stage_groups) if i == 0 or self.stage_groups[i - 1] != g]
        if len(runs) != len(set(runs)):
            raise SpecError(
                field, f"the stages of each node group must be consecutive (groups in pipeline order: {runs})"
            )
        for g, used in self.gpus_by_group().items():
            if used > self.cluster[g].num_gpus:
                raise SpecError(
                    field,
                    f"stages on group {g} need {used} GPUs (sum of tp*cp*dp), the group has {self.cluster[g].num_gpus}",
                )
        check_rule(field, layer_sum_error(m, self.stage_layers))
        self.check_vpp()
        if self.micro_batches is None:
            check_batch(t, self.micro_batch_size, self.dp)
        return self

    def check_vpp(self) -> HeteroDims:
        """The interleaving rule of the homogeneous layout (vpp_error: a pipeline, every stage a whole number of
        chunks, micro-batches by pp), checked in the same place of the order as ParallelDims.check (before the
        batch)."""
        check_rule("layout.vpp", vpp_error(self.vpp, self.pp, self.num_microbatches, self.stage_layers))
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
        """The homogeneous dims stage ``s`` prices itself with: its own TP, the shared pp/dp/cp/ep/vpp/micro-batch/
        ZeRO (vpp: its in-flight micro-batches and per-chunk sends, planner/cost/stage.py)."""
        tp = self.stage_tp[s]
        return ParallelDims(
            tp=tp,
            pp=self.pp,
            dp=self.dp_total or self.dp,
            cp=self.cp,
            ep=self.ep,
            vpp=self.vpp,
            micro_batch_size=self.micro_batch_size,
            sequence_parallel=tp > 1,
            zero_stage=self.zero_stage,
            recompute=self.recompute,
            tp_comm_overlap=False,
            stage_layers=self.stage_layers,
            stage_recompute=self.stage_recompute,
            world=tp * self.cp * self.pp * (self.dp_total or self.dp),
            model=self.model,
            training=self.training,
            microbatches=self.micro_batches,
        )

    def as_dict(self) -> dict:
        """The plan-JSON layout; top-level ``tp`` is the largest stage TP (the per-stage ``tp`` is authoritative)."""
        return {
            "tp": max(self.stage_tp),
            "pp": self.pp,
            "dp": self.dp,
            "cp": self.cp,
            "ep": self.ep,
            "vpp": self.vpp,
            "micro_batch_size": self.micro_batch_size,
            "sequence_parallel": max(self.stage_tp) > 1,
            "zero_stage": self.zero_stage,
            "recompute": self.recompute,
            "tp_comm_overlap": False,
            "stages": [
                {
                    "group": g,
                    "tp": tp,
                    "gpus": tp * self.cp * self.dp,
                    "layers": n,
                    **({"recompute_layers": self.stage_recompute[i]} if self.stage_recompute else {}),
                }
                for i, (g, tp, n) in enumerate(zip(self.stage_groups, self.stage_tp, self.stage_layers))
            ],
            "num_microbatches": self.num_microbatches,
        }


# ---------------------------------------------------------------------------------------------------------------
# Heterogeneous data parallelism: replicas of different pipelines, each running its own number of micro-batches.


@dataclass(frozen=True)
class ReplicaDims:
    """Several pipelines (each a HeteroDims: ``dp`` = its replica count, its own micro-batch count) training one
    model together. They share the layer split, each stage's TP degree, CP, EP, the micro-batch size, the ZeRO
    stage and the baseline recompute mode, so that stage s holds the same parameter shards in every replica: its
    gradients are synchronized (and ZeRO-sharded) over the stage-s GPUs of all replicas, across node groups when
    the replicas sit on different ones. Placement and recompute counts may differ per replica. Each replica entry
    carves its EP groups out of its own count*cp ranks (ep_error in HeteroDims.check): an EP group's all-to-alls
    run every micro-batch, so its ranks run the same micro-batches on one GPU type; the expert gradients are then
    synchronized over the expert-DP ranks (dp*cp/ep) of all replicas."""

    replicas: tuple[HeteroDims, ...]

    @classmethod
    def from_layout(cls, layout: Layout, job: Job) -> ReplicaDims:
        if layout.stages is not None:
            raise SpecError("layout.stages", "give either layout.stages or layout.replicas, not both")
        if layout.vpp != 1:
            raise SpecError("layout.vpp", "layouts with replicas need vpp = 1")
        total = sum(r.count for r in layout.replicas)
        if layout.dp is not None and layout.dp != total:
            raise SpecError("layout.dp", f"dp ({layout.dp}) must equal the replicas' total count ({total})")
        pp = len(layout.replicas[0].stages)
        if "pp" in layout.model_fields_set and layout.pp != pp:
            raise SpecError("layout.pp", f"pp ({layout.pp}) must equal the number of stages of each replica ({pp})")
        reps = tuple(
            HeteroDims.from_stages(
                r.stages,
                r.count,
                layout,
                job,
                f"layout.replicas[{i}].stages",
                micro_batches=r.micro_batches,
                dp_total=total,
            )
            for i, r in enumerate(layout.replicas)
        )
        return cls(reps)

    def check(self) -> ReplicaDims:
        first = self.replicas[0]
        for i, r in enumerate(self.replicas):
            field = f"layout.replicas[{i}].stages"
            r.check(field)
            if r.pp != first.pp:
                raise SpecError(
                    field, f"every replica needs the same number of stages ({r.pp} here, {first.pp} in replica 0)"
                )
            if r.stage_layers != first.stage_layers:
                raise SpecError(
                    field,
                    "every replica needs the same layers per stage (stage s of each replica holds "
                    f"the same parameters): {list(r.stage_layers)} here, {list(first.stage_layers)} in "
                    "replica 0",
                )
            if r.stage_tp != first.stage_tp:
                raise SpecError(
                    field,
                    "every replica needs the same tp per stage (their gradients are reduced shard "
                    f"by shard): {list(r.stage_tp)} here, {list(first.stage_tp)} in replica 0",
                )
        for g, used in self.gpus_by_group().items():
            if used > self.cluster[g].num_gpus:
                raise SpecError(
                    "layout.replicas",
                    f"the replicas need {used} GPUs of group {g}, the group has {self.cluster[g].num_gpus}",
                )
        t = self.training
        sequences = self.micro_batch_size * sum(r.dp * r.num_microbatches for r in self.replicas)
        if sequences != t.global_batch_size:
            raise SpecError(
                "layout.replicas",
                f"micro_batch_size * sum(count * micro_batches) = {sequences} "
                f"sequences, but global_batch_size is {t.global_batch_size}",
            )
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
            {"count": r.dp, "micro_batches": r.num_microbatches, "stages": r.as_dict()["stages"]} for r in self.replicas
        ]
        return out


@functools.lru_cache(maxsize=4096)
def _group_spans(tp: int, cp: int, ep: int, dp: int, pp: int, gpus_per_node: int) -> dict[str, tuple[int, int]]:
    """ParallelDims.group_span of every dimension (memoized: the searches ask for the same degrees many times;
    the dict is shared, not to be mutated)."""
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    strides = rank_strides(sizes)
    return {dim: (size, ranks_per_node(size, strides[dim], gpus_per_node)) for dim, size in sizes.items()}
