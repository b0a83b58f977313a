"""The `planner check` report (planner/gate.py's GateReport) in each of its formats: the versioned JSON
(schema_version 1; `planner schema check` prints its JSON Schema), a table, GitHub Actions annotations with a
Markdown step summary, and JUnit XML (one testcase per target and check)."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from typing import Literal

from rich.table import Table

from planner.gate import FAIL, PASS, SKIPPED, GateReport
from planner.report.plan_json import _d, _Out

CHECK_SCHEMA_VERSION = 1
FORMATS = ("text", "json", "github", "junit")


class CheckOut(_Out):
    """One check of one target."""

    name: Literal["valid", "fits", "no_regression", "efficiency"] = _d(
        "valid: every parallel-degree rule holds (and every rule of the framework, when one is known); fits: every "
        "stage's predicted peak memory within its GPU's memory less the memory margin; no_regression: the predicted "
        "iteration time within --max-regression of the baseline; efficiency: at least --min-efficiency of the best "
        "plan's throughput (opt-in)"
    )
    status: Literal["pass", "fail", "skipped"] = _d(
        "pass or fail; skipped: not run (no baseline, not asked for, or the layout is not valid), the detail says why"
    )
    detail: str = _d("what was found: the numbers compared, or the rule broken and the field it is about")


class TargetOut(_Out):
    """The checks of one target, in the order valid, fits, no_regression, efficiency."""

    target: str = _d("the target's path as given on the command line")
    checks: list[CheckOut] = _d("one entry per check")


class CheckDocument(_Out):
    """The JSON of `planner check --format json`, schema_version 1. Changes within version 1 are additive."""

    schema_version: int = _d("version of this JSON format; a change that is not additive increases it")
    results: list[TargetOut] = _d("one entry per target, in command-line order")


def check_document(report: GateReport) -> dict:
    """The `planner check --format json` document (CheckDocument), validated against its schema."""
    doc = {
        "schema_version": CHECK_SCHEMA_VERSION,
        "results": [
            {
                "target": r.target,
                "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in r.checks],
            }
            for r in report.results
        ],
    }
    CheckDocument.model_validate(doc)  # the output always matches its published schema
    return doc


def check_schema() -> dict:
    """JSON Schema of `planner check --format json` (CheckDocument)."""
    schema = CheckDocument.model_json_schema()
    schema["$id"] = f"https://planner.dev/schemas/check-v{CHECK_SCHEMA_VERSION}.json"
    schema["title"] = f"planner check output, schema_version {CHECK_SCHEMA_VERSION}"
    return schema


def tally(report: GateReport) -> str:
    """``2 targets: 1 failed, 5 passed, 2 skipped``."""
    n = report.counts()
    targets = len(report.results)
    return f"{targets} target{'s' if targets != 1 else ''}: {n[FAIL]} failed, {n[PASS]} passed, {n[SKIPPED]} skipped"


# ----------------------------------------------------------------------------------------------- text

_STYLE = {PASS: "green", FAIL: "bold red", SKIPPED: "dim"}


def render_table(report: GateReport) -> Table:
    """One row per target and check."""
    table = Table(title=f"planner check: {tally(report)}", title_justify="left")
    for col in ("target", "check", "status", "detail"):
        table.add_column(col, overflow="fold")
    for r in report.results:
        for i, c in enumerate(r.checks):
            table.add_row(r.target if i == 0 else "", c.name, f"[{_STYLE[c.status]}]{c.status}[/]", c.detail)
        table.add_section()
    return table


def plain_text(renderable, width: int = 120) -> str:
    """A rich renderable as plain text (no colour), for a file."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, color_system=None, soft_wrap=False).print(renderable)
    return buffer.getvalue()


# ----------------------------------------------------------------------------------------------- GitHub Actions


def _escape_data(text: str) -> str:
    """A workflow command's message (docs.github.com: "Workflow commands for GitHub Actions")."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(report: GateReport) -> str:
    """``::error file=<path>,line=<n>::<check>: <detail>`` per failed check (no line where it is not known)."""
    lines = []
    for r in report.results:
        for c in r.checks:
            if c.status != FAIL:
                continue
            where = f"file={_escape_property(r.target)}"
            if c.line is not None:
                where += f",line={c.line}"
            lines.append(f"::error {where}::{_escape_data(f'planner check {c.name}: {c.detail}')}")
    return "".join(line + "\n" for line in lines)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


_MARK = {PASS: "✅ pass", FAIL: "❌ fail", SKIPPED: "⏭️ skipped"}


def markdown_summary(report: GateReport) -> str:
    """A Markdown table, one row per target and check (a GitHub step summary)."""
    out = [f"### planner check: {tally(report)}", "", "| target | check | status | detail |", "|---|---|---|---|"]
    for r in report.results:
        for c in r.checks:
            out.append(f"| `{_cell(r.target)}` | {c.name} | {_MARK[c.status]} | {_cell(c.detail)} |")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------- JUnit


def junit_xml(report: GateReport) -> str:
    """JUnit XML: a testsuite per target, a testcase per check (``failure`` for a fail, ``skipped`` for a skip)."""
    n = report.counts()
    total = sum(n.values())
    root = ET.Element(
        "testsuites",
        name="planner check",
        tests=str(total),
        failures=str(n[FAIL]),
        errors="0",
        skipped=str(n[SKIPPED]),
    )
    for r in report.results:
        fails = sum(c.status == FAIL for c in r.checks)
        skips = sum(c.status == SKIPPED for c in r.checks)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=r.target,
            tests=str(len(r.checks)),
            failures=str(fails),
            errors="0",
            skipped=str(skips),
        )
        for c in r.checks:
            attrs = {"classname": f"planner check.{r.target}", "name": c.name, "file": r.target}
            if c.line is not None:
                attrs["line"] = str(c.line)
            case = ET.SubElement(suite, "testcase", attrs)
            if c.status == FAIL:
                ET.SubElement(case, "failure", message=c.detail, type=c.name).text = c.detail
            elif c.status == SKIPPED:
                ET.SubElement(case, "skipped", message=c.detail)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
