"""`planner emit`, `planner plan --emit` and the refusals (exit code 4) every target shares: what one global
parallel shape cannot express (planner/emit/launch_plan.py) and each framework's limits (planner/frameworks.py)."""

import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from emit_fixtures import PLANS, load

from planner.emit import TARGETS, EmitOptions, emit
from planner.emit.launch import node_runs
from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible, SpecError

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=cwd or ROOT, check=False
    )


# ---------------------------------------------------------------------------------------------------------------
# what one global shape cannot express


def test_per_stage_tp_is_refused_for_every_target():
    doc = load("llama3-405b-3types-megatron")
    doc["plans"][0]["layout"]["stages"][0]["tp"] = 4
    for target in TARGETS:
        with pytest.raises(Inexpressible, match=rf"different TP degrees.*--framework {target}"):
            emit(doc, target)


def test_replicas_with_different_microbatch_counts_are_refused():
    with pytest.raises(Inexpressible, match="different micro-batch counts.*--framework megatron"):
        emit(load("gpt-32l-2x32-replicas"), "megatron")


def test_replicas_of_one_shape_are_plain_data_parallelism():
    doc = load("gpt-32l-2x32-replicas")
    for rep in doc["plans"][0]["layout"]["replicas"]:
        rep["micro_batches"] = 2
    plan = LaunchPlan.of(doc, 1, "megatron")
    assert plan.num_microbatches == 2 and plan.mixed
    assert [g for g, _, _ in node_runs(plan)] == [0, 1]


def test_per_stage_recompute_counts_are_refused():
    with pytest.raises(Inexpressible, match="recompute different numbers of layers"):
        emit(load("llama3-70b-h100"), "megatron", plan_rank=2)


@pytest.mark.parametrize(
    "target, change, field",
    [
        ("deepspeed", {"pp": 2, "zero_stage": 2}, "zero_stage"),
        ("deepspeed", {"vpp": 2}, "vpp"),
        ("deepspeed", {"cp": 2}, "cp"),
        ("torchtitan", {"zero_stage": 1}, "zero_stage"),
        ("megatron", {"zero_stage": 2}, "zero_stage"),
        ("megatron", {"zero_stage": 3, "ep": 2}, "zero_stage"),
    ],
)
def test_framework_limits_are_refused_naming_the_flag(target, change, field):
    doc = copy.deepcopy(load("llama3-70b-h100-megatron"))
    doc["plans"][0]["layout"].update(change)
    if change.get("pp") == 2:
        doc["plans"][0]["layout"]["stages"] = [{"layers": 40}, {"layers": 40}]
    with pytest.raises(Inexpressible) as info:
        emit(doc, target)
    assert info.value.field.endswith(field)
    assert f"--framework {target}" in info.value.message


def test_partial_recompute_is_refused_where_the_framework_has_no_count():
    doc = copy.deepcopy(load("llama3-70b-h100-torchtitan"))
    for stage in doc["plans"][0]["layout"]["stages"]:
        stage["recompute_layers"] = 2
    with pytest.raises(Inexpressible, match="all layers of a stage or none"):
        emit(doc, "torchtitan")


# ---------------------------------------------------------------------------------------------------------------
# bad input


def test_bad_plan_input_is_a_spec_error():
    with pytest.raises(SpecError, match="not a plan JSON"):
        LaunchPlan.of({"plans": []})
    doc = load("llama3-70b-h100-megatron")
    with pytest.raises(SpecError, match="--plan-rank"):
        LaunchPlan.of(doc, 9)
    with pytest.raises(SpecError, match="schema_version"):
        LaunchPlan.of({**doc, "schema_version": 99})
    broken = copy.deepcopy(doc)
    del broken["plans"][0]["placement"]
    with pytest.raises(SpecError, match="not a complete plan JSON"):
        LaunchPlan.of(broken)
    with pytest.raises(SpecError, match="unknown launcher"):
        emit(doc, "megatron", options=EmitOptions(launcher="mpirun"))
    with pytest.raises(SpecError, match="unknown framework"):
        emit(doc, "megatorn")


def test_cli_exit_codes(tmp_path):
    plan = PLANS / "llama3-70b-h100.json"
    bad = run_cli("emit", str(plan), "--framework", "megatron", "--plan-rank", "2", "-o", str(tmp_path / "x"))
    assert bad.returncode == 4, bad.stderr
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: plans[1].layout.stages: ")
    assert not (tmp_path / "x").exists()
    unknown = run_cli("emit", str(plan), "--framework", "nemo", "-o", str(tmp_path / "y"))
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: --framework: unknown framework")
    missing = run_cli("emit", str(tmp_path / "nope.json"), "--framework", "megatron", "-o", str(tmp_path / "z"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: plan: ")


# ---------------------------------------------------------------------------------------------------------------
# the launch folder


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge"])
def test_emit_writes_a_runnable_folder(tmp_path, target):
    out = tmp_path / "launch"
    res = run_cli(
        "emit", str(PLANS / "llama3-70b-h100-megatron.json"), "--framework", target, "--launcher", "slurm",
        "-o", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    for script in ("launch.sh", "sbatch.sh"):
        path = out / script
        assert path.stat().st_mode & stat.S_IXUSR
        assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    readme = (out / "README.md").read_text()
    assert "bash launch.sh NODE_RANK MASTER_ADDR" in readme and "sbatch sbatch.sh" in readme
    launch = (out / "launch.sh").read_text()
    assert "--rdzv-backend=static" in launch and '--node-rank="$NODE_RANK"' in launch
    assert "--nnodes=64" in launch


def test_launch_script_refuses_a_node_rank_out_of_range(tmp_path):
    out = tmp_path / "launch"
    assert (
        run_cli(
            "emit", str(PLANS / "llama3-70b-h100-megatron.json"), "--framework", "megatron", "-o", str(out)
        ).returncode
        == 0
    )
    res = subprocess.run(["bash", str(out / "launch.sh"), "64", "host0"], capture_output=True, text=True, check=False)
    assert res.returncode == 2 and "NODE_RANK must be 0..63" in res.stderr


def test_mixed_plan_lands_each_stage_on_its_gpu_type(tmp_path):
    doc = load("llama3-405b-3types-megatron")
    plan = LaunchPlan.of(doc, 1, "megatron")
    runs = node_runs(plan)
    files = emit(doc, "megatron", options=EmitOptions(launcher="slurm"))
    sbatch = files["sbatch.sh"]
    # one heterogeneous-job component per run of node ranks, in node-rank order, each with its GPU type
    assert sbatch.count("#SBATCH hetjob") == len(runs) - 1
    constraints = [line.split("=", 1)[1] for line in sbatch.splitlines() if line.startswith("#SBATCH --constraint=")]
    assert constraints == [plan.job.cluster[g].gpu.name for g, _, _ in runs]
    # node ranks follow the stages: every stage's first rank lies on a node of its own group
    order = plan.node_order()
    for s in plan.stages:
        assert order[s.first_rank // plan.gpus_per_node][0] == s.group
        assert order[s.last_rank // plan.gpus_per_node][0] == s.group


def test_plan_emit_writes_one_folder_per_framework(tmp_path):
    job = ROOT / "examples" / "gpt-13b-a100-small.yaml"
    out = tmp_path / "launch"
    res = run_cli(
        "plan", str(job), "--framework", "megatron", "--emit", "megatron,megatron-bridge", "-o", str(out), "--json",
        "--no-timing", "--time-limit", "30",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["plans"]
    assert (out / "megatron" / "README.md").exists() and (out / "megatron-bridge" / "launch.sh").exists()


def test_emitted_files_are_deterministic():
    doc = load("llama3-70b-h100-megatron")
    assert emit(doc, "megatron") == emit(copy.deepcopy(doc), "megatron")


def test_written_files_are_not_private(tmp_path):
    out = tmp_path / "l"
    assert (
        run_cli(
            "emit", str(PLANS / "llama3-70b-h100-megatron.json"), "--framework", "megatron", "-o", str(out)
        ).returncode
        == 0
    )
    mode = os.stat(out / "README.md").st_mode
    assert mode & stat.S_IRGRP and mode & stat.S_IROTH


def test_a_plan_found_under_framework_always_emits_for_it(tmp_path):
    """`plan --framework X` and `emit --framework X` read one rule set: the top plans under a framework restriction
    emit without refusal (Megatron: recompute counts in whole interleaved chunks, one count for all stages)."""
    from planner.frameworks import get_framework
    from planner.load import parse_job
    from planner.report.plan_json import plan_document
    from planner.search import run_search
    from planner.search.space import SearchOptions

    job = parse_job(
        {
            "model": "llama3-70b",
            "cluster": [{"gpu": "h100-sxm", "nodes": 16}],
            "training": {"seq_length": 8192, "global_batch_size": 256},
        }
    )
    for name in ("megatron", "deepspeed", "torchtitan"):
        opts = SearchOptions(framework=get_framework(name))
        result = run_search(job, opts, top=5, time_limit_s=120)
        doc = plan_document(job, result, None, timing=False, framework=name)
        for rank in range(1, len(doc["plans"]) + 1):
            assert emit(doc, name, plan_rank=rank)["README.md"]
