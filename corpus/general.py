"""The corpus's general-task suites (`vtg.general_tasks` format): what the tiny base model is taught before grounding
SFT, and what measures how much of it SFT and RL make it forget.

Two tasks, over clips of the clean videos:

- `color`: "What colour is the object?" (choices: the corpus's 8 colours; chance 1/8) over the clip
  [start_s, end_s) of an ordinary event during which no distractor is on screen, so the queried object is the only
  one and its colour is the answer.
- `presence`: "Is there a shape on screen?" (choices: no, yes; chance 1/2, the classes balanced per video): `yes`
  over the clip of an ordinary event (its object is drawn throughout), `no` over a gap of at least
  `PRESENCE_MIN_GAP_S` in which no object or distractor is drawn (texture or title-card scenes only), at most
  `PRESENCE_MAX_CLIP_S` of its middle.

(Shape and motion-direction questions were tried on the tiny model: it memorised the taught items and stayed at
chance on held-out videos, 0.29 for three shapes and 0.23 for four directions at 112 px, so there was nothing to
forget; colour reached 0.74.) Videos are split by a stable hash of their id: one in five into the retention suite
(scored on the base model and every checkpoint), the rest into the taught suite. Media paths are relative to the
suite's folder (`general/`), so the corpus can be moved.

Files: `teach.jsonl` / `eval.jsonl` hold the colour task alone, byte for byte what corpora before the presence task
wrote (results measured on them stay reproducible); `teach_all.jsonl` / `eval_all.jsonl` hold every task (colour
first, the same items, then presence), and are what the default configuration teaches, replays and measures.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from corpus.plan import COLORS

GENERAL_DIR = "general"
TEACH_FILE = "teach.jsonl"
EVAL_FILE = "eval.jsonl"
TEACH_ALL_FILE = "teach_all.jsonl"
EVAL_ALL_FILE = "eval_all.jsonl"
EVAL_SHARE = 5
"""One video in `EVAL_SHARE` goes to the retention suite."""
PRESENCE_MIN_GAP_S = 2.0
"""A `no` clip needs this many seconds with no object drawn."""
PRESENCE_MAX_CLIP_S = 6.0
"""... and takes at most this much of the gap's middle (events last 2.5-6 s: the clip lengths stay alike)."""
PRESENCE_MARGIN_S = 0.25
"""Seconds left out at both ends of a gap (an object's first or last frame)."""


def _is_eval(video_id: str) -> bool:
    return int(hashlib.sha256(video_id.encode()).hexdigest()[:8], 16) % EVAL_SHARE == 0


def _overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    return min(a1, b1) > max(a0, b0)


def _clean(v: dict) -> bool:
    return v.get("readable", True) and (v.get("defect") or {}).get("kind", "none") == "none"


def _gaps(v: dict) -> list[tuple[float, float]]:
    """The stretches of `v` outside every event and distractor (so no object is drawn; title and credit cards
    count as busy too), each at least `PRESENCE_MIN_GAP_S` long, in time order."""
    drawn = sorted((o["start_s"], o["end_s"]) for o in v["events"] + v["distractors"])
    gaps, t = [], 0.0
    for a, b in drawn + [(v["duration_s"], v["duration_s"])]:
        if a - t >= PRESENCE_MIN_GAP_S:
            gaps.append((t, a))
        t = max(t, b)
    return gaps


def general_items(truth: dict) -> tuple[list[dict], list[dict]]:
    """(teach items, eval items) of the colour task from a corpus ground truth (schema in `corpus`)."""
    teach, held = [], []
    for v in truth["videos"]:
        if not _clean(v):
            continue
        for e in v["events"]:
            if e.get("kind") != "normal":
                continue
            clip = {"video": f"../{v['path']}", "start_s": round(e["start_s"], 3), "end_s": round(e["end_s"], 3)}
            alone = not any(_overlaps(e["start_s"], e["end_s"], d["start_s"], d["end_s"]) for d in v["distractors"])
            if alone:  # the only object in its clip: its colour is the answer
                item = {"id": f"{e['annotation_id']}-color", "task": "color", **clip,
                        "question": "What colour is the object?", "choices": sorted(COLORS), "answer": e["color"]}
                (held if _is_eval(v["video_id"]) else teach).append(item)
    return teach, held


def presence_items(truth: dict) -> tuple[list[dict], list[dict]]:
    """(teach items, eval items) of the presence task: per clean video as many `no` gaps as `yes` events (the
    first ones in time order), so that answering always one way scores 1/2."""
    teach, held = [], []
    question = {"task": "presence", "question": "Is there a shape on screen?", "choices": ["no", "yes"]}
    for v in truth["videos"]:
        if not _clean(v):
            continue
        events = [e for e in v["events"] if e.get("kind") == "normal"]
        gaps = _gaps(v)
        k = min(len(events), len(gaps))
        items = []
        for e in events[:k]:
            items.append({"id": f"{e['annotation_id']}-presence", **question, "answer": "yes",
                          "video": f"../{v['path']}", "start_s": round(e["start_s"], 3),
                          "end_s": round(e["end_s"], 3)})
        for i, (a, b) in enumerate(gaps[:k]):
            mid, half = (a + b) / 2, min(b - a - 2 * PRESENCE_MARGIN_S, PRESENCE_MAX_CLIP_S) / 2
            items.append({"id": f"{v['video_id']}-gap{i}-presence", **question, "answer": "no",
                          "video": f"../{v['path']}", "start_s": round(mid - half, 3), "end_s": round(mid + half, 3)})
        (held if _is_eval(v["video_id"]) else teach).extend(items)
    return teach, held


def _write(path: Path, items: list[dict]) -> None:
    path.write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in items))


def write_general_suites(out: Path, truth: dict) -> dict[str, int]:
    """`<out>/general/`: `teach.jsonl` and `eval.jsonl` (colour), `teach_all.jsonl` and `eval_all.jsonl` (every
    task); returns their item counts."""
    folder = Path(out) / GENERAL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (c_teach, c_eval), (p_teach, p_eval) = general_items(truth), presence_items(truth)
    files = {TEACH_FILE: c_teach, EVAL_FILE: c_eval, TEACH_ALL_FILE: c_teach + p_teach,
             EVAL_ALL_FILE: c_eval + p_eval}
    for name, items in files.items():
        _write(folder / name, items)
    return {name: len(items) for name, items in files.items()}
