"""One plan of a plan JSON (`planner plan --json`) as what a launch needs: the resolved job, one global parallel
shape, the layer split, the recompute setting, and which node group each pipeline stage and each node sits on.

A plan JSON carries the resolved job, so a plan file is enough on its own. ``LaunchPlan.of`` reads one plan of it
(``--plan-rank K``, 1 = the best) and refuses, with exit code 4 (errors.Inexpressible), what one global shape cannot
express: per-stage TP, replicas that differ in micro-batch count or shape, per-stage recompute counts (stock
frameworks take one count for all stages). Every framework emitter (planner/emit/<framework>.py) reads only this.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass
from typing import Any

from planner.cost.estimate import SCHEMA_VERSION as PLAN_SCHEMA_VERSION
from planner.errors import Inexpressible, SpecError
from planner.load import parse_job
from planner.spec import Job


@dataclass(frozen=True)
class StagePlacement:
    """Where pipeline stage ``stage`` runs: node group ``group`` (its GPU type ``gpu``), nodes ``first_node`` to
    ``last_node`` of that group, global ranks ``first_rank`` to ``last_rank``."""

    stage: int
    replica: int  # data-parallel replica of a replica layout (0 otherwise)
    group: int
    gpu: str
    first_node: int
    last_node: int
    first_rank: int
    last_rank: int


@dataclass(frozen=True)
class LaunchPlan:
    """A plan with one parallel shape for every stage (what Megatron-LM, DeepSpeed and torchtitan run)."""

    job: Job
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    micro_batch_size: int
    num_microbatches: int  # micro-batches per DP rank per iteration: global batch / (micro-batch * dp)
    sequence_parallel: bool
    zero_stage: int  # 0 none, 1 optimizer states, 2 + gradients, 3 + weights (FSDP)
    recompute: str  # baseline of every layer: none | selective | full
    recompute_layers: int  # layers of every stage fully recomputed on top of the baseline (all of them for "full")
    stage_layers: tuple[int, ...]
    tp_comm_overlap: bool
    stages: tuple[StagePlacement, ...]  # by stage, then replica
    gpus_per_node: int | None  # None: node groups with different GPUs per node (see node_gpus)
    world_size: int
    plan_rank: int  # 1 = the best plan of the file
    predicted: dict[str, Any]  # iteration_time_s, peak_memory_gib, tokens_per_s, mfu of the plan's estimate

    # ------------------------------------------------------------------ derived
    @property
    def model(self):
        return self.job.model

    @property
    def training(self):
        return self.job.training

    @property
    def global_batch_size(self) -> int:
        return self.job.training.global_batch_size

    @property
    def mixed(self) -> bool:
        """Stages (or replicas) on more than one node group (GPU type)."""
        return len({s.group for s in self.stages}) > 1

    def stage_group(self, stage: int) -> int:
        """The node group of pipeline stage ``stage`` (of its first replica)."""
        return next(s.group for s in self.stages if s.stage == stage)

    @property
    def even_split(self) -> bool:
        return len(set(self.stage_layers)) == 1

    @property
    def nodes(self) -> int:
        """Nodes the plan runs on (idle nodes of the cluster not counted)."""
        return len(self.node_order())

    def node_gpus(self) -> list[int]:
        """GPUs the plan uses on each node, in launch order: the node's share of the stages it hosts (a stage fills
        its nodes in order, at most the group's gpus_per_node each), so a node the plan only partly uses starts
        only as many processes as it has ranks."""
        used: dict[tuple[int, int], int] = {}
        for s in self.stages:
            left = s.last_rank - s.first_rank + 1
            per_node = self.job.cluster[s.group].gpus_per_node
            for node in range(s.first_node, s.last_node + 1):
                room = per_node - used.get((s.group, node), 0)
                take = min(left, room)
                used[(s.group, node)] = used.get((s.group, node), 0) + take
                left -= take
        return [used[key] for key in self.node_order()]

    def node_of_rank(self, rank: int) -> int:
        """The node rank (launch order) that holds global rank ``rank``: nodes take consecutive ranks."""
        ends = self._rank_ends
        node = bisect.bisect_right(ends, rank)
        if node >= len(ends):
            raise ValueError(f"rank {rank} beyond the plan's {ends[-1] if ends else 0} GPUs")
        return node

    @functools.cached_property
    def _rank_ends(self) -> list[int]:
        """One past the last global rank of each node, in launch order."""
        return list(itertools.accumulate(self.node_gpus()))

    def chunk_layers(self) -> list[int]:
        """Layers of each model chunk in Megatron's virtual-stage order (index = vpp_rank * pp + pp_rank): stage i
        holds vpp chunks of stage_layers[i] / vpp layers each."""
        return [self.stage_layers[r] // self.vpp for _ in range(self.vpp) for r in range(self.pp)]

    def node_order(self) -> list[tuple[int, int]]:
        """(node group, node index within the group) of every node in launch order (node rank 0 first): the stages'
        nodes in pipeline order, PP being the outermost rank dimension."""
        order = dict.fromkeys((s.group, node) for s in self.stages for node in range(s.first_node, s.last_node + 1))
        return list(order)

    # ------------------------------------------------------------------ reading a plan JSON
    @classmethod
    def of(cls, doc: dict, plan_rank: int = 1, framework: str = "megatron") -> LaunchPlan:
        """The plan ranked ``plan_rank`` (1-based) of a plan JSON document, for ``framework`` (named in the
        refusals)."""
        if not isinstance(doc, dict) or "plans" not in doc or "job" not in doc:
            raise SpecError("plan", "not a plan JSON (no `plans` and `job`); write one with `planner plan JOB --out`")
        if doc.get("schema_version") != PLAN_SCHEMA_VERSION:
            raise SpecError(
                "plan.schema_version",
                f"{doc.get('schema_version')!r} is not {PLAN_SCHEMA_VERSION}; re-plan with this planner version",
            )
        try:
            return cls._read(doc, plan_rank, framework)
        except (KeyError, TypeError, IndexError) as exc:
            raise SpecError("plan", f"not a complete plan JSON ({type(exc).__name__}: {exc})") from None

    @classmethod
    def _read(cls, doc: dict, plan_rank: int, framework: str) -> LaunchPlan:
        plans = doc["plans"]
        if not 1 <= plan_rank <= len(plans):
            raise SpecError("--plan-rank", f"{plan_rank} is not between 1 and {len(plans)} (the plans in the file)")
        plan = plans[plan_rank - 1]
        field = f"plans[{plan_rank - 1}].layout"
        job = parse_job(doc["job"])
        lay = plan["layout"]
        if lay.get("replicas"):
            lay = _replicas_as_one_shape(lay, field, framework)
        stages = lay["stages"]
        tps = {s.get("tp", lay["tp"]) for s in stages}
        if len(tps) > 1:
            raise Inexpressible(
                f"{field}.stages",
                f"stages use different TP degrees ({', '.join(map(str, sorted(tps)))}); stock frameworks run one TP "
                f"degree on every stage: re-plan with `planner plan JOB --framework {framework}`",
            )
        rec = [s.get("recompute_layers") for s in stages]
        if lay["recompute"] == "full":
            recompute_layers = max(s["layers"] for s in stages)
        elif any(r is not None for r in rec):
            counts = {r or 0 for r in rec}
            if len(counts) > 1:
                raise Inexpressible(
                    f"{field}.stages",
                    f"stages recompute different numbers of layers ({', '.join(map(str, sorted(counts)))}); stock "
                    "frameworks take one count for all stages: re-plan with "
                    f"`planner plan JOB --framework {framework}`",
                )
            recompute_layers = counts.pop()
        else:
            recompute_layers = 0
        placement = plan["placement"]
        placed = sorted(
            (
                StagePlacement(
                    s["stage"],
                    s.get("replica", 0),
                    s["group"],
                    s["gpu"],
                    s["first_node"],
                    s["last_node"],
                    s["first_rank"],
                    s["last_rank"],
                )
                for s in placement["stages"]
            ),
            key=lambda s: (s.stage, s.replica),
        )
        est = plan.get("estimate") or {}
        mb = lay.get("num_microbatches") or job.training.global_batch_size // (lay["micro_batch_size"] * lay["dp"])
        return cls(
            job=job,
            tp=tps.pop(),
            pp=lay["pp"],
            dp=lay["dp"],
            cp=lay["cp"],
            ep=lay["ep"],
            vpp=lay["vpp"],
            micro_batch_size=lay["micro_batch_size"],
            num_microbatches=mb,
            sequence_parallel=bool(lay["sequence_parallel"]),
            zero_stage=lay["zero_stage"],
            recompute=lay["recompute"],
            recompute_layers=recompute_layers,
            stage_layers=tuple(s["layers"] for s in stages),
            tp_comm_overlap=bool(lay.get("tp_comm_overlap", False)),
            stages=tuple(placed),
            gpus_per_node=placement["gpus_per_node"],
            world_size=placement["world_size"],
            plan_rank=plan_rank,
            predicted={k: est.get(k) for k in ("iteration_time_s", "peak_memory_gib", "tokens_per_s", "mfu")},
        )


def _replicas_as_one_shape(lay: dict, field: str, framework: str) -> dict:
    """A replica layout whose replicas all run the same pipeline shape and micro-batch count is plain data
    parallelism; anything else is not expressible in one global shape."""
    reps = lay["replicas"]
    counts = {r["micro_batches"] for r in reps}
    if len(counts) > 1:
        raise Inexpressible(
            f"{field}.replicas",
            f"replicas run different micro-batch counts per iteration ({', '.join(map(str, sorted(counts)))}); stock "
            f"frameworks give every DP rank the same count: re-plan with `planner plan JOB --framework {framework}`",
        )
    shapes = {tuple((s["layers"], s["tp"]) for s in r["stages"]) for r in reps}
    if len(shapes) > 1:
        raise Inexpressible(
            f"{field}.replicas",
            "replicas differ in stage split or TP; stock frameworks run one shape: re-plan with "
            f"`planner plan JOB --framework {framework}`",
        )
    return {**lay, "stages": reps[0]["stages"], "num_microbatches": counts.pop(), "replicas": None}
