"""What a JSON output was computed from: the resolved job, the planner version and the cost model's calibration.

`planner plan --json` and `planner estimate --json` echo these so that a launch script needs the JSON alone:
``planner.load.parse_job(doc["job"])`` rebuilds a Job equal to the one planned. Light imports only (no search).
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.cost.calibration import Calibration
from planner.spec import Job

BUILTIN = "builtin"


def job_json(job: Job) -> dict:
    """The job with every catalog name resolved (model dimensions, each node group's GPU numbers), as
    ``parse_job`` reads it back. The layout is echoed as written (fields left out keep their defaults, so that
    re-reading applies the same rules); its resolved degrees are in the estimate's ``layout``."""
    out = job.model_dump(mode="json", exclude={"layout"})
    out["layout"] = job.layout.model_dump(mode="json", exclude_unset=True) if job.layout is not None else None
    return out


def calibration_file(cal: Calibration | None) -> str | None:
    """``"builtin"``, the ``$PLANNER_CATALOG`` file the default calibration was read from, or None for a
    calibration given in code (not the default)."""
    from planner.catalog import builtin_data_dir
    from planner.cost.calibration import default_calibration, default_calibration_file

    if cal is not None and cal != default_calibration():
        return None
    path = default_calibration_file()
    return BUILTIN if path == builtin_data_dir() / path.name else str(path)


def cost_model_json(cal: Calibration | None = None) -> dict:
    """The calibration the estimates used (default: the catalog's ``calibration.yaml``) and where it came from."""
    from planner.cost.calibration import default_calibration

    used = cal or default_calibration()
    return {"calibration_file": calibration_file(used), "calibration": {k: float(v) for k, v in used.as_dict().items()}}


def warnings_json(warnings: Iterable) -> list[dict]:
    """Objects with ``.field`` and ``.message`` (planner.sanity) as ``{"field", "message"}`` mappings, in order."""
    return [{"field": str(w.field), "message": str(w.message)} for w in warnings]


def provenance(job: Job, cal: Calibration | None = None) -> dict:
    """The ``job``, ``planner_version`` and ``cost_model`` keys shared by the plan and estimate JSON."""
    from planner import __version__

    if job.calibration is not None:
        from planner.cost.calibration import job_calibration

        used = cal or job_calibration(job)
        model = {
            "calibration_file": job.calibration.source,
            "calibration": {k: float(v) for k, v in used.as_dict().items()},
        }
        return {"job": job_json(job), "planner_version": __version__, "cost_model": model}
    return {"job": job_json(job), "planner_version": __version__, "cost_model": cost_model_json(cal)}
