"""Base class for config sections: strict (unknown keys are errors) and documented per field.

Every field says once, on the field, whether it changes its stage's output. Unmarked fields do. Two markers:

- `NOT_OUTPUT` (e.g. `progress`, `log_every`, worker counts, paths): the output bytes do not depend on the value.
  Left out of every hash of config (cache keys, the params recorded in dvc.lock comparisons, lineage hashes).
- `RUN_LENGTH` (`max_steps`, `save_every`, `keep_last`): how far a run goes and what it keeps, not its trajectory.
  They count for "is this stage done?" but not for "may this run resume from that checkpoint?".

The run keys built from these marks (`output_view`, `trajectory_view`, `view_hash`) live in `vtg.config.keys`, the
only reader of them; everyone who hashes config calls it.
"""

from __future__ import annotations

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
