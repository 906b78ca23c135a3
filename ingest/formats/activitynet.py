"""ActivityNet Captions: `{vid: {duration, timestamps: [[s, e], ...], sentences: [...]}}`.

Items are sentences (annotation id `<vid>#<i>`); a video entry that is not of that shape is one item. The
reported line is the line where the video's key appears (1 for single-line files).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

from ingest.items import Parsed, RawItem, Rejected, as_id, as_number, as_windows
from ingest.items import lines as text_lines
from ingest.reasons import UNKNOWN_FORMAT, UNPARSABLE

_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:\s*\{')  # "vid": { anywhere on a line
_LEADING_KEY = re.compile(r'^[\s{]*"((?:[^"\\]|\\.)*)"\s*:')  # a key that starts a line


def key_lines(text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for no, line in enumerate(text_lines(text), 1):
        if m := _LEADING_KEY.match(line):
            found.setdefault(m.group(1), no)
        for m in _KEY.finditer(line):
            found.setdefault(m.group(1), no)
    return found


def _entry(vid: str, entry: object) -> Iterator[tuple[str, RawItem | Rejected]]:
    """(raw text of the item, item) for each sentence of one video's entry."""
    try:
        as_id(vid, "the video key")
    except TypeError as e:
        yield json.dumps({vid: entry}), Rejected(UNPARSABLE, str(e), None)
        return
    if not isinstance(entry, dict) or not {"timestamps", "sentences"} <= entry.keys():
        yield json.dumps({vid: entry}), Rejected(UNPARSABLE, "entry needs `timestamps` and `sentences`", vid)
        return
    ts, sents = entry["timestamps"], entry["sentences"]
    if not isinstance(ts, list) or not isinstance(sents, list) or len(ts) != len(sents):
        yield json.dumps({vid: entry}), Rejected(
            UNPARSABLE, "`timestamps` and `sentences` must be lists of the same length", vid)
        return
    try:
        duration = as_number(entry["duration"]) if entry.get("duration") is not None else None
    except TypeError as e:
        duration = None
        bad_duration = str(e)
    else:
        bad_duration = ""
    for i, (window, sentence) in enumerate(zip(ts, sents, strict=True)):
        aid = f"{vid}#{i}"
        raw = json.dumps({vid: {"duration": entry.get("duration"), "timestamps": [window], "sentences": [sentence]}})
        if bad_duration:
            yield raw, Rejected(UNPARSABLE, f"duration: {bad_duration}", aid)
            continue
        try:
            windows = as_windows([window])
        except TypeError as e:
            yield raw, Rejected(UNPARSABLE, str(e), aid)
            continue
        if not isinstance(sentence, str):
            yield raw, Rejected(UNPARSABLE, f"sentence {sentence!r} is not a string", aid)
            continue
        yield raw, RawItem(vid, sentence, windows, duration, aid)


def parse_video_object(text: str, entry: Callable[[str, object], Iterator]) -> Iterator[Parsed]:
    """A JSON object keyed by video id (ActivityNet Captions, TimeLens-Bench): `entry(video_id, value)` yields
    (raw, item) per query; each comes with the line its video id is on."""
    try:
        data = json.loads(text)
    except ValueError as e:
        yield getattr(e, "lineno", 1), text[:200], Rejected(UNPARSABLE, f"not JSON ({e})")
        return
    if not isinstance(data, dict):
        yield 1, text[:200], Rejected(UNKNOWN_FORMAT, "top level is not an object of video ids")
        return
    lines = key_lines(text)
    for vid, value in data.items():
        for raw, item in entry(vid, value):
            yield lines.get(vid, 1), raw, item


def parse(text: str, name: str = "") -> Iterator[Parsed]:
    return parse_video_object(text, _entry)
