"""Ground truth of the synthetic corpus as canonical records, and the measurements the issue asks for."""

from __future__ import annotations

import json
from pathlib import Path


def load_truth(corpus_dir: Path) -> dict:
    return json.loads((corpus_dir / "ground_truth.json").read_text())


def truth_records(corpus_dir: Path) -> list[dict]:
    """One canonical record per event (what ingest produces from the annotation file's valid lines)."""
    rows = []
    for v in load_truth(corpus_dir)["videos"]:
        for e in v["events"]:
            rows.append({"video_id": v["video_id"], "video_path": str(corpus_dir / v["path"]),
                         "duration_s": v["duration_s"], "query": e["query"],
                         "windows": [[e["start_s"], min(e["end_s"], v["duration_s"])]],
                         "source": "synthetic:ground_truth", "annotation_id": str(e["annotation_id"])})
    return rows


def write_records(corpus_dir: Path, path: Path) -> Path:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in truth_records(corpus_dir)))
    return path


def cut_f1(pred: list[int], truth: list[int], tol: int = 1) -> tuple[int, int, int]:
    """(true positives, false positives, false negatives) with one-to-one matching within `tol` frames."""
    free = sorted(truth)
    tp = 0
    for p in sorted(pred):
        match = next((t for t in free if abs(t - p) <= tol), None)
        if match is not None:
            free.remove(match)
            tp += 1
    return tp, len(pred) - tp, len(free)
