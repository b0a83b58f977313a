"""Bad input never crashes: exit code 2 and exactly one line ``error: <field>: <message>`` on stderr.

The cases live in tests/bad_inputs/cases.yaml (inputs next to it; binary, missing, oversized inputs are generated
into tmp_path). Every case runs in-process through ``planner.cli.main`` (a subprocess costs ~1 s); a few also run
as real subprocesses, so that the console entry point's exit code and stderr are checked end to end.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.cli import main

REPO = Path(__file__).resolve().parents[1]
CASES_DIR = Path(__file__).resolve().parent / "bad_inputs"
CASES = yaml.safe_load((CASES_DIR / "cases.yaml").read_text())
SUBPROCESS_CASES = [
    "job-python-object-tag",
    "job-binary-garbage",
    "job-deeply-nested",
    "hf-unknown-model-type",
    "runs-duplicated-ids",
    "cli-unknown-option",
]


def _make(kind: str, tmp: Path) -> Path:
    """Inputs not worth committing: binary garbage, a missing path, a directory, an oversized file."""
    rng = random.Random(kind)
    garbage = bytes([0xFF, 0xFE, 0x00, 0x89]) + bytes(rng.randrange(256) for _ in range(4096))
    if kind == "binary":
        (tmp / "garbage.yaml").write_bytes(garbage)
        return tmp / "garbage.yaml"
    if kind == "nul-bytes":  # valid UTF-8, but control characters YAML does not allow
        (tmp / "nul.yaml").write_bytes(b"model: llama3-8b\x00\x01\x02\ncluster: []\n")
        return tmp / "nul.yaml"
    if kind == "missing":
        return tmp / "does-not-exist.yaml"
    if kind == "directory":
        (tmp / "a-folder.yaml").mkdir()
        return tmp / "a-folder.yaml"
    if kind == "huge":
        (tmp / "huge.yaml").write_text("# padding\n" * (2 * 1024 * 1024))  # 20 MiB
        return tmp / "huge.yaml"
    if kind == "binary-config":
        (tmp / "cfg.json").write_bytes(garbage)
        (tmp / "job.yaml").write_text(
            "model: ./cfg.json\ncluster: [{gpu: h100-sxm, nodes: 1, gpus_per_node: 8}]\n"
            "training: {seq_length: 4096, global_batch_size: 64}\nlayout: {tp: 8}\n"
        )
        return tmp / "job.yaml"
    raise ValueError(f"unknown make: {kind}")


def _argv(case: dict, tmp: Path) -> list[str]:
    if "args" in case:
        return list(case["args"])
    path = _make(case["make"], tmp) if "make" in case else CASES_DIR / case["file"]
    return [case["command"], str(path)] + (["--json"] if case.get("json") else [])


def _check(case: dict, code: int, stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert code == case["expect_exit"], f"exit {code}, stderr: {stderr!r}"
    lines = stderr.splitlines()
    assert len(lines) == 1 and stderr.endswith("\n"), f"expected exactly one line on stderr, got {stderr!r}"
    line = lines[0]
    assert line.startswith("error: "), line
    field = line[len("error: ") :].split(": ", 1)[0]
    assert case["field"] in field, f"field {case['field']!r} not named in {line!r}"
    if "message" in case:
        assert case["message"] in line, f"{case['message']!r} not in {line!r}"


def test_catalog_is_complete():
    assert len(CASES) >= 50
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    assert set(SUBPROCESS_CASES) <= set(names)
    for case in CASES:
        assert {"name", "command", "expect_exit", "field"} <= set(case), case
        assert case["command"] in ("estimate", "validate"), case
        assert sum(k in case for k in ("file", "make", "args")) == 1, case
        if "file" in case:
            assert (CASES_DIR / case["file"]).is_file(), case
    kinds = {c["command"] for c in CASES} | {c["name"].split("-")[0] for c in CASES}
    assert {"estimate", "validate", "job", "hf", "runs", "cli"} <= kinds


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bad_input(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = _argv(case, tmp_path)
    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    _check(case, code, captured.err)
    assert captured.out == "", "nothing goes to stdout on bad input"


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_subprocess(name, tmp_path):
    case = next(c for c in CASES if c["name"] == name)
    proc = subprocess.run(
        [sys.executable, "-m", "planner.cli", *_argv(case, tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _check(case, proc.returncode, proc.stderr)
    assert proc.stdout == ""


def test_layout_that_does_not_fit_is_not_an_error(tmp_path, capsys):
    """A valid layout whose memory exceeds the GPU is a result (fits: false, exit 0), not bad input."""
    job = tmp_path / "big.yaml"
    job.write_text(
        "model: llama3-405b\ncluster: [{gpu: h100-sxm, nodes: 1, gpus_per_node: 8}]\n"
        "training: {seq_length: 8192, global_batch_size: 8}\nlayout: {tp: 8, pp: 1, recompute: none}\n"
    )
    main(["estimate", str(job), "--json"])
    captured = capsys.readouterr()
    assert captured.err == ""
    assert json.loads(captured.out)["fits"] is False
