"""Time the search on fixed jobs and print a table (seconds, peak RSS, search size, best plan).

    python scripts/bench_search.py [--jobs examples/bench/*.yaml] [--time-limit 60]

Needs only the job files (default: the three of examples/bench/ in this checkout); about 10-20 s with the defaults
on 2 cores (each job's search plus about 1.3 s of start-up). Each job runs in its own process so that its peak RSS
is its own (resource.getrusage of the child).
Targets on a 2-core machine: Llama 3 405B on 16,384 H100 <= 5 s; 530B GPT on 5,128 A100 <= 5 s;
DeepSeek-V3-like MoE on 2,048 H800 <= 10 s; every job <= 1 GiB RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, fail, need_file, run, shown  # noqa: E402

DEFAULT_JOBS = [
    ROOT / "examples/bench/llama3-405b-16k-h100.yaml",
    ROOT / "examples/bench/gpt-530b-5128-a100.yaml",
    ROOT / "examples/bench/deepseek-v3-2048-h800.yaml",
]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from planner.errors import SpecError
from planner.load import load_job
from planner.search.homogeneous import search
try:
    job = load_job(sys.argv[1])
except SpecError as exc:
    print(exc.line(), file=sys.stderr)
    raise SystemExit(2)
t1 = time.perf_counter()
r = search(job, top=5, time_limit_s=float(sys.argv[2]))
t2 = time.perf_counter()
best = r.plans[0] if r.plans else None
d = best.estimate.dims if best else None
print(json.dumps({"gpus": job.num_gpus, "load_s": t1 - t0, "search_s": t2 - t1, "candidates": r.candidates,
                  "solved": r.solved, "complete": r.complete,
                  "best": None if not best else {"time": best.time, "mfu": best.estimate.mfu, "status": best.status,
                  "layout": (f"tp{d.tp} pp{d.pp} dp{d.dp} cp{d.cp} ep{d.ep} vpp{d.vpp} mbs{d.micro_batch_size} "
                             f"zero{d.zero_stage}")}}))
"""


def run_one(path: Path, time_limit: float) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(time_limit)], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t
    rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode == 2 and proc.stderr.startswith("error: "):  # bad job file: the child's one line
        print(proc.stderr.strip().splitlines()[-1], file=sys.stderr)
        raise SystemExit(2)
    if proc.returncode != 0:
        raise SystemExit(f"{path}: failed\n{proc.stderr}")
    out = json.loads(proc.stdout)
    out.update(wall_s=wall, rss_mib=max(rss_kib, before) / 1024, job=path.stem)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--jobs", nargs="+", metavar="FILE", default=None, help="job YAML files (default: the three of examples/bench/)"
    )
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    if args.time_limit <= 0:
        fail("--time-limit", f"expected a positive number of seconds, got {args.time_limit:g}")
    jobs = args.jobs or [shown(p) for p in DEFAULT_JOBS]
    args.jobs = [need_file(p, "jobs", "bench_search.py", "its job files", "--jobs FILE...") for p in jobs]
    rows = [run_one(p, args.time_limit) for p in args.jobs]
    head = (
        f"{'job':32s} {'GPUs':>7s} {'search s':>9s} {'wall s':>7s} {'RSS MiB':>8s} {'cands':>7s} {'CP-SAT':>6s} "
        f"{'status':>8s} {'best s':>8s} {'MFU':>6s}  layout"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        b = r["best"] or {}
        print(
            f"{r['job']:32s} {r['gpus']:>7,d} {r['search_s']:>9.2f} {r['wall_s']:>7.2f} {r['rss_mib']:>8.0f} "
            f"{r['candidates']:>7,d} {r['solved']:>6d} {b.get('status', 'none'):>8s} "
            f"{b.get('time', float('nan')):>8.3f} "
            f"{b.get('mfu', float('nan')) * 100:>5.1f}%  {b.get('layout', '')}"
        )
    print("\nRSS is the peak of each child process (ru_maxrss, the largest child so far).")


if __name__ == "__main__":
    run(main)
