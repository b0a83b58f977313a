"""How closely `planner plan --time-limit S` keeps to S: wall time of the whole command against the limit.

    python scripts/bench_time_limit.py [--job examples/bench/deepseek-v3-2048-h800.yaml] [--limits 1 2 5] [--runs 3]

Needs only the job file (default: the DeepSeek-V3 job of examples/bench/, whose full search takes ~10 s here);
about 30 s with the defaults on 2 cores. Start-up (the interpreter and imports, which the limit does not count)
is measured as the wall time of `planner plan` on a one-GPU job at --time-limit 5 and subtracted. Prints per
limit: the median wall, start-up, overrun (wall - start-up - limit), the stop reason and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, need_file, run  # noqa: E402

TINY = """model: {num_layers: 1, hidden_size: 256, ffn_hidden_size: 1024, num_attention_heads: 4, vocab_size: 1000}
cluster: [{gpu: a100-80gb, nodes: 1, gpus_per_node: 1}]
training: {seq_length: 256, global_batch_size: 1}
"""


def timed(args: list[str]) -> tuple[int, str, float, int]:
    """(returncode, stdout, wall seconds, peak RSS bytes of that child) of ``python -m planner ARGS``."""
    import time

    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "planner", *args], cwd=ROOT, stdout=out, stderr=subprocess.DEVNULL
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        return os.waitstatus_to_exitcode(status), out.read(), wall, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(ROOT / "examples/bench/deepseek-v3-2048-h800.yaml"))
    ap.add_argument("--limits", type=float, nargs="+", default=[1.0, 2.0, 5.0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    job = need_file(args.job, "job", "bench_time_limit.py", "a job file", "--job")
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny.yaml"
        tiny.write_text(TINY)
        startup = statistics.median(
            timed(["plan", str(tiny), "--json", "--time-limit", "5"])[2] for _ in range(args.runs)
        )
    print(f"start-up (one-GPU job, median of {args.runs}): {startup:.2f} s")
    print(f"{'limit s':>8} {'wall s':>8} {'overrun s':>10} {'stop reason':>12} {'RSS MiB':>8}")
    for limit in args.limits:
        rows = [timed(["plan", str(job), "--json", "--time-limit", f"{limit:g}"]) for _ in range(args.runs)]
        wall = statistics.median(r[2] for r in rows)
        reasons = sorted({json.loads(r[1])["search"]["stop_reason"] if r[0] == 0 else f"exit {r[0]}" for r in rows})
        rss = max(r[3] for r in rows) / 2**20
        print(f"{limit:>8g} {wall:>8.2f} {wall - startup - limit:>+10.2f} {','.join(reasons):>12} {rss:>8.0f}")


if __name__ == "__main__":
    run(main)
