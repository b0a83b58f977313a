"""`planner check` on the command line: exit codes, the four formats (JSON against its published schema, JUnit XML,
GitHub annotations and step summary, the table), --output, --update-baseline, and the shipped CI examples: the
GitHub workflow's gate step run on a sample config repository (one good and one bad change), the GitLab snippet and
the pre-commit hook."""

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "examples" / "ci"
CONFIGS = sorted((CI / "configs").glob("*.yaml"))
GITHUB_WORKFLOW = CI / "github-actions.yml"


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_") and k != "PLANNER_CATALOG"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's planner
    env.update(extra)
    return env


def planner(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=120,
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture
def configs(tmp_path) -> Path:
    """tmp/configs: the sample configs, a lock of them, one config that does not fit and one that is slower."""
    folder = tmp_path / "configs"
    folder.mkdir()
    for path in CONFIGS:
        shutil.copy(path, folder / path.name)
    proc = planner("check", *[p.name for p in CONFIGS], "--baseline", "plan.lock.json", "--update-baseline", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith(f"wrote {len(CONFIGS)} baseline entries to plan.lock.json")
    text = (folder / "gpt-13b-a100.yaml").read_text()
    (folder / "too-big.yaml").write_text(text.replace("micro_batch_size: 2", "micro_batch_size: 16"))
    slower = text.replace("recompute: selective", "recompute: full")
    (folder / "gpt-13b-a100.yaml").write_text(slower)
    return folder


def test_exit_codes(configs):
    assert planner("check", "llama3-8b-h100.yaml", "--baseline", "plan.lock.json", cwd=configs).returncode == 0
    failed = planner("check", "llama3-8b-h100.yaml", "too-big.yaml", cwd=configs)
    assert failed.returncode == 1 and failed.stderr == ""
    (configs / "notes.yaml").write_text("owner: infra\n")
    line = one_error_line(planner("check", "llama3-8b-h100.yaml", "notes.yaml", cwd=configs))
    assert line.startswith("error: target: 'notes.yaml' is not a job")
    assert one_error_line(planner("check", "missing.yaml", cwd=configs)) == "error: target: no such file 'missing.yaml'"
    line = one_error_line(planner("check", "llama3-8b-h100.yaml", "--format", "xml", cwd=configs))
    assert line.startswith("error: --format: unknown format 'xml'")


def test_json_matches_the_published_schema(configs):
    schema_proc = planner("schema", "check", cwd=configs)
    assert schema_proc.returncode == 0, schema_proc.stderr
    schema = json.loads(schema_proc.stdout)
    assert schema["title"] == "planner check output, schema_version 1"
    proc = planner(
        "check", "gpt-13b-a100.yaml", "too-big.yaml", "--baseline", "plan.lock.json", "--format", "json", cwd=configs
    )
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, schema)
    assert doc["schema_version"] == 1 and [r["target"] for r in doc["results"]] == ["gpt-13b-a100.yaml", "too-big.yaml"]
    statuses = {(r["target"], c["name"]): c["status"] for r in doc["results"] for c in r["checks"]}
    assert statuses[("gpt-13b-a100.yaml", "no_regression")] == "fail"
    assert statuses[("too-big.yaml", "fits")] == "fail"
    assert statuses[("too-big.yaml", "no_regression")] == "skipped"  # not in the lock

    def described(node, where="$"):
        if isinstance(node, dict):
            if "properties" in node:
                for name, prop in node["properties"].items():
                    assert prop.get("description"), f"{where}.{name} has no description"
            for key, value in node.items():
                described(value, f"{where}.{key}")

    described(schema)


def test_junit_has_one_testcase_per_target_and_check(configs):
    out = configs / "report" / "checks.xml"
    proc = planner("check", "llama3-8b-h100.yaml", "too-big.yaml", "--format", "junit", "--output", out, cwd=configs)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "planner: wrote the junit report to" in proc.stderr
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    cases = root.findall("./testsuite/testcase")
    assert [(c.get("file"), c.get("name")) for c in cases] == [
        (t, n)
        for t in ("llama3-8b-h100.yaml", "too-big.yaml")
        for n in ("valid", "fits", "no_regression", "efficiency")
    ]
    failures = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("file"), c.get("name")) for c in failures] == [("too-big.yaml", "fits")]
    assert "largest terms GiB" in failures[0].find("failure").get("message")
    assert len([c for c in cases if c.find("skipped") is not None]) == 4  # no baseline, no efficiency
    assert root.get("tests") == "8" and root.get("failures") == "1" and root.get("skipped") == "4"


ANNOTATION = re.compile(
    r"^::error file=(?P<file>[^,:]+),line=(?P<line>\d+)::planner check (?P<check>\w+): (?P<msg>.+)$"
)


def layout_line(path: Path) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("layout:"))


def test_github_annotations_and_step_summary(configs, tmp_path):
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    args = ("check", "gpt-13b-a100.yaml", "too-big.yaml", "llama3-8b-h100.yaml", "--baseline", "plan.lock.json")
    proc = planner(*args, "--format", "github", "--output", "summary.md", cwd=configs, GITHUB_STEP_SUMMARY=str(summary))
    assert proc.returncode == 1
    annotations = proc.stdout.splitlines()
    found = [ANNOTATION.match(line) for line in annotations]
    assert all(found), annotations
    assert {(m["file"], m["check"]) for m in found} == {
        ("gpt-13b-a100.yaml", "no_regression"),
        ("too-big.yaml", "fits"),
    }
    for m in found:
        assert int(m["line"]) == layout_line(configs / m["file"])  # the `layout:` key of the offending file
    regression = next(m for m in found if m["check"] == "no_regression")
    assert "%25" in regression["msg"] and "slower: compute" in regression["msg"]  # "%" escaped as Actions wants
    step = summary.read_text()
    assert step.startswith("earlier step\n")  # appended, as Actions collects a step's summary
    table = step.splitlines()[1:]
    assert table[0].startswith("### planner check: 3 targets: 2 failed")
    assert table[2] == "| target | check | status | detail |" and table[3] == "|---|---|---|---|"
    rows = [line for line in table[4:] if line]
    assert len(rows) == 12 and all(line.startswith("| `") and line.endswith(" |") for line in rows)
    assert (configs / "summary.md").read_text() == step.removeprefix("earlier step\n")
    alone = planner(*args, "--format", "github", cwd=configs)  # no step summary, no --output: to stdout
    assert "| target | check | status | detail |" in alone.stdout and alone.stdout.startswith("::error ")


def test_text_table_and_output_file(configs):
    shown = planner("check", "llama3-8b-h100.yaml", "too-big.yaml", cwd=configs)
    assert shown.returncode == 1
    for word in ("llama3-8b-h100.yaml", "too-big.yaml", "valid", "fits", "no_regression", "efficiency", "fail"):
        assert word in shown.stdout
    proc = planner("check", "llama3-8b-h100.yaml", "--output", "report.txt", cwd=configs)
    assert proc.returncode == 0 and proc.stdout == ""
    text = (configs / "report.txt").read_text()
    assert "planner check: 1 target: 0 failed, 2 passed, 2 skipped" in text and "\x1b[" not in text


def test_update_baseline_then_no_regression(configs):
    assert planner("check", "gpt-13b-a100.yaml", "--baseline", "plan.lock.json", cwd=configs).returncode == 1
    accepted = planner("check", "gpt-13b-a100.yaml", "--baseline", "plan.lock.json", "--update-baseline", cwd=configs)
    assert accepted.returncode == 0 and "baseline updated" in accepted.stdout
    assert planner("check", "gpt-13b-a100.yaml", "--baseline", "plan.lock.json", cwd=configs).returncode == 0
    lock = json.loads((configs / "plan.lock.json").read_text())
    assert sorted(lock["targets"]) == sorted(p.name for p in CONFIGS)


def test_the_shipped_configs_pass_against_the_shipped_lock():
    """examples/ci/configs/plan.lock.json is current (or re-prices cleanly after a cost-model change)."""
    lock = CI / "configs" / "plan.lock.json"
    proc = planner("check", *CONFIGS, "--baseline", lock, "--format", "json", cwd=ROOT)
    assert proc.returncode == 0, proc.stdout
    for result in json.loads(proc.stdout)["results"]:
        assert [c["status"] for c in result["checks"]] == ["pass", "pass", "pass", "skipped"]


def test_help_has_an_example():
    proc = planner("check", "--help", cwd=ROOT)
    assert proc.returncode == 0 and "Example: planner check" in proc.stdout


# ----------------------------------------------------------------------------------------------- the CI examples


def gate_step() -> tuple[str, dict]:
    """The shell script and environment of the workflow's gate step (`id: gate`), as GitHub would run it."""
    workflow = yaml.safe_load(GITHUB_WORKFLOW.read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    step = next(s for s in steps if s.get("id") == "gate")
    return step["run"], step.get("env", {})


def git(repo: Path, *args: str) -> str:
    env = clean_env(
        GIT_AUTHOR_NAME="ci",
        GIT_AUTHOR_EMAIL="ci@example.com",
        GIT_COMMITTER_NAME="ci",
        GIT_COMMITTER_EMAIL="ci@example.com",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
    )
    proc = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args], cwd=repo, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def run_gate_step(repo: Path, base_sha: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, str]:
    script, step_env = gate_step()
    env = {}
    for key, value in step_env.items():
        value = str(value).replace("${{ github.event.pull_request.base.sha }}", base_sha)
        assert "${{" not in value, f"the test does not know {value}"
        env[key] = value
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "planner"  # what `pip install` puts on PATH
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m planner "$@"\n')
    shim.chmod(0o755)
    summary = tmp_path / f"summary-{base_sha[:8]}.md"
    summary.write_text("")
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", GITHUB_STEP_SUMMARY=str(summary))
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],  # Actions' `run` shell on Linux
        cwd=repo,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, summary.read_text()


@pytest.mark.skipif(not (shutil.which("git") and shutil.which("bash")), reason="needs git and bash")
def test_the_github_workflow_gates_a_good_and_a_bad_change(tmp_path):
    repo = tmp_path / "repo"
    (repo / "configs").mkdir(parents=True)
    git(repo, "init", "-q")
    for path in CONFIGS:
        shutil.copy(path, repo / "configs" / path.name)
    (repo / "README.md").write_text("training configs\n")
    written = planner(
        "check", "configs/gpt-13b-a100.yaml", "configs/llama3-8b-h100.yaml", "--baseline", "configs/plan.lock.json",
        "--update-baseline", cwd=repo,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    base = commit(repo, "configs and their lock")

    # A good change: the Llama job drops selective recompute (the same time with flash attention, and it fits).
    llama = repo / "configs" / "llama3-8b-h100.yaml"
    llama.write_text(llama.read_text().replace("recompute: selective", "recompute: none"))
    (repo / "README.md").write_text("training configs, v2\n")  # not a config: not checked
    good = commit(repo, "good change")
    proc, summary = run_gate_step(repo, base, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "::error" not in proc.stdout
    assert "| target | check | status | detail |" in summary
    assert "`configs/llama3-8b-h100.yaml`" in summary and "gpt-13b" not in summary  # only the changed config
    assert "❌" not in summary
    assert (repo / "planner-check.md").read_text() == summary  # the artifact the workflow uploads

    # A bad change: the GPT job's micro-batch grows 8x and no longer fits.
    gpt = repo / "configs" / "gpt-13b-a100.yaml"
    gpt.write_text(gpt.read_text().replace("micro_batch_size: 2", "micro_batch_size: 16"))
    commit(repo, "bad change")
    proc, summary = run_gate_step(repo, good, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [ANNOTATION.match(line) for line in proc.stdout.splitlines()]
    assert errors and all(errors), proc.stdout
    assert {(m["file"], m["check"]) for m in errors} >= {("configs/gpt-13b-a100.yaml", "fits")}
    assert all(int(m["line"]) == layout_line(gpt) for m in errors)
    assert "| `configs/gpt-13b-a100.yaml` | fits | ❌ fail |" in summary and "llama3" not in summary

    # Nothing changed: nothing to check.
    proc, summary = run_gate_step(repo, git(repo, "rev-parse", "HEAD"), tmp_path)
    assert proc.returncode == 0 and "no config changed" in summary


def test_the_gitlab_snippet_gates_with_junit():
    job = yaml.safe_load((CI / "gitlab-ci.yml").read_text())["planner-check"]
    script = "\n".join(job["script"])
    assert "planner check" in script and "--format junit --output planner-check.xml" in script
    assert "$CI_MERGE_REQUEST_DIFF_BASE_SHA" in script and "--baseline configs/plan.lock.json" in script
    assert job["artifacts"]["reports"]["junit"] == "planner-check.xml" and job["artifacts"]["when"] == "always"
    assert job["variables"]["GIT_DEPTH"] == "0"
    # the same selection of configs as the GitHub workflow
    github_script, _ = gate_step()
    pathspecs = re.findall(r"'[^']*configs[^']*'", github_script)
    assert pathspecs and all(p in script for p in pathspecs)


def test_the_pre_commit_hook():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "planner-check")
    assert hook["entry"] == "planner check" and hook["language"] == "python"
    files, exclude = re.compile(hook["files"]), re.compile(hook["exclude"])

    def selected(path: str) -> bool:
        return bool(files.search(path)) and not exclude.search(path)

    assert selected("configs/llama.yaml") and selected("configs/team/a.yml") and selected("configs/plan.json")
    assert not selected("configs/plan.lock.json") and not selected("src/app.yaml") and not selected("configs/a.md")
