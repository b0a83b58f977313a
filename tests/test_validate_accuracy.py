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


MODERN = RUNS.parent / "measured-runs-modern.yaml"


@pytest.mark.skipif(not MODERN.exists(), reason="shared/reference/measured-runs-modern.yaml not present")
def test_modern_runs_read_their_frameworks_defaults():
    """NeMo and torchtitan runs that leave attention and the optimizer unstated are read with their frameworks'
    defaults (fused attention, the distributed optimizer): before that reading the median time error was 265%."""
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "validate", str(MODERN), "--json"], capture_output=True, text=True, check=True
    )
    doc = json.loads(proc.stdout)
    assert doc["summary"]["time"]["median_abs_error_pct"] < 40
    nemo = [r for r in doc["runs"] if r["status"] == "ok" and r["id"].startswith("nemo")]
    assert nemo and all("attention=flash (nemo default)" in r["assumed"] for r in nemo)


def test_the_training_stack_comes_from_the_stated_framework_else_the_source():
    from planner.runs import _Section, training_stack

    def stack(run):
        return training_stack(run, _Section(run, "parallel", "run"))

    assert stack({"parallel": {}, "source": {"title": "NVIDIA/NeMo docs performance_summary.md"}}) == "nemo"
    assert stack({"parallel": {}, "source_group": "torchtitan"}) == "torchtitan"
    assert stack({"parallel": {"framework": "Megatron-DeepSpeed"}, "source": {"title": "NeMo"}}) is None
    assert stack({"parallel": {}, "source": "a 2021 paper"}) is None
