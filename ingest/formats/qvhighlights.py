"""QVHighlights: one JSON object per line with `qid, query, vid, duration, relevant_windows`."""

from __future__ import annotations

from collections.abc import Iterator

from ingest.items import Parsed, RawItem, Rejected, as_id, as_number, as_windows, lines, load_object
from ingest.reasons import UNPARSABLE

KEYS = ("qid", "query", "vid", "duration", "relevant_windows")


def parse_line(line: str) -> RawItem | Rejected:
    obj = load_object(line, KEYS, KEYS, "QVHighlights", "qid")
    if isinstance(obj, Rejected):
        if "relevant_windows" in obj.detail:
            return Rejected(obj.reason, obj.detail + " (the released test split has no labels)", obj.annotation_id)
        return obj
    try:
        aid = as_id(obj["qid"], "qid")
    except TypeError as e:
        return Rejected(UNPARSABLE, str(e), None)
    try:
        windows = as_windows(obj["relevant_windows"])
        duration = as_number(obj["duration"])
    except TypeError as e:
        return Rejected(UNPARSABLE, str(e), aid)
    if not isinstance(obj["query"], str):
        return Rejected(UNPARSABLE, "query must be a string", aid)
    try:
        vid = as_id(obj["vid"], "vid")
    except TypeError as e:
        return Rejected(UNPARSABLE, str(e), aid)
    return RawItem(vid, obj["query"], windows, duration, aid)


def parse(text: str, name: str = "") -> Iterator[Parsed]:
    for no, line in enumerate(lines(text), 1):
        if line.strip():
            yield no, line, parse_line(line)
