"""Temporal grounding metrics as pure functions: IoU, mIoU, R@1 at IoU thresholds, breakdowns.

With several ground-truth windows a prediction is scored against the best-matching one (Moment-DETR's
standalone evaluation). A failed parse (`None`) scores IoU 0. Recall uses `iou >= threshold`.
"""

from __future__ import annotations

import math
from collections import defaultdict
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


def length_bucket(length_s: float, edges: Sequence[float], names: Sequence[str]) -> str:
    """Bucket name of a moment length: `names[i]` for `edges[i-1] <= length < edges[i]`."""
    for edge, name in zip(edges, names):
        if length_s < edge:
            return name
    return names[len(edges)]


def breakdown_by_length(
    preds: Sequence[Span | None],
    gts: Sequence[Sequence[Span]],
    thresholds: Sequence[float],
    edges: Sequence[float],
    names: Sequence[str] = ("short", "middle", "long"),
) -> dict[str, dict[str, float]]:
    """Metrics per moment-length bucket. As in Moment-DETR, a query joins a bucket when one of its ground-truth
    windows falls in it, and is scored there against those windows only."""
    per_bucket: dict[str, list[float]] = defaultdict(list)
    for pred, windows in zip(preds, gts):
        grouped: dict[str, list[Span]] = defaultdict(list)
        for w in windows:
            grouped[length_bucket(w[1] - w[0], edges, names)].append(w)
        for name, ws in grouped.items():
            per_bucket[name].append(best_iou(pred, ws)[0])
    return {name: summarize(per_bucket[name], thresholds) for name in names if per_bucket.get(name)}


def breakdown_by_key(
    ious: Sequence[float], keys: Sequence[str], thresholds: Sequence[float]
) -> dict[str, dict[str, float]]:
    """Metrics per group (e.g. source data set)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for iou, key in zip(ious, keys):
        groups[key].append(iou)
    return {key: summarize(groups[key], thresholds) for key in sorted(groups)}
