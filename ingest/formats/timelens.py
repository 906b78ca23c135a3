"""TimeLens-Bench (TencentARC/TimeLens-Bench: `charades-timelens.json`, `activitynet-timelens.json`,
`qvhighlights-timelens.json`): `{vid: {duration, spans: [[s, e], ...], queries: [...]}}`, span i answering query i.

Items are queries (annotation id `<vid>#<i>`), each with its one span, its query cleaned as TimeLens's own loader
cleans it (`timelens/dataset/timelens_data.py` `parse_query`: whitespace runs become one space, the ends and a
trailing period stripped), so the prompt holds the words TimeLens's evaluation gives the model. A video entry not
of that shape is one item; the reported line is the line of the video's key (ActivityNet's rule).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from ingest.formats.activitynet import parse_video_object
from ingest.items import Parsed, RawItem, Rejected, as_id, as_number, as_windows
from ingest.reasons import UNPARSABLE

KEYS = ("spans", "queries")
"""The keys that tell a TimeLens-Bench entry from an ActivityNet Captions one (`timestamps`, `sentences`)."""


def parse_query(query: str) -> str:
    """TimeLens's `parse_query`: `re.sub(r"\\s+", " ", query).strip().strip(".").strip()`."""
    return re.sub(r"\s+", " ", query).strip().strip(".").strip()


def _entry(vid: str, entry: object) -> Iterator[tuple[str, RawItem | Rejected]]:
    try:
        as_id(vid, "the video key")
    except TypeError as e:
        yield json.dumps({vid: entry}), Rejected(UNPARSABLE, str(e), None)
        return
    if not isinstance(entry, dict) or not set(KEYS) <= entry.keys():
        yield json.dumps({vid: entry}), Rejected(UNPARSABLE, "entry needs `spans` and `queries`", vid)
        return
    spans, queries = entry["spans"], entry["queries"]
    if not isinstance(spans, list) or not isinstance(queries, list) or len(spans) != len(queries):
        yield json.dumps({vid: entry}), Rejected(UNPARSABLE, "`spans` and `queries` must be lists of the same length",
                                                 vid)
        return
    for i, (span, query) in enumerate(zip(spans, queries, strict=True)):
        aid = f"{vid}#{i}"
        raw = json.dumps({vid: {"duration": entry.get("duration"), "spans": [span], "queries": [query]}})
        try:
            duration = as_number(entry["duration"]) if entry.get("duration") is not None else None
            windows = as_windows([span])
        except TypeError as e:
            yield raw, Rejected(UNPARSABLE, str(e), aid)
            continue
        if not isinstance(query, str):
            yield raw, Rejected(UNPARSABLE, f"query {query!r} is not a string", aid)
            continue
        yield raw, RawItem(vid, parse_query(query), windows, duration, aid)


def parse(text: str, name: str = "") -> Iterator[Parsed]:
    return parse_video_object(text, _entry)


def looks_like(data: object) -> bool:
    """Whether parsed JSON is TimeLens-Bench's (its first entry has `spans` and `queries`)."""
    first = next(iter(data.values()), None) if isinstance(data, dict) else None
    return isinstance(first, dict) and set(KEYS) <= first.keys()
