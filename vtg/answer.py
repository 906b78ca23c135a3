"""The answer format: the one place that turns a span into target text and model text back into a span.

Training builds targets with `format_answer`; evaluation parses generations with `parse_answer`.
"""

from __future__ import annotations

import math
import re

ANSWER_TEMPLATE = "{start:.1f} - {end:.1f} seconds"
PARSER_VERSION = "1"
"""Bump when `parse_answer` reads any text differently: evaluation's harness card carries it, so scores parsed by
two versions are never ranked against each other."""
PARSER_RULE = ("the earliest span in the answer (`X - Y seconds`, `from X to Y`, `between X and Y`, `[X, Y]`, "
               "mm:ss); a reversed pair swapped; no span: IoU 0")

# A time: seconds (`12`, `12.5`), `mm:ss(.ff)` or `hh:mm:ss(.ff)`.
_NUM = r"(?<![\d.:])(\d+(?::\d{1,2}){0,2}(?:\.\d+)?)(?![\d:])"
_UNIT = r"(?:\s*(?:s|sec|secs|second|seconds)\b)?"
_PATTERNS = [
    re.compile(rf"\bfrom\s+{_NUM}{_UNIT}\s+(?:to|until|till|-)\s+{_NUM}", re.IGNORECASE),
    re.compile(rf"\bbetween\s+{_NUM}{_UNIT}\s+and\s+{_NUM}", re.IGNORECASE),
    re.compile(rf"\bstart\w*\W{{0,3}}\s*{_NUM}{_UNIT}\W{{0,3}}\s*(?:and\s+)?end\w*\W{{0,3}}\s*{_NUM}", re.IGNORECASE),
    re.compile(rf"[\[(]\s*{_NUM}{_UNIT}\s*,\s*{_NUM}{_UNIT}\s*[\])]"),
    re.compile(rf"{_NUM}{_UNIT}\s*(?:-+|–|—|~|\bto\b|\buntil\b|\btill\b)\s*{_NUM}", re.IGNORECASE),
]


def format_answer(start: float, end: float) -> str:
    """Canonical target text for a span, e.g. `12.0 - 15.5 seconds`."""
    return ANSWER_TEMPLATE.format(start=start, end=end)


def _to_seconds(token: str) -> float | None:
    """`12.5` -> 12.5; `1:05` -> 65; `01:02:03.5` -> 3723.5; `1:75` (a field >= 60) -> None."""
    parts = token.split(":")
    value = 0.0
    for i, p in enumerate(parts):
        field = float(p)
        if i > 0 and field >= 60:
            return None
        value = value * 60 + field
    return value


def read_span(text: str) -> tuple[float, float] | None:
    """The earliest span in `text` as written (start, end), a reversed pair left reversed; `None` if none.

    RL's reward uses this to score an inverted answer 0; evaluation reads answers with `parse_answer`."""
    if not isinstance(text, str):
        return None
    matches = [m for p in _PATTERNS if (m := p.search(text))]
    if not matches:
        return None
    m = min(matches, key=lambda m: m.start())
    a, b = _to_seconds(m.group(1)), _to_seconds(m.group(2))
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return (a, b)


def parse_answer(text: str) -> tuple[float, float] | None:
    """Parse a model answer into (start, end) seconds; `None` when no span can be read.

    Accepts the canonical format and common variants: `from X to Y`, `between X and Y`, `start X end Y`,
    `[X, Y]`, `X - Y s`, `X to Y seconds`, `mm:ss`, `hh:mm:ss.ff`. The earliest span in the text wins (a model
    that keeps generating after its answer is still read correctly). A reversed pair is swapped; a
    zero-length span is kept (it scores IoU 0 against any real moment).
    """
    span = read_span(text)
    return None if span is None else (min(span), max(span))
