"""Plan quality on published runs: for every run of a measured-runs file, plan the same model, GPUs, sequence and
global batch, and compare the best plan with the published layout (both predicted by the same cost model).

    python scripts/plan_quality.py [--runs RUNS.yaml] [--time-limit 20] [--top 5] [--limit N]

Needs a measured-runs file (format: docs/measured-runs.md; RUNS.yaml may also be given positionally); the default
is ../shared/reference/measured-runs.yaml, next to the repository. Runs one search per run: about 3 minutes for
the 148 runs of the shared file at --time-limit 10 on 2 cores (at most runs x time limit); --limit N for a quick look.

Reports, per run and in total: whether the best plan is predicted at least as fast as the published layout, and,
when the published layout is inside the search space and within 1% of the best, whether it appears among the top
plans. Framework features the published run used and the search can also use (TP comm overlap) are switched on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import SHARED_RUNS, fail, need_file, run, shown  # noqa: E402

from planner.runs import RunCase, load_runs  # noqa: E402
from planner.search.homogeneous import search  # noqa: E402
from planner.search.space import SearchOptions  # noqa: E402
from planner.validate import predict  # noqa: E402

DEFAULT_RUNS = SHARED_RUNS


def in_space(dims, opts: SearchOptions) -> bool:
    return (
        dims.micro_batch_size <= opts.max_micro_batch
        and (not dims.tp_comm_overlap or opts.tp_comm_overlap)
        and dims.zero_stage in opts.zero_stages
    )


def same_layout(a, b) -> bool:
    keys = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "zero_stage")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="?", default=None, help="measured-runs YAML (same as --runs)")
    ap.add_argument(
        "--runs", dest="runs_opt", metavar="FILE", default=None, help=f"measured-runs YAML (default: {DEFAULT_RUNS})"
    )
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--limit", type=int, default=0, help="only the first N runs")
    args = ap.parse_args()
    if args.runs and args.runs_opt and args.runs != args.runs_opt:
        fail("runs", f"two measured-runs files given ('{args.runs}' and --runs '{args.runs_opt}'); pass one")
    runs = need_file(
        args.runs_opt or args.runs or shown(DEFAULT_RUNS),
        "runs",
        "plan_quality.py",
        "a measured-runs file",
        "--runs FILE",
    )
    cases = [c for c in load_runs(runs) if isinstance(c, RunCase)]
    if args.limit:
        cases = cases[: args.limit]
    rows = []
    t0 = time.perf_counter()
    for case in cases:
        published = predict(case).est
        opts = SearchOptions(tp_comm_overlap=published.dims.tp_comm_overlap, memory_margin=0.0)
        result = search(case.job, top=args.top, time_limit_s=args.time_limit, options=opts)
        best = result.plans[0] if result.plans else None
        pub_fits = published.fits
        ratio = (best.time / published.iteration_time_s) if best else float("nan")
        inside = in_space(published.dims, opts) and pub_fits
        near = inside and best is not None and published.iteration_time_s <= best.time * 1.01
        listed = near and any(
            same_layout(q.estimate.dims, published.dims) for p in result.plans for q in [p, *p.equivalent]
        )
        # ties: top plans often differ only in choices the model prices the same (ZeRO stage when the
        # reduction hides under compute); the published layout "ranks" when it is no slower than the K-th plan
        ranks = near and published.iteration_time_s <= result.plans[-1].time * (1 + 1e-4)
        rows.append(
            (
                case.id,
                published.iteration_time_s,
                pub_fits,
                best.time if best else None,
                ratio,
                result.complete,
                near,
                listed,
                ranks,
            )
        )
        print(
            f"{case.id[:52]:52s} published {published.iteration_time_s:9.3f}s fits={str(pub_fits)[0]} "
            f"best {best.time if best else float('nan'):9.3f}s ratio {ratio:6.3f} "
            f"{'complete' if result.complete else 'time-limit'} near={str(near)[0]} listed={str(listed)[0]} "
            f"ranks={str(ranks)[0]}",
            flush=True,
        )
    planned = [r for r in rows if r[3] is not None]
    fits = [r for r in planned if r[2]]
    at_least = sum(r[3] <= r[1] * (1 + 1e-4) for r in fits)
    near = [r for r in rows if r[6]]
    print()
    print(f"runs: {len(rows)}; planned: {len(planned)}; published layout fits (by the model): {len(fits)}")
    print(f"best plan at least as fast as the published layout: {at_least} of {len(fits)}")
    if fits:
        gains = sorted(r[1] / r[3] for r in fits)
        print(
            f"predicted speed-up of the best plan over the published layout: median {gains[len(gains) // 2]:.3f}x, "
            f"max {gains[-1]:.3f}x"
        )
    print(
        f"published layout inside the space and within 1% of the best: {len(near)}; "
        f"of those listed in the top {args.top}: {sum(r[7] for r in near)}; no slower than the {args.top}th plan "
        f"(so listed but for ties): {sum(r[8] for r in near)}"
    )
    print(f"searches stopped by the time limit: {sum(not r[5] for r in rows)}; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    run(main)
