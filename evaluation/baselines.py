"""Blind baselines: what a model could score without looking at the video.

- `prior`: the best constant span in normalized time (start/duration, end/duration), fit on the train split's
  ground-truth moments by grid search on the selection metric (ties broken by mIoU), then scaled to each
  evaluated window. It is the strongest "predict from the distribution of normalized start/length" baseline.
- `blank`: the evaluated model itself with every frame blanked (text only); computed in `predict`.
The visual gain = model - best blind baseline, per metric.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from evaluation.metrics import Span


def _candidates(grid: int) -> np.ndarray:
    """Normalized spans (s, e) with 0 <= s < e <= 1 on a (grid+1)-point lattice: [K, 2]."""
    pts = np.linspace(0.0, 1.0, grid + 1)
    s, e = np.meshgrid(pts, pts, indexing="ij")
    keep = e > s
    return np.stack([s[keep], e[keep]], axis=1)


def _iou_matrix(cands: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """IoU of every candidate [K, 2] with every span [W, 2] -> [K, W]."""
    inter = np.clip(np.minimum(cands[:, None, 1], spans[None, :, 1]) - np.maximum(cands[:, None, 0],
                                                                                  spans[None, :, 0]), 0, None)
    union = (cands[:, None, 1] - cands[:, None, 0]) + (spans[None, :, 1] - spans[None, :, 0]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def fit_prior(
    moments: Sequence[tuple[float, Sequence[Span]]], select_threshold: float | None, grid: int = 20
) -> tuple[tuple[float, float], dict]:
    """Best constant normalized span for `moments` = [(window duration, ground-truth windows)].

    Maximizes R@1 at `select_threshold` (mIoU when None), ties broken by mIoU; each query is scored against its
    best-matching window. Returns ((start, end) normalized, fit statistics on the train moments).
    """
    spans, owner = [], []
    for qi, (duration, windows) in enumerate(moments):
        for s, e in windows:
            spans.append((s / duration, e / duration))
            owner.append(qi)
    if not spans:
        raise ValueError("no training moments to fit the prior on")
    cands = _candidates(grid)
    ious = _iou_matrix(cands, np.asarray(spans, dtype=np.float64))
    owner_arr = np.asarray(owner)
    starts = np.flatnonzero(np.r_[True, owner_arr[1:] != owner_arr[:-1]])
    best = np.maximum.reduceat(ious, starts, axis=1)  # [K, n_queries]: best-matching window per query
    miou = best.mean(axis=1)
    score = (best >= select_threshold).mean(axis=1) if select_threshold is not None else miou
    k = int(np.lexsort((miou, score))[-1])
    norm = np.asarray(spans)
    stats = {"train_queries": len(moments), "train_windows": len(spans), "train_miou": float(miou[k]),
             "train_score": float(score[k]), "mean_start": float(norm[:, 0].mean()),
             "mean_length": float((norm[:, 1] - norm[:, 0]).mean())}
    return (float(cands[k, 0]), float(cands[k, 1])), stats


def prior_prediction(prior: tuple[float, float], duration_s: float) -> Span:
    """The prior's span for a window of `duration_s` seconds."""
    return (prior[0] * duration_s, prior[1] * duration_s)
