"""Charades-STA: `<vid> <start> <end>##<sentence>` per line; no durations (ingest probes the video)."""

from __future__ import annotations

from collections.abc import Iterator

from ingest.items import Parsed, RawItem, Rejected, lines
from ingest.reasons import UNPARSABLE


def parse_line(line: str, line_no: int) -> RawItem | Rejected:
    head, sep, query = line.partition("##")
    parts = head.split()
    if not sep or len(parts) != 3:
        return Rejected(UNPARSABLE, "expected `<video_id> <start> <end>##<sentence>`")
    vid, start, end = parts
    try:
        window = (float(start), float(end))
    except ValueError:
        return Rejected(UNPARSABLE, f"start/end {start!r} {end!r} are not numbers", f"{vid}#{line_no}")
    return RawItem(vid, query.strip(), [window], None, f"{vid}#{line_no}")


def parse(text: str, name: str = "") -> Iterator[Parsed]:
    for no, line in enumerate(lines(text), 1):
        if line.strip():
            yield no, line, parse_line(line, no)
