"""Heterogeneous search speed and gain: `python scripts/bench_hetero.py [--jobs FILE...] [--time-limit S]`, or the
seeded suite `python scripts/bench_hetero.py --suite [--seed S] [--jobs-count N] [--time-limit S] [--list]`.

Needs only the job files; about 10-20 s with the defaults on 2 cores (mostly the single-type searches, which only
serve the comparison). Default jobs: examples/hetero/gpt-32l-2x32.yaml (2 GPU types x 32 GPUs, 32-layer GPT) and
examples/hetero/llama3-405b-3types-4096.yaml (3 GPU types, 4,096 GPUs, Llama 3 405B). Prints one row per job:
heterogeneous search seconds, candidates, CP-SAT solves, best heterogeneous iteration time, the best plan on one
GPU type alone (found by the homogeneous search on each group, timed separately), their ratio and the optimality
status of the best plan (a gap is to the bound over every mixed pipeline and replica shape).

--suite: the shipped examples/hetero/*.yaml plus N (default 50) generated mixed jobs, the same list for the same
--seed (default 0): 2-4 GPU types from the catalog, 64-16,384 GPUs, dense and MoE model presets (one job in three is
MoE), seq 2K-32K, global batch 256-4096 sequences with at most 16M tokens per iteration, the GPU count between what
holds the model's weights and optimizer states and 100 GPUs per billion parameters (at least 1,024). Each job runs
the real CLI (`python -m planner plan JOB --json --top 1 --time-limit S`, its wall time measured, start-up included,
the checkout's package byte-compiled first as an installed one is); each of its node groups is then planned alone as
a one-group job (same model and training, in this process, S each) for the best single-type time. Prints a row per
job and the suite's summary: p50/p95/max of the CLI wall time and of the gap, the share proven optimal (gap <=
0.01%) and within 1%, and how many mixed plans are slower than the best single-type one (a ratio above 1 + 1e-5); a
job left open names the part of the space its gap comes from (search.gap_source). Last, the CLI's start-up (least of
3 runs of `planner --help`) before and after the suite: a reference for comparing suites run on different days. A
CLI run still going at 3 x S + 120 s is killed and reported as such. Needs examples/hetero/; takes about 4-10
minutes at --time-limit 30 on 2 cores (seed 0: 217 s at commit c96c4c1, 279 s at e01c78a on a slower day), under 1 s
for --list (which runs nothing; --save-jobs DIR writes each job's YAML). Exit 0 after a run, 2 on bad input.
"""

from __future__ import annotations

import argparse
import compileall
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, fail, need_file, run, shown  # noqa: E402

JOBS = [ROOT / "examples/hetero/gpt-32l-2x32.yaml", ROOT / "examples/hetero/llama3-405b-3types-4096.yaml"]

# The suite's generator (--suite). Changing any of these changes every seed's job list.
SEQS = (2048, 4096, 8192, 16384, 32768)
BATCHES = (256, 512, 1024, 2048, 4096)  # sequences per iteration
MAX_TOKENS = 16 * 2**20  # per iteration: Llama 3 405B's 16M tokens, the largest batch of the published dense runs
MIN_GPUS, MAX_GPUS = 64, 16_384
GPUS_PER_B_PARAMS = 100  # at most this many GPUs per billion parameters (no 7B model on 16K GPUs) ...
SMALL_CAP = 1_024  # ... but up to this many for any model
STATE_BYTES = 40  # per parameter, the floor of the GPU count: 2.5x the 16 B of bf16 weights, fp32 grads and Adam states
MOE_EVERY = 3  # job i is MoE when i % MOE_EVERY == 1
PROVEN_GAP = 1e-4  # "proven optimal": gap <= 0.01%
NEAR_GAP = 1e-2
SAME_TIME = 1e-5  # a ratio within this of 1 is the same plan time (plan JSON rounds times to the microsecond)


@dataclass(frozen=True)
class SuiteJob:
    id: str  # the generator's parameters: `llama3-70b 128xh100-sxm+256xa100-80gb s8k b1024`
    raw: dict  # the job as its YAML would read
    source: str | None = None  # the example file it came from


def job_id(raw: dict) -> str:
    model = raw["model"] if isinstance(raw["model"], str) else raw["model"].get("name", "inline-model")
    cluster = "+".join(f"{g['nodes'] * g['gpus_per_node']}x{g['gpu']}" for g in raw["cluster"])
    t = raw["training"]
    seq = t["seq_length"]
    out = f"{model} {cluster} " + (f"s{seq // 1024}k" if seq % 1024 == 0 else f"s{seq}") + f" b{t['global_batch_size']}"
    precision = t.get("precision", "bf16")
    return out if precision == "bf16" else f"{out} {precision}"


def generate_jobs(seed: int, count: int) -> list[SuiteJob]:
    """``count`` mixed jobs, the same for the same seed (and catalog)."""
    from planner.catalog import gpu_names, model_names, resolve_gpu, resolve_model
    from planner.cost.flops import total_params

    gpus = {name: resolve_gpu(name) for name in gpu_names()}
    models = {name: resolve_model(name) for name in model_names()}
    dense = sorted(n for n, m in models.items() if m.moe is None)
    moe = sorted(n for n, m in models.items() if m.moe is not None)
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        model = rng.choice(moe if i % MOE_EVERY == 1 else dense)
        types = rng.sample(sorted(gpus), rng.choice((2, 3, 4)))
        shares = [rng.uniform(0.2, 1.0) for _ in types]
        shares = [s / sum(shares) for s in shares]
        params = total_params(models[model])
        gib = sum(s * gpus[t].memory_gib for s, t in zip(shares, types, strict=True))
        lo = max(MIN_GPUS, math.ceil(params * STATE_BYTES / (gib * 2**30)))
        hi = min(MAX_GPUS, max(SMALL_CAP, round(params / 1e9 * GPUS_PER_B_PARAMS)))
        total = math.exp(rng.uniform(math.log(lo), math.log(max(lo, hi))))
        nodes = [max(1, round(total * s / gpus[t].gpus_per_node)) for s, t in zip(shares, types, strict=True)]
        per_node = [gpus[t].gpus_per_node for t in types]
        while sum(n * g for n, g in zip(nodes, per_node, strict=True)) > MAX_GPUS:  # rounding up past the top
            big = max(range(len(types)), key=lambda k: (nodes[k] * per_node[k], -k))
            nodes[big] -= 1
        while sum(n * g for n, g in zip(nodes, per_node, strict=True)) < lo:  # rounding down below the floor
            nodes[min(range(len(types)), key=lambda k: (per_node[k], k))] += 1
        seq = rng.choice(SEQS)
        batch = rng.choice([b for b in BATCHES if b * seq <= MAX_TOKENS])
        # Volta has no bf16 (its catalog bf16 peak is the fp16 one): such clusters train in fp16.
        precision = "fp16" if any(t.startswith("v100") for t in types) else "bf16"
        raw = {
            "model": model,
            "cluster": [
                {"gpu": t, "nodes": n, "gpus_per_node": g} for t, n, g in zip(types, nodes, per_node, strict=True)
            ],
            "training": {"seq_length": seq, "global_batch_size": batch, "precision": precision, "optimizer": "adam"},
        }
        jobs.append(SuiteJob(job_id(raw), raw))
    return jobs


def example_jobs() -> list[SuiteJob]:
    from planner.io import load_yaml

    folder = ROOT / "examples/hetero"
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if not files:
        fail("jobs", f"scripts/bench_hetero.py --suite needs its example jobs; none at {shown(folder)}/")
    out = []
    for path in files:
        raw = load_yaml(path, field=shown(path))
        out.append(SuiteJob(f"{path.stem}: {job_id(raw)}", raw, shown(path)))
    return out


def suite_jobs(seed: int, count: int) -> list[SuiteJob]:
    """The shipped examples, then the generated jobs."""
    return example_jobs() + generate_jobs(seed, count)


def write_yaml(raw: dict, path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0-100); None for no values."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(p / 100 * len(ranked)) - 1)]


# the CLI as the suite runs it: this checkout's planner in a process of its own
PLANNER = [sys.executable, "-m", "planner"]


def cli_env() -> dict[str, str]:
    """The environment of a CLI run: this checkout first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def compile_package() -> None:
    """Byte-compile this checkout's planner package, as `pip install` does for an installed one, so that each CLI run
    reads compiled modules as a user's second run does: where PYTHONDONTWRITEBYTECODE is set (as in some containers)
    every run would otherwise compile every module again (suite job 14: 0.90 s -> 0.78 s of CLI wall)."""
    compileall.compile_dir(ROOT / "planner", quiet=1)


def startup_seconds(runs: int = 3) -> float:
    """Least wall seconds of `python -m planner --help` over ``runs`` runs: the CLI's start-up on this machine,
    printed before and after the suite so that suites run on different days can be compared (a slower machine shows
    in it as in every job)."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(PLANNER + ["--help"], capture_output=True, env=cli_env(), timeout=120)
        best = min(best, time.perf_counter() - t0)
    return best


def run_cli(path: Path, time_limit: float) -> dict:
    """`planner plan PATH --json --top 1 --time-limit S` in its own process: wall time, status, gap, best time."""
    cmd = PLANNER + ["plan", str(path), "--json", "--top", "1"]
    cmd += ["--time-limit", f"{time_limit:g}"]
    cap = 3 * time_limit + 120
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), timeout=cap)
    except subprocess.TimeoutExpired:
        return {"wall": time.perf_counter() - t0, "status": f"killed: still running at {cap:g} s"}
    out = {"wall": time.perf_counter() - t0}
    if proc.returncode == 3:
        return {**out, "status": "nothing fits"}
    if proc.returncode == 1 and "error: time-limit" in proc.stderr:
        return {**out, "status": "time limit, no plan"}
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        return {**out, "status": f"exit {proc.returncode}: {first[:80]}"}
    doc = json.loads(proc.stdout)
    s, best = doc["search"], doc["plans"][0]
    if best["optimality"]["status"] == "optimal":
        status = "optimal"
    elif s.get("stop_reason") == "time_limit":
        status = "time limit"
    else:
        status = f"feasible ({s.get('stop_reason', '?')})"
    if status != "optimal" and s.get("gap_source"):
        status += f"; gap in {s['gap_source'].replace('_', ' ')}"  # the part of the space whose bound sets the gap
    return {
        **out,
        "status": status,
        "search": s.get("seconds"),
        "gap": best["optimality"]["gap"],
        "best": best["estimate"]["iteration_time_s"],
    }


def single_type(raw: dict, time_limit: float) -> tuple[float | None, str | None, bool, float]:
    """Each node group planned alone as a one-group job: (best time, its GPU, every such search complete, seconds)."""
    from planner.load import parse_job
    from planner.search import run_search
    from planner.search.space import SearchOptions

    best, gpu, complete = None, None, True
    t0 = time.perf_counter()
    for group in raw["cluster"]:
        job = parse_job({**raw, "cluster": [group]}, base_dir=ROOT)
        r = run_search(job, SearchOptions(), top=1, time_limit_s=time_limit)
        complete = complete and r.complete
        if r.plans and (best is None or r.plans[0].time < best):
            best, gpu = r.plans[0].time, job.cluster[0].gpu.name
    return best, gpu, complete, time.perf_counter() - t0


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def run_suite(jobs: list[SuiteJob], time_limit: float, seed: int, count: int) -> None:
    print(
        f"bench_hetero suite: seed {seed}, {count} generated + {len(jobs) - count} example jobs, "
        f"--time-limit {time_limit:g}",
        flush=True,
    )
    print("| # | job | CLI wall s | search s | status | gap | best mixed s | best single-type s (GPU) | mixed/single |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    compile_package()
    startup = startup_seconds()
    t_suite = time.perf_counter()
    single_secs = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-hetero-") as tmp:
        for i, job in enumerate(jobs, 1):
            path = write_yaml(job.raw, Path(tmp) / f"job{i:03d}.yaml")
            r = run_cli(path, time_limit)
            single, gpu, complete, secs = single_type(job.raw, time_limit)
            single_secs += secs
            r.update(single=single, gpu=gpu, ratio=r["best"] / single if r.get("best") and single else None)
            rows.append(r)
            single_txt = "-" if single is None else f"{single:.3f} ({gpu}){'' if complete else ' *'}"
            print(
                f"| {i} | {job.id} | {r['wall']:.2f} | {fmt(r.get('search'), '.2f')} | {r['status']} | "
                f"{fmt(None if r.get('gap') is None else r['gap'] * 100, '.2f', '%')} | {fmt(r.get('best'), '.3f')} | "
                f"{single_txt} | {fmt(r['ratio'], '.3f')} |",
                flush=True,
            )
    n = len(rows)
    planned = [r for r in rows if r.get("best") is not None]
    walls = [r["wall"] for r in rows]
    gaps = [r["gap"] * 100 for r in planned]

    def three(values: list[float], spec: str, suffix: str) -> str:
        return " / ".join(fmt(percentile(values, p), spec, suffix) for p in (50, 95, 100))

    def share(k: int, of: int) -> str:
        return f"{k} of {of} jobs with a plan ({100 * k / of:.0f}%)" if of else "no job has a plan"

    proven = sum(r["gap"] <= PROVEN_GAP for r in planned)
    near = sum(r["gap"] <= NEAR_GAP for r in planned)
    slower = [r for r in planned if r["ratio"] is not None and r["ratio"] > 1 + SAME_TIME]
    lost = [r for r in rows if r.get("best") is None and r["single"] is not None]
    statuses: dict[str, int] = {}
    for r in rows:
        key = "error" if r["status"].startswith("exit") else r["status"].split(";")[0]
        statuses[key] = statuses.get(key, 0) + 1
    print()
    print(f"jobs: {n}; " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items(), key=lambda kv: -kv[1])))
    print(f"CLI wall s p50 / p95 / max: {three(walls, '.2f', '')}")
    print(f"gap p50 / p95 / max (jobs with a plan): {three(gaps, '.2f', '%')}")
    print(f"proven optimal (gap <= 0.01%): {share(proven, len(planned))}")
    print(f"gap <= 1%: {share(near, len(planned))}")
    print(
        f"mixed plan slower than the best single-type plan: {len(slower)}"
        + (f" (worst ratio {max(r['ratio'] for r in slower):.3f})" if slower else "")
        + f"; no mixed plan where a single type has one: {len(lost)}"
    )
    print(
        f"suite wall time {time.perf_counter() - t_suite:.0f} s (CLI {sum(walls):.0f} s, single-type searches "
        f"{single_secs:.0f} s); * = a single-type search stopped before proving its plan"
    )
    print(
        f"machine reference: CLI start-up (least of 3 runs of `planner --help`) {startup:.2f} s before the suite, "
        f"{startup_seconds():.2f} s after"
    )


def list_suite(jobs: list[SuiteJob]) -> None:
    for i, job in enumerate(jobs, 1):
        t = job.raw["training"]
        gpus = sum(g["nodes"] * g["gpus_per_node"] for g in job.raw["cluster"])
        tokens = t["seq_length"] * t["global_batch_size"] / 2**20
        print(f"{i:3d}  {job.id}  ({gpus:,} GPUs, {tokens:g}M tokens/iteration)")


def save_jobs(jobs: list[SuiteJob], folder: str) -> None:
    out = Path(folder)
    if out.exists() and not out.is_dir():
        fail("--save-jobs", f"{folder} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for i, job in enumerate(jobs, 1):
        write_yaml(job.raw, out / f"job{i:03d}.yaml")


def bench_files(files: list[str] | None, time_limit: float) -> None:
    from planner.load import load_job
    from planner.search.mixed_pipelines import search_hetero
    from planner.search.single_type import best_single_type
    from planner.search.space import SearchOptions

    jobs = [
        need_file(p, "jobs", "bench_hetero.py", "its job files", "--jobs FILE...")
        for p in files or [shown(p) for p in JOBS]
    ]
    print(
        "| job | hetero search s | candidates | CP-SAT solves | best hetero s | single-type search s "
        "| best single-type s (group) | ratio | optimality |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for rel in jobs:
        job = load_job(rel)
        t0 = time.monotonic()
        r = search_hetero(job, top=1, time_limit_s=time_limit, single_type=False)
        secs = time.monotonic() - t0
        t1 = time.monotonic()
        plan, group = best_single_type(job, SearchOptions(), 1, time_limit)
        single = plan.time if plan else None
        single_secs = time.monotonic() - t1
        best = r.plans[0].time if r.plans else None
        ratio = f"{best / single:.3f}" if best and single else "-"
        if not best:
            status = "none"
        elif r.plans[0].status == "optimal":
            status = "optimal"
        else:
            status = f"feasible, gap {r.gap * 100:.2f}%" + ("" if r.complete else " (time limit)")
        kind = ("replicas" if getattr(r.plans[0].estimate.dims, "replicas", None) else "mixed pipeline") if best else ""
        single_txt = f"{single:.3f} ({job.cluster[group].gpu.name})" if single else "-"
        print(
            f"| {Path(rel).stem} | {secs:.2f} | {r.candidates:,} | {r.solved:,} | "
            f"{best:.3f} ({kind}) | {single_secs:.2f} | {single_txt} | {ratio} | {status} |"
            if best
            else f"| {Path(rel).stem} | {secs:.2f} | - |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--jobs",
        nargs="+",
        metavar="FILE",
        default=None,
        help="job YAML files with 2 or more node groups (default: the two of examples/hetero/)",
    )
    ap.add_argument(
        "--time-limit", type=float, default=None, help="search budget per search, s (default 60; 30 with --suite)"
    )
    ap.add_argument("--suite", action="store_true", help="the seeded suite of generated mixed jobs plus the examples")
    ap.add_argument("--seed", type=int, default=None, help="--suite: the generator's seed (default 0)")
    ap.add_argument("--jobs-count", type=int, default=None, help="--suite: how many jobs to generate (default 50)")
    ap.add_argument("--list", action="store_true", help="--suite: print the jobs, run nothing")
    ap.add_argument("--save-jobs", metavar="DIR", default=None, help="--suite: also write each job's YAML into DIR")
    args = ap.parse_args()
    suite_opts = [
        name
        for name, given in (
            ("--seed", args.seed is not None),
            ("--jobs-count", args.jobs_count is not None),
            ("--list", args.list),
            ("--save-jobs", args.save_jobs is not None),
        )
        if given
    ]
    if suite_opts and not args.suite:
        fail(suite_opts[0], "only with --suite")
    if args.suite and args.jobs is not None:
        fail("--jobs", "--suite generates its jobs (and adds examples/hetero/); drop --jobs or --suite")
    time_limit = args.time_limit if args.time_limit is not None else 30.0 if args.suite else 60.0
    if time_limit <= 0:
        fail("--time-limit", f"expected a positive number of seconds, got {time_limit:g}")
    if not args.suite:
        bench_files(args.jobs, time_limit)
        return
    count = 50 if args.jobs_count is None else args.jobs_count
    if count < 0:
        fail("--jobs-count", f"expected a count of generated jobs >= 0, got {count}")
    seed = 0 if args.seed is None else args.seed
    jobs = suite_jobs(seed, count)
    if args.save_jobs is not None:
        save_jobs(jobs, args.save_jobs)
    if args.list:
        list_suite(jobs)
        return
    run_suite(jobs, time_limit, seed, count)


if __name__ == "__main__":
    run(main)
