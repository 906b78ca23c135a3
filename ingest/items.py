"""What a format reader yields: one `(line, raw, RawItem | Rejected)` per input item, in file order."""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass, field

from ingest.reasons import UNKNOWN_FORMAT, UNPARSABLE


def lines(text: str) -> list[str]:
    """The lines of an annotation file: split at `\\n`, `\\r\\n` or `\\r` only. (`str.splitlines` also splits at
    U+2028, U+0085, form feeds and more, which a caption may hold as text: its line would be cut in two.)"""
    out = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return out[:-1] if out and out[-1] == "" else out


@dataclass(frozen=True)
class RawItem:
    """One parsed (video, query) annotation, not validated yet."""

    video_id: str
    query: str
    windows: list[tuple[float, float]]
    duration_s: float | None  # None: the format has none (Charades): probe the video
    annotation_id: str
    extra: dict = field(default_factory=dict)
    """Format-specific passthrough (native: video_path, source, licence, annotation_file)."""


@dataclass(frozen=True)
class Rejected:
    """An item the reader could not turn into a RawItem."""

    reason: str
    detail: str
    annotation_id: str | None = None


Parsed = tuple[int, str, RawItem | Rejected]


def as_number(value: object) -> float:
    """A JSON number (NaN/inf allowed, validated later); anything else raises TypeError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def as_id(value: object, key: str) -> str:
    """An identifier field (`video_id`, `qid`, `vid`, `annotation_id`): a non-empty string, or an integer as its
    digits. Anything else (null, a bool, a float, a list) raises TypeError: `str(None)` would make every such line
    the id "None", and a float's digits are not the id the user wrote."""
    if isinstance(value, bool) or not isinstance(value, str | int) or (isinstance(value, str) and not visible(value)):
        raise TypeError(f"{key} must be a non-empty string or an integer, got {value!r}")
    return str(value)


def visible(text: str) -> bool:
    """Whether `text` holds a character a reader can see: not only whitespace, zero-width or other format and
    control characters (U+200B, U+200C, U+200D, U+2060, U+FEFF, ...). The one test of "empty" for every text field."""
    return any(not (c.isspace() or unicodedata.category(c) in ("Cf", "Cc", "Zs", "Zl", "Zp", "Mn")) for c in text)


def load_object(line: str, required: tuple[str, ...], known: tuple[str, ...], what: str,
                id_key: str | None) -> dict | Rejected:
    """One JSON-object line with `required` keys, else why not (no `known` key at all: another format)."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        return Rejected(UNPARSABLE, f"not JSON ({e})")
    if not isinstance(obj, dict) or not any(k in obj for k in known):
        return Rejected(UNKNOWN_FORMAT, f"not a {what} record (expected keys {', '.join(required)})")
    missing = [k for k in required if k not in obj]
    if missing:
        aid = obj[id_key] if id_key and isinstance(obj.get(id_key), str | int) else None
        aid = None if aid is None or isinstance(aid, bool) else str(aid)
        return Rejected(UNPARSABLE, f"missing key(s) {', '.join(missing)}", aid)
    return obj


def as_windows(value: object) -> list[tuple[float, float]]:
    if not isinstance(value, list) or not value:
        raise TypeError(f"windows must be a non-empty list of [start, end], got {value!r}")
    out = []
    for w in value:
        if not isinstance(w, list | tuple) or len(w) != 2:
            raise TypeError(f"window {w!r} is not [start, end]")
        out.append((as_number(w[0]), as_number(w[1])))
    return out

