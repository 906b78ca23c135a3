"""Glue between raw answers and metrics: parse, score against the best-matching window, aggregate."""

from __future__ import annotations

from collections.abc import Sequence

from evaluation.metrics import Span, best_iou, breakdown_by_key, breakdown_by_length, summarize
from vtg.answer import parse_answer


def score_answers(answers: Sequence[str], gts: Sequence[Sequence[Span]]) -> list[dict]:
    """Per query: {"raw", "pred" (span or None), "iou", "best_gt"}; a parse failure scores IoU 0."""
    rows = []
    for raw, windows in zip(answers, gts, strict=True):
        pred = parse_answer(raw)
        iou, best = best_iou(pred, windows)
        rows.append({"raw": raw, "pred": list(pred) if pred else None, "iou": iou, "best_gt": best})
    return rows


def score_spans(preds: Sequence[Span | None], gts: Sequence[Sequence[Span]]) -> list[dict]:
    """Like `score_answers` for spans predicted directly (the prior baseline)."""
    return [{"pred": list(p) if p else None, "iou": best_iou(p, w)[0]} for p, w in zip(preds, gts, strict=True)]


def aggregate(rows: Sequence[dict], thresholds: Sequence[float]) -> dict:
    """mIoU, R@1 at each threshold, n, and the parse-failure rate (when rows carry raw answers)."""
    out = summarize([r["iou"] for r in rows], thresholds)
    if rows and "raw" in rows[0]:
        out["parse_failure_rate"] = sum(r["pred"] is None for r in rows) / len(rows)
    return out


def breakdowns(rows: Sequence[dict], gts: Sequence[Sequence[Span]], sources: Sequence[str],
               thresholds: Sequence[float], length_edges: Sequence[float]) -> dict:
    preds = [tuple(r["pred"]) if r["pred"] else None for r in rows]
    return {
        "by_length": breakdown_by_length(preds, gts, thresholds, length_edges),
        "by_source": breakdown_by_key([r["iou"] for r in rows], sources, thresholds),
    }


def visual_gain(model: dict, baselines: dict[str, dict], metrics: Sequence[str]) -> tuple[dict, dict]:
    """(model - best blind baseline per metric, name of that baseline per metric)."""
    gain, which = {}, {}
    for m in metrics:
        scored = {name: b[m] for name, b in baselines.items() if m in b}
        if not scored:
            continue
        best = max(scored, key=scored.get)
        gain[m], which[m] = model[m] - scored[best], best
    return gain, which
