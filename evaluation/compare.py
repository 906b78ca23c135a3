"""SFT vs RL on the held-out split: the same metrics for both, their difference, overall and per query type.

Pure functions over prediction rows (predictions.jsonl of the two test evaluations) and the query types of
`evaluation.query_types`; the evaluate stage decides which two checkpoints (the best RL checkpoint on val and the
SFT checkpoint its run started from) and writes the result into metrics.json, summary.md and the report.
"""

from __future__ import annotations

from collections.abc import Sequence

from evaluation import intervals
from evaluation.metrics import metric_name
from evaluation.query_types import QUERY_TYPES, UNKNOWN
from evaluation.scoring import aggregate


def _delta(sft: dict, rl: dict, metrics: Sequence[str]) -> dict:
    return {m: rl[m] - sft[m] for m in metrics if m in rl and m in sft}


def _group(sft_rows: list[dict] | None, rl_rows: list[dict], thresholds: Sequence[float],
           metrics: Sequence[str], resamples: int, confidence: float) -> dict:
    out = {"n": len(rl_rows), "rl": aggregate(rl_rows, thresholds),
           "rl_ci": intervals.bootstrap([r["iou"] for r in rl_rows], thresholds, resamples, confidence)}
    if sft_rows is not None:
        out["sft"] = aggregate(sft_rows, thresholds)
        out["sft_ci"] = intervals.bootstrap([r["iou"] for r in sft_rows], thresholds, resamples, confidence)
        out["delta"] = _delta(out["sft"], out["rl"], metrics)
        out["delta_ci"] = intervals.paired(*intervals.aligned_ious(sft_rows, rl_rows), thresholds, resamples,
                                           confidence)
    return out


def compare(sft_predictions: Sequence[dict] | None, rl_predictions: Sequence[dict], types: dict[str, str],
            thresholds: Sequence[float], resamples: int = 1000, confidence: float = 0.95) -> dict:
    """`overall` and `by_query_type` ({n, sft, rl, delta, with 95% bootstrap intervals `sft_ci`, `rl_ci` and the
    paired interval of the difference `delta_ci`}; query types with no query left out) and `query_type_counts`
    (every type, with `total`: they add up to the number of scored queries). A prediction whose key has no type
    is `unknown`. `sft_predictions` None: RL only (no deltas)."""
    metrics = ["miou", *(metric_name(t) for t in thresholds), "parse_failure_rate"]
    rl_keys = {p["key"] for p in rl_predictions}
    if sft_predictions is not None and {p["key"] for p in sft_predictions} != rl_keys:
        raise ValueError("SFT and RL were evaluated on different queries: their comparison would be meaningless")
    sft_list = list(sft_predictions) if sft_predictions is not None else None

    def of_type(rows, t):
        return None if rows is None else [p for p in rows if types.get(p["key"], UNKNOWN) == t]

    counts = {t: len(of_type(rl_predictions, t)) for t in QUERY_TYPES}
    return {
        "metrics": metrics,
        "overall": _group(sft_list, list(rl_predictions), thresholds, metrics, resamples, confidence),
        "by_query_type": {t: _group(of_type(sft_list, t), of_type(rl_predictions, t), thresholds, metrics,
                                    resamples, confidence)
                          for t in QUERY_TYPES if counts[t]},
        "query_type_counts": {**counts, "total": len(rl_predictions)},
    }
