"""`planner plan --time-limit 1` on a 2,048-GPU job returns within the limit (plus process startup), exits 0 with
plans whose optimality is reported, and stays under 1 GiB of resident memory.

Startup is measured separately and subtracted: `python -m planner --help` (the interpreter, typer and rich), and,
because `plan` imports its heavy modules lazily (OR-tools, which pulls in pandas and numpy, and pydantic models),
`planner plan` on a trivial one-GPU job, which is that startup plus a search of a few milliseconds. The allowance
is the larger of the two + 1.1 s + 0.3 s slack.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "bench" / "deepseek-v3-2048-h800.yaml"
TINY = """model: {num_layers: 1, hidden_size: 256, ffn_hidden_size: 1024, num_attention_heads: 4, vocab_size: 1000}
cluster: [{gpu: a100-80gb, nodes: 1, gpus_per_node: 1}]
training: {seq_length: 256, global_batch_size: 1}
"""
LIMIT_S, GRACE_S, SLACK_S = 1.0, 1.1, 0.3
GIB = 1024**3


def timed(args, tmp_path: Path, kill_after_s: float = 120.0):
    """(returncode, stdout, stderr, wall seconds, peak RSS bytes) of ``python -m planner ARGS``. The peak RSS is
    that child's own (os.wait4), not the maximum over every child this test process has waited for."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as fo, err.open("w") as fe:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "planner", *map(str, args)], cwd=ROOT, stdout=fo, stderr=fe)
        killed = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > kill_after_s:
                proc.kill()
                killed = True
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if killed:
        pytest.fail(f"planner {' '.join(map(str, args))} still running after {kill_after_s:.1f} s; killed")
    return proc.returncode, out.read_text(), err.read_text(), wall, usage.ru_maxrss * 1024


@pytest.fixture(scope="module")
def startup_s(tmp_path_factory) -> float:
    tmp = tmp_path_factory.mktemp("startup")
    tiny = tmp / "tiny.yaml"
    tiny.write_text(TINY)
    helps, tinies = [], []
    for _ in range(2):
        rc, _, stderr, wall, _ = timed(["--help"], tmp)
        assert rc == 0, stderr
        helps.append(wall)
        rc, _, stderr, wall, _ = timed(["plan", tiny, "--json", "--time-limit", "0.1"], tmp)
        assert rc == 0, stderr
        tinies.append(wall)
    return max(min(helps), min(tinies))


def test_time_limit_is_respected(tmp_path, startup_s):
    allowed = startup_s + GRACE_S + SLACK_S
    rc, stdout, stderr, wall, rss = timed(["plan", JOB, "--time-limit", LIMIT_S, "--json"], tmp_path,
                                          kill_after_s=allowed + 10)
    assert wall <= allowed, (f"wall {wall:.2f} s > startup {startup_s:.2f} s + {GRACE_S} s + {SLACK_S} s "
                             f"(rc {rc}, stderr {stderr.strip()[:200]!r})")
    assert rc == 0, stderr
    doc = json.loads(stdout)
    assert doc["plans"], "no plans"
    for p in doc["plans"]:
        opt = p["optimality"]
        assert opt["status"] in ("optimal", "feasible")
        assert isinstance(opt["gap"], float) and opt["gap"] >= 0
        if opt["status"] == "optimal":
            assert opt["gap"] == 0
    assert rss < GIB, f"peak RSS {rss / GIB:.2f} GiB"
