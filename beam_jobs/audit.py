"""Annotation audit: per query, the flags that make its annotation doubtful (TimeLens found 20.6% of
Charades-STA queries not unique in their video and 34.9% with imprecise boundaries). Pure functions over one
video's records, its scene changes and its per-frame change; the pipeline counts the flags per split in
manifest.json (`audit`), lists every flagged query in `audit.jsonl`, and filters only the flags in
`preprocess.audit.filter` (reason `audit_<flag>`).

The rules (thresholds in `preprocess.audit`; a query's moment is the span from its first start to its last end):

- `ambiguous`: another query of the same video has the same or near-same text (word-shingle Jaccard of the query
  dedup's shingles >= `ambiguous_jaccard`) but another moment (IoU < `ambiguous_iou`): the text does not say
  which moment is meant. Same text and same moment is a duplicate (the dedup step's); one query with several
  windows is a multi-moment query by design and is not flagged.
- `far_from_scene_change`: the video has at least one detected scene change (hard cut or gradual transition) and
  no boundary of the query is within `boundary_tolerance_s` of one. A single-shot video says nothing about its
  boundaries, so its queries are never flagged (and the video's ends are not scene changes: `touches_video_end`
  is their rule). Useful on edited video whose moments are shots; moments inside a shot (Charades, and every
  synthetic event) are flagged whether precise or not.
- `no_change_at_boundary`: some boundary (not at a video end) has neither a scene change nor a content change
  point within `boundary_tolerance_s`. A change point is a frame whose mean thumbnail change from the previous
  frame (the 16x16 thumbnails the decode keeps of every frame) is >= `change_min` and >= `change_ratio` x the
  median change within `change_context_s`: something appeared, disappeared or started to move. An annotated
  boundary with nothing happening around it was likely placed off the event. A weak signal on real footage
  (camera motion, slow actions), a strong one where events appear or disappear abruptly.
- `touches_video_end`: a moment starts within `end_margin_s` of 0 or ends within it of the duration (annotations
  clipped to the video, or moments that run off it).
- `too_long`: the moment is longer than `max_fraction` of the video (a query that names most of the video does
  not ground anything).

What the synthetic corpus can check (tests/beam_jobs/test_audit.py): `ambiguous` against planted repeats
(`corpus.ambiguous_query_fraction`), `no_change_at_boundary` and `far_from_scene_change` against planted
imprecise windows (`corpus.imprecise_fraction`; its events sit inside scenes, so `far_from_scene_change` cannot
separate precise from imprecise there), `touches_video_end` against the events that run to the video's end.
`too_long` has no planted truth (its rule is geometry; unit tests check it).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from typing import get_args

import numpy as np

from beam_jobs.dedup import jaccard, query_shingles
from vtg.config.preprocess import AuditConfig, AuditFlag

FLAGS: tuple[str, ...] = get_args(AuditFlag)
AUDIT_LOG = "audit.jsonl"


def reason_of(flag: str) -> str:
    """The filter reason of a query filtered for `flag`."""
    return f"audit_{flag}"


def moment(windows: Sequence[Sequence[float]]) -> tuple[float, float]:
    return min(w[0] for w in windows), max(w[1] for w in windows)


def iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def ambiguous_partners(queries: Sequence[tuple[str, str, tuple[float, float]]], ngram: int, min_jaccard: float,
                       max_iou: float) -> dict[str, list[str]]:
    """(annotation_id, text, moment) of one video -> {id: sorted ids with near-same text and another moment}."""
    shingles = [set(query_shingles(text, ngram)) for _, text, _ in queries]
    out: dict[str, list[str]] = {}
    for i, (a, _, ma) in enumerate(queries):
        for j in range(i + 1, len(queries)):
            b, _, mb = queries[j]
            if jaccard(shingles[i], shingles[j]) >= min_jaccard and iou(ma, mb) < max_iou:
                out.setdefault(a, []).append(b)
                out.setdefault(b, []).append(a)
    return {k: sorted(v) for k, v in out.items()}


def change_points(change: np.ndarray, fps: float, min_change: float, ratio: float, context_s: float,
                  times: np.ndarray | None = None) -> list[float]:
    """Times (s) of the frames where the video's activity changes: a spike (the frame's change from the previous
    frame is >= `min_change` and >= `ratio` x the median change of the frames `context_s` before it and of those
    after it: something appears or disappears) or a step (the median change after the frame differs from the one
    before it by >= `min_change` and by a factor >= `ratio`: motion starts or stops). Frame 0 has no change.
    `times`: each frame's presentation time (`vtg.clock`; None: `index / fps`, a constant rate from 0)."""
    n = len(change)
    if n < 3:
        return []
    k = max(1, round(context_s * fps))
    c = np.asarray(change, float).copy()
    c[0] = np.nan
    padded = np.concatenate([np.full(k, np.nan), c, np.full(k, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, k)
    with warnings.catch_warnings():  # a window of only padding (the ends) has no median: no opinion there
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(windows, axis=1)
    before, after = med[:n], med[k + 1:k + 1 + n]
    lo, hi = np.fmin(before, after), np.fmax(before, after)
    with np.errstate(invalid="ignore"):  # NaN compares False
        spike = (c >= min_change) & (c >= ratio * hi)
        step = (hi - lo >= min_change) & (hi >= ratio * lo)
    # the medians differ over a run of frames around a step: its middle is the step
    steps = [(a + b) // 2 for a, b in _runs(step)]
    at = (lambda i: float(times[i])) if times is not None else (lambda i: float(i) / fps)
    return sorted(round(at(i), 6) for i in {*np.flatnonzero(spike).tolist(), *steps})


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each run of True."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), (np.flatnonzero(edges == -1) - 1).tolist()))


def distance(t: float, points: Sequence[float]) -> float | None:
    """Distance from `t` to the nearest of `points` (None: no points)."""
    return min((abs(t - p) for p in points), default=None)


def query_flags(windows: Sequence[Sequence[float]], duration: float, scenes: Sequence[float],
                points: Sequence[float], cfg: AuditConfig) -> dict[str, dict]:
    """The boundary and length flags of one query ({flag: detail}); `scenes`: scene change times, `points`: content
    change points (seconds)."""
    tol, margin = cfg.boundary_tolerance_s, cfg.end_margin_s
    start, end = moment(windows)
    bounds = sorted({float(t) for w in windows for t in w[:2]})
    out: dict[str, dict] = {}
    if scenes:
        near = min(distance(t, scenes) for t in bounds)
        if near > tol:
            out["far_from_scene_change"] = {"nearest_s": round(near, 3)}
    support = sorted({*scenes, *points})
    inner = [t for t in bounds if margin < t < duration - margin]
    off = {f"{t:g}": _round(distance(t, support)) for t in inner
           if (d := distance(t, support)) is None or d > tol}
    if off:
        out["no_change_at_boundary"] = {"nearest_s": off}
    if start <= margin or end >= duration - margin:
        out["touches_video_end"] = {"start_s": round(start, 3), "end_s": round(end, 3),
                                    "duration_s": round(duration, 3)}
    if end - start > cfg.max_fraction * duration:
        out["too_long"] = {"fraction": round((end - start) / duration, 3)}
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def audit_video(queries: Sequence[tuple[str, str, Sequence[Sequence[float]]]], duration: float,
                scenes: Sequence[float], change: np.ndarray, fps: float, cfg: AuditConfig,
                ngram: int, times: np.ndarray | None = None) -> dict[str, dict[str, dict]]:
    """(annotation_id, text, windows) of one video -> {annotation_id: {flag: detail}} for its flagged queries;
    `scenes`: scene change times (s), `change`: per-frame mean thumbnail change at `fps`."""
    points = change_points(change, fps, cfg.change_min, cfg.change_ratio, cfg.change_context_s, times)
    partners = ambiguous_partners([(a, t, moment(w)) for a, t, w in queries], ngram, cfg.ambiguous_jaccard,
                                  cfg.ambiguous_iou)
    out = {}
    for aid, _, windows in queries:
        flags = query_flags(windows, duration, scenes, points, cfg)
        if aid in partners:
            flags["ambiguous"] = {"with": partners[aid]}
        if flags:
            out[aid] = {f: flags[f] for f in FLAGS if f in flags}
    return out


def filter_reason(flags: dict, filtered: Sequence[str]) -> str | None:
    """`audit_<flag>` for the first flag of `filtered` the query has, or None (kept)."""
    hit = next((f for f in filtered if f in flags), None)
    return None if hit is None else reason_of(hit)


def manifest_entry(audited: Counter, cfg: AuditConfig) -> dict:
    """manifest.json `audit` from (split, flags or None) -> queries: per split, the queries audited (every query
    that reached a split, those the audit filters included), flagged (any flag), per flag, and unaudited (the
    audit raised for their video); the rules' thresholds and the filter."""
    splits = sorted({s for s, _ in audited})
    out = {"queries": dict.fromkeys(splits, 0), "flagged": dict.fromkeys(splits, 0),
           "per_flag": {s: dict.fromkeys(FLAGS, 0) for s in splits}, "unaudited": dict.fromkeys(splits, 0),
           "rules": cfg.model_dump(mode="json", exclude={"filter"}), "filter": list(cfg.filter), "list": AUDIT_LOG}
    for (split, flags), n in audited.items():
        out["queries"][split] += n
        if flags is None:
            out["unaudited"][split] += n
            continue
        out["flagged"][split] += n if flags else 0
        for f in flags:
            out["per_flag"][split][f] += n
    return out
