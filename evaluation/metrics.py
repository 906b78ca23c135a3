"""Temporal grounding metrics as pure functions: IoU, mIoU, R@1 at IoU thresholds, breakdowns.

With several ground-truth windows a prediction is scored against the best-matching one (Moment-DETR's
standalone evaluation). A failed parse (`None`) scores IoU 0. Recall uses `iou >= threshold`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from vtg.spans import Span, best_iou, metric_name, summarize, temporal_iou  # noqa: F401 (the scoring primitives)


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
