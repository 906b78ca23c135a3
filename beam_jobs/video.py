"""Per-video core: decoded video + its records -> windows with frames, quality, queries (and the drops)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from beam_jobs import frames as fr
from beam_jobs.audit import audit_video
from beam_jobs.dedup import video_shingles
from beam_jobs.items import FILTERED, Outcome, QueryItem, VideoSig, WindowItem
from beam_jobs.probe import DecodedVideo, decode_video
from beam_jobs.quality import quality_drop_reason, window_quality
from beam_jobs.scenes import assign_window, gradual_transitions, plan_windows, rebase, scene_boundaries
from beam_jobs.text_bias import normalized_span
from vtg.config.preprocess import PreprocessConfig
from vtg.model.families import family_named
from vtg.model.geometry import policy_frames
from vtg.records import CanonicalRecord
from vtg.shards import encode_jpeg, stored_frame_size


def decode(path: str, cfg: PreprocessConfig, expected_duration_s: float | None = None) -> DecodedVideo:
    """`probe.decode_video` with the job's settings (raises DecodeError)."""
    return decode_video(path, frame_size=cfg.frame_size, candidate_fps=cfg.candidate_fps,
                        detect_size=cfg.scenes.detect_size, cut_threshold=cfg.scenes.threshold,
                        min_scene_len_s=cfg.scenes.min_scene_len_s,
                        min_changed_fraction=cfg.scenes.min_changed_fraction, expected_duration_s=expected_duration_s,
                        reader=cfg.reader, decode_threads=cfg.decode_threads, engine=cfg.scenes.engine,
                        quality_fps=cfg.quality.sample_fps, blur_size=cfg.quality.blur_size)


def too_short(video: DecodedVideo, cfg: PreprocessConfig) -> str | None:
    """Why the whole video is too short to split and sample (`too_short`: fewer than `quality.min_frames`
    decoded frames, or under `quality.min_duration_s`), or None."""
    q = cfg.quality
    if video.n_frames < q.min_frames or video.duration_s < q.min_duration_s:
        return (f"{video.n_frames} frame{'s' if video.n_frames != 1 else ''} at {video.fps:g} fps "
                f"({video.duration_s:.3g} s); needs >= {q.min_frames} frames and >= {q.min_duration_s:g} s")
    return None


def detect_scenes(video: DecodedVideo, cfg: PreprocessConfig) -> list[float]:
    sc = cfg.scenes
    reach = max(1, round(sc.gradual_reach_s * video.fps))
    gradual = (gradual_transitions(video.thumbs, reach=reach, high=sc.gradual_threshold, min_frames=reach,
                                   hard_cuts=video.hard_cuts, min_changed=sc.gradual_min_changed_fraction)
               if sc.gradual else [])
    return scene_boundaries(video.hard_cuts, gradual, video.times)


def select_frames(video: DecodedVideo, start: float, end: float, cfg: PreprocessConfig) -> np.ndarray:
    cand_t = video.seconds(video.cand_idx)
    if cfg.frame_mode == "family":
        family = family_named(cfg.family)
        width, height = stored_frame_size(video.width, video.height, cfg.frame_size)
        s = family.sampling
        n = policy_frames(end - start, height, width, family.video_geometry(), s["fps"], s["min_frames"],
                          s["max_frames"], cfg.max_video_tokens)
        return fr.uniform_frames(cand_t, start, end, n)
    if cfg.frame_mode == "adaptive":
        change = fr.candidate_change(video.change, video.cand_idx)
        return fr.adaptive_frames(cand_t, change, start, end, cfg.num_frames, cfg.adaptive_mix)
    return fr.uniform_frames(cand_t, start, end, cfg.num_frames, cfg.frame_fps)


def build_windows(video_id: str, records: Sequence[CanonicalRecord], video: DecodedVideo,
                  cfg: PreprocessConfig) -> tuple[list[WindowItem], list[Outcome], list[str]]:
    """Windows of one video with their queries; outcomes for records dropped here; window drop reasons."""
    duration = video.duration_s
    bounds = detect_scenes(video, cfg)
    moments = [m for r in records for m in r.windows]
    spans = plan_windows(duration, bounds, cfg.max_window_s, moments)
    queries: dict[int, list[QueryItem]] = {}
    dropped: list[Outcome] = []
    for r in sorted(records, key=lambda r: r.annotation_id):
        span = normalized_span(r.windows, r.duration_s)
        k = assign_window(spans, r.windows)
        if k is None:
            dropped.append(Outcome(r.annotation_id, video_id, FILTERED, "moment_crosses_window", span,
                                   f"windows {spans}"))
            continue
        queries.setdefault(k, []).append(QueryItem(r.annotation_id, r.query, rebase(r.windows, spans[k]), span,
                                                     r.annotation_file, r.source, r.licence))
    cand_t = video.seconds(video.cand_idx)  # presentation times (vtg.clock), never index / fps
    windows, window_drops = [], []
    source = "+".join(sorted({r.source for r in records}))
    for k, (ws, we) in enumerate(spans):
        pool = fr.window_candidates(cand_t, ws, we)
        scored = fr.window_candidates(video.seconds(video.qual_idx), ws, we)
        scores = window_quality(video.edge_widths[scored], video.brightness[pool], video.highlight[pool],
                                video.width, video.height)
        reason = quality_drop_reason(scores, cfg.quality)
        if reason is not None:
            window_drops.append(reason)
            detail = json.dumps(scores, sort_keys=True)
            dropped.extend(Outcome(q.annotation_id, video_id, FILTERED, reason, q.span, detail)
                           for q in queries.get(k, []))
            continue
        if k not in queries:
            window_drops.append("no_queries")
            continue
        pick = select_frames(video, ws, we, cfg)
        stamps = [round(float(t) - ws, 4) for t in cand_t[pick]]
        jpegs = [encode_jpeg(video.cand_frames[i][:, :, ::-1], cfg.jpeg_quality) for i in pick]
        windows.append(WindowItem(
            video_id=video_id, index=k, start_s=ws, end_s=we, timestamps=stamps,
            fps=round(len(pick) / (we - ws), 6), jpegs=jpegs, quality=scores,
            scene_cuts=[round(b - ws, 6) for b in bounds if ws < b < we], queries=queries[k], source=source,
            licence=joined_licence(records),
            video_path=records[0].video_path if records else "", source_fps=float(video.fps),
            frame_indices=[int(i) for i in video.cand_idx[pick]]))
    return windows, dropped, window_drops


def joined_licence(records: Sequence[CanonicalRecord]) -> str:
    """The licences a video's frames come under: one, or an SPDX `AND` expression when its queries come from sources
    under different licences (each query also names its own)."""
    return " AND ".join(sorted({r.licence for r in records if r.licence}))


def audit_records(records: Sequence[CanonicalRecord], video: DecodedVideo, cfg: PreprocessConfig) -> dict:
    """The annotation audit's flags of one video's records ({annotation_id: {flag: detail}}, flagged ones only)."""
    return audit_video([(r.annotation_id, r.query, r.windows) for r in records], video.duration_s,
                       detect_scenes(video, cfg), video.change, video.fps, cfg.audit, cfg.dedup.query_ngram,
                       video.times)


def video_signature(video_id: str, video: DecodedVideo, n_usable: int, cfg: PreprocessConfig) -> VideoSig:
    d = cfg.dedup
    shingles = video_shingles(video.thumbs, video.fps, d.hash_fps, d.lag, d.projections, d.bucket_width, d.seed)
    widths = video.edge_widths[np.isfinite(video.edge_widths)]
    rank = (-n_usable, -round(video.duration_s, 3), -min(video.width, video.height),
            round(float(np.median(widths)), 3) if len(widths) else 0.0)
    return VideoSig(video_id, shingles, rank)
