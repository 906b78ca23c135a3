"""Native jsonl: the canonical record's fields (`video_id, query, windows`, optional `duration_s`,
`annotation_id`, `video_path`, `source`, `licence`, `annotation_file`). Ingest's own output is valid input: a record
naming a declared source takes that source (its `video_path` relative to the source's roots), its licence must be
the source's, and its `annotation_file` (where the line first came from) is kept."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ingest.items import Parsed, RawItem, Rejected, as_id, as_number, as_windows, lines, load_object
from ingest.reasons import UNPARSABLE

REQUIRED = ("video_id", "query", "windows")


def parse_line(line: str, line_no: int, stem: str) -> RawItem | Rejected:
    obj = load_object(line, REQUIRED, REQUIRED, "native", "annotation_id")
    if isinstance(obj, Rejected):
        return obj
    try:
        aid = as_id(obj["annotation_id"], "annotation_id") if obj.get("annotation_id") is not None \
            else f"{stem}:{line_no}"
        video_id = as_id(obj["video_id"], "video_id")
    except TypeError as e:
        return Rejected(UNPARSABLE, str(e), None)
    try:
        windows = as_windows(obj["windows"])
        duration = as_number(obj["duration_s"]) if obj.get("duration_s") is not None else None
    except TypeError as e:
        return Rejected(UNPARSABLE, str(e), aid)
    if not isinstance(obj["query"], str):
        return Rejected(UNPARSABLE, "query must be a string", aid)
    bad = [k for k in ("video_path", "source", "licence", "annotation_file")
           if obj.get(k) is not None and not isinstance(obj[k], str)]
    if bad:
        return Rejected(UNPARSABLE, f"{', '.join(bad)} must be a string", aid)
    extra = {k: obj[k] for k in ("video_path", "source", "licence", "annotation_file") if isinstance(obj.get(k), str)}
    return RawItem(video_id, obj["query"], windows, duration, aid, extra)


def parse(text: str, name: str = "") -> Iterator[Parsed]:
    stem = Path(name).stem or "native"
    for no, line in enumerate(lines(text), 1):
        if line.strip():
            yield no, line, parse_line(line, no, stem)
