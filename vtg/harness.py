"""The harness card: how a metric was measured, carried by every metric, and the rule that refuses to rank two
metrics measured differently. The one home of the card's fields.

The field's grounding numbers disagree by harness, not by model: lmms-eval scores Qwen2.5-VL-7B at 29.5 mIoU on
Charades-STA where its report says 43.6, mostly because it samples 32 uniform frames where Qwen samples at 2 fps
(lmms-eval #857). So a metric here never travels without its card: the protocol (windows cut by preprocess, or
the whole video), the frames the model saw (count, rate, pixels, video tokens), the family and a digest of its
processor facts, how time was given, the prompt (the text itself and its digest, and the chat template's
digest), the answer parser's version, the decoding settings, the scoring rule, the interval method, and what
was scored (split, a digest of its shards, the data version, the number of queries).

`differences(a, b)` names the fields two cards disagree on; `require_comparable` raises `HarnessMismatch`
(naming them) before anything ranks results measured under different cards: checkpoint selection, RL's start
checkpoint, the SFT-vs-RL comparison.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from collections.abc import Iterable, Sequence

from vtg.errors import VTGError

CARD_VERSION = 1
WINDOWED = "windowed"
"""Protocol: the queries of the windows preprocess cut (at most `preprocess.max_window_s` each), frames as stored
in the shards. Per-checkpoint selection during training uses it."""
FULL_VIDEO = "full_video"
"""Protocol: the whole source video, frames sampled over its full duration (benchmark numbers)."""
PROTOCOLS = (WINDOWED, FULL_VIDEO)
NOT_COMPARED = ("prompt.text",)
"""Card fields that do not decide comparability (the prompt's digest does)."""


class HarnessMismatch(VTGError):
    """Two metrics with different harness cards were about to be ranked against each other."""


def digest(value) -> str:
    """sha256 (first 16 hex digits) of a JSON-able value or a string."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prompt_text(tokenizer, position: str = "after") -> str:
    """The generation prompt as the model gets it, with `{query}` where the query goes and the family's video
    placeholder where the frames go (the chat template with its default system turn)."""
    from vtg.model.processing import QUERY_SLOT, build_messages, chat_prompt

    text = chat_prompt(tokenizer, build_messages(QUERY_SLOT, position))
    return text.replace(QUERY_SLOT, "{query}")


def _spread(values: Sequence[float], digits: int = 3) -> dict:
    if not values:
        return {}
    return {"min": round(min(values), digits), "median": round(statistics.median(values), digits),
            "max": round(max(values), digits)}


def frame_facts(clips: Iterable[tuple[int, int, int, float]], vision) -> dict:
    """What the model saw per query, from (frames, stored height, stored width, window seconds) per query:
    frames, the sampling rate (frames / window), the model's frame size after the family's resize, and video
    tokens (`vtg.model.geometry`)."""
    from vtg.model.geometry import resized_size, video_tokens

    g = vision.geometry
    frames, fps, pixels, tokens = [], [], [], []
    for n, h, w, seconds in clips:
        rh, rw = resized_size(n, h, w, g)
        frames.append(n)
        fps.append(n / seconds if seconds > 0 else 0.0)
        pixels.append(rh * rw)
        tokens.append(video_tokens(n, h, w, g))
    return {"per_query": _spread(frames, 0), "fps": _spread(fps), "model_pixels_per_frame": _spread(pixels, 0),
            "video_tokens": _spread(tokens, 0)}


def build_card(*, protocol: str, split: str, split_digest: str, data_version: str | None, queries: int,
               vision, tokenizer, timestamps: str, frames: dict, decoding: dict, thresholds: Sequence[float],
               intervals: dict, query_position: str = "after") -> dict:
    """The card of one evaluation (see the module docstring for what each field is)."""
    from vtg.answer import PARSER_RULE, PARSER_VERSION

    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    facts = dataclasses.asdict(vision)
    text = prompt_text(tokenizer, query_position)
    return {
        "card_version": CARD_VERSION,
        "protocol": protocol,
        "data": {"split": split, "split_digest": split_digest[:16], "data_version": data_version,
                 "queries": queries},
        "frames": frames,
        "pixels": {"min_pixels": vision.min_pixels, "max_pixels": vision.max_pixels, "scope": vision.pixel_scope},
        "model": {"family": vision.family, "processor_digest": digest(facts), "timestamps": timestamps},
        "prompt": {"text": text, "digest": digest(text), "query_position": query_position,
                   "chat_template_digest": digest(getattr(tokenizer, "chat_template", None) or "")},
        "parser": {"version": PARSER_VERSION, "rule": PARSER_RULE},
        "decoding": decoding,
        "scoring": {"iou_thresholds": [float(t) for t in thresholds],
                    "several_windows": "best-matching window", "unparsed": "IoU 0"},
        "intervals": intervals,
    }


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
