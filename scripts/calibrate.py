"""Fit the cost model's global efficiencies (planner/data/calibration.yaml) on measured runs.

    python scripts/calibrate.py [--runs RUNS.yaml] [--write]      # RUNS.yaml may also be given positionally

Needs a measured-runs file (format: docs/measured-runs.md); the default is ../shared/reference/measured-runs.yaml,
next to the repository. Starts from the current calibration (planner/data/calibration.yaml, or the one in
$PLANNER_CATALOG); --write rewrites planner/data/calibration.yaml in this checkout. No search: about 11 s on
2 cores for the 148 runs of the shared file (some 500 validations of every run).

The fit is planner/profile/calibrate.py (also `planner calibrate RUNS.yaml -o FILE`, which writes a file of the
user's own); this script is for maintaining the built-in calibration. Prints the before/after accuracy table;
--write stores the result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, SHARED_RUNS, fail, need_file, run, shown  # noqa: E402

from planner.cost.calibration import default_calibration  # noqa: E402
from planner.profile.calibrate import calibrate  # noqa: E402
from planner.runs import RunCase, load_runs  # noqa: E402

DEFAULT_RUNS = SHARED_RUNS
CALIBRATION = ROOT / "planner" / "data" / "calibration.yaml"


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
    cal, before, after = calibrate(cases, cal0)
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


if __name__ == "__main__":
    run(main)
