"""What the emitter tests share: the plan JSON fixtures (tests/fixtures/plans/, written by `planner plan --json
--no-timing`): loading one by stem, and the (stem, plan rank) pairs a target can run; a plan document for one
fixed layout (also scripts/validate_emitters.py); golden folders; the shape a round trip compares; flag values."""

from __future__ import annotations

import json
import os
from pathlib import Path

from planner.emit import emit
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible
from planner.io import write_folder
from planner.load import parse_job
from planner.parallel import dims_from_layout
from planner.report.plan_json import plan_document
from planner.search.result import Plan, SearchResult

PLANS = Path(__file__).parent / "fixtures" / "plans"


def load(stem: str) -> dict:
    return json.loads((PLANS / f"{stem}.json").read_text())


def runnable(target: str) -> list[tuple[str, int]]:
    """(fixture stem, plan rank) of every fixture plan ``target`` can run (emit refuses the others)."""
    out = []
    for path in sorted(PLANS.glob("*.json")):
        doc = json.loads(path.read_text())
        for rank in range(1, len(doc["plans"]) + 1):
            try:
                emit(doc, target, rank)
            except Inexpressible:
                continue
            out.append((path.stem, rank))
    return out


def fixed_layout_doc(job, est) -> dict:
    """The plan JSON document (planner.report.plan_json.plan_document) of one priced layout: job ``job``, the
    estimate ``est`` of its layout as the only plan, no search run."""
    result = SearchResult(
        plans=[Plan(None, est, "feasible")],
        candidates=1,
        pruned=0,
        solved=0,
        seconds=0.0,
        complete=False,
        gap=0.0,
        stop_reason="time_limit",
    )
    return plan_document(job, result, None, timing=False, memory_margin=0.0)


def check_golden_folder(folder: Path, files: dict[str, str], stem: str) -> None:
    """``files`` are exactly the golden files of ``folder``; UPDATE_GOLDEN=1 rewrites the folder first."""
    if os.environ.get("UPDATE_GOLDEN") == "1":
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        write_folder(folder, files)
    assert sorted(files) == sorted(p.name for p in folder.iterdir())
    for name, text in files.items():
        assert text == (folder / name).read_text(), f"{stem}/{name} differs (UPDATE_GOLDEN=1 to accept)"


def plan_shape(plan: LaunchPlan) -> tuple:
    """The layout of ``plan`` as job_shape gives it back from the job an importer read."""
    full = plan.recompute == "full" or plan.recompute_layers >= max(plan.stage_layers)
    return (
        plan.tp,
        plan.pp,
        plan.dp,
        plan.cp,
        plan.ep,
        plan.vpp,
        plan.micro_batch_size,
        plan.sequence_parallel,
        plan.zero_stage,
        "full" if full else "op" if plan.recompute == "op" else "none",
        tuple(plan.stage_layers),
        plan.global_batch_size,
    )


def job_shape(raw: dict, base_dir: Path | None = None) -> tuple:
    """The checked layout of job ``raw`` (an importer's output), as plan_shape gives it for a plan."""
    job = parse_job(raw, base_dir=base_dir)
    d = dims_from_layout(job.layout, job).check()
    return (
        d.tp,
        d.pp,
        d.dp,
        d.cp,
        d.ep,
        d.vpp,
        d.micro_batch_size,
        d.sequence_parallel,
        d.zero_stage,
        d.recompute,
        tuple(d.stage_layers),
        job.training.global_batch_size,
    )


def flag_values(argv: list[str], flag: str) -> list[str] | None:
    """The values after ``flag`` in ``argv`` up to the next --flag ([] for a switch), None when absent."""
    if flag not in argv:
        return None
    i, values = argv.index(flag) + 1, []
    while i < len(argv) and not argv[i].startswith("--"):
        values.append(argv[i])
        i += 1
    return values
