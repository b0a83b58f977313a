"""Megatron-LM training logs as measured runs (`planner calibrate LOG...`): the job from the ``arguments`` block
the run prints at start (read by planner/emit/megatron_import.read_arguments, the importer of the same flags), the
iteration time from the ``elapsed time per iteration (ms)`` lines and the peak memory from the ``memory (MB)``
report lines (formats: shared/reference/profiling.md 3.3; megatron/training/training.py, utils report_memory).

The first logged interval is left out (warm-up: allocator, autotuning, first data loads); the median of the rest
is the run's iteration time. Memory is the largest ``max reserved`` over ranks: what the allocator held, which is
what the model's peak (allocated plus fragmentation allowance) predicts.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from planner.errors import SpecError

ARGS_START = re.compile(r"-+\s*arguments\s*-+")
ARGS_END = re.compile(r"-+\s*end of arguments\s*-+")
ARG_LINE = re.compile(r"^\s*([A-Za-z_][\w]*)\s\.+\s(.*?)\s*$")
ITER_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")
MEMORY = re.compile(r"memory \(MB\).*?max reserved:\s*([0-9.]+)")
PREFIX = re.compile(r"^(\s*\d+:\s)")  # srun --label


def is_megatron_log(text: str) -> bool:
    return bool(ITER_MS.search(text)) and bool(ARGS_START.search(text))


def read_log(path: Path, *, gpu: str | None, gpus_per_node: int | None = None):
    """A planner.runs.RunCase from one Megatron-LM log (the GPU type is not in the log: ``gpu`` names it)."""
    from planner.emit.megatron_import import read_arguments
    from planner.io import read_text
    from planner.load import parse_job
    from planner.runs import Measured, RunCase

    text = read_text(path, "runs")
    arguments, times, reserved = _scan(text, str(path))
    if gpu is None:
        raise SpecError("--gpu", f"{path} is a Megatron-LM log, which does not name the GPU type; pass --gpu NAME")
    job = parse_job(read_arguments(arguments, str(path), gpu=gpu, gpus_per_node=gpus_per_node))
    if len(times) < 2:
        raise SpecError(str(path), "fewer than two `elapsed time per iteration` lines: nothing after the warm-up")
    measured = Measured(
        iteration_time_s=statistics.median(times[1:]) / 1000.0,
        time_source="megatron log: median elapsed time per iteration after the first interval",
        memory_gib=max(reserved) / 1024.0 if reserved else None,
        oom=False,
    )
    return RunCase(id=Path(path).name, job=job, layout_choices=[job.layout], measured=measured)


def _scan(text: str, where: str) -> tuple[dict[str, str], list[float], list[float]]:
    arguments: dict[str, str] = {}
    times: list[float] = []
    reserved: list[float] = []
    inside = seen = False
    lines = text.splitlines()
    for raw in lines:
        line = PREFIX.sub("", raw, count=1)
        if not seen and ARGS_START.search(line) and "end of" not in line:
            inside = seen = True
            continue
        if inside:
            if ARGS_END.search(line):
                inside = False
                continue
            m = ARG_LINE.match(line)
            if m:
                arguments.setdefault(m.group(1), m.group(2))
            continue
        if (m := ITER_MS.search(line)) is not None:
            times.append(float(m.group(1)))
        if (m := MEMORY.search(line)) is not None:
            reserved.append(float(m.group(1)))
    if not seen:
        raise SpecError(where, "no `arguments` block: the log must start where Megatron-LM prints its arguments")
    if inside:
        raise SpecError(f"{where}:{len(lines)}", "the `arguments` block never ends: truncated log")
    return arguments, times, reserved
