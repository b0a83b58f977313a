"""The basics a newcomer reaches for: --version, `list`, `-` as standard input, help with examples, one margin."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner import __version__
from planner.catalog import gpu_names, model_names
from planner.frameworks import FRAMEWORKS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama3-70b-h100.yaml"


def planner(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner", *args], cwd=ROOT, input=stdin, capture_output=True, text=True
    )


def test_version():
    res = planner("--version")
    assert res.returncode == 0
    assert res.stdout.strip() == f"planner {__version__}"


@pytest.mark.parametrize(
    "kind, names", [("gpus", gpu_names), ("models", model_names), ("frameworks", lambda: sorted(FRAMEWORKS))]
)
def test_list_json_names_every_preset(kind, names):
    res = planner("list", kind, "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)[kind]
    assert [r["name"] for r in rows] == names()


def test_list_gpus_table_shows_key_numbers():
    res = planner("list", "gpus")
    assert res.returncode == 0, res.stderr
    for head in ("memory GiB", "BF16 TFLOP/s", "FP8 TFLOP/s", "NVLink GB/s", "NIC Gb/s"):
        assert head in res.stdout
    rows = {r["name"]: r for r in json.loads(planner("list", "gpus", "--json").stdout)["gpus"]}
    assert rows["h100-sxm"]["memory_gib"] == 80 and rows["h100-sxm"]["peak_tflops_fp8"] > 0
    assert rows["a100-80gb"]["peak_tflops_fp8"] is None  # no FP8 tensor cores


def test_list_models_counts_parameters():
    rows = {r["name"]: r for r in json.loads(planner("list", "models", "--json").stdout)["models"]}
    assert 69 < rows["llama3-70b"]["params_b"] < 72
    assert rows["llama3-70b"]["active_params_b"] is None
    assert rows["mixtral-8x7b"]["active_params_b"] < rows["mixtral-8x7b"]["params_b"]


def test_list_unknown_kind_is_bad_input():
    res = planner("list", "gpu")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith("error: what: unknown list 'gpu' (did you mean 'gpus'?)")


def test_dash_reads_the_job_from_stdin():
    text = EXAMPLE.read_text()
    from_stdin = planner("estimate", "-", "--json", stdin=text)
    from_file = planner("estimate", str(EXAMPLE), "--json")
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == from_file.stdout
    planned = planner("plan", "-", "--json", "--top", "1", "--no-timing", stdin=text)
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["plans"]


def test_empty_stdin_is_bad_input():
    res = planner("estimate", "-", stdin="")
    assert res.returncode == 2
    assert res.stderr == "error: job: standard input is empty\n"


@pytest.mark.parametrize("command", ["plan", "estimate", "validate", "list", "schema"])
def test_each_command_help_has_an_example_and_no_bool_metavar(command):
    res = planner(command, "--help")
    assert res.returncode == 0
    assert f"Example: planner {command}" in res.stdout
    assert "<bool>" not in res.stdout


def test_estimate_and_plan_share_one_memory_margin():
    """The job's own layout is judged alike by `estimate` and by `plan`'s current-layout row."""
    est = json.loads(planner("estimate", str(EXAMPLE), "--json").stdout)
    plan = json.loads(planner("plan", str(EXAMPLE), "--json", "--top", "1", "--no-timing").stdout)
    assert est["memory_capacity_gib"] == plan["current"]["memory_capacity_gib"] == pytest.approx(80 * 0.95)
    assert est["fits"] == plan["current"]["fits"]
    loose = json.loads(planner("estimate", str(EXAMPLE), "--json", "--memory-margin", "0").stdout)
    assert loose["memory_capacity_gib"] == 80


def test_the_console_ends_at_once_with_its_whole_output_and_status():
    """planner.console skips the interpreter's teardown (os._exit): what was printed still reaches a pipe in
    full, and the status is the one the command chose."""
    res = planner("schema", "plan")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["title"]  # the whole document, flushed before the process ended
    res = planner("plan", str(ROOT / "examples" / "no-such-job.yaml"))
    assert res.returncode == 2 and res.stderr.startswith("error: job:")


@pytest.mark.parametrize("code, status", [(None, 0), (3, 3), ("a message", 1)])
def test_the_console_exit_status_follows_system_exit(code, status):
    program = (
        "import sys, planner.cli, planner.console\n"
        f"planner.cli.main = lambda: sys.exit({code!r})\n"
        "print('out', flush=False)\n"
        "planner.console.run()\n"
    )
    res = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == status
    assert res.stdout == "out\n"  # buffered output is flushed before the process ends
    assert res.stderr == ("a message\n" if status == 1 else "")
