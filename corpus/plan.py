"""Plan every video of the corpus as plain data (no pixels): scenes, transitions, events, distractors, defects.

All randomness lives here and flows from one `numpy.random.Generator` per video, seeded by
(`corpus.seed`, video index), so the plan -- and therefore every written byte -- depends only on the config.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from vtg.config import CorpusConfig

# Saturated object colours (BGR). Backgrounds stay muted so these stand out even at 56x56.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (40, 40, 230), "green": (50, 205, 50), "blue": (235, 100, 30), "yellow": (30, 225, 245),
    "magenta": (225, 50, 225), "cyan": (235, 225, 40), "orange": (20, 140, 255), "white": (250, 250, 250),
}
SHAPES = ("circle", "square", "triangle")
ACTIONS = ("moves left", "moves right", "moves up", "moves down", "appears")
PHRASINGS: dict[str, tuple[str, ...]] = {
    "moves left": ("the {c} {s} moves left", "a {c} {s} slides to the left"),
    "moves right": ("the {c} {s} moves right", "a {c} {s} slides to the right"),
    "moves up": ("the {c} {s} moves up", "a {c} {s} rises upward"),
    "moves down": ("the {c} {s} moves down", "a {c} {s} drops downward"),
    "appears": ("a {c} {s} appears", "the {c} {s} shows up"),
}
# Text-answerable phrasings: the wording alone gives the position away (always the first / last seconds).
TITLE_QUERIES = ("the opening title card is shown", "the title screen appears at the beginning")
CREDITS_QUERIES = ("the closing credits roll", "end credits scroll at the end")
PATTERNS = ("stripes_h", "stripes_v", "checker", "diagonal", "gradient", "dots")
DEFECT_KINDS = ("blurred", "dark", "low_res", "truncated", "zero_byte", "not_video", "near_duplicate")
INVALID_KINDS = ("start_ge_end", "negative_start", "not_finite", "end_beyond_duration", "empty_query",
                 "missing_video", "unparsable")


@dataclass
class Counts:
    clean: int
    defects: int


def corpus_counts(cfg: CorpusConfig) -> Counts:
    clean = max(1, round(cfg.n_videos * cfg.scale))
    defects = 0
    if cfg.defect_fraction > 0:
        defects = max(len(DEFECT_KINDS), round(cfg.defect_fraction * clean))
    return Counts(clean, defects)


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, *key])


def _split_points(rng: np.random.Generator, a: int, b: int, n_parts: int, min_len: int) -> list[int]:
    """Cut [a, b) into n_parts pieces of at least min_len frames; returns the inner cut frames."""
    n_parts = max(1, min(n_parts, (b - a) // min_len))
    if n_parts == 1:
        return []
    slack = (b - a) - n_parts * min_len
    # Random composition of the slack: sorted uniform points.
    extra = np.diff(np.concatenate([[0], np.sort(rng.integers(0, slack + 1, n_parts - 1)), [slack]]))
    lengths = min_len + extra
    return [int(a + x) for x in np.cumsum(lengths)[:-1]]


def _texture(rng: np.random.Generator, prev: dict | None, cfg: CorpusConfig) -> dict:
    while True:
        pattern = str(rng.choice(PATTERNS))
        level = int(rng.choice([55, 85, 115, 145]))
        if prev is None or (pattern != prev["pattern"] and abs(level - prev["level"]) >= 60):
            break
    tint = [int(x) for x in rng.integers(-25, 26, 3)]
    tint2 = [int(x) for x in rng.integers(-25, 26, 3)]
    return {"pattern": pattern, "level": level, "tint": tint, "tint2": tint2, "contrast": int(rng.integers(cfg.min_texture_contrast, cfg.max_texture_contrast)),
            "period": int(rng.integers(8, 22))}


def _motion(rng: np.random.Generator, action: str, cfg: CorpusConfig) -> dict:
    """Normalised object trajectory: (x0, y0) -> (x1, y1) in [0, 1], radius as a fraction of the frame."""
    r = float(rng.uniform(cfg.min_object_radius, cfg.max_object_radius))
    lo, hi = r + 0.03, 1 - r - 0.03
    u, v = float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi))
    start, end = {
        "moves left": ((hi, v), (lo, v)), "moves right": ((lo, v), (hi, v)),
        "moves up": ((u, hi), (u, lo)), "moves down": ((u, lo), (u, hi)), "appears": ((u, v), (u, v)),
    }[action]
    return {"x0": start[0], "y0": start[1], "x1": end[0], "y1": end[1], "radius": r}


def _place(rng: np.random.Generator, length: int, spans: list[tuple[int, int]], busy: list[tuple[int, int]],
           tries: int = 60) -> tuple[int, int] | None:
    """A [start, end) of `length` frames inside one of `spans`, not overlapping `busy`."""
    fitting = [s for s in spans if s[1] - s[0] >= length]
    for _ in range(tries if fitting else 0):
        a, b = fitting[int(rng.integers(len(fitting)))]
        start = int(rng.integers(a, b - length + 1))
        if all(start + length <= s or start >= e for s, e in busy):
            return start, start + length
    return None


def plan_clean_video(cfg: CorpusConfig, index: int) -> dict:
    """One clean video's full plan (frames are half-open [start, end) intervals)."""
    rng = _rng(cfg.seed, 1, index)
    fps = cfg.fps
    long = bool(rng.random() < cfg.long_fraction)
    lo, hi = (cfg.long_min_duration_s, cfg.long_max_duration_s) if long else (cfg.min_duration_s, cfg.max_duration_s)
    n = round(float(rng.uniform(lo, hi)) * fps)
    title = round(float(rng.uniform(1.5, 2.5)) * fps) if rng.random() < cfg.text_answerable_fraction else 0
    credits = round(float(rng.uniform(2.0, 3.0)) * fps) if rng.random() < cfg.text_answerable_fraction else 0
    a, b = title, n - credits
    min_scene = round(3 * fps)
    n_scenes = int(np.clip(round((b - a) / fps / float(rng.uniform(5, 10))), 2, 8))
    cuts = _split_points(rng, a, b, n_scenes, min_scene)
    bounds = [a, *cuts, b]
    scenes: list[dict] = []
    if title:
        scenes.append({"start_frame": 0, "end_frame": title, "kind": "title"})
    prev = None
    for s, e in itertools.pairwise(bounds):
        prev = _texture(rng, prev, cfg)
        scenes.append({"start_frame": s, "end_frame": e, "kind": "texture", "texture": prev})
    if credits:
        scenes.append({"start_frame": b, "end_frame": n, "kind": "credits"})
    dissolves: list[list[int]] = []
    if cuts and rng.random() < cfg.dissolve_fraction:
        half = max(1, round(fps / 2))
        k = int(rng.integers(1, min(2, len(cuts)) + 1))
        for c in sorted(int(x) for x in rng.choice(cuts, k, replace=False)):
            dissolves.append([c - half, c + half - 1])  # inclusive span of blended frames
    hard_cuts = sorted({s["start_frame"] for s in scenes[1:]} - {d[0] + (d[1] - d[0] + 1) // 2 for d in dissolves})

    n_events = int(rng.integers(1, cfg.max_events + 1)) + (1 if long else 0)
    colors = [str(c) for c in rng.permutation(list(COLORS))]
    # Long videos keep each event inside one scene so that scene-cut windows contain whole moments.
    content = [(s["start_frame"], s["end_frame"]) for s in scenes if s["kind"] == "texture"] if long else [(a, b)]
    ev_lo, ev_hi = round(cfg.min_event_s * fps), round(cfg.max_event_s * fps)
    end_overrun = bool(not credits and not long and rng.random() < 0.02)
    events, busy = [], []
    for j in range(n_events):
        length = int(rng.integers(ev_lo, ev_hi + 1))
        if j == 0 and end_overrun:
            span = (n - length, n)
        else:
            span = _place(rng, length, content, busy) or (None if events else _place(rng, ev_lo, content, busy))
        if span is None:
            continue
        busy.append(span)
        action = str(rng.choice(ACTIONS))
        shape = str(rng.choice(SHAPES))
        color = colors[j]
        template = PHRASINGS[action][int(rng.integers(len(PHRASINGS[action])))]
        events.append({"eid": len(events), "kind": "normal", "query": template.format(c=color, s=shape), "color": color,
                       "shape": shape, "action": action, "start_frame": span[0], "end_frame": span[1],
                       "motion": _motion(rng, action, cfg), "end_overrun_s": 0.0})
    if end_overrun and events and events[0]["end_frame"] == n:
        events[0]["end_overrun_s"] = round(float(rng.uniform(0.1, 0.4)), 3)
    distractors = []
    if rng.random() < cfg.distractor_fraction:
        length = int(rng.integers(ev_lo, ev_hi + 1))
        span = _place(rng, length, [(a, b)], [])
        if span is not None:
            action = str(rng.choice(ACTIONS[:4]))
            distractors.append({"color": colors[-1], "shape": str(rng.choice(SHAPES)), "action": action,
                                "start_frame": span[0], "end_frame": span[1], "motion": _motion(rng, action, cfg)})
    if title:
        events.append({"eid": len(events), "kind": "text_answerable", "query": str(rng.choice(TITLE_QUERIES)),
                       "start_frame": 0, "end_frame": title})
    if credits:
        events.append({"eid": len(events), "kind": "text_answerable", "query": str(rng.choice(CREDITS_QUERIES)),
                       "start_frame": b, "end_frame": n})
    if rng.random() < cfg.duplicate_query_fraction:
        src = int(rng.integers(len(events)))
        events.append({**events[src], "eid": len(events), "kind": "duplicate_query",
                       "query": _variant(rng, events[src]["query"]), "of_eid": src})
    if cfg.ambiguous_query_fraction > 0 or cfg.imprecise_fraction > 0:  # their own stream: the rest stays as is
        fault_rng = _rng(cfg.seed, 5, index)
        if fault_rng.random() < cfg.ambiguous_query_fraction:
            _plant_ambiguous(fault_rng, cfg, events, content, busy, (ev_lo, ev_hi))
        if fault_rng.random() < cfg.imprecise_fraction:
            _plant_imprecise(fault_rng, events, n, fps)
    return {"index": index, "n_frames": n, "fps": fps, "width": cfg.width, "height": cfg.height,
            "scenes": scenes, "hard_cuts": hard_cuts, "gradual_transitions": dissolves, "events": events,
            "distractors": distractors, "defect": {"kind": "none"}, "long": long}


def _variant(rng: np.random.Generator, q: str) -> str:
    """The same words: as written, capitalised with a full stop, or with a doubled space."""
    return [q, q[0].upper() + q[1:] + ".", q.replace(" ", "  ", 1)][int(rng.integers(3))]


def _plant_ambiguous(rng: np.random.Generator, cfg: CorpusConfig, events: list[dict], content: list[tuple[int, int]],
                     busy: list[tuple[int, int]], lengths: tuple[int, int]) -> None:
    """A normal event's object does its action again in a free span, annotated with the same words: both queries
    now match two moments (`ambiguous_query`, `of_eid` = the first)."""
    normal = [e for e in events if e["kind"] == "normal"]
    if not normal:
        return
    src = normal[int(rng.integers(len(normal)))]
    span = _place(rng, int(rng.integers(lengths[0], lengths[1] + 1)), content, busy) or \
        _place(rng, lengths[0], content, busy)
    if span is None:
        return
    busy.append(span)
    events.append({**src, "eid": len(events), "kind": "ambiguous_query", "query": _variant(rng, src["query"]),
                   "of_eid": src["eid"], "start_frame": span[0], "end_frame": span[1],
                   "motion": _motion(rng, src["action"], cfg), "end_overrun_s": 0.0})


IMPRECISE_MODES = ("early", "late", "wide", "narrow")


def _plant_imprecise(rng: np.random.Generator, events: list[dict], n: int, fps: float, tries: int = 20) -> None:
    """One normal event (no other query repeats it) gets an annotated window away from the true one: both
    boundaries earlier or later, or each moved out or in, by 1-2.5 s, kept 0.5 s inside the video and >= 1 s long
    (`annotated_s`; `imprecise` = the mode)."""
    repeated = {e.get("of_eid") for e in events}
    cands = [e for e in events if e["kind"] == "normal" and e["eid"] not in repeated and e["end_frame"] < n]
    if not cands:
        return
    e = cands[int(rng.integers(len(cands)))]
    s, t, duration = e["start_frame"] / fps, e["end_frame"] / fps, n / fps
    for _ in range(tries):
        mode = str(rng.choice(IMPRECISE_MODES))
        d1, d2 = (float(x) for x in rng.uniform(1.0, 2.5, 2))
        ds, de = {"early": (-d1, -d1), "late": (d1, d1), "wide": (-d1, d2), "narrow": (d1, -d2)}[mode]
        a, b = round(s + ds, 3), round(t + de, 3)
        if a >= 0.5 and b <= duration - 0.5 and b - a >= 1.0:
            e.update(annotated_s=[a, b], imprecise=mode)
            return


def plan_defect_video(cfg: CorpusConfig, index: int, kind: str, clean: list[dict]) -> dict:
    """A defective video: fresh content with a transform, or a near-duplicate re-encode of a clean video."""
    rng = _rng(cfg.seed, 2, index)
    if kind == "near_duplicate":
        src = clean[int(rng.integers(len(clean)))]
        trim = round(cfg.fps)
        scale = float(rng.choice([0.75, 0.875, 1.125, 1.25]))
        transform = {"trim_start_frames": trim, "trim_start_s": trim / cfg.fps,
                     "width": round(cfg.width * scale / 2) * 2, "height": round(cfg.height * scale / 2) * 2,
                     "brightness": int(rng.choice([-12, -8, 8, 12])), "jpeg_quality": int(rng.integers(30, 60))}
        plan = _trimmed(src, trim)
        plan.update(index=index, width=transform["width"], height=transform["height"], source_plan=src,
                    defect={"kind": kind, "of_index": src["index"], "transform": transform})
        return plan
    plan = plan_clean_video(cfg, 100_000 + index)
    plan["index"] = index
    plan["events"] = [_precise(e) for e in plan["events"] if e["kind"] not in ("duplicate_query", "ambiguous_query")]
    for e in plan["events"]:
        e["end_overrun_s"] = 0.0
    params: dict = {"kind": kind}
    if kind == "blurred":
        params["sigma"] = round(6.0 * min(cfg.width, cfg.height) / 112, 3)  # the same blur at every frame size
    elif kind == "dark":
        params["gain"] = 0.12
    elif kind == "low_res":
        params.update(width=24, height=24, source_width=cfg.width, source_height=cfg.height)
        plan.update(width=24, height=24)
    elif kind == "truncated":
        params["keep_fraction"] = round(float(rng.uniform(0.3, 0.6)), 3)
    plan["defect"] = params
    return plan


def _precise(e: dict) -> dict:
    """The event annotated with its true window."""
    return {k: v for k, v in e.items() if k not in ("annotated_s", "imprecise")}


def _trimmed(src: dict, trim: int) -> dict:
    """The plan of `src` with its first `trim` frames cut: frame indices shift, moments under 1 s drop."""
    scenes, events = [], []
    for s in src["scenes"]:
        if s["end_frame"] - trim > 0:
            scenes.append({**s, "start_frame": max(0, s["start_frame"] - trim), "end_frame": s["end_frame"] - trim})
    for e in src["events"]:
        a, b = max(0, e["start_frame"] - trim), e["end_frame"] - trim
        if b - a >= round(src["fps"]):
            events.append({**_precise(e), "start_frame": a, "end_frame": b, "end_overrun_s": 0.0})
    kept = {e["eid"] for e in events}
    for e in events:  # a duplicate (or repeat) whose original was trimmed away is just a normal query now
        if e["kind"] in ("duplicate_query", "ambiguous_query") and e["of_eid"] not in kept:
            e["kind"] = "normal"
            del e["of_eid"]
    return {**src, "n_frames": src["n_frames"] - trim, "scenes": scenes, "events": events,
            "hard_cuts": [c - trim for c in src["hard_cuts"] if c - trim > 0],
            "gradual_transitions": [[a - trim, b - trim] for a, b in src["gradual_transitions"] if a - trim > 0],
            "distractors": [{**d, "start_frame": max(0, d["start_frame"] - trim), "end_frame": d["end_frame"] - trim}
                            for d in src["distractors"] if d["end_frame"] - trim > 0]}


def plan_corpus(cfg: CorpusConfig) -> list[dict]:
    """Every video's plan, in a shuffled order that hides which ids are defective."""
    counts = corpus_counts(cfg)
    clean = [plan_clean_video(cfg, i) for i in range(counts.clean)]
    cycle = (*DEFECT_KINDS, "near_duplicate")  # near-duplicates twice as often: dedup needs clusters
    kinds = [cycle[i % len(cycle)] for i in range(counts.defects)]
    defects = [plan_defect_video(cfg, counts.clean + i, k, clean) for i, k in enumerate(kinds)]
    videos = clean + defects
    order = _rng(cfg.seed, 3).permutation(len(videos))
    width = max(6, math.ceil(math.log10(len(videos) + 1)))
    for vid_no, pos in enumerate(order):
        videos[int(pos)]["video_id"] = f"v{vid_no:0{width}d}"
    by_index = {v["index"]: v for v in videos}
    for v in videos:
        if v["defect"]["kind"] == "near_duplicate":
            v["defect"]["of"] = by_index[v["defect"]["of_index"]]["video_id"]
    return sorted(videos, key=lambda v: v["video_id"])
