"""Base class for config sections: strict (unknown keys are errors) and documented per field."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A strict config section: typos are errors, assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
