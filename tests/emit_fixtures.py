"""The plan JSON fixtures the emitter tests share (tests/fixtures/plans/, written by `planner plan --json
--no-timing`): loading one by stem, and the (stem, plan rank) pairs a target can run."""

import json
from pathlib import Path

from planner.emit import emit
from planner.errors import Inexpressible

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
