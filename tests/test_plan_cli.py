"""`planner plan` end to end: JSON against its schema, determinism, --out, exit code 3 with advice."""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "gpt-13b-a100-small.yaml"


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "planner", *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def plan_text():
    return run("plan", JOB, "--json", "--no-timing", "--top", "3").stdout


def test_plan_json_matches_published_schema(plan_text):
    doc = json.loads(plan_text)
    schema = json.loads(run("schema", "plan").stdout)
    jsonschema.validate(doc, schema)
    assert doc["schema_version"] == 1
    assert [p["rank"] for p in doc["plans"]] == [1, 2, 3]
    times = [p["estimate"]["iteration_time_s"] for p in doc["plans"]]
    assert times == sorted(times)
    assert all(p["optimality"] == {"status": "optimal", "gap": 0.0} for p in doc["plans"])
    assert doc["current"]["iteration_time_s"] >= times[0]  # the job's own layout is in the space


def test_plan_invariants(plan_text):
    doc = json.loads(plan_text)
    for p in doc["plans"]:
        lay, est, place = p["layout"], p["estimate"], p["placement"]
        assert lay["tp"] * lay["pp"] * lay["dp"] * lay["cp"] == place["world_size"] == 32
        assert sum(s["layers"] for s in lay["stages"]) == 40
        assert lay["micro_batch_size"] * lay["num_microbatches"] * lay["dp"] == 256
        assert est["peak_memory_gib"] <= 80 * 0.95 + 1e-9
        assert len(place["stages"]) == lay["pp"]
        assert place["stages"][-1]["last_rank"] == 31 and place["rank_order"] == "tp-cp-ep-dp-pp"


def test_plan_is_byte_identical_across_runs_and_workers(plan_text):
    assert run("plan", JOB, "--json", "--no-timing", "--top", "3").stdout == plan_text
    assert run("plan", JOB, "--json", "--no-timing", "--top", "3", "--workers", "2").stdout == plan_text


def test_out_file_written(tmp_path, plan_text):
    out = tmp_path / "plan.json"
    run("plan", JOB, "--json", "--no-timing", "--top", "3", "--out", out)
    assert out.read_text() == plan_text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".plan.json")]  # no temp file left


def test_nothing_fits_exit_3_with_advice(tmp_path):
    job = tmp_path / "huge.yaml"
    job.write_text(
        "model: llama3-405b\ncluster: [{gpu: a100-40gb, nodes: 1, gpus_per_node: 8}]\n"
        "training: {seq_length: 8192, global_batch_size: 64}\n"
    )
    proc = run("plan", job, "--time-limit", "20", check=False)
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: nothing fits")
    assert "nodes" in lines[0] and "Traceback" not in proc.stderr
