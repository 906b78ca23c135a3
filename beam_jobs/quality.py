"""Quality scores of a window and the drop decision (thresholds from `preprocess.quality`).

Blur is measured as the width of a frame's steepest edges (`edge_width`), not as the variance of the
Laplacian: the Laplacian's variance scales with contrast, so a plain, low-contrast but perfectly sharp scene
scored as low as a Gaussian-blurred one (on the plain-background corpus clean windows went down to 1.2 while
blurred ones reached 6.1). An edge's width (local intensity range / slope at its steepest point) does not depend
on its contrast: a step edge is 2 px wide whatever its height, while a Gaussian blur of sigma s spreads it over
~2.5 s px (up to the neighbourhood's side). Measured on both synthetic corpora at 56 px: clean windows <= 2.3,
re-encoded near-duplicates <= 3.0, blurred defects (sigma 6 at 112 px) >= 4.1.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from vtg.config.preprocess import QualityConfig

EDGE_RADIUS = 4
"""Half-side of the square over which an edge's intensity range is measured (px at the analysis size)."""
EDGE_MIN_CONTRAST = 48
"""Pixels whose neighbourhood spans less than this (sum over B, G, R of max - min) are not edges: below it,
quantisation steps and chroma compression noise look like 1-px 'edges' even in a blurred frame."""
EDGE_TOP_FRACTION = 0.01
"""Share of the frame's pixels (the steepest edge pixels) whose widths are pooled (median)."""

_KERNEL = cv2.getStructuringElement(cv2.MORPH_RECT, (2 * EDGE_RADIUS + 1, 2 * EDGE_RADIUS + 1))


def edge_width(frame: np.ndarray) -> float:
    """Median width in pixels of the steepest edges of a BGR (or grey) uint8 frame, NaN if it has no edge.

    Per pixel: slope = (|Sobel x| + |Sobel y|) / 8 summed over the colour channels (a ramp of s levels per pixel
    gives s per channel), range = max - min over the (2 EDGE_RADIUS + 1)^2 neighbourhood summed over the
    channels. Among pixels with range >= EDGE_MIN_CONTRAST, the EDGE_TOP_FRACTION steepest give range / slope,
    the number of pixels the edge needs to cross its local range. Colour (not luma) so that an object on an
    equally bright background still has edges. Resolution matters (widths are in pixels), so callers score
    frames resized to one analysis size (`quality.blur_size`)."""
    f = frame if frame.ndim == 3 else frame[:, :, None]
    slope = np.abs(cv2.Sobel(f, cv2.CV_16S, 1, 0))  # 8 x slope: |dx| + |dy| <= 2040, exact in int16
    slope += np.abs(cv2.Sobel(f, cv2.CV_16S, 0, 1))
    # max >= min, so the uint8 difference is exact (OpenCV's uint8 -> int16 subtract is ~5x slower)
    spread = cv2.subtract(cv2.dilate(f, _KERNEL), cv2.erode(f, _KERNEL)).astype(np.int16)
    if f.shape[2] > 1:  # channel sums (exact in int16: <= 3 x 2040)
        ones = np.ones((1, f.shape[2]), np.float32)
        slope, spread = cv2.transform(slope, ones), cv2.transform(spread, ones)
    slope, spread = slope.ravel(), spread.ravel()
    edges = np.flatnonzero(spread >= EDGE_MIN_CONTRAST)
    if len(edges) == 0:
        return math.nan
    s = slope[edges]
    k = max(1, min(len(s), round(EDGE_TOP_FRACTION * spread.size)))
    top = edges[s >= np.partition(s, len(s) - k)[len(s) - k]]  # the k steepest, and every tie with them
    w = np.sort(8.0 * spread[top] / np.maximum(slope[top], 1))
    return float((w[(len(w) - 1) // 2] + w[len(w) // 2]) / 2)  # the median (np.median costs more than the rest)


def window_quality(edge_widths: np.ndarray, brightness: np.ndarray, highlight: np.ndarray, width: int,
                   height: int) -> dict[str, float]:
    """Scores stored in the sample metadata: resolution (shorter side), edge width, median brightness (mean
    luma of the candidate frames) and median highlight (brightest luma of each candidate). Edge width is the
    10th percentile over the window's scored frames that have edges (a sharp window needs only some sharp
    frames: objects come and go over plain backgrounds; blur widens the edges of every frame); 0.0 when no
    frame has an edge (a flat window cannot be judged blurry)."""
    w = np.asarray(edge_widths, float)
    w = w[np.isfinite(w)]
    return {
        "resolution": float(min(width, height)),
        "edge_width": round(float(np.percentile(w, 10)), 3) if len(w) else 0.0,
        "brightness": round(float(np.median(brightness)), 3),
        "highlight": round(float(np.median(highlight)), 3),
    }


def quality_drop_reason(scores: dict[str, float], cfg: QualityConfig) -> str | None:
    """The first failed check, or None. Darkness is checked before blur (dark frames also look flat). A window
    is too dark when it is dark on average and has no bright content either: a title card or credits (bright
    text on black) is dark on average but not underexposed."""
    if scores["resolution"] < cfg.min_resolution:
        return "low_resolution"
    if scores["brightness"] < cfg.min_brightness and scores["highlight"] < cfg.min_highlight:
        return "too_dark"
    if scores["brightness"] > cfg.max_brightness:
        return "washed_out"
    if scores["edge_width"] > cfg.max_edge_width:
        return "blurry"
    return None
