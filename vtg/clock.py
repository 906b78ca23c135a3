"""The one clock (issue 35): what a frame's time means, for every reader of video files.

A frame's time is its **presentation time**: the decoder's timestamp of the frame (pts), in seconds on the file's
presentation timeline, whose 0 is the container's start, the time a player shows and annotators read answers off.
It is not `index / fps`: on a variable-frame-rate file (phone and screen recordings, many web videos) that is off by
seconds (DESIGN §6, "Presentation time is not `index / fps`").

Two facts make it:
- OpenCV's `CAP_PROP_POS_MSEC` after each sequential `grab()` / `read()`: the frame's pts, but counted from the
  *video stream's* first timestamp (`dts_to_sec` in OpenCV's FFmpeg backend subtracts the stream's start time);
- the video stream's start on the container's timeline (`stream_start_s`, from the container through PyAV without
  decoding): a video track that starts after the container does (an audio track first, a trimmed recording)
  shows its first frame at that time, not at 0.

`frame_time = POS_MSEC / 1000 + stream_start_s`. A window's frame times (the shard's `frame_timestamps`) are these
minus the window's start on the same timeline; the whole-video benchmark's are these as they are. Durations, window
plans, scene cuts and the truncation check all read this clock (`end_time`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from vtg.errors import VTGError

RESOLUTION_S = 1e-3
"""OpenCV reports presentation times in milliseconds (as doubles): two frames closer than this are one time."""


@functools.lru_cache(maxsize=4096)
def _stream_start(path: str, size: int, mtime_ns: int) -> float:
    import av

    try:
        with av.open(path) as container:
            streams = container.streams.video
            if not streams:
                return 0.0
            stream = streams[0]
            if stream.start_time is None or stream.time_base is None:
                return 0.0
            start = float(stream.start_time * stream.time_base)
            origin = container.start_time / 1e6 if container.start_time is not None else start
    except (av.FFmpegError, OSError, ValueError):
        return 0.0  # unreadable here: the decoder that follows says why, with the file's own error
    return max(0.0, round(start - origin, 6))


def stream_start_s(path: str) -> float:
    """Where the file's (first) video stream starts on its presentation timeline, in seconds (0 for most files; a
    video track that starts after an audio track, or after an edit list's empty edit, starts later)."""
    import os

    try:
        st = os.stat(path)
    except OSError:
        return 0.0
    return _stream_start(os.fspath(path), st.st_size, st.st_mtime_ns)


def pos_seconds(cap) -> float:
    """The presentation time of the frame an OpenCV capture last grabbed, on the video stream's own clock."""
    import cv2

    return float(cap.get(cv2.CAP_PROP_POS_MSEC)) / 1000.0


def check_increasing(times: Sequence[float], what: str) -> None:
    """Presentation times must increase frame by frame; a file whose timestamps repeat or run backwards has no
    clock a model can be told (an error naming the first bad frame, so the video is dead-lettered, not misread)."""
    t = np.asarray(times, float)
    if len(t) and not np.isfinite(t).all():
        raise VTGError(f"{what}: a frame has no presentation time (decoder reported {t[~np.isfinite(t)][:3]})")
    bad = np.flatnonzero(np.diff(t) < RESOLUTION_S / 2)
    if len(bad):
        i = int(bad[0])
        raise VTGError(f"{what}: presentation times do not increase at frame {i + 1} ({t[i]:.4f} s, then "
                       f"{t[i + 1]:.4f} s): the container's timestamps are broken; remux it (ffmpeg -i IN -c copy "
                       "OUT) or re-encode it")


def end_time(times: Sequence[float], fps: float) -> float:
    """When the last frame stops being shown: its time plus the interval before it (a single frame: 1 / fps)."""
    t = [float(x) for x in times]
    if not t:
        return 0.0
    last = t[-1] - t[-2] if len(t) > 1 else (1.0 / fps if fps > 0 else 0.0)
    return t[-1] + last


def nearest(times: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Index into sorted `times` of the frame shown nearest each target time."""
    times = np.asarray(times, float)
    if len(times) < 2:
        return np.zeros(len(targets), int)
    pos = np.clip(np.searchsorted(times, targets), 1, len(times) - 1)
    left = times[pos - 1]
    return np.where(np.abs(np.asarray(targets) - left) <= np.abs(times[pos] - targets), pos - 1, pos)
