"""Time `planner check` on 20 targets as CI runs it (a fresh process, start-up included) and print the wall time.

    python scripts/bench_check.py [--jobs FILE...] [--targets 20] [--repeats 3]

Needs only job files with a layout (default: examples/ci/configs/*.yaml, examples/gpt-13b-a100-small.yaml and
examples/llama3-70b-h100.yaml in this checkout); they are copied into a temporary folder as --targets configs
(the layouts' recompute setting varied), a lock is written once with --update-baseline (not timed), and then
`planner check TARGETS --baseline LOCK --format json` is timed --repeats times. About 2 s with the defaults on 2
cores (0.4 s a run). Target: <= 3 s for 20 targets without --min-efficiency.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, fail, need_file, run, shown  # noqa: E402

DEFAULT_JOBS = [
    ROOT / "examples/ci/configs/gpt-13b-a100.yaml",
    ROOT / "examples/ci/configs/llama3-8b-h100.yaml",
    ROOT / "examples/gpt-13b-a100-small.yaml",
    ROOT / "examples/llama3-70b-h100.yaml",
]
TARGET_S = 3.0
RECOMPUTE = ("selective", "full", "none")


def targets_from(jobs: list[Path], count: int, folder: Path) -> list[Path]:
    """``count`` job files in ``folder``, cycling over ``jobs`` with the layout's recompute setting varied."""
    import yaml

    from planner.io import load_yaml

    out = []
    for i in range(count):
        source = jobs[i % len(jobs)]
        raw = load_yaml(source, "jobs")
        if not isinstance(raw, dict) or not isinstance(raw.get("layout"), dict):
            fail("jobs", f"{source} has no layout; scripts/bench_check.py needs jobs with a layout")
        raw["layout"]["recompute"] = RECOMPUTE[(i // len(jobs)) % len(RECOMPUTE)]
        path = folder / f"config-{i:02d}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        out.append(path)
    return out


def check(targets: list[Path], lock: Path, *extra: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "check", *map(str, targets), "--baseline", str(lock), *extra],
        capture_output=True,
        text=True,
        cwd=lock.parent,
    )
    return time.perf_counter() - started, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", nargs="+", type=Path, default=DEFAULT_JOBS, help="job files with a layout")
    ap.add_argument("--targets", type=int, default=20, help="configs checked in one run (default 20)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (default 3)")
    args = ap.parse_args()
    if args.targets < 1 or args.repeats < 1:
        fail("targets", "--targets and --repeats take a positive count")
    jobs = [need_file(p, "jobs", "bench_check.py", "its job files", "--jobs FILE...") for p in args.jobs]
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        folder = Path(tmp)
        targets = targets_from(jobs, args.targets, folder)
        lock = folder / "plan.lock.json"
        _, proc = check(targets, lock, "--update-baseline", "--format", "json")
        if proc.returncode not in (0, 1):
            fail("planner", f"`planner check --update-baseline` exited {proc.returncode}: {proc.stderr.strip()}")
        walls = []
        for _ in range(args.repeats):
            wall, proc = check(targets, lock, "--format", "json")
            if proc.returncode not in (0, 1):
                fail("planner", f"`planner check` exited {proc.returncode}: {proc.stderr.strip()}")
            walls.append(wall)
    import json

    checks = [c for r in json.loads(proc.stdout)["results"] for c in r["checks"]]
    tally = {s: sum(c["status"] == s for c in checks) for s in ("pass", "fail", "skipped")}
    print(f"jobs: {', '.join(shown(p) for p in jobs)}")
    print(f"planner check on {args.targets} targets (start-up included), {args.repeats} runs:")
    print(f"  wall s: median {statistics.median(walls):.2f}, min {min(walls):.2f}, max {max(walls):.2f}")
    counts = f"{tally['pass']} passed, {tally['fail']} failed, {tally['skipped']} skipped"
    print(f"  checks: {counts} (exit {proc.returncode})")
    met = "met" if statistics.median(walls) <= TARGET_S else "NOT met"
    print(f"  target <= {TARGET_S:g} s without --min-efficiency: {met}")
    return 0


if __name__ == "__main__":
    run(main)
