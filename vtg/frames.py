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
