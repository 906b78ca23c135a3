"""`ingest`: annotation files -> canonical records (+ dead letters)."""

from typing import Literal

from pydantic import Field

from vtg.config._base import NOT_OUTPUT, Section
from vtg.sources import SYNTHETIC, SourceDecl


class IngestConfig(Section):
    sources: list[SourceDecl] = Field(default_factory=lambda: [SYNTHETIC])
    """Every data source, declared once: id, licence (SPDX id or `LicenseRef-<name>`), origin (URL or citation),
    terms of use and the roots its annotation files and videos live under (`vtg.sources`). An annotation file under
    no root is refused; records carry the source id and licence, and paths relative to the root."""
    annotations: list[str] = Field(default_factory=lambda: ["data/raw/synthetic/annotations"], min_length=1)
    """Annotation files or directories of them (Charades-STA .txt, QVHighlights .jsonl, ActivityNet .json,
    TimeLens-Bench .json, native .jsonl)."""
    format: Literal["auto", "charades", "qvhighlights", "activitynet", "timelens", "jsonl"] = "auto"
    """Annotation format; `auto` decides by extension and content."""
    video_root: str = "data/raw/synthetic/videos"
    """Directory searched (recursively) for `<video_id>.{mp4,avi,mkv,webm,mov}`; every record's video (after resolving symlinks) must lie inside it or an `extra_video_roots` directory, else it is dead-lettered `path_outside_root`."""
    extra_video_roots: list[str] = Field(default_factory=list)
    """More directories a record's `video_path` may point into (an explicit allow-list; not searched by id)."""
    end_tolerance_s: float = Field(0.5, ge=0)
    """An end time up to this far beyond the video duration is clipped, not rejected."""
    max_query_tokens: int = Field(150, ge=1)
    """A longer query is dead-lettered `query_too_long`, counted with the tokenizer pre-flight counts
    `train.model.base` with (`vtg.model.tokens`); pre-flight budgets a query of exactly this length against
    `train.data.max_seq_len`, so no query that enters can make an example too long."""
    out: str = Field("data/interim/records.jsonl", json_schema_extra=NOT_OUTPUT)
    """Canonical records output (one JSON object per (video, query))."""
    dead_letter: str = Field("data/interim/ingest_dead_letter.jsonl", json_schema_extra=NOT_OUTPUT)
    """Every rejected line with file, line number and reason."""
    summary: str = Field("data/interim/ingest_summary.json", json_schema_extra=NOT_OUTPUT)
    """Counts that reconcile: input lines = records + dead letters."""
