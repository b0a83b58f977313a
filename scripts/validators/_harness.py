"""Shared by the harnesses of this folder. They run INSIDE a framework's venv (.venv-validators/<name>, built by
scripts/setup_validators.sh), not in the planner's environment, and import nothing of the planner.

Protocol (scripts/validate_emitters.py is the other side): a JSON list of cases on stdin, each a dict with an "id";
one JSON line per case on stdout, in order: {"id", "status", "message", "facts", "seconds"}. status:
  accepted  the framework's own code took the config; "facts" holds what it derived (degrees, batch, split ...)
  rejected  the framework's code raised (its message, and "where": the framework file and line), or one of the
            recipe's own checks failed (raised as Rejected; the message starts with "[check]")
  error     the harness itself failed (an exception raised in this folder's code): a harness bug, not a verdict
Everything the frameworks print goes to stderr, so stdout carries only the results.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


class Rejected(Exception):
    """One of the recipe's own checks (emitters.md) failed: a rejection, not a harness error."""


def _where(exc: BaseException) -> tuple[str, bool]:
    """(file:line of the innermost frame, whether that frame is harness code)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?", True
    last = frames[-1]
    ours = os.path.abspath(last.filename).startswith(HERE + os.sep)
    path = last.filename
    for marker in ("site-packages" + os.sep, "lib" + os.sep + "python"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{last.lineno}", ours


def _tail(text: str, lines: int = 6) -> str:
    """The lines of a parser's error output that say what is wrong (else its last lines), on one line."""
    boxless = "".join(" " if 0x2500 <= ord(c) <= 0x257F else c for c in text)  # tyro draws boxes
    kept = [" ".join(ln.strip(" \t|").split()) for ln in boxless.strip().splitlines()]
    kept = [ln for ln in kept if ln]
    said = [ln for ln in kept if any(w in ln.lower() for w in ("error", "unrecognized", "invalid", "must", "expected"))]
    return " | ".join((said or kept)[-lines:])


def verdict(check, case: dict) -> dict:
    """Run ``check(case)`` and turn its outcome into a result line."""
    err = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err):
            facts = check(case)
        res = {"status": "accepted", "message": "", "facts": facts or {}}
    except Rejected as exc:
        res = {"status": "rejected", "message": f"[check] {exc}"}
    except SystemExit as exc:  # argparse / tyro: the text went to stderr
        res = {"status": "rejected", "message": f"SystemExit({exc.code}): {_tail(err.getvalue())}"}
    except BaseException as exc:  # noqa: BLE001 - every failure is a verdict or a harness error
        where, ours = _where(exc)
        text = f"{type(exc).__name__}: {exc}".strip()
        if ours:
            res = {"status": "error", "message": text, "where": where, "traceback": traceback.format_exc()[-3000:]}
        else:
            res = {"status": "rejected", "message": text, "where": where}
    res["id"] = case.get("id")
    res["seconds"] = round(time.perf_counter() - start, 3)
    return res


def serve(check, setup=None) -> None:
    """Read the cases from stdin, write one result line per case. ``setup()`` imports the framework once; if it
    fails, every case is a harness error naming why (the venv is broken)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the frameworks print lands on stderr
    cases = json.load(sys.stdin)
    broken = None
    if setup is not None:
        try:
            setup()
        except BaseException as exc:  # noqa: BLE001
            broken = f"importing the framework failed: {type(exc).__name__}: {exc}"
            traceback.print_exc()
    for case in cases:
        if broken:
            res = {"id": case.get("id"), "status": "error", "message": broken, "seconds": 0.0}
        else:
            res = verdict(check, case)
        out.write(json.dumps(res, default=str) + "\n")
    out.flush()
