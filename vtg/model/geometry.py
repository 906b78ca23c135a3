"""How big a clip's frames become, and how many tokens and frames a family's policy gives it: the resize rules of
Qwen's processors in plain Python (no torch, so the Beam workers can sample by a family's policy without loading
transformers). Parity with transformers' own `smart_resize` functions: tests/training/test_family_parity.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    """A family's video geometry: patch and merge sizes, the pixel bounds and what they bound."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    pixel_scope: str = "frame"
    """`frame`: the bounds hold per frame (Qwen2-VL's image processor); `video`: for t x h x w (Qwen3-VL's)."""

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def resized_size(num_frames: int, height: int, width: int, g: Geometry) -> tuple[int, int]:
    """(height, width) every frame of a clip is resized to: multiples of patch x merge, the aspect ratio kept,
    the pixels within the bounds (per frame, or over the clip's frames rounded to temporal patches)."""
    factor = g.factor
    if g.pixel_scope == "video":
        num_frames = max(num_frames, g.temporal_patch_size)
        if height < factor or width < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
        t, n = round(num_frames / g.temporal_patch_size) * g.temporal_patch_size, num_frames
    else:
        t = n = 1
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if t * h_bar * w_bar > g.max_pixels:
        beta = math.sqrt(n * height * width / g.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t * h_bar * w_bar < g.min_pixels:
        beta = math.sqrt(g.min_pixels / (n * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def video_tokens(num_frames: int, height: int, width: int, g: Geometry) -> int:
    """LLM tokens of a clip of `num_frames` frames of height x width (temporal patches x merged patches)."""
    h, w = resized_size(num_frames, height, width, g)
    groups = -(-num_frames // g.temporal_patch_size)
    return groups * (h // g.patch_size) * (w // g.patch_size) // g.merge_size ** 2


def policy_frames(duration_s: float, height: int, width: int, g: Geometry, fps: float, min_frames: int,
                  max_frames: int, max_tokens: int = 0) -> int:
    """Frames the family's policy samples from `duration_s` seconds: `fps` per second within [min_frames,
    max_frames], rounded to whole temporal patches, and fewer while the clip would pass `max_tokens` (0: no
    budget; never below one temporal patch)."""
    n = min(max(round(duration_s * fps), min_frames), max_frames)
    n = max(g.temporal_patch_size, n - n % g.temporal_patch_size)
    while max_tokens and n > g.temporal_patch_size and video_tokens(n, height, width, g) > max_tokens:
        n -= g.temporal_patch_size
    return n


def published_geometry(data: dict, pixel_scope: str = "frame") -> Geometry:
    """The geometry of a published processor config (`min_pixels`/`max_pixels`, or transformers 5's
    `size.shortest_edge`/`longest_edge`)."""
    size = data.get("size") if isinstance(data.get("size"), dict) else {}
    return Geometry(int(data["patch_size"]), int(data["merge_size"]), int(data["temporal_patch_size"]),
                    int(data.get("min_pixels", size.get("shortest_edge"))),
                    int(data.get("max_pixels", size.get("longest_edge"))), pixel_scope)
