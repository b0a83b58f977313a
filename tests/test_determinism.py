"""`planner plan --json --no-timing` is byte-identical across runs, processes and CP-SAT worker counts.

Four runs go through the CLI entry point in this process (planner.cli.main, the same code path as the console
script), one through a fresh interpreter with a different hash seed (so set/dict iteration order and the
in-process caches cannot make runs agree by accident), and one with --workers 2.
"""

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "gpt-13b-a100-small.yaml"
ARGS = ["plan", str(JOB), "--json", "--no-timing"]


def plan_in_process(*extra: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main([*ARGS, *extra])
        except SystemExit as exc:  # main() only exits on failure
            pytest.fail(f"planner plan exited with {exc.code}")
    return buf.getvalue()


def plan_subprocess(*extra: str, hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    proc = subprocess.run(
        [sys.executable, "-m", "planner", *ARGS, *extra], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def first() -> str:
    text = plan_in_process()
    assert text.startswith("{") and '"plans"' in text and '"seconds": null' in text
    return text


def test_five_runs_byte_identical(first):
    runs = [first] + [plan_in_process() for _ in range(3)] + [plan_subprocess(hash_seed="12345")]
    assert len(runs) == 5
    for i, text in enumerate(runs[1:], start=2):
        assert text == first, f"run {i} differs from run 1"


def test_workers_1_and_2_byte_identical(first):
    assert plan_in_process("--workers", "1") == first
    assert plan_in_process("--workers", "2") == first


def test_mixed_cluster_byte_identical():
    """The mixed-GPU search (mixed pipelines, replicas, single-type comparison) is deterministic too."""
    job = ROOT / "examples" / "hetero" / "gpt-32l-2x32.yaml"
    args = ["plan", str(job), "--json", "--no-timing", "--top", "3"]
    runs = []
    for extra in ([], [], ["--workers", "2"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            main([*args, *extra])
        runs.append(buf.getvalue())
    assert '"replicas"' in runs[0]
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_mixed_search_same_in_one_process_and_two():
    """The mixed pipelines' two shares (planner/search/lockstep.py) give the same plans and counts whether they run
    side by side or one after the other."""
    from planner.load import load_job
    from planner.search.lockstep import processes_available
    from planner.search.mixed_pipelines import search_hetero

    if processes_available() < 2:
        pytest.skip("no second core, or no fork here")
    job = load_job(ROOT / "examples" / "hetero" / "llama3-405b-3types-4096.yaml")
    runs = [search_hetero(job, top=3, time_limit_s=120, processes=n) for n in (1, 2)]
    for r in runs:
        r.seconds = 0.0
    assert runs[0].complete and runs[0].solved > 0
    assert runs[1] == runs[0]
