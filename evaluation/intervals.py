"""95% bootstrap intervals of the grounding metrics, and paired intervals of differences. Pure functions.

Every metric here is a mean over queries of a per-query score (mIoU: the IoU; R@1@t: 1 if IoU >= t), so one
percentile bootstrap over queries serves them all: resample the queries with replacement `resamples` times, take
the metric of each resample, and report the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles. A comparison
of two systems on the same queries (checkpoint vs checkpoint, SFT vs RL, model vs blind baseline) resamples the
queries once for both (a paired bootstrap of the per-query difference), which is far tighter than two separate
intervals and the only honest way to say whether a change is more than the split's noise.

The resampling seed is fixed (`SEED`): the same per-query scores give the same interval on every machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vtg.spans import metric_name

SEED = 0
METHOD = "percentile bootstrap over queries (paired for differences)"


def per_query_scores(ious: Sequence[float], thresholds: Sequence[float]) -> dict[str, np.ndarray]:
    """{metric name: per-query score} whose means are `vtg.spans.summarize`'s metrics."""
    iou = np.asarray(ious, dtype=np.float64)
    out = {"miou": iou}
    for t in thresholds:
        out[metric_name(t)] = (iou >= t).astype(np.float64)
    return out


def _resample_index(n: int, resamples: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, n, size=(resamples, n))


def _interval(values: np.ndarray, index: np.ndarray, confidence: float) -> list[float]:
    means = values[index].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return [float(lo), float(hi)]


def bootstrap(ious: Sequence[float], thresholds: Sequence[float], resamples: int = 1000,
              confidence: float = 0.95) -> dict[str, list[float]]:
    """{metric: [low, high]} for mIoU and R@1 at each threshold; {} with no queries or `resamples` 0."""
    if not len(ious) or resamples <= 0:
        return {}
    index = _resample_index(len(ious), resamples)
    return {m: _interval(v, index, confidence) for m, v in per_query_scores(ious, thresholds).items()}


def mean_and_ratio(series: dict[str, tuple[list, list | None]], resamples: int = 1000,
                   confidence: float = 0.95) -> dict[str, list[float]]:
    """Intervals of other per-query statistics, resampled like the metrics: `(values, None)` is a mean (e.g. the
    parse-failure rate), `(numerators, denominators)` a ratio of sums (the eval loss: answer-token losses over
    answer tokens). Empty series are left out."""
    out = {}
    for name, (num, den) in series.items():
        if not len(num) or resamples <= 0:
            continue
        index = _resample_index(len(num), resamples)
        n = np.asarray(num, dtype=np.float64)[index].sum(axis=1)
        d = (np.asarray(den, dtype=np.float64)[index].sum(axis=1) if den is not None
             else np.full(resamples, float(len(num))))
        values = n / np.maximum(d, 1e-12)
        lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
        out[name] = [float(lo), float(hi)]
    return out


def paired(ious_a: Sequence[float], ious_b: Sequence[float], thresholds: Sequence[float], resamples: int = 1000,
           confidence: float = 0.95) -> dict[str, dict]:
    """{metric: {"delta": mean(b) - mean(a), "ci": [low, high], "excludes_zero": bool}}, the queries paired by
    position (the caller aligns them); `a` is the reference (SFT, the earlier checkpoint, the blind baseline)."""
    if len(ious_a) != len(ious_b):
        raise ValueError(f"a paired interval needs the same queries: {len(ious_a)} vs {len(ious_b)} scores")
    if not len(ious_a):
        return {}
    sa, sb = per_query_scores(ious_a, thresholds), per_query_scores(ious_b, thresholds)
    index = _resample_index(len(ious_a), resamples) if resamples > 0 else None
    out = {}
    for m in sa:
        diff = sb[m] - sa[m]
        entry: dict = {"delta": float(diff.mean())}
        if index is not None:
            lo, hi = _interval(diff, index, confidence)
            entry.update(ci=[lo, hi], excludes_zero=bool(lo > 0 or hi < 0))
        out[m] = entry
    return out


def aligned_ious(rows_a: Sequence[Mapping], rows_b: Sequence[Mapping], key: str = "key") -> tuple[list, list]:
    """The IoUs of two prediction lists on the same queries, in one order (by `key`); an error if the queries
    differ, since a paired interval over different queries would mean nothing."""
    a = {r[key]: float(r["iou"]) for r in rows_a}
    b = {r[key]: float(r["iou"]) for r in rows_b}
    if a.keys() != b.keys():
        only_a, only_b = sorted(a.keys() - b.keys())[:3], sorted(b.keys() - a.keys())[:3]
        raise ValueError(f"the two evaluations scored different queries (only in the first: {only_a}, only in the "
                         f"second: {only_b}): their difference has no paired interval")
    keys = sorted(a)
    return [a[k] for k in keys], [b[k] for k in keys]


def format_ci(value: float, ci: Sequence[float] | None, digits: int = 3) -> str:
    """`0.904 [0.853, 0.949]` (or the value alone without an interval)."""
    if not ci:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def format_delta(entry: Mapping | None, digits: int = 3) -> str:
    """`+0.029 [+0.007, +0.051]` for a `paired` entry."""
    if not entry:
        return "-"
    text = f"{entry['delta']:+.{digits}f}"
    if entry.get("ci"):
        lo, hi = entry["ci"]
        text += f" [{lo:+.{digits}f}, {hi:+.{digits}f}]"
    return text
