"""The non-editable install: build the wheel, install it in a fresh venv, run the `planner` it installs.

The wheel is built from a copy of pyproject.toml + planner/ (nothing is written into the working tree). It is
built without build isolation when setuptools>=68 and the `wheel` package are present (.ci/run installs them: no
download), else with pip's isolated build (which fetches setuptools from the package index). The venv reaches the
dependencies (ortools, typer, pydantic, ...) through a .pth file naming this interpreter's site-packages folders,
which come after the venv's own; .pth files in those folders are not run, so an editable install of planner
there (a dev machine's) stays invisible, and the test checks that `planner.__file__` lies in the venv. Every
command runs from a folder outside the repository, without PLANNER_CATALOG or PYTHONPATH, so the catalogs must
come from the wheel's package data.
"""

import importlib.metadata
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import planner

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "llama3-70b-h100.yaml"
BUILD_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md", "LICENSE")


def _no_isolation_possible() -> bool:
    """setuptools new enough for pyproject.toml (>=68) and able to make wheels (the `wheel` package, or >=70.1)."""
    try:
        version = tuple(int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return version >= (68, 0) and (version >= (70, 1) or importlib.util.find_spec("wheel") is not None)


def _env(venv_bin: Path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PLANNER_CATALOG", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env["PATH"] = os.pathsep.join([str(venv_bin), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv_bin.parent)
    return env


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin folder, a work folder outside the repo holding a copy of the example job, the wheel path)."""
    top = tmp_path_factory.mktemp("wheel")
    src = top / "src"
    shutil.copytree(ROOT / "planner", src / "planner", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in BUILD_FILES:
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    dist = top / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", dist, src]
    if _no_isolation_possible():
        cmd.insert(4, "--no-build-isolation")
    proc = _run(cmd, cwd=top)
    assert proc.returncode == 0, f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}"
    wheels = list(dist.glob("planner-*.whl"))
    assert len(wheels) == 1, wheels

    venv = top / "venv"
    # Not --system-site-packages: when this interpreter is itself a venv (CI), that would reach the base Python's
    # packages, not the ones installed here.
    proc = _run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert proc.returncode == 0, proc.stderr
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    proc = _run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    assert proc.returncode == 0, proc.stderr
    outer = [p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()]
    (Path(proc.stdout.strip()) / "_outer_site_packages.pth").write_text("".join(f"{p}\n" for p in outer))
    # this interpreter's pip installs into the venv (pip >= 22.3: --python); --force-reinstall so that a planner
    # visible through the outer site-packages does not count as already installed
    proc = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            bin_dir / "python",
            "install",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            "--disable-pip-version-check",
            "-q",
            wheels[0],
        ],
        env=_env(bin_dir),
        cwd=top,
    )
    assert proc.returncode == 0, f"installing the wheel failed:\n{proc.stdout}\n{proc.stderr}"

    work = top / "work"
    work.mkdir()
    shutil.copy2(JOB, work / JOB.name)
    return bin_dir, work, wheels[0]


def planner_cmd(installed, *args) -> subprocess.CompletedProcess:
    bin_dir, work, _ = installed
    exe = bin_dir / ("planner.exe" if os.name == "nt" else "planner")
    return _run([exe, *args], cwd=work, env=_env(bin_dir), timeout=120)


def test_wheel_holds_the_package_data(installed):
    names = zipfile.ZipFile(installed[2]).namelist()
    for data in ("gpus.yaml", "models.yaml", "calibration.yaml"):
        assert f"planner/data/{data}" in names
    assert f"-{planner.__version__}-" in installed[2].name


def test_planner_comes_from_the_wheel_not_the_repo(installed):
    bin_dir, work, _ = installed
    proc = _run(
        [
            bin_dir / "python",
            "-c",
            "import planner, planner.catalog as c; print(planner.__file__); print(c.data_file('gpus.yaml')); "
            "print(planner.__version__)",
        ],
        cwd=work,
        env=_env(bin_dir),
    )
    assert proc.returncode == 0, proc.stderr
    module, data, version = proc.stdout.split("\n")[:3]
    venv = bin_dir.parent.resolve()
    for path in (module, data):
        p = Path(path).resolve()
        assert p.is_relative_to(venv) and "site-packages" in p.parts, path
        assert not p.is_relative_to(ROOT.resolve()), path
    assert version == planner.__version__


def test_version(installed):
    proc = planner_cmd(installed, "--version")
    assert proc.returncode == 0, proc.stderr
    assert f"planner {planner.__version__}" in proc.stdout


def test_list_gpus(installed):
    proc = planner_cmd(installed, "list", "gpus")
    assert proc.returncode == 0, proc.stderr
    assert "h100" in proc.stdout.lower()


def test_plan(installed):
    proc = planner_cmd(installed, "plan", JOB.name, "--json", "--top", "1", "--time-limit", "30")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["plans"]) == 1
    assert doc["plans"][0]["estimate"]["iteration_time_s"] > 0


def test_estimate(installed):
    proc = planner_cmd(installed, "estimate", JOB.name, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["iteration_time_s"] > 0
