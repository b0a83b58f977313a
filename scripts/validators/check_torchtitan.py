"""torchtitan harness (emitters.md 3.4): run with .venv-validators/torchtitan/bin/python (torchtitan 0.3.0) or
.venv-validators/torchtitan-0.2/bin/python (0.2.2, TOML). Each case: {"id", "folder": the emitted bundle's folder,
"argv": the words after `-m torchtitan.train` (0.3: --module M --config F [--section.option ...]; 0.2:
--job.config_file F.toml ...), "world_size"}. Runs ConfigManager().parse_args with the folder on sys.path and as
the working directory, ParallelDims with the world size, build_mesh() on a `fake` process group, the batch rule,
and the pipeline split functions with the recipe's own FQN check. Facts: degrees, batch, grad-accum, the layers
each PP rank holds, the model's shape as torchtitan built it."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import math
import os
import sys

from _harness import Rejected, serve

TT: dict = {}
VERSION = md.version("torchtitan")
V03 = tuple(int(x) for x in VERSION.split(".")[:2]) >= (0, 3)
OUTPUT = "lm_head" if V03 else "output"  # the output module's FQN (emitters.md 3.3)


def setup() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed import pipeline_parallel as ppm
    from torchtitan.distributed.parallel_dims import ParallelDims

    TT.update(dist=dist, FakeStore=FakeStore, ConfigManager=ConfigManager, ppm=ppm, ParallelDims=ParallelDims)


SEEN_FOLDERS: set[str] = set()


def _fresh_imports(folder: str) -> None:
    """Forget the modules earlier cases imported from their bundle folders: every bundle names its modules alike
    (plan_config, plan_model), so a cached one would stand in for this case's."""
    SEEN_FOLDERS.add(os.path.abspath(folder) + os.sep)
    for name, mod in list(sys.modules.items()):
        path = os.path.abspath(getattr(mod, "__file__", None) or "/")
        if any(path.startswith(f) for f in SEEN_FOLDERS):
            del sys.modules[name]
    importlib.invalidate_caches()


def _find(d, *keys):
    """The first value under one of ``keys`` in a nested dict (depth first), else None."""
    if isinstance(d, dict):
        for k in keys:
            if d.get(k) is not None and not isinstance(d[k], (dict, list)):
                return d[k]
        for v in d.values():
            found = _find(v, *keys)
            if found is not None:
                return found
    return None


def _model_facts(model_cfg) -> dict:
    try:
        d = model_cfg.to_dict()
    except Exception:  # noqa: BLE001 - a summary only
        return {}
    layers = d.get("layers") or []
    first = layers[0] if layers else {}
    ffn = first.get("feed_forward") if isinstance(first, dict) else None
    moe_layers = [x for x in layers if isinstance(x, dict) and x.get("moe")]
    out = {
        "dim": d.get("dim"),
        "vocab_size": d.get("vocab_size"),
        "n_layers": len(layers),
        "weight_tying": d.get("enable_weight_tying"),
        "n_heads": _find(first.get("attention") if isinstance(first, dict) else None, "n_heads"),
        "n_kv_heads": _find(first.get("attention") if isinstance(first, dict) else None, "n_kv_heads"),
        "ffn_hidden": _find((ffn or {}).get("w1"), "out_features") if isinstance(ffn, dict) else None,
        "moe_layers": len(moe_layers),
    }
    if moe_layers:
        out["num_experts"] = _find(moe_layers[0]["moe"], "num_experts")
        out["top_k"] = _find(moe_layers[0]["moe"], "top_k")
    return out


def _model_layers(cfg, folder: str) -> tuple[int, object, dict]:
    """(transformer layers, model config, facts about the model) of a parsed config."""
    if V03:
        model = cfg.model_spec.model
        return len(model.layers), model, _model_facts(model)
    # 0.2.2: the model is a registered train spec's flavor (experimental.custom_import may register one, as
    # torchtitan/train.py does before it looks the spec up)
    from torchtitan.protocols import train_spec as ts

    custom = getattr(cfg.experimental, "custom_import", "")
    if custom:
        sys.path.insert(0, folder)
        try:
            importlib.import_module(custom)
        finally:
            sys.path.remove(folder)
    args = ts.get_train_spec(cfg.model.name).model_args[cfg.model.flavor]
    facts = {k: getattr(args, k, None) for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size")}
    moe = getattr(args, "moe_args", None)
    if moe is not None:
        facts["num_experts"] = getattr(moe, "num_experts", None)
        facts["top_k"] = getattr(moe, "top_k", None)
    return int(args.n_layers), args, facts


def check(case: dict) -> dict:
    dist, ppm = TT["dist"], TT["ppm"]
    folder = os.path.abspath(case["folder"])
    world = int(case["world_size"])
    _fresh_imports(folder)
    sys.path.insert(0, folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        cfg = TT["ConfigManager"]().parse_args(list(case["argv"]))
    finally:
        os.chdir(cwd)
        sys.path.remove(folder)
    p = cfg.parallelism
    if V03:
        pd = TT["ParallelDims"].from_config(p, world)
    else:
        pd = TT["ParallelDims"](
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            ep=p.expert_parallel_degree,
            etp=getattr(p, "expert_tensor_parallel_degree", 1),
            world_size=world,
        )
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=TT["FakeStore"](), rank=0, world_size=world)
    try:
        pd.build_mesh()
    finally:
        dist.destroy_process_group()
    dp = pd.dp_replicate * pd.dp_shard
    t = cfg.training
    lbs = t.local_batch_size
    gbs = t.global_batch_size if t.global_batch_size > 0 else lbs * dp
    if gbs % (lbs * dp):
        raise Rejected(f"global batch {gbs} is not divisible by local batch {lbs} * dp {dp}")
    n_layers, model_cfg, model_facts = _model_layers(cfg, folder)
    facts = {
        "version": VERSION,
        "dp_replicate": pd.dp_replicate,
        "dp_shard": pd.dp_shard,
        "cp": pd.cp,
        "tp": pd.tp,
        "pp": pd.pp,
        "ep": pd.ep,
        "local_batch_size": lbs,
        "global_batch_size": gbs,
        "grad_accum": gbs // (lbs * dp),
        "seq_len": t.seq_len,
        "pp_schedule": p.pipeline_parallel_schedule,
        "pp_microbatch_size": p.pipeline_parallel_microbatch_size,
        "n_layers": n_layers,
        "activation_checkpoint": _ac_mode(cfg),
        "model": model_facts,
    }
    if pd.pp > 1:
        if lbs % p.pipeline_parallel_microbatch_size:
            raise Rejected(
                f"local batch {lbs} is not divisible by the pipeline micro-batch {p.pipeline_parallel_microbatch_size}"
            )
        if V03:
            nvs, nl, iw, ow = ppm._get_pipeline_metadata(pd, p, model_cfg)
        else:
            nvs, nl, iw, ow = _metadata_02(pd, p, n_layers)
        gen = ppm._generate_llm_fqn_per_model_part if V03 else ppm.generate_llm_fqn_per_model_part
        stages = p.module_fqns_per_model_part or gen(nvs, nl, iw, ow)
        allowed = set(sum(gen(1, nl), []))
        flat = sum(stages, [])
        if set(flat) != allowed or len(flat) != len(allowed):
            extra = sorted(set(flat) - allowed)
            missing = sorted(allowed - set(flat))
            dup = sorted({x for x in flat if flat.count(x) > 1})
            raise Rejected(
                f"module_fqns_per_model_part does not name every module once: unknown {extra[:6]}, "
                f"missing {missing[:6]}, repeated {dup[:6]} (the output module is '{OUTPUT}' in {VERSION})"
            )
        if len(stages) % pd.pp:
            raise Rejected(f"{len(stages)} model parts are not divisible by pp {pd.pp}")
        owner = [_stage_indices(r, pd.pp, p.pipeline_parallel_schedule, len(stages)) for r in range(pd.pp)]
        per_part = [sum(1 for m in part if m.startswith("layers.")) for part in stages]
        facts["stage_layers"] = [sum(per_part[i] for i in idx) for idx in owner]
        facts["parts_per_rank"] = len(stages) // pd.pp
        facts["part_layers"] = per_part
        facts["owner"] = [list(idx) for idx in owner]
        facts["n_microbatches"] = math.ceil(lbs / p.pipeline_parallel_microbatch_size)
    else:
        facts["stage_layers"] = [n_layers]
    return facts


def _stage_indices(rank: int, pp: int, schedule: str, num_stages: int) -> tuple[int, ...]:
    """The model parts PP rank ``rank`` holds (0.2.2 computes it inside pipeline_module_split: same rule)."""
    ppm = TT["ppm"]
    if V03:
        return ppm._get_pp_rank_to_stage_indices_mapping(rank, pp, schedule, num_stages)
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV, ScheduleZBVZeroBubble, get_schedule_class

    per_rank = num_stages // pp
    if get_schedule_class(schedule) in (ScheduleZBVZeroBubble, ScheduleDualPipeV):
        if per_rank != 2:
            raise ValueError(f"v schedules assume 2 stages per rank, got {per_rank}")
        return tuple(list(zip(range(pp), range(num_stages - 1, pp - 1, -1)))[rank])
    return tuple(rank + s * pp for s in range(per_rank))


def _metadata_02(pd, p, n_layers):
    """0.2.2 has no _get_pipeline_metadata: the same computation as pipeline_llm there."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    single = issubclass(get_schedule_class(p.pipeline_parallel_schedule), PipelineScheduleSingle)
    iw = getattr(p, "pipeline_parallel_first_stage_less_layers", 1)
    ow = getattr(p, "pipeline_parallel_last_stage_less_layers", 1)
    lps = p.pipeline_parallel_layers_per_stage
    if lps is not None:
        nvs = math.ceil((n_layers + iw + ow) / lps)
        if nvs % pd.pp:
            raise ValueError(f"Number of virtual stages ({nvs}) must be divisible by pipeline parallel size ({pd.pp})")
        per_rank = nvs // pd.pp
        if single and per_rank != 1:
            raise ValueError(f"Single stage schedule requires exactly 1 stage per rank, got {per_rank}")
        if not single and per_rank < 2:
            raise ValueError(f"Multi-stage schedule requires at least 2 stages per rank, got {per_rank}")
    else:
        nvs = pd.pp * (1 if single else 2)
    return nvs, n_layers, iw, ow


def _ac_mode(cfg) -> str:
    ac = getattr(cfg, "activation_checkpoint", None)
    if ac is None:
        return "none"
    mode = getattr(ac, "mode", None)  # 0.2.2
    if mode is not None:
        opt = getattr(ac, "selective_ac_option", None)
        return f"{mode}:{opt}" if mode == "selective" and opt else str(mode)
    name = type(ac).__qualname__.split(".")[0]  # 0.3.0: FullAC.Config, SelectiveAC.Config, ...
    return {"FullAC": "full", "SelectiveAC": "selective", "MemoryBudgetAC": "memory_budget"}.get(name, name)


if __name__ == "__main__":
    serve(check, setup)
