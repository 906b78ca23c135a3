"""The canonical record: one (video, query) pair after ingest (docs/architecture.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator, model_serializer, model_validator

AUTO_FIELDS = ("video_source", "confidence", "verdict")
"""Fields only auto records (the annotate stage's) set; left out of a record's JSON when unset."""


class CanonicalRecord(BaseModel):
    """One query about one video, with one or more ground-truth windows in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    video_id: str
    video_path: str
    """Relative to a root of the record's source (`vtg.sources.Sources.resolve` finds the file); never a machine
    path when ingest wrote it."""
    duration_s: float
    query: str
    windows: list[tuple[float, float]]
    source: str
    """The declared source's id (`ingest.sources`), e.g. `charades-sta`."""
    annotation_id: str
    licence: str = ""
    """The source's licence when ingest read it (SPDX id or `LicenseRef-<name>`; empty: records from before
    declared sources)."""
    annotation_file: str = ""
    """`<format>:<annotation file relative to the source root>`: where the line came from."""
    video_source: str = ""
    """The declared source whose roots `video_path` is under, when it is not `source` (an `auto:<digest>` record's
    video belongs to a declared source; empty: `source`)."""
    confidence: float | None = None
    """An auto record's confidence: the share of the annotator's sampled captionings that agree with it."""
    verdict: dict | None = None
    """An auto record's verification: the verifier, its window for the query and its IoU with the proposal."""

    @model_serializer(mode="wrap")
    def _drop_unset_auto_fields(self, handler):
        """A record that is not an auto record serializes as before these fields existed (same bytes)."""
        data = handler(self)
        for name in AUTO_FIELDS:
            if data.get(name) in ("", None):
                data.pop(name, None)
        return data

    @property
    def video_owner(self) -> str:
        """The declared source to resolve `video_path` against (`vtg.sources.Sources.resolve`)."""
        return self.video_source or self.source

    @field_validator("query")
    @classmethod
    def _query_non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("empty query")
        return v.strip()

    @model_validator(mode="after")
    def _windows_valid(self) -> CanonicalRecord:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration {self.duration_s} is not a positive finite number")
        if not self.windows:
            raise ValueError("no ground-truth window")
        for s, e in self.windows:
            if not (math.isfinite(s) and math.isfinite(e)):
                raise ValueError(f"window [{s}, {e}] is not finite")
            if s < 0:
                raise ValueError(f"window [{s}, {e}] starts before 0")
            if s >= e:
                raise ValueError(f"window [{s}, {e}] has start >= end")
            if e > self.duration_s + 1e-6:
                raise ValueError(f"window [{s}, {e}] ends after the video ({self.duration_s} s)")
        return self


def write_jsonl(path: str | Path, rows: Iterable[dict | BaseModel]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w") as f:
        for row in rows:
            obj = row.model_dump(mode="json") if isinstance(row, BaseModel) else row
            f.write(json.dumps(obj, sort_keys=True) + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[dict]:
    with Path(path).open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def read_records(path: str | Path) -> list[CanonicalRecord]:
    """Every canonical record in a jsonl file (what `python -m ingest` writes). A file that is not one (an
    annotation file, a predictions file, a truncated line) is a `VTGError` naming the file, the line and the
    first field wrong: the stages that read records as input (annotate, the benchmark) stop before any work."""
    from vtg.errors import VTGError

    out = []
    with Path(path).open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(CanonicalRecord.model_validate(json.loads(line)))
            except ValueError as e:  # json.JSONDecodeError and pydantic's ValidationError both are
                errors = getattr(e, "errors", None)
                why = (f"{'.'.join(map(str, errors()[0]['loc'])) or 'record'}: {errors()[0]['msg']}" if errors
                       else str(e).splitlines()[0])
                raise VTGError(f"{path}:{n}: not a canonical record ({why}); records are what `python -m ingest` "
                               "writes (`ingest.out=<file>`), not an annotation file") from None
    return out
