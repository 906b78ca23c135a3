"""Annotation lines for the planned corpus, in one of the real formats, plus deliberate invalid lines.

Each writer turns a list of items (one per query, valid or not) into file text and tells, per item, the
locator ingest will report (`line`) and the `annotation_id` ingest will assign, so the ground truth can name
them exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np

from corpus.plan import INVALID_KINDS

EXTENSIONS = {"qvhighlights": "jsonl", "jsonl": "jsonl", "charades": "txt", "activitynet": "json"}


def _num(x: float) -> float:
    return float(x) if not math.isfinite(x) else round(float(x), 6)


def valid_items(videos: list[dict]) -> list[dict]:
    items = []
    for v in videos:
        fps, duration = v["fps"], v["n_frames"] / v["fps"]
        for e in v["events"]:
            true = (e["start_frame"] / fps, e["end_frame"] / fps + e.get("end_overrun_s", 0.0))
            start, end = e.get("annotated_s", true)
            items.append({"video_id": v["video_id"], "query": e["query"], "start": start, "end": end,
                          "duration": duration, "eid": e["eid"]})
    return items


def invalid_items(videos: list[dict], per_kind: int, rng: np.random.Generator) -> list[dict]:
    clean = [v for v in videos if v["defect"]["kind"] == "none"]
    items = []
    for k in range(per_kind):
        for reason in INVALID_KINDS:
            v = clean[int(rng.integers(len(clean)))]
            d = v["n_frames"] / v["fps"]
            item = {"video_id": v["video_id"], "query": v["events"][0]["query"], "start": 1.0, "end": 3.0,
                    "duration": d, "invalid": reason}
            if reason == "start_ge_end":
                item.update(start=round(d / 2, 2), end=round(d / 2, 2) - [0.0, 1.5][k % 2])
            elif reason == "negative_start":
                item.update(start=-2.0, end=4.0)
            elif reason == "not_finite":
                item.update(start=float("nan"))
            elif reason == "end_beyond_duration":
                item.update(start=round(d - 3, 2), end=round(d + 5, 2))
            elif reason == "empty_query":
                item.update(query=["", "   "][k % 2])
            elif reason == "missing_video":
                item.update(video_id=f"vmissing{k:04d}")
            items.append(item)
    return items


def _qvh(items: list[dict]) -> tuple[str, list[tuple[int, str]]]:
    lines, refs = [], []
    for i, it in enumerate(items):
        qid = i + 1
        obj = {"qid": qid, "query": it["query"], "vid": it["video_id"], "duration": _num(it["duration"]),
               "relevant_windows": [[_num(it["start"]), _num(it["end"])]]}
        line = json.dumps(obj)
        if it.get("invalid") == "unparsable":
            line = line[: len(line) // 2]
        lines.append(line)
        refs.append((i + 1, str(qid)))
    return "\n".join(lines) + "\n", refs


def _native(items: list[dict]) -> tuple[str, list[tuple[int, str]]]:
    lines, refs = [], []
    for i, it in enumerate(items):
        aid = f"syn-{i + 1:06d}"
        obj = {"annotation_id": aid, "video_id": it["video_id"], "query": it["query"],
               "windows": [[_num(it["start"]), _num(it["end"])]], "duration_s": _num(it["duration"])}
        line = json.dumps(obj)
        if it.get("invalid") == "unparsable":
            line = line[: len(line) // 2]
        lines.append(line)
        refs.append((i + 1, aid))
    return "\n".join(lines) + "\n", refs


def _charades(items: list[dict]) -> tuple[str, list[tuple[int, str]]]:
    lines, refs = [], []
    for i, it in enumerate(items):
        line = f"{it['video_id']} {it['start']:.3f} {it['end']:.3f}##{it['query']}"
        if it.get("invalid") == "unparsable":
            line = f"{it['video_id']} {it['start']:.3f}##{it['query']}"  # the end time is missing
        lines.append(line)
        refs.append((i + 1, f"{it['video_id']}#{i + 1}"))
    return "\n".join(lines) + "\n", refs


def _activitynet(items: list[dict]) -> tuple[str, list[tuple[int, str]]]:
    """One video per line (`"vid": {...}`) so that a video's line number is meaningful in dead letters."""
    entries: dict[str, dict] = {}
    slots: list[tuple[str, int]] = []
    for it in items:
        if it.get("invalid") == "unparsable":
            vid = f"{it['video_id']}_broken{len(entries)}"
            entries[vid] = {"duration": _num(it["duration"]), "timestamps": "not a list", "sentences": [it["query"]]}
            slots.append((vid, 0))
            continue
        e = entries.setdefault(it["video_id"], {"duration": _num(it["duration"]), "timestamps": [], "sentences": []})
        slots.append((it["video_id"], len(e["sentences"])))
        e["timestamps"].append([_num(it["start"]), _num(it["end"])])
        e["sentences"].append(it["query"])
    line_of = {vid: 2 + k for k, vid in enumerate(entries)}
    body = ",\n".join(f"{json.dumps(vid)}: {json.dumps(e)}" for vid, e in entries.items())
    refs = [(line_of[vid], f"{vid}#{j}") for vid, j in slots]
    return "{\n" + body + "\n}\n", refs


WRITERS: dict[str, Callable[[list[dict]], tuple[str, list[tuple[int, str]]]]] = {
    "qvhighlights": _qvh, "jsonl": _native, "charades": _charades, "activitynet": _activitynet,
}


def order_items(items: list[dict], fmt: str, rng: np.random.Generator) -> list[dict]:
    """Shuffle (interleaving the invalid lines); ActivityNet groups by video anyway, keep its key order stable."""
    order = rng.permutation(len(items))
    shuffled = [items[int(i)] for i in order]
    if fmt == "activitynet":
        first: dict[str, int] = {}
        for k, it in enumerate(shuffled):
            first.setdefault(it["video_id"], k)
        shuffled.sort(key=lambda it: first[it["video_id"]])
    return shuffled
