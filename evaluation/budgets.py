"""The frame and pixel budgets other harnesses evaluate with, as plain functions: which frames of a whole video a
profile takes and the size it resizes them to, so that a benchmark profile (evaluation/profiles/*.json,
`frames.mode: fps`) samples as the peer's code does.

Two peers, each a copy of the rules of a file we read (the profile names the file; `tests/evaluation/
test_benchmark_profiles.py` pins these functions to worked examples of those files):

- **qwen-vl-utils 0.0.14** (`qwen_vl_utils/vision_process.py`, QwenLM/Qwen3-VL), which TimeLens's evaluation calls
  with a video file and `fps`, `min_pixels`, `total_pixels`: `smart_nframes` takes total_frames / video_fps x fps
  frames within [4, min(768, total_frames)], floored to a multiple of 2 (`FRAME_FACTOR`); the frames are
  `torch.linspace(0, total - 1, n).round()`; `fetch_video` resizes every frame with `smart_resize` (multiples of
  the factor, 28 for Qwen2.5-VL's patch 14 and 32 for Qwen3-VL's patch 16) within [min_pixels,
  max(min(768 x factor^2, total_pixels / n x 2), int(min_pixels x 1.05))], capped by `max_pixels` when given. A
  list of frames (VLMEvalKit's path) is first resized one by one within [min_pixels, max_pixels] (`fetch_image`),
  padded to an even count, then resized by the same video rule.
- **VLMEvalKit's TimeLens datasets** (TimeLens2's evaluation): required = int(duration x fps) frames at
  `int(i x video_fps / fps)`; past `frames_limit`, `int(i x total / (frames_limit + 1))` for i in 1..frames_limit;
  each clamped to [0, total - 1], duration = total / video_fps (the decoder's count and average rate).

Frames are resized once, to the final size (the peers resize twice on the frame-list path, PIL then torchvision):
the size is theirs, the resampling is ours (bicubic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FRAME_FACTOR = 2
"""qwen-vl-utils: frame counts are multiples of this (the temporal patch)."""
VIDEO_MAX_TOKEN_NUM = 768
"""qwen-vl-utils 0.0.14: a video frame holds at most this many factor x factor cells."""
FPS_MIN_FRAMES, FPS_MAX_FRAMES = 4, 768
"""qwen-vl-utils 0.0.14's frame bounds when sampling by fps."""
INDEX_RULES = ("qwen_vl_utils", "vlmevalkit")


def _round_by(n: float, f: int) -> int:
    return round(n / f) * f


def _ceil_by(n: float, f: int) -> int:
    return math.ceil(n / f) * f


def _floor_by(n: float, f: int) -> int:
    return math.floor(n / f) * f


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: float) -> tuple[int, int]:
    """qwen-vl-utils 0.0.14's `smart_resize`: both sides multiples of `factor` (at least one factor before any
    scaling), the aspect kept, the pixels within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = max(factor, _round_by(height, factor)), max(factor, _round_by(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar, w_bar = _floor_by(height / beta, factor), _floor_by(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = _ceil_by(height * beta, factor), _ceil_by(width * beta, factor)
    return h_bar, w_bar


def qwen_vl_utils_nframes(total: int, video_fps: float, fps: float, min_frames: int = FPS_MIN_FRAMES,
                          max_frames: int = FPS_MAX_FRAMES) -> int:
    """qwen-vl-utils 0.0.14's `smart_nframes` for a video file sampled at `fps`."""
    lo, hi = _ceil_by(min_frames, FRAME_FACTOR), _floor_by(min(max_frames, total), FRAME_FACTOR)
    n = min(min(max(total / video_fps * fps, lo), hi), total)
    n = _floor_by(n, FRAME_FACTOR)
    if not FRAME_FACTOR <= n <= total:
        raise ValueError(f"nframes should be in [{FRAME_FACTOR}, {total}], got {n} (a video of {total} frames)")
    return n


def qwen_vl_utils_indices(total: int, n: int) -> np.ndarray:
    """`torch.linspace(0, total - 1, n).round().long()`, as qwen-vl-utils' readers take them (float32, half to
    even: computed with torch so the rounding is theirs)."""
    import torch

    return torch.linspace(0, total - 1, n).round().long().numpy()


def vlmevalkit_indices(total: int, video_fps: float, fps: float, frames_limit: int) -> np.ndarray:
    """VLMEvalKit's TimeLens datasets: `int(duration * fps)` frames `video_fps / fps` apart, or `frames_limit`
    frames spread over the video past that; clamped to the video (indices may repeat where fps > video_fps)."""
    duration = total / video_fps if video_fps > 0 else 0.0
    required = int(duration * fps) if duration > 0 else 0
    if required > frames_limit:
        step = total / (frames_limit + 1)
        idx = [int(i * step) for i in range(1, frames_limit + 1)]
    else:
        step = video_fps / fps
        idx = [int(i * step) for i in range(required)]
    return np.asarray([min(max(0, i), total - 1) for i in idx], dtype=int)


def video_frame_size(num_frames: int, height: int, width: int, factor: int, min_pixels: int, total_pixels: int,
                     max_pixels: int | None = None, frame_list: bool = False) -> tuple[int, int]:
    """The (height, width) qwen-vl-utils 0.0.14's `fetch_video` gives every frame of a video: a file's frames
    resized once; a frame list's frames first each within [min_pixels, max_pixels] (`fetch_image`), the list padded
    to an even count, then the same video rule."""
    if frame_list:
        height, width = smart_resize(height, width, factor, min_pixels, max_pixels or VIDEO_MAX_TOKEN_NUM * factor ** 2)
        num_frames = _ceil_by(num_frames, FRAME_FACTOR)
    most = max(min(VIDEO_MAX_TOKEN_NUM * factor ** 2, total_pixels / num_frames * FRAME_FACTOR),
               int(min_pixels * 1.05))
    if max_pixels is not None:
        most = min(max_pixels, most)
    return smart_resize(height, width, factor, min_pixels, most)


@dataclass(frozen=True)
class Budget:
    """A profile's `frames: fps` budget: the rate, which rule picks the frames, and the pixel rule's numbers."""

    fps: float
    indices: str
    """`qwen_vl_utils` (a video file given to qwen-vl-utils) or `vlmevalkit` (VLMEvalKit's TimeLens datasets)."""
    min_pixels: int
    total_pixels: int
    max_pixels: int | None = None
    min_frames: int = FPS_MIN_FRAMES
    max_frames: int = FPS_MAX_FRAMES
    frames_limit: int = 0
    """`vlmevalkit`: most frames per video."""
    frame_list: bool = False
    """The frames reach qwen-vl-utils as a list of images (VLMEvalKit), not as a video file."""

    @classmethod
    def of(cls, frames: dict, pixels: dict) -> Budget:
        if frames.get("indices") not in INDEX_RULES:
            raise ValueError(f"frames.indices must be one of {INDEX_RULES}, got {frames.get('indices')!r}")
        return cls(fps=float(frames["fps"]), indices=frames["indices"], min_pixels=int(pixels["min_pixels"]),
                   total_pixels=int(pixels["total_pixels"]),
                   max_pixels=int(pixels["max_pixels"]) if pixels.get("max_pixels") is not None else None,
                   min_frames=int(frames.get("min_frames", FPS_MIN_FRAMES)),
                   max_frames=int(frames.get("max_frames", FPS_MAX_FRAMES)),
                   frames_limit=int(frames.get("frames_limit", 0)), frame_list=bool(pixels.get("frame_list", False)))

    def indices_for(self, total: int, video_fps: float) -> np.ndarray:
        """The source frame indices this budget takes from a video of `total` frames at `video_fps`."""
        if self.indices == "vlmevalkit":
            return vlmevalkit_indices(total, video_fps, self.fps, self.frames_limit)
        return qwen_vl_utils_indices(total, qwen_vl_utils_nframes(total, video_fps, self.fps, self.min_frames,
                                                                  self.max_frames))

    def frame_size(self, num_frames: int, height: int, width: int, factor: int) -> tuple[int, int]:
        return video_frame_size(num_frames, height, width, factor, self.min_pixels, self.total_pixels,
                                self.max_pixels, self.frame_list)

    def words(self, factor: int | None = None) -> str:
        """The budget in one line (`factor`: the model's, where known)."""
        if self.indices == "vlmevalkit":
            frames = f"{self.fps:g} fps, at most {self.frames_limit:,} frames (VLMEvalKit's TimeLens sampling)"
        else:
            frames = f"{self.fps:g} fps within {self.min_frames}-{self.max_frames} frames (qwen-vl-utils 0.0.14)"
        cap = f", at most {self.max_pixels:,} px a frame" if self.max_pixels else ""
        cells = f" = {self.total_pixels / factor ** 2:,.0f} cells of {factor}x{factor}" if factor else ""
        return (f"{frames}; at least {self.min_pixels:,} px a frame{cap}, {self.total_pixels:,} px per video"
                f"{cells}")
