"""scripts/validate_emitters.py without the framework venvs: its plan generator (valid plan JSON documents that
LaunchPlan.of reads, layouts that pass planner.parallel's checks, the same plans for a seed), its one-line bad-input
exit, and a small run that reports every validator as skipped when no venv exists."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.emit.launch_plan import LaunchPlan
from planner.errors import Inexpressible
from planner.load import parse_job
from planner.parallel import dims_from_layout
from planner.spec import Layout

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "validate_emitters.py"
sys.path.insert(0, str(ROOT / "scripts"))

import validate_emitters as ve  # noqa: E402

LAYOUT_FIELDS = set(Layout.model_fields)


def _layout(plan: dict) -> Layout:
    """The plan's layout as a job layout (without the derived and null fields the plan JSON adds)."""
    lay = {k: v for k, v in plan["layout"].items() if k in LAYOUT_FIELDS and v is not None}
    lay["stages"] = [{k: v for k, v in s.items() if v is not None} for s in lay["stages"]]
    return Layout.model_validate(lay)


def run_script(*args: str, cwd: Path | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd or ROOT, env=env, timeout=timeout
    )


def test_generated_plans_are_valid_plan_documents():
    read = inexpressible = 0
    kinds, mixed = set(), 0
    for i in range(40):
        gp = ve.gen_plan(0, i)
        doc = gp.doc
        assert doc["schema_version"] == 1 and len(doc["plans"]) == 1
        job = parse_job(doc["job"])
        plan = doc["plans"][0]
        dims_from_layout(_layout(plan), job).check()  # the planner.parallel rules (raises SpecError)
        try:
            lp = LaunchPlan.of(doc, 1, "megatron")
        except Inexpressible:  # per-stage recompute counts: drawn on purpose now and then
            inexpressible += 1
            continue
        read += 1
        assert sum(lp.stage_layers) == job.model.num_layers
        assert lp.global_batch_size == lp.micro_batch_size * lp.dp * lp.num_microbatches
        kinds.add(gp.kind)
        mixed += gp.mixed
    assert read >= 30 and inexpressible <= 10
    assert kinds == {"dense", "moe"}


def test_generated_plans_cover_the_layout_space():
    seen = set()
    for i in range(120):
        lay = ve.gen_plan(1, i).doc["plans"][0]["layout"]
        seen |= {k for k in ("cp", "ep", "vpp") if lay[k] > 1}
        seen.add(f"zero{lay['zero_stage']}")
        seen.add(lay["recompute"])
        if len({s["layers"] for s in lay["stages"]}) > 1:
            seen.add("uneven")
        if any(s.get("recompute_layers") for s in lay["stages"]):
            seen.add("partial")
        if any(s.get("group") is not None for s in lay["stages"]):
            seen.add("mixed")
        if (lay["tp"] or 1) > 1:
            seen.add("tp")
    want = {"cp", "ep", "vpp", "zero0", "zero1", "zero2", "zero3", "none", "full", "uneven", "partial", "mixed", "tp"}
    assert want <= seen, want - seen


def test_generator_is_deterministic_for_a_seed():
    a = [json.dumps(ve.gen_plan(7, i).doc, sort_keys=True) for i in range(8)]
    b = [json.dumps(ve.gen_plan(7, i).doc, sort_keys=True) for i in range(8)]
    c = [json.dumps(ve.gen_plan(8, i).doc, sort_keys=True) for i in range(8)]
    assert a == b
    assert a != c
    # plan i does not depend on the plans before it (--only reruns one)
    assert json.dumps(ve.gen_plan(7, 5).doc, sort_keys=True) == a[5]


@pytest.mark.parametrize(
    "args,field",
    [
        (["--plans", "0"], "--plans"),
        (["--plans", "many"], "--plans"),
        (["--frameworks", "megatorn"], "--frameworks"),
        (["--launcher", "mpirun"], "--launcher"),
        (["--only", "-3"], "--only"),
        (["--no-such-option"], "arguments"),
    ],
)
def test_bad_input_is_one_error_line(args, field):
    proc = run_script(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_unknown_framework_suggests_the_name():
    proc = run_script("--frameworks", "deepsped")
    assert "did you mean 'deepspeed'" in proc.stderr


def test_small_run_without_venvs_reports_the_validators_skipped(tmp_path):
    proc = run_script("--plans", "5", "--venvs", str(tmp_path / "no-venvs"), timeout=300)
    out = proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "skipped validators:" in out, out
    for name in ("megatron", "deepspeed", "torchtitan"):
        assert f"scripts/setup_validators.sh --only {name}" in out or f"{name}: no emitter" in out, out
    assert "torchrun lines not parsed" in out
    failures = ("emit crash", "emit error", ": rejected (", ": mismatch (", ": round trip (", "harness error")
    failed = any(f in out for f in failures)
    assert proc.returncode == (1 if failed else 0), out
    assert proc.returncode in (0, 1)


def test_launcher_stand_ins_record_every_node(tmp_path):
    """The torchrun launch script runs under bash with the torchrun stand-in: one record per node, each with its
    node rank, and the split of torchrun's own options from the program."""
    from planner.emit import EmitOptions, emit
    from planner.io import write_folder

    gp = next(p for p in (ve.gen_plan(0, i) for i in range(40)) if not p.mixed and _runs(p.doc, "megatron"))
    files = emit(gp.doc, "megatron", 1, EmitOptions())
    folder = tmp_path / "bundle"
    write_folder(folder, files)
    lp = LaunchPlan.of(gp.doc, 1, "megatron")
    b = ve.Bundle(gp, "megatron", "torchrun", folder, files, lp)
    ve.run_launcher(b, tmp_path / "work")
    assert b.launch_error is None
    assert len(b.nodes) == lp.nodes
    assert [ve._node_rank_of(b, n) for n in b.nodes] == list(range(lp.nodes))
    opts, program = ve.split_torchrun(b.nodes[0]["argv"])
    assert program[0].endswith("pretrain_gpt.py") and all(o.startswith("--") for o in opts)
    cases = ve.cases_of(b)
    assert len(cases["torchrun"]) == lp.nodes and len(cases["megatron"]) == 1


def _runs(doc, target) -> bool:
    from planner.emit import emit

    try:
        emit(doc, target)
        return True
    except Exception:  # noqa: BLE001
        return False


def test_sbatch_components_are_parsed():
    text = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n#SBATCH hetjob\n#SBATCH -N 3 --constraint=l4\n"
    comps = ve.sbatch_components(text)
    assert comps == [{"--nodes": "2", "--gpus-per-node": "8"}, {"--nodes": "3", "--constraint": "l4"}]
