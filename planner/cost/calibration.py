"""The calibrated efficiencies of the analytic cost model (``planner/data/calibration.yaml``).

Each is a physically meaningful, global number (a fraction of a datasheet or measured rate, an overlap share, an
allocator allowance); none is specific to one run. ``scripts/calibrate.py`` fits them on the measured runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Calibration:
    gemm_efficiency: float
    attention_efficiency: float
    hbm_efficiency: float
    nvlink_efficiency: float
    network_efficiency: float
    dp_overlap: float
    fsdp_overlap: float
    layer_overhead_s: float
    memory_fixed_gib: float
    memory_fragmentation: float

    def replace(self, **changes) -> Calibration:
        return Calibration(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def default_calibration() -> Calibration:
    return _default()[0]


def default_calibration_file():
    """The file default_calibration() was read from (``$PLANNER_CATALOG/calibration.yaml`` or the built-in one)."""
    return _default()[1]


@functools.cache
def _default():
    from planner.catalog import data_file
    from planner.io import load_yaml

    path = data_file("calibration.yaml")
    data = load_yaml(path, field=str(path))
    return Calibration(**{f.name: float(data[f.name]) for f in fields(Calibration)}), path


def job_calibration(job) -> Calibration:
    """The efficiencies ``job`` is priced with: its own ``calibration`` over the default (calibration_from)."""
    return calibration_from(getattr(job, "calibration", None))


def calibration_from(spec) -> Calibration:
    """A planner.spec.CalibrationSpec (None: the default) over the default calibration, field by field."""
    base = default_calibration()
    if spec is None:
        return base
    return base.replace(**{k: v for k, v in spec.model_dump().items() if k != "source" and v is not None})
