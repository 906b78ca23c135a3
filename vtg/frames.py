"""Decoding chosen frames of a video file (OpenCV): the one reader of the side paths that score whole videos or
clips outside the shards (the benchmark protocol, the general-task suites). Preprocess has its own decoder
(beam_jobs/video.py), tuned for its candidate frames."""

from __future__ import annotations

import numpy as np

from vtg.errors import VTGError


def video_facts(path: str) -> tuple[int, float, int, int]:
    """(frames, fps, height, width) as the decoder reports them; an unreadable file is an error."""
    import cv2

    cap = cv2.VideoCapture(path)
    try:
        if not cap.isOpened():
            raise VTGError(f"{path}: cannot open the video")
        return (int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), float(cap.get(cv2.CAP_PROP_FPS)),
                int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)), int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)))
    finally:
        cap.release()


def decode_at(path: str, wanted: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """RGB frames at the wanted (sorted) indices, decoded in one sequential pass from the first of them, and the
    indices actually got (a container that reports more frames than it holds yields fewer)."""
    import cv2

    if not len(wanted):
        return [], []
    cap = cv2.VideoCapture(path)
    frames, got = [], []
    want = {int(i) for i in wanted}
    i, last = int(wanted[0]), int(wanted[-1])
    try:
        if i:
            cap.set(cv2.CAP_PROP_POS_FRAMES, i)
        while i <= last and cap.grab():
            if i in want:
                ok, bgr = cap.retrieve()
                if ok:
                    frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
                    got.append(i)
            i += 1
    finally:
        cap.release()
    if not frames:
        raise VTGError(f"{path}: no frame could be decoded at {int(wanted[0])}-{last}")
    return frames, got


def resize_stored(frame: np.ndarray, frame_size: int) -> np.ndarray:
    """A frame resized the way preprocess stores frames (`vtg.shards.stored_frame_size`: aspect kept)."""
    import cv2

    from vtg.shards import stored_frame_size

    w, h = stored_frame_size(frame.shape[1], frame.shape[0], frame_size)
    return cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA) if (h, w) != frame.shape[:2] else frame


def clip_frames(path: str, start_s: float, end_s: float | None, num_frames: int,
                frame_size: int) -> tuple[np.ndarray, list[float]]:
    """(uint8 RGB frames [T, H, W, 3] uniform over [start_s, end_s) (end None: the video's end), stored-size, and
    their seconds from `start_s`); never a repeated frame: a clip with fewer frames gives fewer."""
    total, fps, _, _ = video_facts(path)
    if fps <= 0 or total <= 0:
        raise VTGError(f"{path}: cannot read the video")
    first = min(int(start_s * fps), total - 1)
    last = min(total, int(np.ceil((end_s if end_s is not None else total / fps) * fps)))
    wanted = np.unique(np.linspace(first, max(first, last - 1), num_frames).round().astype(int))
    decoded, got = decode_at(path, wanted)
    return np.stack([resize_stored(f, frame_size) for f in decoded]), [round((i - first) / fps, 4) for i in got]
