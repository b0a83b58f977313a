"""`planner validate` on the shared published runs meets the accuracy bars of the foundation issue."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "measured-runs.yaml"
pytestmark = pytest.mark.skipif(not RUNS.exists(), reason="shared/reference/measured-runs.yaml not present")


@pytest.fixture(scope="module")
def report():
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "validate", str(RUNS), "--json"], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


def test_coverage(report):
    s = report["summary"]
    assert s["coverage"] >= 0.95
    for run in report["runs"]:
        assert run["status"] in ("ok", "skipped")
        if run["status"] == "skipped":
            assert run["reason"]


def test_iteration_time_accuracy(report):
    t = report["summary"]["time"]
    assert t["count"] >= 140
    assert t["median_abs_error_pct"] <= 10.0
    assert t["p90_abs_error_pct"] <= 25.0


def test_memory_accuracy(report):
    m = report["summary"]["memory"]
    assert m["count"] >= 15
    assert m["median_abs_error_pct"] <= 10.0


def test_measured_ooms(report):
    o = report["summary"]["oom"]
    assert o["measured"] == 3
    # bloom-prequel h14336-l82 OOMed while h13312-l94, whose stages hold as many parameters and more activations,
    # ran at 67 GB; no physical term separates the two (see README, accuracy).
    assert o["predicted_not_fitting"] >= 2


def test_json_is_deterministic(report):
    again = subprocess.run(
        [sys.executable, "-m", "planner", "validate", str(RUNS), "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(again.stdout) == report
