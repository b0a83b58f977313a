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


@contextlib.contextmanager
def _older_objects_frozen() -> Iterator[None]:
    """Keep the objects that exist before the search (imported modules: pydantic, OR-Tools, the job) out of the
    cyclic garbage collector while it runs. The search allocates millions of short-lived objects, and each full
    collection would otherwise walk every one of those older objects again (about a tenth of the search time on
    the bench jobs). Objects the search creates are collected as usual. See the `gc.freeze` documentation."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _search(job, options, top, limit, workers, progress):
    if len(job.cluster) > 1:
        from planner.search.mixed_pipelines import search_hetero as search
    else:
        from planner.search.homogeneous import search
    with _older_objects_frozen():  # after the imports: their objects are frozen too
        return search(job, top=top, time_limit_s=max(0.0, limit), workers=workers, options=options, progress=progress)
