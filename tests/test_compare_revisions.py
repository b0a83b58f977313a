"""scripts/compare_revisions.py: the old-vs-new plan and timing table runs end to end, and its plan comparison flags
every differing value while only reporting keys one side lacks. About 10 s (one small job, two trees)."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_revisions.py"
SMALL_JOB = "examples/gpt-13b-a100-small.yaml"
needs_git_history = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and this checkout's history"
)


def load_script():
    spec = importlib.util.spec_from_file_location("compare_revisions", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLANNER_CATALOG")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


@needs_git_history
def test_table_against_head():
    proc = run_script("--base", "HEAD", "--jobs", SMALL_JOB, "--runs", "1")
    assert proc.returncode in (0, 1), proc.stderr  # 1: someone's edit in progress changed a plan; not a crash
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("job") and "plans identical?" in line and "new/old" in line for line in lines)
    row = next(line for line in lines if line.startswith("gpt-13b-a100-small "))
    assert row.split()[1] in ("yes", "NO"), row
    assert any(line.startswith("summary: 1 jobs") for line in lines)
    assert "extracted to" in proc.stdout and f"imports {ROOT / 'planner' / '__init__.py'}" in proc.stdout


def test_comparison_flags_values_and_reports_one_sided_keys():
    script = load_script()
    old = [{"layout": {"tp": 2, "stages": [{"layers": 8}]}, "estimate": {"iteration_time_s": 1.5}, "extra": 1}]
    new = [{"layout": {"tp": 2, "stages": [{"layers": 8}]}, "estimate": {"iteration_time_s": 1.5, "added": {}}}]
    same = script.PlanComparison()
    script.compare_values(old, new, "plans", same)
    assert same.identical
    assert same.one_sided_keys == {"plans[].extra (old only)", "plans[].estimate.added (new only)"}

    new[0]["layout"]["stages"][0]["layers"] = 9
    new[0]["estimate"]["iteration_time_s"] = 1.500001
    changed = script.PlanComparison()
    script.compare_values(old, new + new, "plans", changed)
    assert changed.differences == [("len(plans)", 1, 2)]
    script.compare_values(old, new, "plans", changed)
    assert changed.differences[1:] == [
        ("plans[0].estimate.iteration_time_s", 1.5, 1.500001),
        ("plans[0].layout.stages[0].layers", 8, 9),
    ]


def test_missing_job_file_is_one_line():
    proc = run_script("--base", "HEAD", "--jobs", "/nonexistent/planner-test/missing.yaml")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "error: jobs: scripts/compare_revisions.py needs its job files; none at /nonexistent/planner-test/missing.yaml "
        "(pass --jobs FILE...)"
    )
