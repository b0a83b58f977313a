"""Compare the plans and search times of an older revision with this working tree, job by job, in one run.

    python scripts/compare_revisions.py --base REV [--jobs FILE...] [--runs N] [--time-limit S] [--snapshot]
    python scripts/compare_revisions.py --base REV --show-diff JOB

Needs git and this checkout's history: REV (a commit, branch or tag; or a folder holding an extracted tree with
`planner/` in it) is written into a temporary folder with `git archive REV | tar -x`, which leaves the repository's
branches, index, stash and worktrees untouched; the folder is removed at the end. Each job (default:
examples/*.yaml, examples/bench/*.yaml, examples/hetero/*.yaml of this tree; the same job file feeds both sides)
runs `python -m planner plan JOB --json --top 5 --time-limit S` with the working folder set to each tree, so each
side imports its own `planner` package (checked before the first job: `planner.__file__` must lie in that tree).
The new side is the live working tree; `--snapshot` runs it on a copy taken at start (tracked and untracked files
git does not ignore), so that edits others make during the run are not half seen.

Per job: one run per side with `--no-timing` gives the plans to compare (the `plans` list: layouts, times,
optimality, estimates, placement; keys that only one side has are ignored and reported); then N timed runs per
side (default 3), alternating old/new and swapping who goes first each round, give the times. `old s`/`new s` are
the medians of `search.seconds` from the JSON of the timed runs (the search alone); `wall` is the median wall time
of the subprocess, which adds Python start-up and imports (about 1 s). A timed run whose plans differ from its
side's untimed run (nondeterminism, or a search stopped by --time-limit) or that crashed is noted under the table.

Takes (N + 1) x 2 x the jobs' own time: about 6 minutes for the defaults on this 2-core machine (the 3-type 405B
mixed job alone takes about 20 s a run), about 5 s for one small job with --runs 1.
Exit 0 when every job gives the same plans on both sides, 1 when one differs (or a run crashed), 2 for bad input.
`--show-diff JOB` runs that job once per side and prints a unified diff of the two `plans` lists (as indented JSON).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, fail, need_file, run, shown

DEFAULT_JOB_GLOBS = ["examples/*.yaml", "examples/bench/*.yaml", "examples/hetero/*.yaml"]
PLANNER_EXITS = {0, 2, 3, 4}  # ok, bad input, nothing fits, framework cannot express it; others are crashes
SHOWN_DIFFERENCES = 5  # differing values listed per job under the table


@dataclass
class PlanRun:
    """One `planner plan` subprocess: its exit code, JSON document (None unless exit 0) and timings."""

    returncode: int
    doc: dict | None
    wall_s: float
    stderr_last_line: str

    @property
    def search_s(self) -> float:
        seconds = (self.doc or {}).get("search", {}).get("seconds")
        return math.nan if seconds is None else float(seconds)

    @property
    def crashed(self) -> bool:
        return self.returncode not in PLANNER_EXITS or (self.returncode == 0 and self.doc is None)

    def outcome(self) -> str:
        """What a run that gave no plans ended with, for the table: `exit 3: error: nothing fits: ...`."""
        return f"exit {self.returncode}: {self.stderr_last_line}"


@dataclass
class PlanComparison:
    """How two `plans` lists differ: differing values (path, old, new) and keys only one side has."""

    differences: list[tuple[str, Any, Any]] = field(default_factory=list)
    one_sided_keys: set[str] = field(default_factory=set)

    @property
    def identical(self) -> bool:
        return not self.differences


@dataclass
class JobResult:
    job: str
    comparison: PlanComparison
    old_runs: list[PlanRun]
    new_runs: list[PlanRun]
    notes: list[str] = field(default_factory=list)


# --- the two trees ---------------------------------------------------------------------------------------------


def resolve_commit(rev: str) -> str:
    """The full commit id REV names in this checkout, else exit 2."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        check=False,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        fail("--base", f"{rev!r} is neither a commit of {shown(ROOT)} nor a folder holding planner/")
    return proc.stdout.strip()


def extract_tree(commit: str, into: Path) -> Path:
    """Write the files of `commit` into `into` (git archive | tar -x): no change to the repository's state."""
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
    untar = subprocess.run(
        ["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=False, capture_output=True, text=True
    )
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        fail("--base", f"could not extract {commit[:12]} into {into}: {untar.stderr.strip()}")
    return into


def base_tree(rev: str, scratch: Path) -> tuple[Path, str]:
    """The folder holding the base code and how to name it: an extracted commit, or REV itself when a tree."""
    given = Path(rev)
    if (given / "planner" / "__init__.py").is_file():
        return given.resolve(), f"folder {given.resolve()}"
    commit = resolve_commit(rev)
    return extract_tree(commit, scratch), f"{rev} ({commit[:12]}) extracted to {scratch}"


def snapshot_tree(into: Path) -> Path:
    """Copy this working tree's files as they are now (tracked or untracked, not ignored) into `into`."""
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=False,
        capture_output=True,
        text=True,
    )
    if listing.returncode != 0:
        fail("--snapshot", f"cannot list the files of {ROOT}: {listing.stderr.strip()}")
    for name in filter(None, listing.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is listed but absent
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def working_tree(snapshot: bool, scratch: Path) -> tuple[Path, str]:
    """The folder holding the new code and how to name it: the live working tree, or a copy of it taken now."""
    if not snapshot:
        return ROOT, f"working tree {ROOT}"
    return snapshot_tree(scratch), f"snapshot of the working tree {ROOT} in {scratch}"


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a run in `tree`: its own folder first on the import path, nothing else of ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = str(tree)
    return env


def imported_planner(tree: Path) -> Path:
    """The `planner/__init__.py` that `python -m planner` imports when run in `tree`; exit 2 unless it is the tree's."""
    proc = subprocess.run(
        [sys.executable, "-c", "import planner; print(planner.__file__)"],
        cwd=tree,
        env=tree_env(tree),
        check=False,
        capture_output=True,
        text=True,
    )
    path = Path(proc.stdout.strip()).resolve() if proc.returncode == 0 else None
    if path is None or tree.resolve() not in path.parents:
        fail("planner", f"python in {tree} imports {path or proc.stderr.strip()}, not that tree's planner")
    return path


# --- running one job ---------------------------------------------------------------------------------------------


def plan_command(job: Path, time_limit: float, timed: bool) -> list[str]:
    command = [sys.executable, "-m", "planner", "plan", str(job), "--json", "--top", "5"]
    command += ["--time-limit", f"{time_limit:g}"]
    return command if timed else command + ["--no-timing"]


def run_plan(tree: Path, job: Path, time_limit: float, timed: bool) -> PlanRun:
    """One `planner plan` of `job` with `tree`'s code; wall time of the whole subprocess."""
    start = time.perf_counter()
    proc = subprocess.run(
        plan_command(job, time_limit, timed), cwd=tree, env=tree_env(tree), check=False, capture_output=True, text=True
    )
    wall_s = time.perf_counter() - start
    stderr_lines = proc.stderr.strip().splitlines() or [""]
    doc = plan_json(proc.stdout) if proc.returncode == 0 else None
    last_line = stderr_lines[-1] if doc is not None or proc.returncode != 0 else "stdout is not a JSON document"
    return PlanRun(proc.returncode, doc, wall_s, last_line)


def plan_json(stdout: str) -> dict | None:
    try:
        return json.loads(stdout)
    except json.JSONDecodeError:
        return None


def alternating_runs(old_tree: Path, new_tree: Path, job: Path, args) -> tuple[list[PlanRun], list[PlanRun]]:
    """N timed runs per side, old/new alternating, the side that goes first swapped every round."""
    old_runs, new_runs = [], []
    for round_index in range(args.runs):
        order = [(old_tree, old_runs), (new_tree, new_runs)]
        for tree, runs in order if round_index % 2 == 0 else reversed(order):
            runs.append(run_plan(tree, job, args.time_limit, timed=True))
    return old_runs, new_runs


# --- comparing plans ---------------------------------------------------------------------------------------------


def generic_path(path: str) -> str:
    """`plans[3].stages[0].tp` -> `plans[].stages[].tp`: one entry per key, whatever the list index."""
    return re.sub(r"\[\d+\]", "[]", path)


def compare_values(old: Any, new: Any, path: str, result: PlanComparison) -> None:
    """Record every value that differs between `old` and `new`; keys only one side has are noted, not compared."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            if key not in new or key not in old:
                result.one_sided_keys.add(f"{generic_path(f'{path}.{key}')} ({'old' if key in old else 'new'} only)")
            else:
                compare_values(old[key], new[key], f"{path}.{key}", result)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for index, (old_item, new_item) in enumerate(zip(old, new, strict=True)):
            compare_values(old_item, new_item, f"{path}[{index}]", result)
    elif isinstance(old, list) and isinstance(new, list):
        result.differences.append((f"len({path})", len(old), len(new)))
    elif old != new or type(old) is not type(new):
        result.differences.append((path, old, new))


def compare_runs(old: PlanRun, new: PlanRun) -> PlanComparison:
    """The plans of two runs; a run without plans matches only one that ended the same way, a crash nothing."""
    result = PlanComparison()
    if old.doc is not None and new.doc is not None:
        compare_values(old.doc.get("plans"), new.doc.get("plans"), "plans", result)
    elif old.crashed or new.crashed or old.outcome() != new.outcome():
        result.differences.append(("outcome", old.outcome(), new.outcome()))
    return result


def timed_runs_notes(side: str, untimed: PlanRun, timed_runs: list[PlanRun]) -> list[str]:
    """A note per timed run that ended otherwise than the untimed run of its side (crash, nondeterminism, limit)."""
    notes = []
    for index, timed in enumerate(timed_runs, start=1):
        comparison = compare_runs(untimed, timed)
        if timed.crashed and timed.outcome() != untimed.outcome():
            notes.append(f"{side} timed run {index} crashed: {timed.outcome()}")
        elif not comparison.identical and not untimed.crashed:
            path, before, after = comparison.differences[0]
            notes.append(f"{side} timed run {index} differs from its --no-timing run at {path}: {before} -> {after}")
        elif untimed.crashed and not timed.crashed:
            notes.append(f"{side} timed run {index} ran although its --no-timing run crashed (tree edited meanwhile?)")
    return notes


def stop_reason_notes(old: PlanRun, new: PlanRun) -> list[str]:
    reasons = [(run_.doc or {}).get("search", {}).get("stop_reason") for run_ in (old, new)]
    return [] if reasons[0] == reasons[1] else [f"search.stop_reason differs: {reasons[0]} -> {reasons[1]}"]


def compare_job(old_tree: Path, new_tree: Path, job: Path, args) -> JobResult:
    old, new = (run_plan(tree, job, args.time_limit, timed=False) for tree in (old_tree, new_tree))
    old_runs, new_runs = alternating_runs(old_tree, new_tree, job, args)
    notes = stop_reason_notes(old, new)
    notes += timed_runs_notes("old", old, old_runs) + timed_runs_notes("new", new, new_runs)
    return JobResult(job_name(job), compare_runs(old, new), old_runs, new_runs, notes)


# --- output ------------------------------------------------------------------------------------------------------


def job_name(job: Path) -> str:
    """`bench/gpt-530b-5128-a100` for a job under examples/, else the path as given without `.yaml`."""
    try:
        name = str(job.resolve().relative_to(ROOT / "examples"))
    except ValueError:
        name = shown(job)
    return name.removesuffix(".yaml")


def median(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def identical_cell(result: JobResult) -> str:
    differences = result.comparison.differences
    return "yes" if not differences else f"NO ({len(differences)} values)"


def table_row(result: JobResult) -> str:
    old_s, new_s = (median([r.search_s for r in runs]) for runs in (result.old_runs, result.new_runs))
    old_wall, new_wall = (median([r.wall_s for r in runs]) for runs in (result.old_runs, result.new_runs))
    return (
        f"{result.job:34s} {identical_cell(result):>16s} {old_s:>9.3f} {new_s:>9.3f} {new_s / old_s:>7.3f} "
        f"{old_wall:>9.2f} {new_wall:>9.2f} {new_wall / old_wall:>7.3f}"
    )


def print_table(results: list[JobResult], runs: int) -> None:
    head = (
        f"{'job':34s} {'plans identical?':>16s} {'old s':>9s} {'new s':>9s} {'new/old':>7s} "
        f"{'old wall':>9s} {'new wall':>9s} {'new/old':>7s}"
    )
    print(head)
    print("-" * len(head))
    for result in results:
        print(table_row(result))
    print(
        f"\nold s / new s: median search.seconds of {runs} timed run(s) per side; wall: median subprocess time "
        f"(adds start-up and imports)."
    )


def print_details(results: list[JobResult]) -> None:
    """Under the table: the first differing values per job, the keys one side lacks, and other notes."""
    for result in results:
        lines = [f"  {path}: {old!r} -> {new!r}" for path, old, new in result.comparison.differences]
        if len(lines) > SHOWN_DIFFERENCES:
            lines = lines[:SHOWN_DIFFERENCES] + [f"  ... {len(lines) - SHOWN_DIFFERENCES} more (--show-diff)"]
        lines += [f"  ignored key {key}" for key in sorted(result.comparison.one_sided_keys)]
        lines += [f"  note: {note}" for note in result.notes]
        if lines:
            print(f"\n{result.job}:")
            print("\n".join(lines))


def geometric_mean(values: list[float]) -> float:
    finite = [v for v in values if v > 0 and not math.isnan(v)]
    return math.exp(sum(map(math.log, finite)) / len(finite)) if finite else math.nan


def print_summary(results: list[JobResult], elapsed_s: float) -> None:
    differing = [r.job for r in results if not r.comparison.identical]
    ratios = [
        median([r.search_s for r in res.new_runs]) / median([r.search_s for r in res.old_runs]) for res in results
    ]
    finite = [r for r in ratios if not math.isnan(r)]
    spread = f" (range {min(finite):.3f}-{max(finite):.3f})" if finite else ""
    plans = "all plans identical" if not differing else f"plans differ in {len(differing)}: {', '.join(differing)}"
    print(
        f"\nsummary: {len(results)} jobs, {plans}; search time new/old geometric mean "
        f"{geometric_mean(ratios):.3f}{spread}; took {elapsed_s:.0f} s"
    )


def plans_text(run_: PlanRun) -> list[str]:
    if run_.doc is None:
        return [run_.outcome() + "\n"]
    return [line + "\n" for line in json.dumps(run_.doc.get("plans"), indent=2, sort_keys=True).splitlines()]


def show_diff(old_tree: Path, new_tree: Path, job: Path, args, labels: tuple[str, str]) -> int:
    """Print a unified diff of the two `plans` lists of `job`; 0 when they are identical (one-sided keys aside)."""
    old, new = (run_plan(tree, job, args.time_limit, timed=False) for tree in (old_tree, new_tree))
    diff = difflib.unified_diff(
        plans_text(old), plans_text(new), fromfile=f"old: {labels[0]}", tofile=f"new: {labels[1]}"
    )
    comparison = compare_runs(old, new)
    ignored = [f"ignored by the table: key {key}\n" for key in sorted(comparison.one_sided_keys)]
    verdict = f"{job_name(job)}: plans {'identical' if comparison.identical else 'differ'}\n"
    try:
        sys.stdout.writelines([*diff, *ignored, verdict])
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if comparison.identical else 1


# --- command line ------------------------------------------------------------------------------------------------


def default_jobs() -> list[Path]:
    return [path for pattern in DEFAULT_JOB_GLOBS for path in sorted(ROOT.glob(pattern))]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, metavar="REV", help="the old revision (commit, branch, tag) or a folder")
    ap.add_argument(
        "--jobs",
        nargs="+",
        metavar="FILE",
        default=None,
        help="job YAML files (default: examples/*.yaml, examples/bench/*.yaml, examples/hetero/*.yaml)",
    )
    ap.add_argument("--runs", type=int, default=3, help="timed runs per side and job (default 3)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="planner's --time-limit per run (default 60)")
    ap.add_argument(
        "--snapshot",
        action="store_true",
        help="run the new side on a copy of the working tree taken at start (edits made meanwhile are not seen)",
    )
    ap.add_argument("--show-diff", metavar="JOB", default=None, help="print the unified diff of one job's plans")
    args = ap.parse_args()
    if args.runs < 1:
        fail("--runs", f"expected at least 1 timed run, got {args.runs}")
    if args.time_limit <= 0:
        fail("--time-limit", f"expected a positive number of seconds, got {args.time_limit:g}")
    return args


def job_files(args: argparse.Namespace) -> list[Path]:
    if args.show_diff is not None:
        return [need_file(args.show_diff, "show-diff", "compare_revisions.py", "a job file", "--show-diff JOB")]
    jobs = args.jobs or [shown(p) for p in default_jobs()] or ["examples/*.yaml"]
    return [need_file(p, "jobs", "compare_revisions.py", "its job files", "--jobs FILE...") for p in jobs]


def main() -> int:
    args = parse_args()
    jobs = [job.resolve() for job in job_files(args)]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="planner-compare-") as scratch:
        (Path(scratch) / "old").mkdir()
        (Path(scratch) / "new").mkdir()
        old_tree, old_label = base_tree(args.base, Path(scratch) / "old")
        new_tree, new_label = working_tree(args.snapshot, Path(scratch) / "new")
        print(f"old: {old_label}; imports {imported_planner(old_tree)}")
        print(f"new: {new_label}; imports {imported_planner(new_tree)}\n", flush=True)
        if args.show_diff is not None:
            return show_diff(old_tree, new_tree, jobs[0], args, (old_label, new_label))
        results = []
        for index, job in enumerate(jobs):
            print(f"[{index + 1}/{len(jobs)}] {job_name(job)}", file=sys.stderr, flush=True)
            results.append(compare_job(old_tree, new_tree, job, args))
    print_table(results, args.runs)
    print_details(results)
    print_summary(results, time.perf_counter() - started)
    return 0 if all(r.comparison.identical for r in results) else 1


if __name__ == "__main__":
    run(main)
