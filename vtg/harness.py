"""The harness card's comparison rule: two metrics measured under different cards are never ranked against each
other. The card itself (its fields, and how an evaluation builds it) lives in `evaluation.harness`; this part is
in the core because checkpoint selection (`vtg.selection`), which training's early stop and RL's start
checkpoint use too, applies it.

`differences(a, b)` names the fields two cards disagree on; `require_comparable` raises `HarnessMismatch`
(naming them) before anything ranks results measured under different cards: checkpoint selection, RL's start
checkpoint, the SFT-vs-RL comparison. `card_digest` is the short digest of the fields that decide
comparability (MLflow's `vtg.harness` tag).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from vtg.errors import VTGError

NOT_COMPARED = ("prompt.text", "parser.implementation")
"""Card fields that do not decide comparability: the prompt's text (its digest does), which code read the answers
(lmms-eval's own function or our copy of it: the same spans by test; the parser's version and the profile's
lmms-eval version do decide)."""


class HarnessMismatch(VTGError):
    """Two metrics with different harness cards were about to be ranked against each other."""


def digest(value) -> str:
    """sha256 (first 16 hex digits) of a JSON-able value or a string."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def card_digest(card: dict) -> str:
    """A short digest of the fields that decide comparability."""
    return digest(_flatten(card, skip=NOT_COMPARED))


def _flatten(value, prefix: str = "", skip: Sequence[str] = ()) -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if path not in skip:
                out.update(_flatten(v, path, skip))
        return out
    return {prefix: value}


def differences(a: dict | None, b: dict | None) -> list[str]:
    """`field: a-value vs b-value` for every compared field the two cards disagree on (a missing card differs in
    everything)."""
    if not a or not b:
        return ["card: one of the results has no harness card (stored before cards existed; evaluate it again)"]
    fa, fb = _flatten(a, skip=NOT_COMPARED), _flatten(b, skip=NOT_COMPARED)
    return [f"{k}: {fa.get(k, '(absent)')!r} vs {fb.get(k, '(absent)')!r}"
            for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)]


def card_of(result: dict) -> dict | None:
    """The card of an evaluation result (`summary.harness`), or of a metrics.json (`harness`)."""
    return (result.get("summary") or {}).get("harness") or result.get("harness")


def require_comparable(labeled: Sequence[tuple[str, dict | None]], what: str = "rank") -> None:
    """Raise `HarnessMismatch` unless every (label, card) has the first one's card, naming the first
    difference found and its fields. Results of which none carries a card (stored before cards existed) pass;
    a mix of carded and card-less ones does not."""
    if len(labeled) < 2 or not any(card for _, card in labeled):
        return  # nothing to compare: results written before cards existed carry none
    first_label, first = labeled[0]
    for label, card in labeled[1:]:
        diff = differences(first, card)
        if diff:
            shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
            raise HarnessMismatch(
                f"cannot {what} {first_label} against {label}: they were measured under different harness cards "
                f"({shown}). Evaluate both with the same settings, data and protocol, or compare them as separate "
                "results")
