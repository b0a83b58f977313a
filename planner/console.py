"""The `planner` console entry point: guards the imports so that Ctrl-C during start-up exits 130 cleanly, and ends
the process without tearing the interpreter down."""

import os
import sys


def run() -> None:
    try:
        from planner.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(130)
    try:
        main()
    except SystemExit as exc:
        _exit_now(exc.code)
    _exit_now(0)


def _exit_now(code) -> None:
    """Flush the output and end the process at once, skipping the interpreter's teardown: a mixed-GPU search leaves
    millions of memoized bounds and cost terms that Python would free one by one after the answer is out (about
    0.3 s of a 6 s `planner plan` of suite job 46 in `scripts/bench_hetero.py --suite`). Nothing of ours waits for
    the teardown: every output is written and closed (io.write_atomic), and the search's worker process is ended by
    the search. ``code`` as SystemExit takes it: None is 0, an int its status, anything else printed, status 1."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            # the reader went away (`planner plan --json | head`): as main does for a broken pipe
            status = status or 1
    os._exit(status)
