"""The corpus's general-task suite (`vtg.general_tasks` format): what the tiny base model is taught before grounding
SFT, and what measures how much of it SFT and RL make it forget.

One task, `color`: "What colour is the object?" (choices: the corpus's colours) over the clip [start_s, end_s) of
an ordinary event during which no distractor is on screen, so the queried object is the only one and its colour
is the answer. (Shape and motion-direction questions were tried on the tiny model: it memorised the taught items
and stayed at chance on held-out videos, 0.29 for three shapes and 0.23 for four directions at 112 px, so there
was nothing to forget; colour reached 0.74.) Videos are split by a stable hash of their id: one in five into
`eval.jsonl` (the retention suite, scored on the base model and every checkpoint), the rest into `teach.jsonl`.
Media paths are relative to the suite's folder (`general/`), so the corpus can be moved.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from corpus.plan import COLORS

GENERAL_DIR = "general"
TEACH_FILE = "teach.jsonl"
EVAL_FILE = "eval.jsonl"
EVAL_SHARE = 5
"""One video in `EVAL_SHARE` goes to the retention suite."""


def _is_eval(video_id: str) -> bool:
    return int(hashlib.sha256(video_id.encode()).hexdigest()[:8], 16) % EVAL_SHARE == 0


def _overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    return min(a1, b1) > max(a0, b0)


def general_items(truth: dict) -> tuple[list[dict], list[dict]]:
    """(teach items, eval items) from a corpus ground truth (schema in `corpus`)."""
    teach, held = [], []
    for v in truth["videos"]:
        if not v.get("readable", True) or (v.get("defect") or {}).get("kind", "none") != "none":
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


def write_general_suites(out: Path, truth: dict) -> dict[str, int]:
    """`<out>/general/teach.jsonl` and `eval.jsonl`; returns their item counts."""
    folder = Path(out) / GENERAL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, items in zip((TEACH_FILE, EVAL_FILE), general_items(truth)):
        (folder / name).write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in items))
        counts[name] = len(items)
    return counts
