"""The synthetic corpus ground truth and scene-cut matching."""

from __future__ import annotations

import json
from pathlib import Path


def load_truth(corpus_dir: Path) -> dict:
    return json.loads((corpus_dir / "ground_truth.json").read_text())


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


def scene_counts(video_truth: dict, hard_cuts: list[int], bounds_s: list[float]) -> tuple[int, int, int, int, int]:
    """One clean video against its truth: (hard-cut tp, fp, fn with a 1-frame tolerance, dissolves found within
    their span by a scene boundary, dissolves). A detected hard cut inside a dissolve (+-1 frame) marks that
    dissolve: it is not scored as a hard cut."""
    spans = video_truth["gradual_transitions"]
    hard = [c for c in hard_cuts if not any(a - 1 <= c <= b + 1 for a, b in spans)]
    tp, fp, fn = cut_f1(hard, video_truth["hard_cuts"], tol=1)
    bounds = [round(b * video_truth["fps"]) for b in bounds_s]
    return tp, fp, fn, sum(any(a <= x <= b + 1 for x in bounds) for a, b in spans), len(spans)
