"""Ingest fixtures: a video root with a few real and a few broken files, and an IngestConfig factory."""

from pathlib import Path

import cv2
import numpy as np
import pytest
from support.declared import declared

from vtg.config import IngestConfig


def write_video(path: Path, n_frames: int = 40, fps: float = 8.0, size: int = 32) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fourcc = "MJPG" if path.suffix == ".avi" else "mp4v"
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (size, size))
    for i in range(n_frames):
        w.write(np.full((size, size, 3), i * 5 % 255, np.uint8))
    w.release()
    return path


@pytest.fixture
def video_root(tmp_path: Path) -> Path:
    """a.mp4 (5 s), b.avi (5 s, in a subfolder), c.mkv (an empty stand-in), broken.mp4 (zero bytes)."""
    root = tmp_path / "videos"
    write_video(root / "a.mp4")
    write_video(root / "sub" / "b.avi")
    (root / "c.mkv").write_bytes(b"")
    (root / "broken.mp4").write_bytes(b"")
    return root


@pytest.fixture
def ingest_config(tmp_path: Path, video_root: Path):
    def make(*annotations: Path, **kw) -> IngestConfig:
        out = tmp_path / "out"
        kw.setdefault("sources", declared(tmp_path))  # the test's folder: annotations and videos
        return IngestConfig(annotations=[str(a) for a in annotations], video_root=str(video_root),
                            out=str(out / "records.jsonl"), dead_letter=str(out / "dead.jsonl"),
                            summary=str(out / "summary.json"), **kw)
    return make
