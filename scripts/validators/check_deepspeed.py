"""DeepSpeed harness (emitters.md 2.4): run with .venv-validators/deepspeed/bin/python (deepspeed 0.19.8, torch
2.13.0 CPU). Each case: {"id", "config": the ds_config.json dict, "world_size", "tp", "pp"} (or "dp" directly).
DeepSpeedConfig gets an mpu whose data-parallel size is world / (pp * tp), as DeepSpeed's topology makes it, and
deepspeed.comm.get_rank patched (else it silently checks the batch against world size 1). With "partition_folder"
(a bundle with deepspeed_partition.py) also DeepSpeed's PipeModelDataParallelTopology from its topology(). Facts: the
batch numbers, data-parallel size, ZeRO stage and precision DeepSpeed derived, the optimizer wrapper its engine picks
and the gradient accumulation dtype; the stage ranks and layer split."""

from __future__ import annotations

import copy
import importlib
import logging
import sys

from _harness import Rejected, serve

DS = {}


class _MPU:
    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


# DeepSpeedEngine's own methods that pick the optimizer wrapper from the parsed config (engine.py
# _do_optimizer_sanity_check and what it calls), run on _Engine below instead of a whole engine
ENGINE_METHODS = (
    "_do_optimizer_sanity_check",
    "get_data_types",
    "zero_optimization",
    "zero_optimization_stage",
    "zero_allow_untested_optimizer",
    "zero_cpu_offload",
    "zero_compute_grad_norm",
    "fp16_enabled",
    "bfloat16_enabled",
)


class _Engine:
    """The parsed config as the engine holds it (``_config``), with a pipeline or not and rank 0."""

    def __init__(self, config, pipeline: bool):
        self._config, self.pipeline_parallelism, self.global_rank = config, pipeline, 0


def setup() -> None:
    import deepspeed.comm as dscomm
    import torch
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    for name in ENGINE_METHODS:
        setattr(_Engine, name, getattr(DeepSpeedEngine, name))
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # a ZeRO-supported optimizer
    DS.update(comm=dscomm, Config=DeepSpeedConfig, adam=adam)


def optimizer_facts(cfg, pipeline: bool) -> dict:
    """The optimizer wrapper DeepSpeed's engine picks for this config (``bf16``: BF16_Optimizer,
    ``zero_optimization``, ``fp16``, ``ddp_bf16`` or None) and the gradient accumulation dtype it reads, or the
    error it raises for the mix."""
    engine = _Engine(cfg, pipeline)
    accum = str(engine.get_data_types()[1]).replace("torch.", "")
    try:
        return {"optimizer_wrapper": engine._do_optimizer_sanity_check(DS["adam"]), "grad_accum_dtype": accum}
    except (NotImplementedError, ValueError, AssertionError) as exc:
        raise Rejected(f"DeepSpeed refuses the optimizer setup: {exc}") from exc


def check(case: dict) -> dict:
    dp = case.get("dp")
    if dp is None:  # DeepSpeed's topology (PipeModelDataParallelTopology) makes dp = world / (pp * tp)
        world, tp, pp = int(case["world_size"]), int(case.get("tp", 1)), int(case.get("pp", 1))
        if world % (tp * pp):
            raise Rejected(f"world size {world} is not divisible by pp*tp = {pp}*{tp} (the pipe/data/model topology)")
        dp = world // (tp * pp)
    dscomm = DS["comm"]
    orig, dscomm.get_rank = dscomm.get_rank, (lambda *a, **k: 0)
    try:
        cfg = DS["Config"](copy.deepcopy(case["config"]), mpu=_MPU(dp))
        optimizer = optimizer_facts(cfg, int(case.get("pp", 1)) > 1)  # (the ZeRO check logs on rank 0)
    finally:
        dscomm.get_rank = orig
    bf16 = getattr(cfg, "bfloat16_config", None)
    facts = {
        "dp": dp,
        "world_size": cfg.world_size,
        "train_batch_size": cfg.train_batch_size,
        "micro_batch_size": cfg.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "zero_stage": int(cfg.zero_optimization_stage),
        "bf16": bool(getattr(bf16, "enabled", False)),
        "fp16": bool(getattr(getattr(cfg, "float16_config", None), "enabled", getattr(cfg, "fp16_enabled", False))),
        "pipeline": dict(cfg.pipeline) if isinstance(getattr(cfg, "pipeline", None), dict) else None,
    }
    facts.update(optimizer)
    if case.get("partition_folder"):
        facts.update(_partition(case["partition_folder"], int(case.get("world_size") or 0)))
    return facts


def _partition(folder: str, world: int) -> dict:
    """The emitted deepspeed_partition.py: DeepSpeed's own PipeModelDataParallelTopology from its topology() (world
    size, the global ranks of each pipeline stage: pipe is the outermost axis) and the layers its parts() give each
    stage (with the default 1 embedding spec before the transformer layers and 2 specs after)."""
    sys.modules.pop("deepspeed_partition", None)  # every bundle names its module alike: never a cached one
    importlib.invalidate_caches()
    sys.path.insert(0, folder)
    try:
        mod = importlib.import_module("deepspeed_partition")
    finally:
        sys.path.remove(folder)
    topo = mod.topology()
    pp = topo.get_dim("pipe")
    stage_ranks = [sorted(topo.get_axis_list(axis="pipe", idx=s)) for s in range(pp)]
    if world and topo.world_size() != world:
        raise Rejected(f"deepspeed_partition.topology() spans {topo.world_size()} ranks, the launch starts {world}")
    bounds = mod.parts(1, 2)
    layers = [bounds[s + 1] - bounds[s] for s in range(len(bounds) - 1)]
    layers[0] -= 1
    layers[-1] -= 2
    return {
        "topology_world": topo.world_size(),
        "topology": {a: topo.get_dim(a) for a in topo.get_axis_names()},
        "stage_ranks": [[r[0], r[-1], len(r)] for r in stage_ranks],
        "stage_layers": layers,
    }


if __name__ == "__main__":
    serve(check, setup)
