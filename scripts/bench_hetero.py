"""Heterogeneous search speed and gain: `python scripts/bench_hetero.py [--time-limit S]`.

Jobs: examples/hetero/gpt-32l-2x32.yaml (2 GPU types x 32 GPUs, 32-layer GPT) and
examples/hetero/llama3-405b-3types-4096.yaml (3 GPU types, 4,096 GPUs, Llama 3 405B). Prints one row per job:
heterogeneous search seconds, candidates, CP-SAT solves, best heterogeneous iteration time, the best plan on one
GPU type alone (found by the homogeneous search on each group, timed separately), their ratio and the optimality
status of the best plan (a gap is to the bound over every mixed pipeline and replica shape).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner.search.hetero import best_single_type, search_hetero
from planner.search.space import SearchOptions
from planner.spec import load_job

ROOT = Path(__file__).resolve().parents[1]
JOBS = ["examples/hetero/gpt-32l-2x32.yaml", "examples/hetero/llama3-405b-3types-4096.yaml"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    print("| job | hetero search s | candidates | CP-SAT solves | best hetero s | single-type search s "
          "| best single-type s (group) | ratio | optimality |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rel in JOBS:
        job = load_job(ROOT / rel)
        t0 = time.monotonic()
        r = search_hetero(job, top=1, time_limit_s=args.time_limit, single_type=False)
        secs = time.monotonic() - t0
        t1 = time.monotonic()
        single, group = best_single_type(job, SearchOptions(), 1, args.time_limit)
        single_secs = time.monotonic() - t1
        best = r.plans[0].time if r.plans else None
        ratio = f"{best / single:.3f}" if best and single else "-"
        if not best:
            status = "none"
        elif r.plans[0].status == "optimal":
            status = "optimal"
        else:
            status = f"feasible, gap {r.gap * 100:.2f}%" + ("" if r.complete else " (time limit)")
        kind = "replicas" if getattr(r.plans[0].estimate.dims, "replicas", None) else "mixed pipeline"
        single_txt = f"{single:.3f} ({job.cluster[group].gpu.name})" if single else "-"
        print(f"| {Path(rel).stem} | {secs:.2f} | {r.candidates:,} | {r.solved:,} | "
              f"{best:.3f} ({kind}) | {single_secs:.2f} | {single_txt} | {ratio} | {status} |" if best
              else f"| {Path(rel).stem} | {secs:.2f} | - |")


if __name__ == "__main__":
    main()
