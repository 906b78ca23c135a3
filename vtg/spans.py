"""Scoring a predicted span against ground truth: temporal IoU, best-window IoU, mIoU and R@1 at IoU thresholds.

The one home of these definitions: evaluation's metrics (`evaluation.metrics`: breakdowns and reports on top) and
RL's reward (`training.rl.algo`) both call them. With several ground-truth windows a prediction is scored against
the best-matching one (Moment-DETR's standalone evaluation); a failed parse (`None`) scores IoU 0; recall uses
`iou >= threshold`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Span = tuple[float, float]


def temporal_iou(a: Span, b: Span) -> float:
    """IoU of two [start, end] spans in seconds. Touching or disjoint spans score 0; a zero-length span scores
    0 against anything except the identical zero-length span (1)."""
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    if union <= 0:
        return 1.0 if (a[0], a[1]) == (b[0], b[1]) else 0.0
    return inter / union


def best_iou(pred: Span | None, gts: Sequence[Span]) -> tuple[float, int]:
    """(IoU with the best-matching ground-truth window, its index); (0.0, -1) for a failed parse."""
    if pred is None or not gts:
        return 0.0, -1
    ious = [temporal_iou(pred, gt) for gt in gts]
    i = max(range(len(ious)), key=ious.__getitem__)
    return ious[i], i


def metric_name(threshold: float) -> str:
    return f"r1@{threshold:g}"


def summarize(ious: Sequence[float], thresholds: Sequence[float]) -> dict[str, float]:
    """`{"miou", "r1@0.3", ..., "n"}` over per-query IoUs (NaN metrics for an empty set)."""
    n = len(ious)
    out = {"miou": sum(ious) / n if n else math.nan}
    for t in thresholds:
        out[metric_name(t)] = sum(iou >= t for iou in ious) / n if n else math.nan
    out["n"] = n
    return out
