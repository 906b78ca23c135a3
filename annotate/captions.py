"""The dense-captioning format: the one place that turns a video's events into the annotator's target text and the
annotator's text back into (query, window) proposals.

    the red circle moves left: 2.5 - 6.0 seconds
    a blue square appears: 9.0 - 12.5 seconds

One event per line, in start order; the window in the grounding answer format (`vtg.answer`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from vtg.answer import format_answer, parse_answer

CAPTION_PROMPT = "List every event in the video, one per line, as `<event>: <start> - <end> seconds`."
"""The instruction the annotator answers (it stands where a grounding query would)."""

_LINE = re.compile(r"^\s*[-*\d.)\s]*(?P<query>[^:\n]*[^:\s])\s*:\s*(?P<span>.+?)\s*$")


def normalize(query: str) -> str:
    """Case and space folded: how two proposals are compared for agreement."""
    return " ".join(query.lower().split())


def caption_text(events: Iterable[tuple[str, Sequence[float]]]) -> str:
    """Target text for a video's events: (query, (start, end)) pairs, written in start order."""
    rows = sorted(((float(w[0]), float(w[1]), q) for q, w in events), key=lambda r: (r[0], r[1], r[2]))
    return "\n".join(f"{q}: {format_answer(s, e)}" for s, e, q in rows)


def parse_captions(text: str, duration_s: float | None = None) -> list[tuple[str, tuple[float, float]]]:
    """(query, window) proposals read from an annotator's text: one per line that holds `<query>: <span>`; a line
    without a readable span, an empty query or an empty window (after clipping to the video) is skipped; the same
    query twice keeps its first line."""
    out: list[tuple[str, tuple[float, float]]] = []
    seen: set[str] = set()
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        span = parse_answer(m.group("span"))
        query = m.group("query").strip()
        if span is None or not query or normalize(query) in seen:
            continue
        start, end = max(0.0, span[0]), span[1] if duration_s is None else min(span[1], duration_s)
        if end <= start:
            continue
        seen.add(normalize(query))
        out.append((query, (round(start, 3), round(end, 3))))
    return out
