"""Shared by the scripts in this folder: the one-line bad-input exit (``error: <field>: <what>``, exit 2) that the
`planner` CLI uses, for input files that are missing or malformed. Not a script of its own."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
SHARED_RUNS = ROOT.parent / "shared" / "reference" / "measured-runs.yaml"


def shown(path: str | Path) -> str:
    """A default path as the user would type it from the current directory."""
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def fail(field: str, message: str) -> NoReturn:
    print(f"error: {field}: {message}", file=sys.stderr)
    raise SystemExit(2)


def need_file(path: str | Path, field: str, script: str, what: str, option: str) -> Path:
    """``path`` when it is a file, else exit 2 with one line naming the script, the path (as given) and the option."""
    p = Path(path)
    try:
        ok = p.is_file()
    except (OSError, ValueError):
        ok = False
    if not ok:
        fail(field, f"scripts/{script} needs {what}; none at {path} (pass {option})")
    return p


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run a script's main(): bad input (planner's SpecError) is one line and exit 2, Ctrl-C exits 130."""
    try:
        from planner.errors import SpecError
    except ImportError as exc:
        fail("planner", f"cannot import the planner package ({exc}); run `pip install -e .` in {shown(ROOT)}")
    try:
        code = main()
    except SpecError as exc:
        print(exc.line(), file=sys.stderr)
        raise SystemExit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        raise SystemExit(130)
    raise SystemExit(code or 0)
