"""RawItem -> CanonicalRecord, or the reason it goes to the dead-letter file (docs/architecture.md rules)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from ingest import reasons as R
from ingest.items import RawItem, visible
from ingest.videos import VideoIndex
from vtg.records import CanonicalRecord
from vtg.sources import AmbiguousName, SourceDecl, Sources

Probe = Callable[[str], tuple[float | None, str]]


@dataclass(frozen=True)
class QueryLimit:
    """`ingest.max_query_tokens`, and how a query is counted: with the tokenizer pre-flight counts the model's
    text with (`vtg.model.tokens.counting_tokenizer`)."""

    max_tokens: int
    count: Callable[[str], int]
    counted_with: str
    """Says whose tokenizer, for the dead letter."""

    @classmethod
    def for_base(cls, base: str, max_tokens: int) -> QueryLimit:
        from vtg.model.text import query_ids
        from vtg.model.tokens import counting_tokenizer

        tokenizer, note, _ = counting_tokenizer(base)
        return cls(max_tokens, lambda q: len(query_ids(tokenizer, q)), f"train.model.base={base} ({note})")

    def check(self, query: str) -> None:
        n = self.count(query)
        if n > self.max_tokens:
            raise Invalid(R.QUERY_TOO_LONG, f"the query is {n} tokens > ingest.max_query_tokens={self.max_tokens} "
                                            f"(counted for {self.counted_with}): shorten it, or raise "
                                            "ingest.max_query_tokens (pre-flight then checks the longer query "
                                            "against train.data.max_seq_len)", query_tokens=n)


class Invalid(Exception):
    def __init__(self, reason: str, detail: str, **fields):
        super().__init__(detail)
        self.reason, self.detail = reason, detail
        self.fields = fields
        """Extra dead-letter fields (e.g. the offending `video_path`)."""


def check_windows(windows: list[tuple[float, float]]) -> None:
    for s, e in windows:
        if not (math.isfinite(s) and math.isfinite(e)):
            raise Invalid(R.NOT_FINITE, f"window [{s}, {e}] is not finite")
        if s < 0:
            raise Invalid(R.NEGATIVE_START, f"window [{s}, {e}] starts before 0")
        if s >= e:
            raise Invalid(R.START_GE_END, f"window [{s}, {e}] has start >= end")


def resolve_duration(item: RawItem, path: str, probe: Probe) -> float:
    if item.duration_s is None:
        duration, why = probe(path)
        if duration is None:
            raise Invalid(R.UNPROBEABLE_VIDEO, f"{path}: {why}")
        return duration
    if not (math.isfinite(item.duration_s) and item.duration_s > 0):
        raise Invalid(R.BAD_DURATION, f"duration {item.duration_s} is not a positive number")
    return item.duration_s


def clip_windows(windows: list[tuple[float, float]], duration: float, tolerance: float) -> tuple[list, bool]:
    out, clipped = [], False
    for s, e in windows:
        if e > duration + tolerance:
            raise Invalid(R.END_BEYOND_DURATION,
                          f"window [{s}, {e}] ends {e - duration:.3f} s after the video ({duration:.3f} s; "
                          f"tolerance {tolerance} s)")
        if e > duration:
            e, clipped = duration, True
            if s >= e:
                raise Invalid(R.END_BEYOND_DURATION, f"window starts at {s} >= duration {duration:.3f} s")
        out.append((s, e))
    return out, clipped


def record_source(item: RawItem, file_source: SourceDecl, sources: Sources) -> SourceDecl:
    """The record's source: the one a native record names (it must be declared, and its licence, if given, the
    declared one), else the source whose root holds the annotation file."""
    named = item.extra.get("source")
    decl = file_source
    if named is not None and named != file_source.id:
        if named not in sources:
            raise Invalid(R.UNDECLARED_SOURCE, f"the record names source {named!r}, which ingest.sources does not "
                                               f"declare (declared: {', '.join(sources.decls)}): declare it with its "
                                               f"licence, or drop the field to take the file's source "
                                               f"({file_source.id!r})")
        decl = sources[named]
    licence = item.extra.get("licence")
    if licence is not None and licence != decl.licence:
        raise Invalid(R.LICENCE_MISMATCH, f"the record says licence {licence!r}, its source {decl.id!r} is declared "
                                          f"{decl.licence!r}: fix the record or the declaration")
    return decl


def to_record(item: RawItem, source: SourceDecl, sources: Sources, annotation_file: str, videos: VideoIndex,
              tolerance: float, probe: Probe, query_limit: QueryLimit | None = None) -> tuple[CanonicalRecord, bool]:
    """`_to_record`; a path that two of its source's roots hold (`vtg.sources.AmbiguousName`) is the dead letter
    `ambiguous_video_id` naming both files, never a record of the first one."""
    try:
        return _to_record(item, source, sources, annotation_file, videos, tolerance, probe, query_limit)
    except AmbiguousName as e:
        raise Invalid(R.AMBIGUOUS_VIDEO, str(e)) from None


def _to_record(item: RawItem, source: SourceDecl, sources: Sources, annotation_file: str, videos: VideoIndex,
               tolerance: float, probe: Probe, query_limit: QueryLimit | None = None) -> tuple[CanonicalRecord, bool]:
    """(record, whether a window end was clipped to the duration); raises `Invalid`. `source` holds the annotation
    file (`annotation_file`: `<format>:<path under its root>`); the record's video path is stored relative to its
    source's root."""
    if not visible(item.query):
        raise Invalid(R.EMPTY_QUERY, "the query text is empty" + (
            f" (only invisible characters: {', '.join(sorted({f'U+{ord(c):04X}' for c in item.query}))})"
            if item.query.strip() else ""))
    if query_limit is not None:
        query_limit.check(item.query)
    if not item.windows:
        raise Invalid(R.UNPARSABLE, "no ground-truth window")
    check_windows(item.windows)
    source = record_source(item, source, sources)
    given = item.extra.get("video_path")  # native records may carry their path; else look the id up
    path = given
    if path and "source" in item.extra and not os.path.isabs(path):
        path = sources.resolve(source.id, path)  # ingest's own output: relative to its source's root
    if given and not (path and os.path.isfile(path)):
        # a path the record names is the record's video: never another file found by its id
        raise Invalid(R.MISSING_VIDEO, f"the record's video_path {given!r} is not a file"
                      + (f" (resolved to {path})" if path and path != given else "")
                      + ": fix the path, or drop video_path to look the video up by its id", video_path=given)
    if not path:
        if item.video_id in videos.ambiguous:
            files = videos.ambiguous[item.video_id]
            raise Invalid(R.AMBIGUOUS_VIDEO, f"id {item.video_id!r} names {len(files)} files under {videos.root} "
                                             f"({', '.join(files)}): give the record a video_path, or each video "
                                             "its own id")
        path = videos.locate(item.video_id)
    if path is None:
        raise Invalid(R.MISSING_VIDEO, f"no video file for id {item.video_id!r} under {videos.root} "
                                       "(.mp4 .avi .mkv .webm .mov)")
    real = videos.outside_roots(path)  # the one containment check: the record's own path and indexed symlinks
    if real is not None:
        raise Invalid(R.PATH_OUTSIDE_ROOT, f"video {path} (resolves to {real}) is outside ingest.video_root "
                                           f"{videos.root} and ingest.extra_video_roots", video_path=path)
    rel = sources.relative(source.id, path)
    if rel is None:
        raise Invalid(R.VIDEO_OUTSIDE_SOURCE, f"video {path} lies under none of source {source.id!r}'s roots "
                                              f"({', '.join(source.roots)}): add its folder to that source's roots "
                                              "in ingest.sources (videos share their annotations' licence)",
                      video_path=path)
    duration = resolve_duration(item, path, probe)
    windows, clipped = clip_windows(item.windows, duration, tolerance)
    try:
        record = CanonicalRecord(video_id=item.video_id, video_path=rel, duration_s=duration, query=item.query,
                                 windows=windows, source=source.id, licence=source.licence,
                                 annotation_file=item.extra.get("annotation_file", annotation_file),
                                 annotation_id=item.annotation_id)
    except ValidationError as e:
        raise Invalid(R.UNPARSABLE, "; ".join(err["msg"] for err in e.errors())) from None
    return record, clipped
