"""The answer format: the one place that turns a span into target text and model text back into a span.

Training builds targets with `format_answer`; evaluation parses generations with `parse_answer`.
"""

from __future__ import annotations

import math
import re

ANSWER_TEMPLATE = "{start:.1f} - {end:.1f} seconds"

_NUM = r"(\d+(?::\d{1,2}){0,2}(?:\.\d+)?)"
_PATTERNS = [
    re.compile(rf"from\s+{_NUM}\s*(?:s|sec|secs|seconds)?\s+to\s+{_NUM}", re.I),
    re.compile(rf"between\s+{_NUM}\s*(?:s|sec|secs|seconds)?\s+and\s+{_NUM}", re.I),
    re.compile(rf"{_NUM}\s*(?:s|sec|secs|seconds)?\s*(?:-|–|—|~|to|until|till)\s*{_NUM}", re.I),
]


def format_answer(start: float, end: float) -> str:
    """Canonical target text for a span, e.g. `12.0 - 15.5 seconds`."""
    return ANSWER_TEMPLATE.format(start=start, end=end)


def _to_seconds(token: str) -> float:
    """`12.5` -> 12.5; `1:05` -> 65; `01:02:03.5` -> 3723.5."""
    parts = token.split(":")
    value = 0.0
    for p in parts:
        value = value * 60 + float(p)
    return value


def parse_answer(text: str) -> tuple[float, float] | None:
    """Parse a model answer into (start, end) seconds; `None` when no span can be read.

    Accepts the canonical format and common variants: `from X to Y`, `between X and Y`, `X - Y s`,
    `X to Y seconds`, `mm:ss`, `hh:mm:ss.ff`. A reversed pair is swapped; a zero-length span is kept.
    """
    for pattern in _PATTERNS:
        m = pattern.search(text)
        if m:
            a, b = _to_seconds(m.group(1)), _to_seconds(m.group(2))
            if not (math.isfinite(a) and math.isfinite(b)):
                return None
            return (min(a, b), max(a, b))
    return None
