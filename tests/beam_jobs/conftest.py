"""Fixtures for the preprocess tests: tiny mp4 videos built with OpenCV, and canonical records for them."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from vtg.config import load_config

REPO = Path(__file__).resolve().parents[2]


def scene_frame(seed: int, size: int, t: int) -> np.ndarray:
    """A textured BGR frame (stripes of a seed-dependent colour and period) with a moving square."""
    rng = np.random.default_rng(seed)
    base = rng.integers(40, 200, 3)
    period = int(rng.integers(6, 20))
    yy, xx = np.mgrid[0:size, 0:size]
    pattern = ((xx + (yy if seed % 2 else 0)) // period) % 2
    img = (base[None, None, :] * (0.6 + 0.4 * pattern[..., None])).astype(np.uint8)
    x = (5 + 2 * t) % (size - 20)
    img[20:36, x:x + 16] = (0, 0, 255) if seed % 3 else (255, 255, 255)
    return img


def _write_video(path: Path, scenes: list[tuple[int, int]], fps: float = 8.0, size: int = 96,
                dissolve: int = 0, post=None) -> list[int]:
    """Scenes as (seed, n_frames); `dissolve` > 0 blends the last scene pair over that many frames.
    Returns the first frame index of every scene after the first (the ground-truth cuts)."""
    frames, cuts = [], []
    for k, (seed, n) in enumerate(scenes):
        if k:
            cuts.append(len(frames))
        frames.extend(scene_frame(seed, size, len(frames) + t) for t in range(n))
    if dissolve and len(scenes) >= 2:
        c = cuts[-1]
        for i in range(dissolve):
            t = c - dissolve // 2 + i
            w = (i + 1) / (dissolve + 1)
            a, b = scene_frame(scenes[-2][0], size, t), scene_frame(scenes[-1][0], size, t)
            frames[t] = cv2.addWeighted(a, 1 - w, b, w, 0)
    if post is not None:
        frames = [post(f) for f in frames]
    h, w = frames[0].shape[:2]
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    for f in frames:
        out.write(f)
    out.release()
    return cuts


def record(video_id: str, path: Path, duration: float, query: str, window: tuple[float, float],
           aid: str) -> dict:
    return {"video_id": video_id, "video_path": str(path), "duration_s": duration, "query": query,
            "windows": [list(window)], "source": "test:fixture", "annotation_id": aid}


@pytest.fixture
def cfg_factory(tmp_path):
    def make(records: Path, *overrides: str):
        return load_config(REPO / "params.yaml", None, [f"preprocess.records={records}",
                                                        f"preprocess.out_dir={tmp_path / 'shards'}",
                                                        "preprocess.progress=false", *overrides])
    return make


@pytest.fixture
def small_dataset(tmp_path) -> Path:
    """Three clean videos (one with a dissolve), one near-duplicate, a zero-byte and a non-video file."""
    vdir = tmp_path / "videos"
    vdir.mkdir()
    rows = []
    _write_video(vdir / "a.mp4", [(1, 40), (2, 40)])
    _write_video(vdir / "b.mp4", [(3, 48), (4, 32)], dissolve=6)
    _write_video(vdir / "c.mp4", [(5, 40), (6, 40), (7, 40)])
    _write_video(vdir / "a_dup.mp4", [(1, 40), (2, 40)],
                post=lambda f: cv2.convertScaleAbs(cv2.resize(f, (80, 80)), alpha=1.0, beta=8))
    (vdir / "zero.mp4").write_bytes(b"")
    (vdir / "text.mp4").write_text("not a video\n")
    for vid, dur in (("a", 10.0), ("b", 10.0), ("c", 15.0), ("a_dup", 10.0), ("zero", 10.0), ("text", 10.0)):
        rows.append(record(vid, vdir / f"{vid}.mp4", dur, f"the red square moves in {vid}", (1.0, 3.0),
                           f"{vid}-q1"))
        rows.append(record(vid, vdir / f"{vid}.mp4", dur, "a white thing shows up", (5.5, 8.0), f"{vid}-q2"))
    rows.append(record("c", vdir / "c.mp4", 15.0, "the red square moves in c", (1.0, 3.0), "c-q1-dup"))
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n")
    return path


@pytest.fixture(name="write_video")
def write_video_fixture():
    """The scene-video writer for tests (a fixture: importing `conftest` by name clashes across test dirs)."""
    return _write_video
