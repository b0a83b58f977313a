"""Per-layer fidelity of the analytic cost model on real GPUs: Sailor's measured per-layer forward and backward
times against the analytic layer time of the same model shape, GPU, micro-batch and TP degree.

    python scripts/layer_fidelity.py [--layer-profiles DIR] [--fp32] [--gpu-map SAILOR=CATALOG ...]

Needs the shared per-layer profiles (format: DIR/README.md, section 2); the default DIR is
../shared/reference/layer-profiles, next to the repository. Reads DIR/sailor/profiles/<model>/<gpu>/profile.json
({mbs: {tp: {layer: [fwd_s, bwd_s, update_s]}}}) and keeps layer "2", a steady-state transformer layer. No search:
about 1 s for the 16 shared files.

The analytic time is `cost_source(job)(0).layer(...)` (planner/cost/provider.py) for a job of the profile's model
shape (Sailor's profile_all.py dimensions, DIR/README.md section 2) on the catalog GPU Sailor's GPU name maps to,
with eager attention, no recompute and no sequence parallelism, as Sailor ran. GPUs the catalog lacks are skipped
and listed; --gpu-map NAME=CATALOG prices one with a catalog GPU of your choice (e.g. GH-96=h100-sxm).

Read the errors knowing what was measured: Sailor trained with fp32 parameters (TF32 matmuls inferred on A100 and
GH200; fp32 on V100) while the planner prices 16-bit training, and at TP > 1 Sailor's layer times include the TP
all-reduces, which the analytic layer time leaves to the communication model. --fp32 prices the GPUs as Sailor
trained (GEMMs at the TF32/FP32 tensor rate, element-wise traffic at 4 bytes: FP32_TFLOPS, as_fp32) to separate the
precision gap from the model's structure. Error % = analytic / measured - 1: positive when the analytic model is
too slow, negative when too fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import SHARED_RUNS, fail, run, shown  # noqa: E402

from planner.cost.provider import cost_source  # noqa: E402
from planner.load import parse_job  # noqa: E402

DEFAULT_DIR = SHARED_RUNS.parent / "layer-profiles"
LAYER = "2"  # Sailor's steady-state transformer layer (0 embedding, 1 the first layer, N+1.. the head)

# Sailor's profile_all.py shapes (DIR/README.md section 2, verified there against llm_info.json parameter counts):
# name -> (layers, hidden, heads, FFN, MLP, sequence length). LLAMA-3-8 is Sailor's 16h^2 layer (MHA, 3-matrix
# FFN of 4h), not the real Llama-3-8B one.
SAILOR_MODELS = {
    "OPT-350": (24, 1024, 16, 4096, "gelu", 2048),
    "GPT-Neo-2.7": (32, 2560, 20, 10240, "gelu", 2048),
    "OPT-30": (48, 7168, 56, 28672, "gelu", 2048),
    "LLAMA-3-8": (32, 4096, 32, 16384, "swiglu", 8192),
}

# Sailor GPU name -> catalog GPU (planner/data/gpus.yaml). V100-16 is the catalog's own 16 GB V100 variant
# (gpus.yaml `ambiguous: v100`); timing does not depend on memory size.
SAILOR_GPUS: dict[str, object] = {
    "A100-40": "a100-40gb",
    "A100-80": "a100-80gb",
    "V100-16": {"base": "v100-32gb", "memory_gib": 16},
}

# --fp32: dense fp32-input tensor rate (TFLOP/s, no sparsity) per catalog GPU, from the NVIDIA datasheets:
# A100 TF32 156, H100/H200 SXM TF32 494.7; V100 has no TF32: FP32 15.7.
FP32_TFLOPS = {"a100-40gb": 156.0, "a100-80gb": 156.0, "h100-sxm": 494.7, "h200": 494.7, "v100-32gb": 15.7}


def sailor_rows(root: Path) -> list[dict]:
    """Every (model, GPU, micro-batch, TP) of Sailor's profiles: the measured forward and backward seconds."""
    rows = []
    for path in sorted(root.glob("*/*/profile.json")):
        model, gpu = path.parent.parent.name, path.parent.name
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            fail("--layer-profiles", f"cannot read {path}: {exc}")
        for mbs, by_tp in data.items():
            for tp, layers in by_tp.items():
                row = layers.get(LAYER)
                if not row or len(row) < 2 or row[0] <= 0:
                    continue
                rows.append({"model": model, "gpu": gpu, "mbs": int(mbs), "tp": int(tp), "fwd": row[0], "bwd": row[1]})
    rows.sort(key=lambda r: (r["gpu"], r["model"], r["tp"], r["mbs"]))
    return rows


def as_fp32(gpu) -> dict:
    """``gpu`` (a catalog name or inline mapping) priced as fp32 training: its GEMM rate scaled to the TF32/FP32
    tensor rate (FP32_TFLOPS), its HBM bandwidth halved (4-byte element-wise tensors instead of 2-byte)."""
    from planner.catalog import resolve_gpu

    spec = resolve_gpu(gpu)
    base = (gpu.get("base") if isinstance(gpu, dict) else gpu) or spec.name
    fp32 = FP32_TFLOPS.get(resolve_gpu(base).name)
    if fp32 is None:
        fail("--fp32", f"no TF32/FP32 rate known for {spec.name}; known: {', '.join(sorted(FP32_TFLOPS))}")
    scale = fp32 / spec.peak_tflops_bf16
    out = spec.model_dump()
    out.update(
        peak_tflops_bf16=fp32,
        peak_tflops_fp16=fp32,
        matmul_tflops_bf16=spec.matmul_tflops_bf16 * scale if spec.matmul_tflops_bf16 else None,
        attention_tflops_bf16=None,
        hbm_tbps=spec.hbm_tbps / 2,
    )
    return out


def analytic_layer(model_name: str, gpu, mbs: int, tp: int, cache: dict) -> tuple[float, float]:
    layers, h, heads, ffn, mlp, seq = SAILOR_MODELS[model_name]
    key = (model_name, json.dumps(gpu, sort_keys=True), tp)
    costs = cache.get(key)
    if costs is None:
        raw = {
            "model": {"name": model_name, "num_layers": layers, "hidden_size": h, "num_attention_heads": heads,
                      "ffn_hidden_size": ffn, "mlp": mlp, "vocab_size": 50304},
            "cluster": [{"gpu": gpu, "nodes": 1, "gpus_per_node": max(8, tp)}],
            "training": {"seq_length": seq, "global_batch_size": 8, "precision": "bf16", "attention": "eager"},
        }  # fmt: skip
        job = parse_job(raw)
        costs = cache[key] = (job.model, cost_source(job)(0))
    model, provider = costs
    lt = provider.layer(model, mbs * seq, seq, tp, False, 1, 1, False, False, "none")
    return lt.forward, lt.backward


def stats(errs: list[float]) -> tuple[float, float, float]:
    """median |err|, p90 |err|, signed median (%)."""
    a = np.asarray(errs)
    return float(np.median(np.abs(a))), float(np.percentile(np.abs(a), 90)), float(np.median(a))


HEADER = (
    f"{'':22s}{'points':>7s}  {'fwd |err| med':>13s}{'p90':>8s}{'signed':>8s}  {'bwd |err| med':>13s}{'p90':>8s}"
    f"{'signed':>8s}"
)


def line(label: str, rows: list[dict]) -> str:
    f = stats([r["fwd_err"] for r in rows])
    b = stats([r["bwd_err"] for r in rows])
    return (
        f"{label:22s}{len(rows):>7d}  {f[0]:>12.1f}%{f[1]:>7.1f}%{f[2]:>+7.1f}%  {b[0]:>12.1f}%{b[1]:>7.1f}%"
        f"{b[2]:>+7.1f}%"
    )


def parse_map(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        name, sep, target = item.partition("=")
        if not sep or not name.strip() or not target.strip():
            fail("--gpu-map", f"expected SAILOR=CATALOG like GH-96=h100-sxm; got {item!r}")
        out[name.strip()] = target.strip()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--layer-profiles",
        metavar="DIR",
        default=None,
        help=f"the shared per-layer profiles folder (default: {shown(DEFAULT_DIR)})",
    )
    ap.add_argument(
        "--fp32",
        action="store_true",
        help="price the GPUs as Sailor trained: TF32/FP32 GEMM rates and 4-byte element-wise traffic",
    )
    ap.add_argument(
        "--gpu-map",
        metavar="SAILOR=CATALOG",
        action="append",
        default=[],
        help="price a Sailor GPU with a catalog GPU (repeatable), e.g. GH-96=h100-sxm",
    )
    args = ap.parse_args()
    folder = Path(args.layer_profiles or shown(DEFAULT_DIR))
    try:
        present = folder.is_dir()
    except (OSError, ValueError):
        present = False
    if not present:
        fail(
            "layer-profiles",
            f"scripts/layer_fidelity.py needs the shared per-layer profiles; no folder at {folder} "
            "(pass --layer-profiles DIR)",
        )
    profiles = folder / "sailor" / "profiles"
    rows = sailor_rows(profiles) if profiles.is_dir() else []
    if not rows:
        fail(
            "layer-profiles",
            f"no Sailor profile under {folder} (expected sailor/profiles/<model>/<gpu>/profile.json)",
        )
    gpu_map = {**SAILOR_GPUS, **parse_map(args.gpu_map)}
    priced = {name: as_fp32(gpu) for name, gpu in gpu_map.items()} if args.fp32 else gpu_map

    cache: dict = {}
    skipped: dict[str, set[str]] = {}
    kept = []
    for r in rows:
        if r["model"] not in SAILOR_MODELS:
            skipped.setdefault(f"model {r['model']} (shape unknown)", set()).add(r["gpu"])
            continue
        if r["gpu"] not in gpu_map:
            skipped.setdefault(f"GPU {r['gpu']} (not in the catalog)", set()).add(r["model"])
            continue
        fwd, bwd = analytic_layer(r["model"], priced[r["gpu"]], r["mbs"], r["tp"], cache)
        r["fwd_err"] = 100.0 * (fwd / r["fwd"] - 1.0)
        r["bwd_err"] = 100.0 * (bwd / r["bwd"] - 1.0) if r["bwd"] > 0 else 0.0
        kept.append(r)
    if not kept:
        fail("--gpu-map", "no profiled GPU maps to a catalog GPU (pass --gpu-map SAILOR=CATALOG)")

    how = "fp32: TF32/FP32 GEMM rate, 4-byte element-wise" if args.fp32 else "bf16"
    print(f"Sailor per-layer profiles under {folder}: analytic ({how}, eager attention) vs measured layer {LAYER}")
    print("error % = analytic / measured - 1 (+ = analytic too slow); TP > 1 measured times include TP all-reduces")
    gpus = sorted({r["gpu"] for r in kept})
    for gpu in gpus:
        target = gpu_map[gpu]
        shown_target = target if isinstance(target, str) else ", ".join(f"{k}: {v}" for k, v in target.items())
        print(f"\n{gpu} (priced as {shown_target}{', fp32' if args.fp32 else ''})")
        print(HEADER)
        mine = [r for r in kept if r["gpu"] == gpu]
        for model in sorted({r["model"] for r in mine}, key=list(SAILOR_MODELS).index):
            for tp in sorted({r["tp"] for r in mine if r["model"] == model}):
                group = [r for r in mine if r["model"] == model and r["tp"] == tp]
                print(line(f"  {model} tp{tp}", group))
        print(line("  all", mine))

    print("\nper GPU")
    print(HEADER)
    for gpu in gpus:
        print(line(f"  {gpu}", [r for r in kept if r["gpu"] == gpu]))
    print(line("  all GPUs", kept))
    if skipped:
        print("\nskipped: " + "; ".join(f"{what}: {', '.join(sorted(v))}" for what, v in sorted(skipped.items())))


if __name__ == "__main__":
    run(main)
