"""Pipeline schedule: iteration time of 1F1B and interleaved 1F1B from per-stage micro-batch times."""

from __future__ import annotations


def bubble_fraction(pp: int, vpp: int, num_microbatches: int) -> float:
    """Narayanan et al. 2021, Sec. 2.2: idle share relative to ideal time, (p - 1)/(v*m)."""
    return (pp - 1) / (vpp * num_microbatches)


def pipeline_time(stage_times: list[float], vpp: int, num_microbatches: int) -> tuple[float, float]:
    """(steady-state time, bubble time) of one iteration.

    With equal stages of time t this is m*t + (p-1)*t/v, i.e. the ideal m*t plus the bubble (p-1)/(v*m) of it
    (Narayanan et al. 2021). With unequal stages the slowest stage paces the steady state and the warm-up and
    cool-down pass once through every other stage."""
    slowest = max(stage_times)
    steady = num_microbatches * slowest
    bubble = (sum(stage_times) - slowest) / vpp
    return steady, bubble
