"""Fitting the analytic model's few global efficiencies to measured runs (`planner calibrate`).

Time parameters are fitted by coordinate descent within physical bounds, minimizing the median plus the 90th
percentile of |log(predicted/measured)| iteration time. The two memory allowances (fixed GiB, fragmentation share)
are a least-squares-like fit of peak = allocated*(1+frag) + fixed on runs that report memory, with feasibility
mistakes (a run that ran predicted not to fit, a measured OOM predicted to fit) in the loss. No per-run constant
exists: every parameter is one physically meaningful number for all runs (planner/cost/calibration.py).
"""

from __future__ import annotations

import datetime

import numpy as np

from planner.cost.calibration import Calibration
from planner.runs import RunCase
from planner.validate import run_validation, summarize

# parameter -> (low, high): physical ranges, not free knobs
TIME_BOUNDS = {
    "gemm_efficiency": (0.5, 1.0),
    "attention_efficiency": (0.2, 1.0),
    "hbm_efficiency": (0.4, 0.95),
    "dp_overlap": (0.0, 1.0),
    "fsdp_overlap": (0.0, 1.0),
    "layer_overhead_s": (0.0, 2e-4),
}
COMMENTS = {
    "gemm_efficiency": "fraction of the GPU's measured achievable GEMM rate (MAMF) reached by layer GEMMs",
    "attention_efficiency": "fused (flash) attention, fraction of the GPU's measured flash-attention rate",
    "hbm_efficiency": "achieved fraction of HBM bandwidth by element-wise kernels",
    "nvlink_efficiency": "ring bus bandwidth / unidirectional NVLink",
    "network_efficiency": "NCCL bus bandwidth / NIC line rate",
    "dp_overlap": "share of the last micro-batch's backward that hides the DP gradient reduction",
    "fsdp_overlap": "share of a micro-batch's compute that hides ZeRO-3 gathers/scatters",
    "layer_overhead_s": "fixed per-layer-pass cost (kernel launches, framework dispatch)",
    "memory_fixed_gib": "CUDA context + NCCL buffers",
    "memory_fragmentation": "allocator cache and fragmentation, fraction of allocated bytes",
}


def time_loss(cases: list[RunCase], cal: Calibration) -> float:
    errs = [
        abs(np.log(r.est.iteration_time_s / r.case.measured.iteration_time_s))
        for r in run_validation(cases, cal)
        if hasattr(r, "case") and r.time_error is not None
    ]
    return float(np.median(errs) + np.percentile(errs, 90)) if errs else 0.0


def fit_time(cases: list[RunCase], cal: Calibration, rounds: int = 4) -> tuple[Calibration, float]:
    best = time_loss(cases, cal)
    for _ in range(rounds):
        for name, (lo, hi) in TIME_BOUNDS.items():
            for value in np.linspace(lo, hi, 21):
                trial = cal.replace(**{name: float(value)})
                loss = time_loss(cases, trial)
                if loss < best - 1e-9:
                    best, cal = loss, trial
    return cal, best


def fit_memory(cases: list[RunCase], cal: Calibration) -> Calibration:
    """The two allocator allowances, peak = allocated*(1+frag) + fixed, within physical ranges (fragmentation 0-20%
    of allocated bytes; fixed 0.5-4 GiB for the CUDA context and NCCL buffers). The loss is the median relative
    error on runs that report memory plus the share of feasibility mistakes. Unchanged without memory evidence."""
    zero = cal.replace(memory_fixed_gib=0.0, memory_fragmentation=0.0)
    rows = [
        (r.est.peak_memory_gib, r.case.measured.memory_gib, r.case.measured.oom, r.est.capacity_gib)
        for r in run_validation(cases, zero)
        if hasattr(r, "case")
    ]
    if not any(r[1] or r[2] for r in rows):
        return cal
    alloc = np.array([r[0] for r in rows])
    meas = np.array([r[1] if r[1] else np.nan for r in rows])
    oom = np.array([bool(r[2]) for r in rows])
    cap = np.array([r[3] for r in rows])
    has_mem = ~np.isnan(meas)
    best = None
    for frag in np.linspace(0.0, 0.2, 21):
        for fixed in np.linspace(0.5, 4.0, 15):
            peak = alloc * (1 + frag) + fixed
            err = float(np.median(np.abs(peak[has_mem] - meas[has_mem]) / meas[has_mem])) if has_mem.any() else 0.0
            ran_oom = float(np.mean(peak[~oom] > cap[~oom])) if (~oom).any() else 0.0
            missed = float(np.mean(peak[oom] <= cap[oom])) if oom.any() else 0.0
            loss = err + 0.5 * ran_oom + 0.5 * missed
            if best is None or loss < best[0] - 1e-12:
                best = (loss, float(frag), float(fixed))
    return cal.replace(memory_fragmentation=best[1], memory_fixed_gib=best[2])


def calibrate(cases: list[RunCase], start: Calibration) -> tuple[Calibration, dict, dict]:
    """(fitted calibration, accuracy summary before, after): planner.validate.summarize of both."""
    before = summarize(run_validation(cases, start))
    cal, _ = fit_time(cases, start)
    cal = fit_memory(cases, cal)
    return cal, before, summarize(run_validation(cases, cal))


def calibration_yaml(cal: Calibration, runs: str, count: int) -> str:
    """A calibration file (the format of planner/data/calibration.yaml) a job names with `calibration: FILE`."""
    lines = [
        f"# Efficiencies of the analytic cost model fitted by `planner calibrate` on {runs}",
        f"# ({count} runs, {datetime.date.today().isoformat()}): global values, no per-run constants.",
        "schema_version: 1",
    ]
    for key, value in cal.as_dict().items():
        lines.append(f"{key + ':':31s}{value:<.4g}  # {COMMENTS.get(key, '')}".rstrip())
    return "\n".join(lines) + "\n"
