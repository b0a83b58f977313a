"""Heterogeneous search speed and gain: `python scripts/bench_hetero.py [--jobs FILE...] [--time-limit S]`.

Needs only the job files; about 10-20 s with the defaults on 2 cores (mostly the single-type searches, which only
serve the comparison). Default jobs: examples/hetero/gpt-32l-2x32.yaml (2 GPU types x 32 GPUs, 32-layer GPT) and
examples/hetero/llama3-405b-3types-4096.yaml (3 GPU types, 4,096 GPUs, Llama 3 405B). Prints one row per job:
heterogeneous search seconds, candidates, CP-SAT solves, best heterogeneous iteration time, the best plan on one
GPU type alone (found by the homogeneous search on each group, timed separately), their ratio and the optimality
status of the best plan (a gap is to the bound over every mixed pipeline and replica shape).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, fail, need_file, run, shown  # noqa: E402

from planner.load import load_job  # noqa: E402
from planner.search.mixed_pipelines import best_single_type, search_hetero  # noqa: E402
from planner.search.space import SearchOptions  # noqa: E402

JOBS = [ROOT / "examples/hetero/gpt-32l-2x32.yaml", ROOT / "examples/hetero/llama3-405b-3types-4096.yaml"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--jobs",
        nargs="+",
        metavar="FILE",
        default=None,
        help="job YAML files with 2 or more node groups (default: the two of examples/hetero/)",
    )
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    if args.time_limit <= 0:
        fail("--time-limit", f"expected a positive number of seconds, got {args.time_limit:g}")
    jobs = [
        need_file(p, "jobs", "bench_hetero.py", "its job files", "--jobs FILE...")
        for p in args.jobs or [shown(p) for p in JOBS]
    ]
    print(
        "| job | hetero search s | candidates | CP-SAT solves | best hetero s | single-type search s "
        "| best single-type s (group) | ratio | optimality |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for rel in jobs:
        job = load_job(rel)
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
        kind = ("replicas" if getattr(r.plans[0].estimate.dims, "replicas", None) else "mixed pipeline") if best else ""
        single_txt = f"{single:.3f} ({job.cluster[group].gpu.name})" if single else "-"
        print(
            f"| {Path(rel).stem} | {secs:.2f} | {r.candidates:,} | {r.solved:,} | "
            f"{best:.3f} ({kind}) | {single_secs:.2f} | {single_txt} | {ratio} | {status} |"
            if best
            else f"| {Path(rel).stem} | {secs:.2f} | - |"
        )


if __name__ == "__main__":
    run(main)
