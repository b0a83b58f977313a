"""`planner validate`: predict measured runs and report the error against what was measured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.cost.calibration import Calibration
from planner.cost.estimate import SCHEMA_VERSION, Estimate, estimate
from planner.errors import SpecError
from planner.runs import RunCase, Skipped, load_runs

NO_GROUP = "(none)"  # the group of runs that name no source_group


@dataclass
class RunResult:
    case: RunCase
    est: Estimate

    @property
    def time_error(self) -> float | None:
        t = self.case.measured.iteration_time_s
        return None if not t else (self.est.iteration_time_s - t) / t

    @property
    def memory_error(self) -> float | None:
        m = self.case.measured.memory_gib
        return None if not m else (self.est.peak_memory_gib - m) / m


def predict(case: RunCase, cal: Calibration | None = None) -> RunResult:
    """The run's layout; with unstated recompute, the least recompute that fits (else the last tried)."""
    est = None
    for layout in case.layout_choices:
        est = estimate(case.job, layout, cal)
        if est.fits:
            break
    return RunResult(case, est)


def load_files(paths: Sequence[str | Path]) -> dict[str, list[RunCase | Skipped]]:
    """Each measured-runs file's runs, keyed by its path as given, in the order given. A run id is unique across all
    the files: one that two files share is bad input (SpecError naming both files)."""
    by_file: dict[str, list[RunCase | Skipped]] = {}
    first: dict[str, str] = {}
    for path in paths:
        name = str(path)
        if name in by_file:
            raise SpecError("runs", f"'{name}' is given twice")
        cases = load_runs(path)
        for c in cases:
            if c.id in first:
                raise SpecError("runs", f"run id '{c.id}' is in both '{first[c.id]}' and '{name}'")
            first[c.id] = name
        by_file[name] = cases
    return by_file


def run_validation(cases: list[RunCase | Skipped], cal: Calibration | None = None) -> list[RunResult | Skipped]:
    return [c if isinstance(c, Skipped) else predict(c, cal) for c in cases]


def _pct(values: list[float], q: float) -> float | None:
    return float(round(np.percentile(np.abs(values), q) * 100, 2)) if values else None


def summarize(results: list[RunResult | Skipped]) -> dict:
    ok = [r for r in results if isinstance(r, RunResult)]
    t_err = [r.time_error for r in ok if r.time_error is not None]
    m_err = [r.memory_error for r in ok if r.memory_error is not None]
    ooms = [r for r in ok if r.case.measured.oom]
    return {
        "runs": len(results),
        "predicted": len(ok),
        "skipped": len(results) - len(ok),
        "coverage": round(len(ok) / len(results), 4) if results else 0.0,
        "time": {
            "count": len(t_err),
            "median_abs_error_pct": _pct(t_err, 50),
            "p90_abs_error_pct": _pct(t_err, 90),
            "mean_signed_error_pct": float(round(np.mean(t_err) * 100, 2)) if t_err else None,
        },
        "memory": {"count": len(m_err), "median_abs_error_pct": _pct(m_err, 50), "p90_abs_error_pct": _pct(m_err, 90)},
        "oom": {
            "measured": len(ooms),
            "predicted_not_fitting": sum(not r.est.fits for r in ooms),
            "ran_but_predicted_not_fitting": sum(not r.est.fits for r in ok if not r.case.measured.oom),
        },
    }


def group_of(r: RunResult | Skipped) -> str:
    """The run's source_group, NO_GROUP when it names none."""
    return (r.source_group if isinstance(r, Skipped) else r.case.source_group) or NO_GROUP


def summarize_groups(results: Sequence[RunResult | Skipped]) -> dict[str, dict]:
    """summarize() of each source group's runs, by group name (sorted; runs without a group under NO_GROUP)."""
    groups: dict[str, list[RunResult | Skipped]] = {}
    for r in results:
        groups.setdefault(group_of(r), []).append(r)
    return {g: summarize(groups[g]) for g in sorted(groups)}


def to_json(
    results: list[RunResult | Skipped], files: Mapping[str, Sequence[RunResult | Skipped]] | None = None
) -> dict:
    """The validate document: every run, the summary over all of them and one per source group (``groups``).

    ``files`` maps each input file (as given) to its own results, in the order given; ``results`` is their
    concatenation. With more than one file the document also lists each file's summary (``files``)."""
    runs = []
    for r in results:
        if isinstance(r, Skipped):
            runs.append({"id": r.id, "status": "skipped", "reason": r.reason, "source_group": r.source_group or None})
            continue
        m = r.case.measured
        te, me = r.time_error, r.memory_error
        runs.append(
            {
                "id": r.case.id,
                "status": "ok",
                "reason": None,
                "assumed": r.case.assumed,
                "source_group": r.case.source_group or None,
                "layout": {k: v for k, v in r.est.dims.as_dict().items() if k != "stages"},
                "predicted": {
                    "iteration_time_s": round(r.est.iteration_time_s, 6),
                    "peak_memory_gib": round(r.est.peak_memory_gib, 3),
                    "fits": r.est.fits,
                },
                "measured": {
                    "iteration_time_s": None if m.iteration_time_s is None else round(m.iteration_time_s, 6),
                    "time_from": m.time_source or None,
                    "memory_gib": m.memory_gib,
                    "oom": m.oom,
                },
                "error": {
                    "iteration_time": None if te is None else round(te, 4),
                    "peak_memory": None if me is None else round(me, 4),
                },
            }
        )
    doc = {
        "schema_version": SCHEMA_VERSION,
        "runs": runs,
        "summary": summarize(results),
        "groups": summarize_groups(results),
    }
    if files is not None and len(files) > 1:
        doc["files"] = [{"path": path, "summary": summarize(list(rs))} for path, rs in files.items()]
    return doc
