"""lmms-eval's Charades-STA answer reading, reimplemented from its rule (evaluation/profiles/lmms_eval_charades.json
names the source): so that the `lmms_eval_charades` profile scores an answer exactly as lmms-eval's `eval_tvg.py`
does, including where that differs from our parser (`vtg.answer`).

The rule: lower-case the answer and drop its example sentence; every `to` (also inside words) becomes `-`; take
every `a - b` pair of numbers; else, in sentences (split at `!`, `?`, newlines) that hold a start/end keyword,
the first number of each, paired in order; else the first `hh:mm:ss` of each such sentence, paired. Each pair is
ordered (start <= end); with several pairs the first counts. No pair: lmms-eval predicts [gt_end + 10,
gt_end + 20], which scores IoU 0 against that window.
"""

from __future__ import annotations

import re

_EXAMPLE = "a specific example is : 20.8 - 30.0 seconds"
_KEYWORDS = ("starts", "ends", "happens in", "start time", "end time", "start", "end", "happen")
_PAIR = re.compile(r"(\d+\.*\d*)\s*-\s*(\d+\.*\d*)")
_NUMBER = re.compile(r"\b(\d+\.\d+\b|\b\d+)\b")
_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}:\d{2})\b")


def _pairs(values: list[float]) -> list[tuple[float, float]]:
    values = values[: len(values) // 2 * 2]
    return [(values[i], values[i + 1]) for i in range(0, len(values), 2)]


def _seconds(clock: str) -> float:
    h, m, s = (int(x) for x in clock.split(":"))
    return float(h * 3600 + m * 60 + s)


def lmms_eval_spans(answer: str) -> list[tuple[float, float]]:
    """The time pairs lmms-eval reads from `answer` (at most one: the first), each ordered."""
    text = answer.lower().replace(_EXAMPLE, "").replace("to", "-")
    sentences = re.split(r"[!?\n]", text)
    candidates = [s for s in sentences if any(k in s for k in _KEYWORDS)]
    found: list[tuple[float, float]] = []
    for start, end in _PAIR.findall(text):
        try:
            found.append((float(start), float(end)))
        except ValueError:  # `1..2`-like text the pattern admits: lmms-eval would crash, we read no pair
            continue
    if not found:
        numbers = [float(m[0]) for s in candidates if (m := _NUMBER.findall(s))]
        found = _pairs(numbers)
    if not found:
        clocks = [_seconds(m[0]) for s in candidates if (m := _CLOCK.findall(s))]
        found = _pairs(clocks)
    ordered = [(min(a, b), max(a, b)) for a, b in found]
    return ordered[:1]


def lmms_eval_span(answer: str) -> tuple[float, float] | None:
    """The one span lmms-eval scores, or None (lmms-eval's fallback prediction, IoU 0)."""
    spans = lmms_eval_spans(answer)
    return spans[0] if len(spans) == 1 else None
