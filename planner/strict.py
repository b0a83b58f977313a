"""The base of every input schema (job, measured profile): frozen pydantic models that refuse unknown fields and
pydantic's lax scalar conversions, so each mistake is reported at its field."""

from __future__ import annotations

import functools
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, field_validator


@functools.cache
def _scalar_kind(annotation: Any) -> type | None:
    """int, float or bool when a field holds exactly that scalar (or None), else None."""
    kinds = [a for a in (get_args(annotation) or (annotation,)) if a is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (int, float, bool) else None


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_lax_scalars(cls, value: Any, info) -> Any:
        """Refuse pydantic's lax conversions of YAML scalars: ``tp: yes`` -> 1, ``seq_length: '4k'``-like strings,
        ``sequence_parallel: 'on'`` -> True. Numbers must be numbers and switches true/false."""
        kind = _scalar_kind(cls.model_fields[info.field_name].annotation)
        if kind is None or value is None:
            return value
        if kind is bool:
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                raise ValueError("expected true or false")
        elif isinstance(value, (bool, str)):
            raise ValueError("expected an integer" if kind is int else "expected a number")
        return value
