"""Probe and decode: each video is read once; everything later steps need is computed in that one pass.

The reader is swappable (`READERS`): a reader yields BGR frames with their presentation times (`vtg.clock`: the
decoder's pts on the file's timeline, never `index / fps`) and reports fps. During the single pass we
run PySceneDetect's ContentDetector algorithm on downscaled frames (hard cuts; `scenes.ContentCuts`), keep a
tiny colour thumbnail per frame (content change, gradual transitions, perceptual hashes, brightness), keep
candidates of about frame_size^2 pixels with the source's aspect ratio (`vtg.shards.stored_frame_size`) at
`candidate_fps`, and score a subset of them (`quality_fps`) for blur. Per frame the
loop does only a decode and a thumbnail resize (plus a resize per candidate); cut scores are computed for all
thumbnails at once after the loop. Memory per video is bounded by duration x candidate_fps x frame_size^2.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import cv2
import numpy as np

from beam_jobs.quality import edge_width
from beam_jobs.scenes import ContentCuts
from vtg import clock
from vtg.errors import VTGError
from vtg.shards import stored_frame_size

THUMB = 16  # side of the colour thumbnail kept for every decoded frame


class DecodeError(Exception):
    """The file is not a (complete) readable video; the message says why."""


class VideoReader(Protocol):
    def open(self, path: str) -> tuple[float, int, int, int]:
        """-> (fps, width, height, declared frame count). Raises DecodeError."""

    def frames(self) -> Iterator[tuple[float, np.ndarray]]:
        """(presentation time in seconds on the file's timeline, BGR uint8 frame) in order. A reader may reuse one
        array for every frame: copy a frame to keep it."""

    def close(self) -> None: ...


class OpenCVReader:
    def __init__(self, threads: int = 0) -> None:
        """`threads`: FFmpeg decoder threads (0: OpenCV's default, one per CPU)."""
        self._cap: cv2.VideoCapture | None = None
        self._offset = 0.0
        self._params = [cv2.CAP_PROP_N_THREADS, threads] if threads > 0 else []

    def open(self, path: str) -> tuple[float, int, int, int]:
        cap = cv2.VideoCapture(path, cv2.CAP_ANY, self._params)
        if not cap.isOpened() and self._params:  # a backend that does not take the threads setting
            cap = cv2.VideoCapture(path)
        if not cap.isOpened():
            raise DecodeError("not a decodable video (OpenCV could not open it)")
        self._cap = cap
        self._offset = clock.stream_start_s(path)
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        w, h = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        return fps, w, h, int(cap.get(cv2.CAP_PROP_FRAME_COUNT))

    def frames(self) -> Iterator[tuple[float, np.ndarray]]:
        assert self._cap is not None
        frame = None
        while True:
            ok, frame = self._cap.read(frame)  # decodes into the previous frame's buffer (~20 us/frame less)
            if not ok:
                return
            yield clock.pos_seconds(self._cap) + self._offset, frame

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None


READERS: dict[str, type] = {"opencv": OpenCVReader}


@dataclass
class DecodedVideo:
    """What one decode pass of a video leaves behind (no full-resolution frames)."""

    fps: float
    """The container's average rate (a count of frames per second, not the clock: `times` is)."""
    width: int
    height: int
    n_frames: int
    times: np.ndarray
    """(n_frames,) presentation time of every decoded frame, seconds on the file's timeline (`vtg.clock`)."""
    thumbs: np.ndarray
    """(n_frames, THUMB, THUMB, 3) uint8 BGR thumbnails."""
    change: np.ndarray
    """(n_frames,) mean absolute thumbnail change from the previous frame (0 for the first)."""
    hard_cuts: list[int]
    """Frame indices where a new scene starts (PySceneDetect ContentDetector)."""
    cand_idx: np.ndarray
    """Frame indices of the kept candidates."""
    cand_frames: list[np.ndarray] = field(repr=False)
    """BGR candidates of `stored_frame_size` (about frame_size^2 pixels, aspect kept; RGB only when picked)."""
    brightness: np.ndarray = field(repr=False)
    """Mean luma per candidate (of its thumbnail)."""
    highlight: np.ndarray = field(repr=False)
    """Brightest luma per candidate (of the frame_size candidate): bright text on a dark title card is not a dark
    video."""
    qual_idx: np.ndarray = field(repr=False)
    """Frame indices of the candidates scored for blur (a subset of `cand_idx`, at `quality_fps`)."""
    edge_widths: np.ndarray = field(repr=False)
    """`quality.edge_width` per scored frame (NaN: no edge in that frame)."""

    @property
    def duration_s(self) -> float:
        """When the last frame stops being shown (`vtg.clock.end_time`): the video's length on its timeline."""
        return clock.end_time(self.times[-2:], self.fps)

    def seconds(self, idx) -> np.ndarray:
        """The presentation times of frames by index (`cand_idx`, `qual_idx`, cut indices)."""
        return self.times[np.asarray(idx, int)]


@contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A local path for `path` (Beam FileSystems for gs://, s3://, ...; local files are used in place)."""
    from apache_beam.io.filesystems import FileSystems

    if "://" not in path:
        yield path
        return
    fd, tmp = tempfile.mkstemp(suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as dst, FileSystems.open(path) as src:
            shutil.copyfileobj(src, dst)
        yield tmp
    finally:
        os.unlink(tmp)


def file_sha256(path: str) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


def decode_video(
    path: str,
    *,
    frame_size: int,
    candidate_fps: float,
    detect_size: int = 64,
    cut_threshold: float = 27.0,
    min_scene_len_s: float = 0.5,
    min_changed_fraction: float = 0.0,
    expected_duration_s: float | None = None,
    reader: str = "opencv",
    decode_threads: int = 0,
    engine: str = "batched",
    quality_fps: float = 1.0,
    blur_size: int = 56,
) -> DecodedVideo:
    """Decode the local file `path` once. Raises DecodeError for zero-byte, non-video, unreadable or truncated
    files (use `local_copy` first for remote paths)."""
    if not os.path.exists(path):
        raise DecodeError(f"file not found: {path}")
    if os.path.getsize(path) == 0:
        raise DecodeError("zero-byte file")
    rd: VideoReader = READERS[reader](threads=decode_threads)
    fps, w, h, declared = rd.open(path)
    try:
        if not (fps > 0) or w <= 0 or h <= 0:
            raise DecodeError(f"no usable video stream (fps={fps}, size={w}x{h})")
        cutter = ContentCuts(fps, cut_threshold, max(1, round(min_scene_len_s * fps)), engine, min_changed_fraction)
        video = _scan(rd.frames(), fps, w, h, frame_size=frame_size, candidate_fps=candidate_fps,
                      detect_size=detect_size, cutter=cutter, quality_fps=quality_fps, blur_size=blur_size)
    finally:
        rd.close()
    _check_complete(video.n_frames, video.duration_s, declared, expected_duration_s)
    return video


def prescale_halvings(w: int, h: int, target: int) -> int:
    """How many times a w x h frame is halved (INTER_AREA, exact 2x2 means) before its area resizes to `target`
    px and below: while both sides are even and the halved shorter side stays >= 2 x target. OpenCV's INTER_AREA
    by a large factor is slow (448 -> 16 px: ~535 us, 224 -> 16 or 56: ~105 us, more than a 448-px frame's
    decode of ~195 us) while its 2x path and small integer factors are fast (448 -> 224: ~135 us, 224 -> 112:
    ~36 us, 112 -> 16: ~26 us, 112 -> 56: ~11 us). Frames under 4 x target (the 112-px default corpus and its
    near-duplicate copies) are resized in one step."""
    n = 0
    while w % 2 == 0 and h % 2 == 0 and min(w, h) // 2 >= 2 * target:
        w, h, n = w // 2, h // 2, n + 1
    return n


def _scan(frames: Iterator[np.ndarray], fps: float, w: int, h: int, *, frame_size: int, candidate_fps: float,
          detect_size: int, cutter: ContentCuts, quality_fps: float, blur_size: int) -> DecodedVideo:
    """The single pass over the frames (OpenCV primitives only: this loop is the job's hot path)."""
    factor = max(1, math.ceil(max(w, h) / detect_size))  # integer factors take OpenCV's fast INTER_AREA path
    dsize = (max(1, w // factor), max(1, h // factor))
    on_thumbs = detect_size <= THUMB and cutter.engine == "batched"  # cut scores for all thumbnails after the loop
    # candidates and scored frames are chosen by presentation time (a variable-rate file is sampled evenly in time)
    step = 1.0 / candidate_fps
    qstep = max(step, 1.0 / quality_fps)
    tol = clock.RESOLUTION_S / 2
    halvings = prescale_halvings(w, h, max(frame_size, blur_size))
    cand_size = stored_frame_size(w, h, frame_size)  # the aspect ratio kept (shard contract 2)
    thumbs, cand_idx, cands, qual_idx, widths, times = [], [], [], [], [], []
    next_cand = next_qual = None
    n = 0
    for i, (t, frame) in enumerate(frames):
        times.append(t)
        if next_cand is None:  # the first frame is a candidate and is scored, wherever the video starts
            next_cand = next_qual = t
        src = frame
        for _ in range(halvings):  # large frames: exact 2x area steps first (OpenCV's fast path), then one resize
            src = cv2.resize(src, (src.shape[1] // 2, src.shape[0] // 2), interpolation=cv2.INTER_AREA)
        # Thumbnails are area averages of the whole frame, so every resolution of the same content matches.
        thumb = cv2.resize(src, (THUMB, THUMB), interpolation=cv2.INTER_AREA)
        thumbs.append(thumb)
        if not on_thumbs:
            small = thumb if detect_size <= THUMB else \
                cv2.resize(frame, dsize, interpolation=cv2.INTER_AREA) if factor > 1 else frame
            cutter.push(i, small)
        n = i + 1
        if t >= next_cand - tol:
            next_cand += step * max(1, int((t - next_cand + tol) // step) + 1)
            cand = cv2.resize(src, cand_size, interpolation=cv2.INTER_AREA)
            cands.append(cand)
            cand_idx.append(i)
            if t >= next_qual - tol:
                next_qual += qstep * max(1, int((t - next_qual + tol) // qstep) + 1)
                scored = cand if cand_size == (blur_size, blur_size) else \
                    cv2.resize(src, (blur_size, blur_size), interpolation=cv2.INTER_AREA)
                widths.append(edge_width(scored))
                qual_idx.append(i)
    if n == 0:
        raise DecodeError("no frame could be decoded")
    try:
        clock.check_increasing(times, "presentation times")
    except VTGError as e:
        raise DecodeError(str(e)) from None
    th = np.stack(thumbs)
    if on_thumbs:
        cutter.push_all(th)
    change = np.zeros(n, np.float32)
    change[1:] = np.abs(th[1:].astype(np.int16) - th[:-1].astype(np.int16)).mean(axis=(1, 2, 3))
    grey = cv2.cvtColor(th[cand_idx].reshape(-1, THUMB, 3), cv2.COLOR_BGR2GRAY).reshape(len(cand_idx), -1)
    cand_grey = cv2.cvtColor(np.concatenate(cands), cv2.COLOR_BGR2GRAY).reshape(len(cands), -1)
    return DecodedVideo(fps=fps, width=w, height=h, n_frames=n, times=np.asarray(times, float), thumbs=th,
                        change=change,
                        hard_cuts=[c for c in cutter.finish() if 0 < c < n], cand_idx=np.asarray(cand_idx),
                        cand_frames=cands, brightness=grey.mean(axis=1),
                        highlight=cand_grey.max(axis=1).astype(float), qual_idx=np.asarray(qual_idx),
                        edge_widths=np.asarray(widths, float))


def duration_slack_s(duration_s: float) -> float:
    """How far a decoded duration may fall from an annotated one (1 s or 5%): one home for the truncation check
    and preprocess's per-line `duration_mismatch`."""
    return max(1.0, 0.05 * duration_s)


def _check_complete(n: int, duration_s: float, declared: int, expected_duration_s: float | None) -> None:
    """Truncated files decode fewer frames than the container (or less time than the annotation) promises; the
    decoded duration is the presentation clock's (`DecodedVideo.duration_s`)."""
    if declared > 0 and n < 0.95 * declared - 1:
        raise DecodeError(f"truncated: decoded {n} of {declared} frames")
    if expected_duration_s and duration_s < expected_duration_s - duration_slack_s(expected_duration_s):
        raise DecodeError(f"truncated: decoded {duration_s:.2f} s of the annotated {expected_duration_s:.2f} s")
