"""Fit the cost model's global efficiencies (planner/data/calibration.yaml) on measured runs.

    python scripts/calibrate.py [--runs RUNS.yaml] [--write]      # RUNS.yaml may also be given positionally

Needs a measured-runs file (format: docs/measured-runs.md); the default is ../shared/reference/measured-runs.yaml,
next to the repository. Starts from the current calibration (planner/data/calibration.yaml, or the one in
$PLANNER_CATALOG); --write rewrites planner/data/calibration.yaml in this checkout. No search: about 11 s on
2 cores for the 148 runs of the shared file (some 500 validations of every run).

Time parameters are fitted by coordinate descent within physical bounds, minimizing the median plus the 90th
percentile of |log(predicted/measured)| iteration time. The two memory allowances (fixed GiB, fragmentation share)
are a least-squares fit of peak = allocated*(1+frag) + fixed on runs that report memory. No per-run constant exists.
Prints the before/after accuracy table; --write stores the result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, SHARED_RUNS, fail, need_file, run, shown  # noqa: E402

from planner.cost.calibration import default_calibration  # noqa: E402
from planner.cost.memory import GIB  # noqa: E402
from planner.runs import RunCase, load_runs  # noqa: E402
from planner.validate import run_validation, summarize  # noqa: E402

DEFAULT_RUNS = SHARED_RUNS
CALIBRATION = ROOT / "planner" / "data" / "calibration.yaml"

# parameter -> (low, high): physical ranges, not free knobs
TIME_BOUNDS = {
    "gemm_efficiency": (0.5, 1.0),
    "attention_efficiency": (0.2, 1.0),
    "hbm_efficiency": (0.4, 0.95),
    "dp_overlap": (0.0, 1.0),
    "fsdp_overlap": (0.0, 1.0),
    "layer_overhead_s": (0.0, 2e-4),
}


def time_loss(cases, cal) -> float:
    errs = []
    for r in run_validation(cases, cal):
        if isinstance(r.case if hasattr(r, "case") else None, RunCase) and r.time_error is not None:
            errs.append(abs(np.log(r.est.iteration_time_s / r.case.measured.iteration_time_s)))
    return float(np.median(errs) + np.percentile(errs, 90))


def fit_time(cases, cal, rounds: int = 4):
    best = time_loss(cases, cal)
    for _ in range(rounds):
        for name, (lo, hi) in TIME_BOUNDS.items():
            for value in np.linspace(lo, hi, 21):
                trial = cal.replace(**{name: float(value)})
                loss = time_loss(cases, trial)
                if loss < best - 1e-9:
                    best, cal = loss, trial
    return cal, best


def fit_memory(cases, cal):
    """The two allocator allowances, peak = allocated*(1+frag) + fixed, within physical ranges (fragmentation 0-20%
    of allocated bytes; fixed 0.5-4 GiB for the CUDA context and NCCL buffers). The loss is the median relative
    error on runs that report memory plus the share of feasibility mistakes: runs that ran but would be predicted
    not to fit, and measured OOMs predicted to fit. Both kinds of evidence constrain the same two numbers."""
    zero = cal.replace(memory_fixed_gib=0.0, memory_fragmentation=0.0)
    rows = [
        (r.est.peak_memory_gib, r.case.measured.memory_gib, r.case.measured.oom, r.est.capacity_gib)
        for r in run_validation(cases, zero)
        if hasattr(r, "case")
    ]
    alloc = np.array([r[0] for r in rows])
    meas = np.array([r[1] if r[1] else np.nan for r in rows])
    oom = np.array([r[2] for r in rows])
    cap = np.array([r[3] for r in rows])
    has_mem = ~np.isnan(meas)
    best = None
    for frag in np.linspace(0.0, 0.2, 21):
        for fixed in np.linspace(0.5, 4.0, 15):
            peak = alloc * (1 + frag) + fixed
            err = float(np.median(np.abs(peak[has_mem] - meas[has_mem]) / meas[has_mem])) if has_mem.any() else 0.0
            ran_oom = float(np.mean(peak[~oom] > cap[~oom]))
            missed = float(np.mean(peak[oom] <= cap[oom])) if oom.any() else 0.0
            loss = err + 0.5 * ran_oom + 0.5 * missed
            if best is None or loss < best[0] - 1e-12:
                best = (loss, float(frag), float(fixed))
    return cal.replace(memory_fragmentation=best[1], memory_fixed_gib=best[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="?", default=None, help="measured-runs YAML (same as --runs)")
    ap.add_argument(
        "--runs", dest="runs_opt", metavar="FILE", default=None, help=f"measured-runs YAML (default: {DEFAULT_RUNS})"
    )
    ap.add_argument("--write", action="store_true", help=f"store the fit in {CALIBRATION}")
    args = ap.parse_args()
    if args.runs and args.runs_opt and args.runs != args.runs_opt:
        fail("runs", f"two measured-runs files given ('{args.runs}' and --runs '{args.runs_opt}'); pass one")
    runs = need_file(
        args.runs_opt or args.runs or shown(DEFAULT_RUNS), "runs", "calibrate.py", "a measured-runs file", "--runs FILE"
    )
    if args.write and not CALIBRATION.is_file():  # checked before the fit, which takes minutes
        fail(
            "--write",
            f"scripts/calibrate.py --write rewrites {shown(CALIBRATION)}, which is missing; "
            "run it from a checkout of the repository",
        )
    cases = [c for c in load_runs(runs) if isinstance(c, RunCase)]
    if not cases:
        fail("runs", f"'{runs}' has no run the planner can express (see `planner validate {runs}`)")
    cal0 = default_calibration()
    before = summarize(run_validation(cases, cal0))
    cal, loss = fit_time(cases, cal0)
    cal = fit_memory(cases, cal)
    after = summarize(run_validation(cases, cal))
    print(f"{'':28s}{'before':>12s}{'after':>12s}")
    for key, sub in (
        ("time median %", ("time", "median_abs_error_pct")),
        ("time p90 %", ("time", "p90_abs_error_pct")),
        ("memory median %", ("memory", "median_abs_error_pct")),
    ):
        print(f"{key:28s}{before[sub[0]][sub[1]]:>12}{after[sub[0]][sub[1]]:>12}")
    print("\nfitted efficiencies:")
    for k, v in cal.as_dict().items():
        print(f"  {k:24s} {v:.6g}   (was {getattr(cal0, k):.6g})")
    if args.write:
        path = CALIBRATION
        text = path.read_text()
        data = yaml.safe_load(text)
        lines = []
        for line in text.splitlines():
            key = line.split(":")[0].strip()
            if key in data and key != "schema_version" and not line.startswith("#"):
                comment = line[line.index("#") :] if "#" in line else ""
                line = f"{key + ':':31s}{getattr(cal, key):<.4g}".ljust(31) + ("  " + comment if comment else "")
            lines.append(line)
        path.write_text("\n".join(lines) + "\n")
        print(f"\nwrote {path}")
    _ = GIB


if __name__ == "__main__":
    run(main)
