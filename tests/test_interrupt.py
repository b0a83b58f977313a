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

from planner.search.lockstep import processes_available

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "bench" / "deepseek-v3-2048-h800.yaml"
HANG_GUARD_S = 300  # only catches a hung process; no assertion depends on how fast the machine is


def _default_sigint():
    # A shell's background job (CI runners, `cmd &`) inherits SIGINT ignored, and Python then never installs its
    # KeyboardInterrupt handler; give the child the disposition it has in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_at(marker: str, tmp_path: Path, job: Path = JOB, children: list | None = None):
    """Run `plan -v`, send SIGINT as soon as a stderr line contains ``marker``; (rc, stdout, stderr lines).
    ``children``: filled with the pids of the process's children when the signal went out."""
    out = tmp_path / "plan.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner", "plan", str(job), "--out", str(out), "--json", "-v"],
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
                if children is not None:
                    children += _children(proc.pid)
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


def _children(pid: int) -> list[int]:
    """Pids of the processes whose parent is ``pid`` (Linux /proc; none elsewhere)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


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


MIXED = """
model: kimi-k2
cluster:
- {gpu: mi355x, nodes: 6, gpus_per_node: 8}
- {gpu: h100-pcie, nodes: 11, gpus_per_node: 8}
- {gpu: gb300, nodes: 2, gpus_per_node: 72}
- {gpu: gh200, nodes: 27, gpus_per_node: 4}
training: {seq_length: 16384, global_batch_size: 256, precision: bf16, optimizer: adam}
"""


def test_sigint_during_mixed_pipeline_search_exits_130_and_ends_its_child(tmp_path):
    """The mixed pipelines are searched in two processes (planner/search/lockstep.py, where the machine has two
    cores): Ctrl-C ends both (a terminal sends it to both; the child leaves it to the parent, which ends it)."""
    job = tmp_path.parent / f"{tmp_path.name}-job.yaml"
    job.write_text(MIXED)
    children: list[int] = []
    try:
        assert_clean_interrupt(*interrupt_at("mixed-pipeline candidates", tmp_path, job, children), tmp_path)
    finally:
        job.unlink()
    if processes_available() >= 2:
        assert children, "no search process was running"
    assert all(not Path(f"/proc/{pid}").exists() for pid in children), "a search process outlived the CLI"
