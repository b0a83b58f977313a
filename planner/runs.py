"""Measured training runs (the format of shared/reference/measured-runs.yaml) -> jobs to predict + what was measured.

A run the planner cannot express becomes a ``Skipped`` with the reason; nothing is dropped silently.
Where a source leaves a setting unstated, the reader fills the framework's documented default and records it in
``assumed`` so the report can show it:
- ffn_hidden -> 4*hidden (GPT/Megatron default); kv_heads -> heads (MHA); cp, ep, vpp -> 1; micro_batch -> 1;
- sequence parallelism -> on when tp > 1 (Megatron-Core default practice);
- recompute -> the least of none/selective/full with which the layout fits in memory;
- attention kernel -> flash when the architecture or framework names a fused kernel (flash, Megatron-Core),
  else the materialized softmax of pre-2022 Megatron/DeepSpeed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.cost import flops as F
from planner.errors import SpecError
from planner.spec import Job, Layout, ModelSpec


@dataclass
class Measured:
    iteration_time_s: float | None
    time_source: str
    memory_gib: float | None
    oom: bool


@dataclass
class RunCase:
    id: str
    job: Job
    layout_choices: list[Layout]  # first that fits is the run's layout (unstated recompute)
    measured: Measured
    assumed: list[str] = field(default_factory=list)


@dataclass
class Skipped:
    id: str
    reason: str


def load_runs(path: str | Path) -> list[RunCase | Skipped]:
    from planner.io import load_yaml

    raw = load_yaml(path, field="runs")
    if not isinstance(raw, list):
        raise SpecError("runs", f"expected a YAML list of runs, got {type(raw).__name__}")
    out: list[RunCase | Skipped] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise SpecError(f"runs[{i}]", f"expected a mapping, got {type(entry).__name__}")
        run_id = str(entry.get("id") or f"run-{i}")
        if run_id in seen:
            raise SpecError(f"runs[{i}].id", f"duplicated run id '{run_id}'")
        seen.add(run_id)
        try:
            out.append(_read_run(run_id, entry))
        except _Skip as skip:
            out.append(Skipped(run_id, str(skip)))
    return out


class _Skip(Exception):
    pass


def _need(section: dict, key: str, where: str):
    value = section.get(key)
    if value is None:
        raise _Skip(f"{where}.{key} is not stated")
    return value


def _text(*values) -> str:
    return " ".join(str(v) for v in values if v is not None).lower()


def _read_run(run_id: str, e: dict[str, Any]) -> RunCase:
    from planner.catalog import resolve_gpu
    from planner.spec import parse_job

    model_s = e.get("model") or {}
    hw = e.get("hardware") or {}
    par = e.get("parallel") or {}
    meas = e.get("measured") or {}
    for name, sec in (("model", model_s), ("hardware", hw), ("parallel", par), ("measured", meas)):
        if not isinstance(sec, dict):
            raise _Skip(f"{name} is not a mapping")
    assumed: list[str] = []

    # ---- model
    hidden = int(_need(model_s, "hidden", "model"))
    heads = int(_need(model_s, "heads", "model"))
    arch = _text(model_s.get("arch"), par.get("framework"))
    ffn = model_s.get("ffn_hidden")
    if ffn is None:
        ffn = 4 * hidden
        assumed.append("ffn_hidden=4*hidden")
    kv = model_s.get("kv_heads")
    if kv is None:
        kv = heads
        assumed.append("kv_heads=heads")
    mlp = "swiglu" if ("swiglu" in arch or "geglu" in arch) else ("relu" if "relu" in arch else "gelu")
    model = {
        "name": str(model_s.get("name") or run_id),
        "num_layers": int(_need(model_s, "layers", "model")), "hidden_size": hidden,
        "ffn_hidden_size": int(ffn), "num_attention_heads": heads, "num_kv_heads": int(kv),
        "vocab_size": int(_need(model_s, "vocab", "model")), "mlp": mlp,
        "tie_embeddings": "untied" not in arch,
        "dropout": "gpt" in arch and "mpt" not in arch,  # Megatron GPT defaults: hidden/attention dropout 0.1
    }
    if model_s.get("num_experts"):
        model["moe"] = {
            "num_experts": int(model_s["num_experts"]), "top_k": int(_need(model_s, "top_k", "model")),
            "expert_ffn_hidden_size": int(model_s.get("expert_ffn_hidden") or ffn),
            "shared_experts": int(model_s.get("shared_experts") or 0),
        }

    # ---- hardware: catalog name, else the catalog GPU with the same memory and 16-bit peak
    gpu_name = str(_need(hw, "gpu", "hardware"))
    try:
        gpu = resolve_gpu(gpu_name)
    except SpecError:
        gpu = _match_gpu(hw)
        if gpu is None:
            raise _Skip(f"GPU '{gpu_name}' is not in the catalog and no catalog GPU has its memory and peak")
        assumed.append(f"gpu={gpu.name}")
    n_gpus = int(_need(hw, "n_gpus", "hardware"))
    gpn = int(hw.get("gpus_per_node") or gpu.gpus_per_node)
    if n_gpus % gpn:
        gpn = 1 if n_gpus < gpn else gpn
    group = {"gpu": gpu.model_dump(), "nodes": max(1, n_gpus // gpn), "gpus_per_node": min(gpn, n_gpus)}
    nic = _nic_gbps(hw.get("interconnect"), gpn)
    if nic:
        group["inter_node_gbps"] = nic

    # ---- training
    prec_text = _text(par.get("precision"))
    precision = "fp8" if "fp8" in prec_text else ("fp16" if "fp16" in prec_text or "mixed 16" in prec_text else "bf16")
    seq = int(_need(model_s, "seq_len", "model"))
    gbs = int(_need(par, "global_batch", "parallel"))
    flash = "flash" in arch or "megatron-core" in arch or bool(par.get("flash_attention"))
    training = {"seq_length": seq, "global_batch_size": gbs, "precision": precision,
                "attention": "flash" if flash else "eager"}
    if "fp32 grad accumulation" in prec_text and "bf16" in prec_text:
        training["grad_dtype"] = "bf16+fp32"  # DeepSpeed BF16_Optimizer

    # ---- layout
    tp = par.get("tp")
    pp = par.get("pp")
    if tp is None or pp is None:
        raise _Skip("parallel.tp/pp are not stated")
    tp, pp = int(tp), int(pp)
    cp = int(par.get("cp") or 1)
    dp = par.get("dp")
    dp = int(dp) if dp is not None else n_gpus // (tp * pp * cp)
    vpp = par.get("vpp")
    if vpp is None:
        vpp = 1
        assumed.append("vpp=1")
    mbs = par.get("micro_batch")
    if mbs is None:
        mbs = 1
        assumed.append("micro_batch=1")
    sp = par.get("sp")
    if sp is None:
        sp = tp > 1
        assumed.append(f"sp={str(sp).lower()}")
    zero_text = _text(par.get("zero"), par.get("fsdp_sharding_strategy"))
    if "full_shard" in zero_text or "fsdp" in zero_text or zero_text.strip() == "3":
        zero = 3
    elif "shard_grad_op" in zero_text or zero_text.strip() == "2":
        zero = 2
    elif zero_text.strip() == "1" or par.get("distributed_optimizer") or "overlap-param-gather" in _text(par.get("overlap")):
        zero = 1  # --overlap-param-gather only exists with Megatron's distributed optimizer
    else:
        zero = 0
    layout = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": int(par.get("ep") or 1), "vpp": int(vpp),
              "micro_batch_size": int(mbs), "sequence_parallel": bool(sp), "zero_stage": zero,
              "tp_comm_overlap": "tp-comm-overlap" in _text(par.get("overlap"))}
    from planner.parallel import balanced_split

    partition = _text(par.get("pp_partition"))
    uneven = model["num_layers"] % pp != 0
    if pp > 1 and ("embedding" in partition or (uneven and "deepspeed" in arch)):
        # DeepSpeed "type:transformer|embedding": both embeddings take a pipeline slot of their own.
        slots = balanced_split(model["num_layers"] + 2, pp)
        slots[0] -= 1
        slots[-1] -= 1
        layout["stages"] = [{"layers": n} for n in slots]
        if not partition:
            assumed.append("pp_partition=type:transformer|embedding")
    elif uneven:
        layout["stages"] = [{"layers": n} for n in balanced_split(model["num_layers"], pp)]
        assumed.append("pp_partition=balanced")
    rc = _text(par.get("recompute"))
    if rc.startswith(("full", "yes", "true")):
        choices = ["full"]
    elif rc.startswith("selective"):
        choices = ["selective"]
    elif rc.startswith(("none", "no", "false")):
        choices = ["none"]
    elif "full activation checkpointing" in _text(e.get("notes")) or "counts recompute" in _text(meas.get("tflops_definition")) \
            or "hardware" in _text(meas.get("tflops_definition")):
        # The source's notes name full checkpointing, or its hardware-FLOP count includes the recompute pass.
        choices = ["full"]
        assumed.append("recompute=full (from notes / hardware-FLOP convention)")
    else:
        choices = ["none", "selective", "full"]
        assumed.append("recompute=least that fits")

    raw_job = {"model": model, "cluster": [group], "training": training, "layout": {**layout, "recompute": choices[0]}}
    try:
        job = parse_job(raw_job)
    except SpecError as exc:
        raise _Skip(f"cannot express the run: {exc.field}: {exc.message}")
    layouts = [Layout.model_validate({**layout, "recompute": c}) for c in choices]
    return RunCase(run_id, job, layouts, _measured(e, job, meas, par), assumed)


def _match_gpu(hw: dict):
    from planner.catalog import _catalog, resolve_gpu

    mem, peak = hw.get("mem_gb"), hw.get("peak_tflops_16bit")
    if mem is None or peak is None:
        return None
    for name in sorted({e["name"] for e in _catalog("gpus").values()}):
        g = resolve_gpu(name)
        if abs(g.memory_gib - float(mem)) < 1 and abs(g.peak_tflops_bf16 - float(peak)) < 0.01 * float(peak):
            return g
    return None


def _nic_gbps(interconnect: Any, gpus_per_node: int) -> float | None:
    """Per-GPU NIC rate when the interconnect text states a fabric different from the catalog's typical one:
    Omni-Path (100 Gb/s per link) with N links per node."""
    text = _text(interconnect)
    m = re.search(r"(\d+)\s*(?:x\s*)?(?:opa|omni-path)?\s*links? per node", text)
    if "omni-path" in text and m:
        return int(m.group(1)) * 100.0 / gpus_per_node
    return None


def _measured(e: dict, job: Job, meas: dict, par: dict) -> Measured:
    """Iteration time from what the source measured, converting with the source's own FLOP convention."""
    t, m = job.training, job.model
    n = job.num_gpus
    tokens = t.global_batch_size * t.seq_length
    time, src = None, ""
    defn = _text(meas.get("tflops_definition"), meas.get("mfu_definition"))
    if meas.get("iteration_time_s"):
        time, src = float(meas["iteration_time_s"]), "iteration_time_s"
    elif meas.get("tokens_per_s"):
        time, src = tokens / float(meas["tokens_per_s"]), "tokens_per_s"
    elif meas.get("tokens_per_s_per_gpu"):
        time, src = tokens / (float(meas["tokens_per_s_per_gpu"]) * n), "tokens_per_s_per_gpu"
    elif meas.get("tflops_per_gpu") and "not stated" not in defn:
        x = float(meas["tflops_per_gpu"]) * 1e12 * n
        if "eq.3" in defn or "hardware" in defn or "4*2" in defn:
            time, src = F.narayanan_hardware_flops(m, t.seq_length, t.global_batch_size) / x, "tflops_per_gpu (Narayanan Eq. 3)"
        elif e.get("source_group") == "megatron-lm-h100" or "megatron" in defn:
            time, src = F.model_flops_per_iteration(m, t.seq_length, t.global_batch_size) / x, "tflops_per_gpu (Megatron model FLOPs)"
    elif meas.get("mfu") and "palm" in defn:
        peak = float((e.get("hardware") or {}).get("peak_tflops_16bit") or job.cluster[0].gpu.peak_tflops_bf16)
        time = F.palm_flops_per_token(m, t.seq_length) * tokens / (float(meas["mfu"]) * peak * 1e12 * n)
        src = "mfu (PaLM)"
    mem = meas.get("memory_gb")
    return Measured(time, src, float(mem) if mem is not None else None, bool(meas.get("oom")))
