"""The `planner` console entry point: guards the imports so that Ctrl-C during start-up exits 130 cleanly."""

import sys


def run() -> None:
    try:
        from planner.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(130)
    main()
