"""The harness card: how a metric was measured, carried by every metric. The one home of the card's fields and
of its builder (`build_card`).

The field's grounding numbers disagree by harness, not by model: lmms-eval scores Qwen2.5-VL-7B at 29.5 mIoU on
Charades-STA where its report says 43.6, mostly because it samples 32 uniform frames where Qwen samples at 2 fps
(lmms-eval #857). So a metric here never travels without its card: the protocol (windows cut by preprocess, or
the whole video), the frames the model saw (count, rate, pixels, video tokens), the family and a digest of its
processor facts, how time was given, the prompt (the text itself and its digest, and the chat template's
digest), the answer parser's version, the decoding settings, the scoring rule, the interval method, and what
was scored (split, a digest of its shards, the data version, the number of queries). A benchmark's card also
names its profile, and for an lmms-eval task the lmms-eval version whose answer reading and prompt it matches.

The rule that refuses to rank results measured under different cards (`differences`, `require_comparable`,
`card_digest`) is in the core, `vtg.harness`: checkpoint selection (`vtg.selection`) applies it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence

from vtg.harness import digest

CARD_VERSION = 1
WINDOWED = "windowed"
"""Protocol: the queries of the windows preprocess cut (at most `preprocess.max_window_s` each), frames as stored
in the shards. Per-checkpoint selection during training uses it."""
FULL_VIDEO = "full_video"
"""Protocol: the whole source video, frames sampled over its full duration (benchmark numbers)."""
PROTOCOLS = (WINDOWED, FULL_VIDEO)


def prompt_text(tokenizer, position: str = "after") -> str:
    """The generation prompt as the model gets it, with `{query}` where the query goes and the family's video
    placeholder where the frames go (the chat template with its default system turn)."""
    from vtg.model.processing import QUERY_SLOT, build_messages, chat_prompt

    text = chat_prompt(tokenizer, build_messages(QUERY_SLOT, position))
    return text.replace(QUERY_SLOT, "{query}")


def spread(values: Sequence[float], digits: int = 3) -> dict:
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
    return {"per_query": spread(frames, 0), "fps": spread(fps), "model_pixels_per_frame": spread(pixels, 0),
            "video_tokens": spread(tokens, 0)}


def build_card(*, protocol: str, split: str, split_digest: str, data_version: str | None, queries: int,
               vision, tokenizer, timestamps: str, frames: dict, decoding: dict, thresholds: Sequence[float],
               intervals: dict, query_position: str = "after", parser: dict | None = None,
               profile: dict | None = None) -> dict:
    """The card of one evaluation (see the module docstring for what each field is). `parser`: the answer
    reader's entry (None: `vtg.answer`'s); `profile`: a benchmark profile's entry, with the lmms-eval version
    it matches (`evaluation.benchmark.profile_entry`; windowed evaluation has none)."""
    from vtg.answer import PARSER_RULE, PARSER_VERSION

    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    facts = dataclasses.asdict(vision)
    text = prompt_text(tokenizer, query_position)
    card = {
        "card_version": CARD_VERSION,
        "protocol": protocol,
        "data": {"split": split, "split_digest": split_digest[:16], "data_version": data_version,
                 "queries": queries},
        "frames": frames,
        "pixels": {"min_pixels": vision.min_pixels, "max_pixels": vision.max_pixels, "scope": vision.pixel_scope},
        "model": {"family": vision.family, "processor_digest": digest(facts), "timestamps": timestamps},
        "prompt": {"text": text, "digest": digest(text), "query_position": query_position,
                   "chat_template_digest": digest(getattr(tokenizer, "chat_template", None) or "")},
        "parser": parser or {"version": PARSER_VERSION, "rule": PARSER_RULE},
        "decoding": decoding,
        "scoring": {"iou_thresholds": [float(t) for t in thresholds],
                    "several_windows": "best-matching window", "unparsed": "IoU 0"},
        "intervals": intervals,
    }
    if profile is not None:
        card["profile"] = profile
    return card
