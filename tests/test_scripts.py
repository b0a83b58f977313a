"""scripts/*.py without their input files: one line `error: <field>: ...` on stderr, exit 2, no traceback, no search.

Two ways a file goes missing: a path given on the command line that does not exist, and the defaults of a copy of
scripts/ in a folder with no ../shared/reference/measured-runs.yaml, no examples/ and no tests/ (what a checkout
without the shared folder looks like; ../shared itself is read-only and never moved).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
MISSING = "/nonexistent/planner-test/missing.yaml"


def run_script(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLANNER_CATALOG")}
    env["PYTHONPATH"] = str(ROOT)  # the planner package, for a copy of scripts/ outside the checkout
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


def assert_one_error_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""  # nothing started: no table header, no progress
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    "script,args,expected",
    [
        (
            "calibrate.py",
            ["--runs", MISSING],
            f"error: runs: scripts/calibrate.py needs a measured-runs file; none at {MISSING} (pass --runs FILE)",
        ),
        (
            "calibrate.py",
            [MISSING],  # the positional form the README used
            f"error: runs: scripts/calibrate.py needs a measured-runs file; none at {MISSING} (pass --runs FILE)",
        ),
        (
            "plan_quality.py",
            ["--runs", MISSING, "--time-limit", "1"],
            f"error: runs: scripts/plan_quality.py needs a measured-runs file; none at {MISSING} (pass --runs FILE)",
        ),
        (
            "bench_search.py",
            ["--jobs", str(ROOT / "examples/bench/gpt-530b-5128-a100.yaml"), MISSING],
            f"error: jobs: scripts/bench_search.py needs its job files; none at {MISSING} (pass --jobs FILE...)",
        ),
        (
            "bench_hetero.py",
            ["--jobs", MISSING],
            f"error: jobs: scripts/bench_hetero.py needs its job files; none at {MISSING} (pass --jobs FILE...)",
        ),
    ],
)
def test_missing_file_given(script, args, expected, tmp_path):
    line = assert_one_error_line(run_script(SCRIPTS / script, *args, cwd=tmp_path))
    assert line == expected


def test_malformed_runs_file_is_one_line(tmp_path):
    proc = run_script(
        SCRIPTS / "calibrate.py", "--runs", str(ROOT / "tests/bad_inputs/runs/hidden-string.yaml"), cwd=tmp_path
    )
    assert_one_error_line(proc, "runs[0].model.hidden")


@pytest.fixture(scope="module")
def bare_checkout(tmp_path_factory) -> Path:
    """<tmp>/checkout/scripts/: a copy of scripts/ with no shared/ beside the checkout, no examples/, no tests/."""
    top = tmp_path_factory.mktemp("bare")
    shutil.copytree(SCRIPTS, top / "checkout" / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    return top / "checkout"


@pytest.mark.parametrize(
    "script,fragments",
    [
        (
            "calibrate.py",
            [
                "error: runs: scripts/calibrate.py needs a measured-runs file; "
                "none at ../shared/reference/measured-runs.yaml (pass --runs FILE)"
            ],
        ),
        (
            "plan_quality.py",
            [
                "error: runs: scripts/plan_quality.py needs a measured-runs file; "
                "none at ../shared/reference/measured-runs.yaml (pass --runs FILE)"
            ],
        ),
        (
            "bench_search.py",
            [
                "error: jobs: scripts/bench_search.py needs its job files; none at examples/bench/",
                "(pass --jobs FILE...)",
            ],
        ),
        (
            "bench_hetero.py",
            [
                "error: jobs: scripts/bench_hetero.py needs its job files; none at examples/hetero/",
                "(pass --jobs FILE...)",
            ],
        ),
        ("fuzz.py", ["error: tests: scripts/fuzz.py needs tests/strategies.py", "none at tests/strategies.py"]),
    ],
)
def test_default_files_missing(script, fragments, bare_checkout):
    assert_one_error_line(run_script(bare_checkout / "scripts" / script, cwd=bare_checkout), *fragments)


def test_every_script_is_covered_and_documented():
    scripts = sorted(p.name for p in SCRIPTS.glob("*.py") if not p.name.startswith("_"))
    assert scripts == [
        "bench_check.py",
        "bench_hetero.py",
        "bench_search.py",
        "bench_time_limit.py",
        "calibrate.py",
        "compare_revisions.py",
        "fuzz.py",
        "layer_fidelity.py",
        "plan_quality.py",
        "validate_emitters.py",
    ]
    for name in scripts:
        text = (SCRIPTS / name).read_text()
        assert text.startswith('"""'), name
        doc = text.split('"""')[1]
        assert "Needs" in doc, name  # what it reads
        assert re.search(r"\d+ (s|minutes)\b", doc), name  # and roughly how long it takes


def test_measured_runs_doc_example_validates(tmp_path):
    """docs/measured-runs.md's complete one-run example is accepted and predicted by `planner validate`."""
    text = (ROOT / "docs" / "measured-runs.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    (tmp_path / "runs.yaml").write_text(block)
    env = {k: v for k, v in os.environ.items() if k != "PLANNER_CATALOG"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's planner, whatever is installed
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "validate", "runs.yaml", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["predicted"] == 1 and doc["summary"]["skipped"] == 0
    run = doc["runs"][0]
    assert run["assumed"] == []  # every setting stated
    assert run["measured"]["time_from"] == "iteration_time_s" and run["predicted"]["fits"]


def test_fuzz_under_a_framework_checks_that_each_plan_runs_there():
    """scripts/fuzz.py --framework X plans as `plan --framework X` and holds every plan to X's check_runnable
    (strategies.SearchSettings.refusals): a plan it found passes, the same plan at ZeRO-1 is refused under
    torchtitan (ZeRO-0 or 3 only); a short run under each framework finds no violation."""
    sys.path.insert(0, str(ROOT / "tests"))
    from strategies import SearchSettings, run_case

    raw = {
        "model": "llama3-8b",
        "cluster": [{"gpu": "h100-sxm", "nodes": 2, "gpus_per_node": 8}],
        "training": {"seq_length": 4096, "global_batch_size": 64},
    }
    settings = SearchSettings(0.05, False, True, framework="torchtitan")
    _, result, doc, violations = run_case(raw, settings, top=1, time_limit_s=30)
    assert result.plans and violations == [] and settings.refusals(doc) == []
    doc["plans"][0]["layout"]["zero_stage"] = 1
    assert [v for v in settings.refusals(doc) if "torchtitan cannot run it" in v and "zero_stage" in v]
    for framework in ("megatron", "deepspeed", "torchtitan"):
        proc = subprocess.run(
            [sys.executable, str(SCRIPTS / "fuzz.py"), "--mixed", "--cases", "6", "--framework", framework],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "invariant violations                      0" in proc.stdout
