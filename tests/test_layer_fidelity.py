"""scripts/layer_fidelity.py: the analytic per-layer time against Sailor's measured per-layer profiles."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "layer_fidelity.py"
SHARED = ROOT.parent / "shared" / "reference" / "layer-profiles"


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLANNER_CATALOG")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def per_gpu_rows(stdout: str) -> dict[str, list[str]]:
    """The rows of the closing per-GPU table: GPU -> its cells."""
    section = stdout.split("\nper GPU\n", 1)[1].split("\n\n", 1)[0]
    return {cells[0]: cells[1:] for cells in (row.split() for row in section.splitlines()[1:]) if cells}


def test_a_missing_folder_is_one_error_line():
    missing = "/nonexistent/planner-test/layer-profiles"
    proc = run("--layer-profiles", missing)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"error: layer-profiles: scripts/layer_fidelity.py needs the shared per-layer profiles; no folder at "
        f"{missing} (pass --layer-profiles DIR)"
    ]


def test_a_checkout_without_the_shared_folder_names_the_default(tmp_path):
    """A copy of scripts/ with no ../shared beside the checkout: the default path, as typed from the checkout."""
    shutil.copytree(SCRIPT.parent, tmp_path / "checkout" / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLANNER_CATALOG")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "scripts/layer_fidelity.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "checkout",
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "error: layer-profiles: scripts/layer_fidelity.py needs the shared per-layer profiles; no folder at "
        "../shared/reference/layer-profiles (pass --layer-profiles DIR)\n"
    )


def test_a_folder_without_sailor_profiles_is_one_error_line(tmp_path):
    proc = run("--layer-profiles", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: layer-profiles: no Sailor profile under ") and proc.stderr.count("\n") == 1


def test_a_profile_equal_to_the_analytic_model_has_no_error(tmp_path):
    """A synthetic Sailor file whose times are the analytic ones: every error is 0, and unknown GPUs are listed."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import layer_fidelity as lf
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    data = {}
    for mbs in (1, 4):
        for tp in (1, 2):
            fwd, bwd = lf.analytic_layer("OPT-350", "a100-80gb", mbs, tp, {})
            data.setdefault(str(mbs), {})[str(tp)] = {"1": [9.0, 9.0, 1.0], "2": [fwd, bwd, 1.0]}
    for gpu in ("A100-80", "Some-GPU"):
        folder = tmp_path / "sailor" / "profiles" / "OPT-350" / gpu
        folder.mkdir(parents=True)
        (folder / "profile.json").write_text(json.dumps(data))
    proc = run("--layer-profiles", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = per_gpu_rows(proc.stdout)
    assert set(rows) == {"A100-80", "all"}  # "all GPUs"
    assert rows["A100-80"] == ["4", "0.0%", "0.0%", "+0.0%", "0.0%", "0.0%", "+0.0%"]
    assert "skipped: GPU Some-GPU (not in the catalog): OPT-350" in proc.stdout
    # --gpu-map prices an unknown GPU with a catalog one
    mapped = run("--layer-profiles", str(tmp_path), "--gpu-map", "Some-GPU=a100-80gb")
    assert mapped.returncode == 0 and set(per_gpu_rows(mapped.stdout)) == {"A100-80", "Some-GPU", "all"}
    bad = run("--layer-profiles", str(tmp_path), "--gpu-map", "Some-GPU")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --gpu-map: expected SAILOR=CATALOG")


@pytest.mark.skipif(not (SHARED / "sailor" / "profiles").is_dir(), reason="no shared layer-profiles folder")
@pytest.mark.parametrize("extra", [(), ("--fp32",)])
def test_the_shared_profiles_print_a_row_per_gpu(extra):
    proc = run(*extra)  # the default folder: ../shared/reference/layer-profiles
    assert proc.returncode == 0, proc.stderr
    profiled = {p.parent.name for p in (SHARED / "sailor" / "profiles").glob("*/*/profile.json")}
    priced = profiled & {"A100-40", "A100-80", "V100-16"}  # the Sailor GPUs the catalog holds
    rows = per_gpu_rows(proc.stdout)
    assert set(rows) == priced | {"all"}
    for gpu in priced:
        assert int(rows[gpu][0]) > 0 and all(re.fullmatch(r"[+-]?\d+\.\d%", c) for c in rows[gpu][1:])
        assert f"\n{gpu} (priced as " in proc.stdout  # its own table
    for gpu in profiled - priced:
        assert f"GPU {gpu} (not in the catalog)" in proc.stdout
