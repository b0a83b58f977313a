"""scripts/bench_hetero.py --suite: its job generator (deterministic per seed, >= 50 jobs in the stated ranges, every
job parses), `--list`, and its bad-input lines. No search runs here: `--list` and the errors stop before any."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner.catalog import gpu_names, model_names, resolve_gpu, resolve_model
from planner.load import parse_job

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_hetero.py"
sys.path.insert(0, str(SCRIPT.parent))

import bench_hetero  # noqa: E402

EXAMPLES = sorted((ROOT / "examples/hetero").glob("*.yaml"))


def run_script(*args: str, script: Path = SCRIPT, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLANNER_CATALOG")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert proc.stdout == ""  # nothing listed, nothing run
    return lines[0]


def test_same_seed_same_jobs_other_seed_other_jobs():
    a, b = bench_hetero.generate_jobs(0, 50), bench_hetero.generate_jobs(0, 50)
    assert a == b
    assert [j.id for j in bench_hetero.generate_jobs(1, 50)] != [j.id for j in a]
    assert bench_hetero.generate_jobs(0, 10) == a[:10]  # --jobs-count N runs the first N of the full suite


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_jobs_within_the_stated_ranges_and_parse(seed):
    jobs = bench_hetero.suite_jobs(seed, 50)
    assert len(jobs) >= 50
    generated = [j for j in jobs if j.source is None]
    assert len(generated) == 50
    assert {Path(j.source).name for j in jobs if j.source} == {p.name for p in EXAMPLES}
    gpus, models = set(gpu_names()), set(model_names())
    kinds = set()
    for job in generated:
        raw = job.raw
        types = [g["gpu"] for g in raw["cluster"]]
        assert 2 <= len(types) <= 4 and len(set(types)) == len(types) and set(types) <= gpus, job.id
        for g in raw["cluster"]:
            assert g["nodes"] >= 1 and g["gpus_per_node"] == resolve_gpu(g["gpu"]).gpus_per_node, job.id
        total = sum(g["nodes"] * g["gpus_per_node"] for g in raw["cluster"])
        assert 64 <= total <= 16_384, job.id
        t = raw["training"]
        assert 2048 <= t["seq_length"] <= 32_768, job.id
        assert 256 <= t["global_batch_size"] <= 4096, job.id
        assert t["seq_length"] * t["global_batch_size"] <= bench_hetero.MAX_TOKENS, job.id
        assert raw["model"] in models, job.id
        kinds.add(resolve_model(raw["model"]).moe is not None)
        assert job.id == bench_hetero.job_id(raw)
        cluster = "+".join(f"{g['nodes'] * g['gpus_per_node']}x{g['gpu']}" for g in raw["cluster"])
        assert job.id.startswith(f"{raw['model']} {cluster} s{t['seq_length'] // 1024}k b{t['global_batch_size']}"), (
            job.id
        )
        parsed = parse_job(raw)
        assert parsed.num_gpus == total and len(parsed.cluster) == len(types)
    assert kinds == {False, True}  # dense and MoE
    for job in jobs:
        if job.source:
            parse_job(job.raw, base_dir=ROOT / "examples/hetero")


def test_job_id_names_the_generator_parameters():
    raw = {
        "model": "llama3-70b",
        "cluster": [
            {"gpu": "h100-sxm", "nodes": 16, "gpus_per_node": 8},
            {"gpu": "a100-80gb", "nodes": 32, "gpus_per_node": 8},
        ],
        "training": {"seq_length": 8192, "global_batch_size": 1024, "precision": "bf16"},
    }
    assert bench_hetero.job_id(raw) == "llama3-70b 128xh100-sxm+256xa100-80gb s8k b1024"
    raw["training"]["precision"] = "fp16"
    assert bench_hetero.job_id(raw).endswith(" fp16")


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 21)]
    assert bench_hetero.percentile(values, 50) == 10.0
    assert bench_hetero.percentile(values, 95) == 19.0
    assert bench_hetero.percentile(values, 100) == 20.0
    assert bench_hetero.percentile([], 50) is None


def test_list_prints_the_seeded_jobs_without_running(tmp_path):
    proc = run_script("--suite", "--seed", "7", "--jobs-count", "5", "--list", "--save-jobs", str(tmp_path / "jobs"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    expected = bench_hetero.suite_jobs(7, 5)
    assert len(lines) == len(expected) == 5 + len(EXAMPLES)
    for i, (line, job) in enumerate(zip(lines, expected, strict=True), 1):
        assert line.split(None, 1)[0] == str(i) and f"  {job.id}  (" in line, line
    assert "|" not in proc.stdout  # no table: nothing ran
    saved = sorted((tmp_path / "jobs").glob("*.yaml"))
    assert len(saved) == len(expected)


def test_default_suite_lists_at_least_50_jobs():
    proc = run_script("--suite", "--list")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 50 + len(EXAMPLES)


@pytest.mark.parametrize(
    "args,line",
    [
        (["--suite", "--jobs-count", "-1"], "error: --jobs-count: expected a count of generated jobs >= 0, got -1"),
        (["--suite", "--time-limit", "0"], "error: --time-limit: expected a positive number of seconds, got 0"),
        (["--seed", "3"], "error: --seed: only with --suite"),
        (["--list"], "error: --list: only with --suite"),
        (
            ["--suite", "--jobs", str(EXAMPLES[0])],
            "error: --jobs: --suite generates its jobs (and adds examples/hetero/); drop --jobs or --suite",
        ),
    ],
)
def test_bad_input_is_one_line(args, line):
    assert one_error_line(run_script(*args)) == line


def test_suite_without_examples_is_one_line(tmp_path):
    """A copy of scripts/ in a checkout with no examples/: --suite names the folder it needs."""
    shutil.copytree(SCRIPT.parent, tmp_path / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    proc = run_script("--suite", "--list", script=tmp_path / "scripts" / SCRIPT.name, cwd=tmp_path)
    assert one_error_line(proc) == (
        "error: jobs: scripts/bench_hetero.py --suite needs its example jobs; none at examples/hetero/"
    )
