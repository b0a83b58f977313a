"""Fuzz `planner plan` on random small jobs and check every plan with the independent checker.

    python scripts/fuzz.py                      # 10,000 cases, seed 0
    python scripts/fuzz.py --cases 300 --procs 2
    python scripts/fuzz.py --seed 0 --only 1234 # re-run one case, print its job as YAML
    python scripts/fuzz.py --mixed --cases 1000 # clusters of 2-3 GPU types, tests/invariants_mixed.py
    python scripts/fuzz.py --framework torchtitan # as `plan --framework torchtitan`: each plan must emit for it

Each case i draws its job from random.Random(f"{seed}:{i}") with the generators of tests/strategies.py (the
ones the hypothesis properties use), so a case is reproducible on its own whatever --procs is. A few cases
(--invalid-rate) get one field broken on purpose to exercise the bad-input path. Prints a table of counts and
exits 1 if any case crashed (an exception other than SpecError from parse_job) or broke an invariant.

Needs a checkout with tests/ (strategies.py and the independent checkers invariants.py, invariants_mixed.py); no
data files. Time: about 0.09 s per case on 2 cores (10,000 cases: about 15 minutes; --mixed: about
0.4 s per case); --procs 2 halves it on an idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, fail, run, shown  # noqa: E402

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
if __name__ == "__main__":  # the generators and the independent checkers live in the test suite
    for _name in ("strategies.py", "invariants.py", "invariants_mixed.py"):
        if not (ROOT / "tests" / _name).is_file():
            fail(
                "tests",
                f"scripts/fuzz.py needs tests/{_name} of a checkout of the repository; none at "
                f"{shown(ROOT / 'tests' / _name)}",
            )

from strategies import RandomChooser, gen_case, gen_mixed_case  # noqa: E402


def _break_one_field(raw: dict, rng: random.Random) -> str:
    """Make the job invalid in one of a few ways parse_job must reject with a SpecError."""
    m, t, g = raw["model"], raw["training"], raw["cluster"][0]
    how = rng.choice(
        [
            "kv_heads",
            "hidden",
            "top_k",
            "seq_zero",
            "nodes_zero",
            "gpu_name",
            "unknown_field",
            "layers_str",
            "gbs_negative",
        ]
    )
    if how == "kv_heads":
        m["num_kv_heads"] = m["num_attention_heads"] + 1
    elif how == "hidden":
        m["hidden_size"] += 1
    elif how == "top_k":
        m["moe"] = {"num_experts": 4, "top_k": 5, "expert_ffn_hidden_size": 256}
    elif how == "seq_zero":
        t["seq_length"] = 0
    elif how == "nodes_zero":
        g["nodes"] = 0
    elif how == "gpu_name":
        g["gpu"] = "a100-81gb"
    elif how == "unknown_field":
        t["seq_lenght"] = t["seq_length"]
    elif how == "layers_str":
        m["num_layers"] = str(m["num_layers"])
    elif how == "gbs_negative":
        t["global_batch_size"] = -t["global_batch_size"]
    return how


def make_case(seed: int, index: int, invalid_rate: float, mixed: bool = False, framework: str | None = None):
    rng = random.Random(f"{seed}:{index}")
    raw, settings = (gen_mixed_case if mixed else gen_case)(RandomChooser(rng))
    broken = _break_one_field(raw, rng) if rng.random() < invalid_rate else None
    settings = dataclasses.replace(settings, framework=framework)  # (after the draws: the same jobs as without)
    return raw, settings, broken


def run_one(args: tuple) -> dict:
    """One case -> a small picklable record."""
    seed, index, invalid_rate, time_limit, top, mixed, framework = args
    from strategies import run_case, run_mixed_case

    from planner.errors import SpecError
    from planner.load import parse_job

    raw, settings, broken = make_case(seed, index, invalid_rate, mixed, framework)
    rec = {"index": index, "broken": broken, "outcome": None, "seconds": 0.0, "violations": [], "error": None}
    try:
        parse_job(raw)
    except SpecError as exc:
        rec["outcome"] = "rejected"
        rec["error"] = exc.line()
        return rec
    except Exception as exc:  # parse_job must turn every bad input into a SpecError
        rec.update(outcome="crash", error=_summarize(exc))
        return rec
    start = time.perf_counter()
    try:
        job, result, doc, violations = (run_mixed_case if mixed else run_case)(
            raw, settings, top=top, time_limit_s=time_limit
        )
    except SpecError as exc:  # a framework that cannot train the job at all (precision, gradient buffers)
        rec.update(outcome="rejected", error=exc.line(), seconds=time.perf_counter() - start)
        return rec
    except Exception as exc:
        rec.update(outcome="crash", error=_summarize(exc), seconds=time.perf_counter() - start)
        return rec
    rec["seconds"] = time.perf_counter() - start
    rec["outcome"] = "plans" if result.plans else "nothing"
    rec["complete"] = result.complete
    rec["violations"] = violations
    if mixed:  # interleaved mixed pipelines among the plans (tests/invariants_mixed.py checks their vpp rule)
        rec["interleaved"] = any((p.get("layout") or {}).get("vpp", 1) > 1 for p in doc["plans"])
    return rec


def _summarize(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    where = f"{Path(last.filename).name}:{last.lineno} in {last.name}" if last else "?"
    short = "".join(traceback.format_list(frames[-6:])) + f"{type(exc).__name__}: {exc}"
    return {"type": type(exc).__name__, "message": str(exc)[:300], "where": where, "traceback": short}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=2.0, help="search budget per case, seconds")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--invalid-rate", type=float, default=0.03, help="share of cases with one field broken on purpose")
    ap.add_argument("--procs", type=int, default=1, help="worker processes")
    ap.add_argument("--only", type=int, default=None, help="run just this case index and print its job")
    ap.add_argument("--show", type=int, default=3, help="how many crash/violation details to print")
    ap.add_argument("--mixed", action="store_true", help="clusters of 2-3 GPU types (the mixed-GPU search)")
    ap.add_argument(
        "--framework",
        choices=("megatron", "deepspeed", "torchtitan"),
        default=None,
        help="plan as `plan --framework` does; every plan must also pass that framework's check_runnable",
    )
    a = ap.parse_args(argv)

    if a.only is not None:
        import yaml

        raw, settings, broken = make_case(a.seed, a.only, a.invalid_rate, a.mixed, a.framework)
        print(yaml.safe_dump(raw, sort_keys=False), end="")
        print(f"# search options: {settings}; broken on purpose: {broken}")
        rec = run_one((a.seed, a.only, a.invalid_rate, a.time_limit, a.top, a.mixed, a.framework))
        print(f"# outcome: {rec['outcome']} in {rec['seconds']:.3f}s")
        for v in rec["violations"]:
            print(f"# violation: {v}")
        if rec["error"]:
            print(rec["error"]["traceback"] if isinstance(rec["error"], dict) else rec["error"])
        return 1 if rec["outcome"] == "crash" or rec["violations"] else 0

    jobs = [(a.seed, i, a.invalid_rate, a.time_limit, a.top, a.mixed, a.framework) for i in range(a.cases)]
    every = max(1, min(500, a.cases // 20))
    counts: Counter = Counter()
    seconds: list[float] = []
    crashes: list[dict] = []
    violations: list[dict] = []
    slow: list[tuple[float, int]] = []
    start = time.perf_counter()

    def consume(rec: dict) -> None:
        counts["cases"] += 1
        counts[rec["outcome"]] += 1
        if rec["outcome"] in ("plans", "nothing"):
            seconds.append(rec["seconds"])
            if not rec.get("complete", True):
                counts["incomplete"] += 1
            if rec.get("interleaved"):
                counts["interleaved"] += 1
            if rec["seconds"] > a.time_limit + 1.0:
                slow.append((rec["seconds"], rec["index"]))
        if rec["outcome"] == "crash":
            crashes.append(rec)
        if rec["violations"]:
            counts["violation"] += 1
            violations.append(rec)
        if rec["broken"] and rec["outcome"] != "rejected":
            counts["broken accepted"] += 1
        if counts["cases"] % every == 0 or counts["cases"] == a.cases:
            el = time.perf_counter() - start
            print(
                f"  {counts['cases']:>6}/{a.cases}  {el:7.1f}s  plans {counts['plans']}  nothing {counts['nothing']}"
                f"  rejected {counts['rejected']}  violations {counts['violation']}  crashes {counts['crash']}",
                file=sys.stderr,
                flush=True,
            )

    if a.procs > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(a.procs) as pool:
            for rec in pool.imap_unordered(run_one, jobs, chunksize=4):
                consume(rec)
    else:
        for job in jobs:
            consume(run_one(job))
    wall = time.perf_counter() - start

    valid = counts["plans"] + counts["nothing"] + counts["crash"]
    rows = [
        ("cases", counts["cases"]),
        ("valid jobs", valid),
        ("bad-input rejections (SpecError)", counts["rejected"]),
        ("plans found", counts["plans"]),
        ("nothing fits", counts["nothing"]),
        ("searches stopped by the time limit", counts["incomplete"]),
        *([("with an interleaved plan (vpp > 1)", counts["interleaved"])] if a.mixed else []),
        ("invariant violations", counts["violation"]),
        ("crashes", counts["crash"]),
    ]
    width = max(len(k) for k, _ in rows)
    print(
        f"\nfuzz{' (mixed GPU types)' if a.mixed else ''}: seed {a.seed}, time limit {a.time_limit:g}s, "
        f"top {a.top}, {a.procs} process(es)"
    )
    for k, n in rows:
        print(f"  {k:<{width}}  {n:>7}")
    if counts["broken accepted"]:
        print(f"  (inputs broken on purpose but accepted: {counts['broken accepted']})")
    if seconds:
        q = sorted(seconds)
        p95 = q[min(len(q) - 1, math.ceil(0.95 * len(q)) - 1)]
        print(
            f"  time per valid case: mean {statistics.fmean(q):.3f}s  median {statistics.median(q):.3f}s  "
            f"p95 {p95:.3f}s  max {q[-1]:.3f}s"
        )
    print(f"  wall {wall:.1f}s ({wall / max(1, counts['cases']):.3f}s per case)")
    if slow:
        slow.sort(reverse=True)
        print(
            f"  {len(slow)} case(s) ran over the time limit by more than 1 s: "
            + ", ".join(f"#{i} {s:.1f}s" for s, i in slow[:5])
        )

    if crashes:
        groups = Counter((c["error"]["type"], c["error"]["where"]) for c in crashes)
        print("\ncrashes by kind:")
        for (kind, where), n in groups.most_common():
            print(f"  {n:>5}  {kind} at {where}")
        for c in crashes[: a.show]:
            print(f"\n--- case {c['index']} (rerun: python scripts/fuzz.py --seed {a.seed} --only {c['index']})")
            print(c["error"]["traceback"])
    if violations:
        print("\ninvariant violations:")
        for r in violations[: a.show]:
            print(f"\n--- case {r['index']} (rerun: python scripts/fuzz.py --seed {a.seed} --only {r['index']})")
            for v in r["violations"][:8]:
                print(f"  {v}")
    return 1 if crashes or violations else 0


if __name__ == "__main__":
    run(main)
