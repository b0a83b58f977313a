"""`planner list gpus|models|frameworks`: the presets a job can name, with the numbers the cost model uses."""

from __future__ import annotations

from rich.table import Table

from planner.catalog import aliases, gpu_names, model_names, resolve_gpu, resolve_model
from planner.cost.flops import active_params_per_token, embedding_params, total_params
from planner.frameworks import FRAMEWORKS

LISTS = ("gpus", "models", "frameworks")


def catalog_rows(kind: str) -> list[dict]:
    """One row per preset: its name, aliases and key numbers (also the `--json` output)."""
    if kind == "gpus":
        return [_gpu_row(name) for name in gpu_names()]
    if kind == "models":
        return [_model_row(name) for name in model_names()]
    return [_framework_row(fw) for _, fw in sorted(FRAMEWORKS.items())]


def render_catalog(kind: str, rows: list[dict]) -> Table:
    columns = {
        "gpus": [
            ("name", "name"),
            ("memory_gib", "memory GiB"),
            ("peak_tflops_bf16", "BF16 TFLOP/s"),
            ("peak_tflops_fp8", "FP8 TFLOP/s"),
            ("hbm_tbps", "HBM TB/s"),
            ("intra_node_gbps", "NVLink GB/s"),
            ("inter_node_gbps", "NIC Gb/s"),
            ("gpus_per_node", "GPUs/node"),
            ("aliases", "aliases"),
        ],
        "models": [
            ("name", "name"),
            ("params_b", "params B"),
            ("active_params_b", "active B"),
            ("num_layers", "layers"),
            ("hidden_size", "hidden"),
            ("heads", "heads (kv)"),
            ("ffn_hidden_size", "FFN"),
            ("vocab_size", "vocab"),
            ("experts", "experts (top-k)"),
            ("aliases", "aliases"),
        ],
        "frameworks": [
            ("name", "name"),
            ("per_stage_tp", "per-stage TP"),
            ("uneven_layers", "uneven layers"),
            ("per_stage_recompute", "per-stage recompute"),
            ("partial_recompute", "partial recompute"),
            ("zero_with_pp", "ZeRO with PP"),
            ("zero_without_pp", "ZeRO without PP"),
            ("interleaving", "interleaving"),
            ("context_parallel", "CP"),
            ("expert_parallel", "EP"),
        ],
    }[kind]
    table = Table(title=f"{kind} ({len(rows)})", title_justify="left")
    for key, head in columns:
        table.add_column(head, justify="left" if key in ("name", "aliases", "heads", "experts") else "right")
    for row in rows:
        table.add_row(*(_cell(row.get(key)) for key, _ in columns))
    return table


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _gpu_row(name: str) -> dict:
    g = resolve_gpu(name)
    return {
        "name": g.name,
        "memory_gib": g.memory_gib,
        "peak_tflops_bf16": g.peak_tflops_bf16,
        "peak_tflops_fp8": g.peak_tflops_fp8,
        "hbm_tbps": g.hbm_tbps,
        "intra_node_gbps": g.intra_node_gbps,
        "inter_node_gbps": g.inter_node_gbps,
        "gpus_per_node": g.gpus_per_node,
        "aliases": aliases("gpus", name),
        "source": g.source,
    }


def _model_row(name: str) -> dict:
    m = resolve_model(name)
    total = total_params(m)
    active = active_params_per_token(m) + embedding_params(m) * (1 if m.tie_embeddings else 2)
    return {
        "name": m.name,
        "params_b": round(total / 1e9, 2),
        "active_params_b": round(active / 1e9, 2) if m.moe else None,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "heads": f"{m.num_attention_heads} ({m.kv_heads})",
        "ffn_hidden_size": m.ffn_hidden_size,
        "vocab_size": m.vocab_size,
        "experts": f"{m.moe.num_experts} (top-{m.moe.top_k})" if m.moe else None,
        "aliases": aliases("models", name),
        "source": m.source,
    }


def _framework_row(fw) -> dict:
    return {
        "name": fw.name,
        "per_stage_tp": fw.per_stage_tp,
        "uneven_layers": fw.uneven_layers,
        "per_stage_recompute": fw.per_stage_recompute,
        "partial_recompute": fw.partial_recompute,
        "zero_with_pp": sorted(fw.zero_with_pp),
        "zero_without_pp": sorted(fw.zero_without_pp),
        "interleaving": fw.interleaving,
        "context_parallel": fw.context_parallel,
        "expert_parallel": fw.expert_parallel,
        "fsdp_with_ep": fw.fsdp_with_ep,
        # gradient buffers (Training.grad_dtype) it runs, the one it takes unless the job says first
        "gradients": [fw.grad_dtype] + sorted(fw.grad_dtypes - {fw.grad_dtype}),
        "fp32_accumulation_zero": sorted(fw.fp32_accumulation_zero),
    }
