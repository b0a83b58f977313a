"""`planner validate` over several measured-runs files: the summary over all runs, per source group and per file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.runs import load_runs
from planner.validate import NO_GROUP, group_of, run_validation, summarize

ROOT = Path(__file__).resolve().parents[1]


def planner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True)


def run(run_id: str, group: str | None, *, hidden=1024, layers=8, tp=1, pp=1, time_s=1.0, memory_gb=20.0):
    """A tiny run in the format of shared/reference/measured-runs.yaml."""
    entry = {
        "id": run_id,
        "model": {"name": run_id, "arch": "GPT", "layers": layers, "hidden": hidden, "heads": 16, "vocab": 32000}
        | {"seq_len": 2048},
        "hardware": {"gpu": "h100-sxm", "n_gpus": 8, "gpus_per_node": 8},
        "parallel": {"tp": tp, "pp": pp, "cp": 1, "vpp": 1, "sp": tp > 1, "zero": 0, "recompute": "none"}
        | {"micro_batch": 1, "global_batch": 64, "precision": "bf16"},
        "measured": {"iteration_time_s": time_s, "memory_gb": memory_gb, "oom": False},
    }
    if group is not None:
        entry["source_group"] = group
    return entry


def skipped(run_id: str, group: str) -> dict:
    """A run the planner cannot express: its layout is not stated."""
    entry = run(run_id, group)
    del entry["parallel"]["tp"], entry["parallel"]["pp"]
    return entry


def write(path: Path, runs: list[dict]) -> Path:
    path.write_text(yaml.safe_dump(runs, sort_keys=False))
    return path


@pytest.fixture
def files(tmp_path):
    a = write(
        tmp_path / "a.yaml",
        [run("a-1", "alpha", time_s=0.8), run("a-2", "beta", hidden=2048, tp=2, time_s=2.0), skipped("a-3", "alpha")],
    )
    b = write(tmp_path / "b.yaml", [run("b-1", "beta", layers=12, time_s=1.5), run("b-2", None, memory_gb=30.0)])
    return a, b


def validate_json(*paths: Path) -> dict:
    res = planner("validate", *map(str, paths), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_groups_counts_and_summaries(files):
    a, b = files
    doc = validate_json(a, b)
    results = run_validation(load_runs(a)) + run_validation(load_runs(b))
    assert [r["id"] for r in doc["runs"]] == ["a-1", "a-2", "a-3", "b-1", "b-2"]
    assert doc["summary"] == summarize(results)
    assert list(doc["groups"]) == sorted(["alpha", "beta", NO_GROUP])
    counts = {g: (s["runs"], s["predicted"], s["skipped"]) for g, s in doc["groups"].items()}
    assert counts == {"alpha": (2, 1, 1), "beta": (2, 2, 0), NO_GROUP: (1, 1, 0)}
    for group, s in doc["groups"].items():
        assert s == summarize([r for r in results if group_of(r) == group])
    assert sum(s["runs"] for s in doc["groups"].values()) == doc["summary"]["runs"]


def test_each_run_names_its_group(files):
    doc = validate_json(*files)
    groups = {r["id"]: r["source_group"] for r in doc["runs"]}
    assert groups == {"a-1": "alpha", "a-2": "beta", "a-3": "alpha", "b-1": "beta", "b-2": None}
    skipped_run = next(r for r in doc["runs"] if r["id"] == "a-3")
    assert skipped_run["status"] == "skipped" and skipped_run["reason"]


def test_by_file_summaries(files):
    a, b = files
    doc = validate_json(a, b)
    assert [f["path"] for f in doc["files"]] == [str(a), str(b)]
    for f, path in zip(doc["files"], (a, b)):
        assert f["summary"] == summarize(run_validation(load_runs(path)))
    assert [f["summary"]["runs"] for f in doc["files"]] == [3, 2]


def test_one_file_has_groups_but_no_file_list(files):
    a, _ = files
    doc = validate_json(a)
    assert "files" not in doc
    assert list(doc["groups"]) == ["alpha", "beta"]
    assert doc["summary"]["runs"] == 3


def test_json_is_deterministic(files):
    first = planner("validate", *map(str, files), "--json")
    again = planner("validate", *map(str, files), "--json")
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout


def test_duplicate_id_across_files_is_bad_input(tmp_path, files):
    a, _ = files
    c = write(tmp_path / "c.yaml", [run("a-2", "gamma")])
    res = planner("validate", str(a), str(c))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith("error: runs: ")
    assert "'a-2'" in res.stderr and str(a) in res.stderr and str(c) in res.stderr
    assert "Traceback" not in res.stderr


def test_the_same_file_twice_is_bad_input(files):
    a, _ = files
    res = planner("validate", str(a), str(a), "--json")
    assert res.returncode == 2
    assert res.stderr.startswith("error: runs: ") and len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == ""


def test_rich_report_has_group_and_file_tables(files):
    res = planner("validate", *map(str, files))
    assert res.returncode == 0, res.stderr
    assert "By source group" in res.stdout and "By file" in res.stdout
    for group in ("alpha", "beta", NO_GROUP):
        assert group in res.stdout
    one = planner("validate", str(files[0]))
    assert "By source group" in one.stdout and "By file" not in one.stdout
