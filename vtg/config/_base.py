"""Base class for config sections: strict (unknown keys are errors) and documented per field.

Every field says once, on the field, whether it changes its stage's output. Unmarked fields do. Two markers:

- `NOT_OUTPUT` (e.g. `progress`, `log_every`, worker counts, paths): the output bytes do not depend on the value.
  Left out of every hash of config (cache keys, the params recorded in dvc.lock comparisons, lineage hashes).
- `RUN_LENGTH` (`max_steps`, `save_every`, `keep_last`): how far a run goes and what it keeps, not its trajectory.
  They count for "is this stage done?" but not for "may this run resume from that checkpoint?".

`output_view(section)` and `trajectory_view(section)` are the only readers; everyone who hashes config calls them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

MARK = "vtg_output"
NOT_OUTPUT: dict[str, Any] = {MARK: "none"}
"""`Field(..., json_schema_extra=NOT_OUTPUT)`: the field does not change the stage's output."""
RUN_LENGTH: dict[str, Any] = {MARK: "run_length"}
"""`Field(..., json_schema_extra=RUN_LENGTH)`: run length or retention; resuming across a change is fine."""


class Section(BaseModel):
    """A strict config section: typos are errors, assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


def _mark(section: BaseModel, name: str) -> str | None:
    extra = type(section).model_fields[name].json_schema_extra
    return extra.get(MARK) if isinstance(extra, dict) else None


def _view(section: BaseModel, drop: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in type(section).model_fields:
        if _mark(section, name) in drop:
            continue
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            out[name] = _view(value, drop)
        else:
            out[name] = section.__pydantic_serializer__.to_python(section, mode="json", include={name})[name]
    return out


def output_view(section: BaseModel) -> dict[str, Any]:
    """The section as JSON data without its `NOT_OUTPUT` fields (nested sections included)."""
    return _view(section, {"none"})


def trajectory_view(section: BaseModel) -> dict[str, Any]:
    """`output_view` without the `RUN_LENGTH` fields either: what a resumed run must share with its checkpoint."""
    return _view(section, {"none", "run_length"})


def view_hash(view: dict[str, Any], length: int = 12) -> str:
    """Stable short hash of a view (sorted keys, compact separators)."""
    blob = json.dumps(view, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]
