"""Decoding chosen frames of a video file (OpenCV): the one reader of the side paths that score whole videos or
clips outside the shards (the benchmark protocol, the general-task suites, annotate). Preprocess has its own decoder
(beam_jobs/video.py), tuned for its candidate frames. Both tell time by `vtg.clock`: a frame's time is its
presentation time on the file's timeline, never `index / fps`."""

from __future__ import annotations

import numpy as np

from vtg import clock
from vtg.errors import VTGError


def video_facts(path: str) -> tuple[int, float, int, int]:
    """(frames, fps, height, width) as the decoder reports them; an unreadable file is an error. The fps is the
    container's average rate: a count, not a clock (`frame_times` is the clock)."""
    import cv2

    cap = cv2.VideoCapture(path)
    try:
        if not cap.isOpened():
            raise VTGError(f"{path}: cannot open the video")
        return (int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), float(cap.get(cv2.CAP_PROP_FPS)),
                int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)), int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)))
    finally:
        cap.release()


def declared_duration_s(frames: int, fps: float, path: str) -> float:
    """When a video's last frame ends on its timeline, from the container's frame count and average rate (no
    decode): where the video stream starts plus frames / fps (a variable-rate file's average rate makes that its
    stream duration)."""
    return clock.stream_start_s(path) + frames / fps if fps > 0 else 0.0


def frame_times(path: str) -> np.ndarray:
    """The presentation time (seconds on the file's timeline, `vtg.clock`) of every frame the decoder yields, in one
    sequential pass that decodes no pixels into Python."""
    import cv2

    offset = clock.stream_start_s(path)
    cap = cv2.VideoCapture(path)
    times = []
    try:
        if not cap.isOpened():
            raise VTGError(f"{path}: cannot open the video")
        while cap.grab():
            times.append(clock.pos_seconds(cap) + offset)
    finally:
        cap.release()
    clock.check_increasing(times, path)
    return np.asarray(times, float)


def decode_at(path: str, wanted: np.ndarray) -> tuple[list[np.ndarray], list[int], list[float]]:
    """RGB frames at the wanted (sorted) indices, the indices actually got (a container that reports more frames than
    it holds yields fewer) and their presentation times, in one sequential pass from the first frame: OpenCV's seek
    turns a frame index into a time with the average fps, which lands on another frame in a variable-rate file."""
    import cv2

    if not len(wanted):
        return [], [], []
    offset = clock.stream_start_s(path)
    cap = cv2.VideoCapture(path)
    frames, got, times = [], [], []
    want = {int(i) for i in wanted}
    i, last = 0, int(wanted[-1])
    try:
        while i <= last and cap.grab():
            if i in want:
                ok, bgr = cap.retrieve()
                if ok:
                    frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
                    got.append(i)
                    times.append(clock.pos_seconds(cap) + offset)
            i += 1
    finally:
        cap.release()
    if not frames:
        raise VTGError(f"{path}: no frame could be decoded at {int(wanted[0])}-{last}")
    clock.check_increasing(times, path)
    return frames, got, times


def resize_stored(frame: np.ndarray, frame_size: int) -> np.ndarray:
    """A frame resized the way preprocess stores frames (`vtg.shards.stored_frame_size`: aspect kept)."""
    import cv2

    from vtg.shards import stored_frame_size

    w, h = stored_frame_size(frame.shape[1], frame.shape[0], frame_size)
    return cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA) if (h, w) != frame.shape[:2] else frame


def _span_picks(times: np.ndarray, path: str, start_s: float, end_s: float | None, num_frames: int) -> np.ndarray:
    """Indices of the frames `clip_frames` shows for [start_s, end_s) (end None: the video's end)."""
    end = clock.end_time(times, video_facts(path)[1]) if end_s is None else end_s
    inside = np.flatnonzero((times >= start_s - clock.RESOLUTION_S / 2) & (times < end - clock.RESOLUTION_S / 2))
    if not len(inside):
        inside = clock.nearest(times, np.array([start_s]))
    return inside[np.unique(np.linspace(0, len(inside) - 1, num_frames).round().astype(int))]


def clips_frames(path: str, spans: list[tuple[float, float | None]], num_frames: int,
                 frame_size: int) -> list[tuple[np.ndarray, list[float]]]:
    """`clip_frames` of several spans of one video in two passes over the file in all (its clock, then the union of
    the spans' frames), not two per span: the same frames and times as one `clip_frames` call per span."""
    times = frame_times(path)
    if not len(times):
        raise VTGError(f"{path}: cannot read the video")
    picks = [_span_picks(times, path, start, end, num_frames) for start, end in spans]
    decoded, got, shown = decode_at(path, np.unique(np.concatenate(picks)))
    stored = {i: (resize_stored(f, frame_size), t) for i, f, t in zip(got, decoded, shown)}
    out = []
    for (start, _), pick in zip(spans, picks):
        have = [int(i) for i in pick if int(i) in stored]
        if not have:
            raise VTGError(f"{path}: no frame could be decoded at {int(pick[0])}-{int(pick[-1])}")
        out.append((np.stack([stored[i][0] for i in have]), [round(stored[i][1] - start, 4) for i in have]))
    return out


def clip_frames(path: str, start_s: float, end_s: float | None, num_frames: int,
                frame_size: int) -> tuple[np.ndarray, list[float]]:
    """(uint8 RGB frames [T, H, W, 3], stored-size, and their presentation times in seconds from `start_s`): the frames
    shown in [start_s, end_s) (end None: the video's end), `num_frames` of them spread first to last over that span
    as the families' processors spread a video's frames (`linspace`, rounded); never a repeated frame: a clip with
    fewer frames gives fewer."""
    return clips_frames(path, [(start_s, end_s)], num_frames, frame_size)[0]
