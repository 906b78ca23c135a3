"""The run keys: what of a config section counts for "is this stage done?" (`output_view`), for "may this run
resume from that checkpoint?" (`trajectory_view`), and their stable short hash (`view_hash`). The one home of
these keys; the marks they read are declared on the fields (`vtg.config._base`: `NOT_OUTPUT`, `RUN_LENGTH`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from vtg.config._base import MARK


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
