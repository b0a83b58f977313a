"""The search: the one entry point the CLI calls, `run_search`.

One node group is searched by branch and bound over its candidates (homogeneous search); several node groups by
the mixed-GPU search (pipelines whose stages sit on different groups, and replicas on different types). See
docs/ARCHITECTURE.md for the files.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.search.result import SearchResult
    from planner.search.space import SearchOptions
    from planner.spec import Job


def run_search(
    job: Job,
    options: SearchOptions,
    *,
    top: int,
    time_limit_s: float,
    workers: int = 1,
    progress: Callable[..., None] | None = None,
) -> SearchResult:
    """The top plans of ``job`` within ``time_limit_s``. With a framework restriction, half of the budget goes to
    the restricted search and the rest prices the unrestricted best plan (``result.unrestricted_best_s``), so
    that the report can say what the restriction costs."""
    from planner.frameworks import check_training

    t = job.training
    check_training(options.framework, t.precision, t.fp8_recipe, t.grad_dtype)
    deadline = time.monotonic() + time_limit_s
    share = 0.5 if options.framework is not None else 1.0
    result = _search(job, options, top, time_limit_s * share, workers, progress)
    if options.framework is not None:
        free = _search(job, replace(options, framework=None), top, deadline - time.monotonic(), workers, None)
        result.unrestricted_best_s = free.plans[0].time if free.plans else None
    return result


# gc.set_threshold's third threshold while the search runs: young-generation collections before a full one
NO_FULL_COLLECTION = 2**30


@contextlib.contextmanager
def _older_objects_frozen() -> Iterator[None]:
    """Keep the cyclic garbage collector's full collections out of the search while it runs.

    The objects that exist before the search (imported modules: pydantic, OR-Tools, the job) are frozen: no
    collection walks them again (about a tenth of the search time on the bench jobs). The search itself allocates
    millions of short-lived objects and keeps many long-lived ones (its memoized bounds and cost terms), which
    every full collection would walk again as they grow: Llama 4 Maverick on four GPU types (bench_hetero --suite,
    job 46) ran 10 of them, 7% of its search time. So the young generations are collected as usual (short-lived
    cycles go at once) and the oldest one not at all until the search ends (it holds little cyclic garbage: the
    same job's peak memory grew by under 1%). See the `gc.freeze` and `gc.set_threshold` documentation."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], NO_FULL_COLLECTION)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _search(job, options, top, limit, workers, progress):
    if len(job.cluster) > 1:
        from planner.search.mixed_pipelines import search_hetero as search
    else:
        from planner.search.homogeneous import search
    with _older_objects_frozen():  # after the imports: their objects are frozen too
        return search(job, top=top, time_limit_s=max(0.0, limit), workers=workers, options=options, progress=progress)
