"""Ctrl-C during `planner plan`: exit 130, one `error:` line on stderr, no traceback, no partial or temp file.

The signal is sent when `plan --verbose` reports that the search has reached the phase under test, read from its
stderr, never after a fixed delay: the test holds on any machine speed. The remaining phase lasts seconds (the
DeepSeek-V3 job enumerates ~100k candidates, then runs ~100 CP-SAT solves), the signal goes out microseconds
after the line is read.
"""

import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "bench" / "deepseek-v3-2048-h800.yaml"
HANG_GUARD_S = 300  # only catches a hung process; no assertion depends on how fast the machine is


def _default_sigint():
    # A shell's background job (CI runners, `cmd &`) inherits SIGINT ignored, and Python then never installs its
    # KeyboardInterrupt handler; give the child the disposition it has in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_at(marker: str, tmp_path: Path):
    """Run `plan -v`, send SIGINT as soon as a stderr line contains ``marker``; (rc, stdout, stderr lines)."""
    out = tmp_path / "plan.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner", "plan", str(JOB), "--out", str(out), "--json", "-v"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr] + [lines.put(None)], daemon=True).start()
    stdout_chunks: list[str] = []
    threading.Thread(target=lambda: stdout_chunks.append(proc.stdout.read()), daemon=True).start()
    seen = []
    try:
        while True:
            line = lines.get(timeout=HANG_GUARD_S)
            if line is None:
                raise AssertionError(f"the search ended (rc={proc.wait()}) before reporting {marker!r}: {seen}")
            seen.append(line.rstrip("\n"))
            if marker in line:
                assert proc.poll() is None, "the process ended right after reporting the phase"
                proc.send_signal(signal.SIGINT)
                break
        rc = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while (line := lines.get(timeout=HANG_GUARD_S)) is not None:
        seen.append(line.rstrip("\n"))
    return rc, "".join(stdout_chunks), seen


def assert_clean_interrupt(rc, stdout, stderr_lines, tmp_path):
    assert rc == 130, (rc, stderr_lines)
    assert not any("Traceback" in line for line in stderr_lines), stderr_lines
    assert stderr_lines[-1] == "error: interrupted", stderr_lines
    assert all(line.startswith("planner: ") for line in stderr_lines[:-1]), stderr_lines  # progress lines only
    assert stdout == ""
    assert list(tmp_path.iterdir()) == [], "plan.json or a temp file was left behind"


def test_sigint_during_enumeration_exits_130_cleanly(tmp_path):
    """The candidate enumeration (Python code)."""
    assert_clean_interrupt(*interrupt_at("enumerating candidates", tmp_path), tmp_path)


def test_sigint_during_cp_sat_phase_exits_130_cleanly(tmp_path):
    """Candidates are being solved by CP-SAT (the first progress report comes after the enumeration)."""
    assert_clean_interrupt(*interrupt_at("solving candidates with CP-SAT", tmp_path), tmp_path)
