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
