"""Quality scores of a window and the drop decision (thresholds from `preprocess.quality`)."""

from __future__ import annotations

import numpy as np

from vtg.config.preprocess import QualityConfig


def window_quality(sharpness: np.ndarray, brightness: np.ndarray, width: int, height: int) -> dict[str, float]:
    """Scores stored in the sample metadata: resolution (shorter side), sharpness and median brightness (mean
    luma) over the window's candidate frames. Sharpness is the 90th percentile of the per-frame variance of
    the Laplacian (native resolution): smooth content has sharp moments (objects, edges) that blur removes
    from every frame, so a high percentile separates blur from flat scenes where a median does not."""
    return {
        "resolution": float(min(width, height)),
        "sharpness": round(float(np.percentile(sharpness, 90)), 3),
        "brightness": round(float(np.median(brightness)), 3),
    }


def quality_drop_reason(scores: dict[str, float], cfg: QualityConfig) -> str | None:
    """The first failed check, or None. Darkness is checked before blur (dark frames also look flat)."""
    if scores["resolution"] < cfg.min_resolution:
        return "low_resolution"
    if scores["brightness"] < cfg.min_brightness:
        return "too_dark"
    if scores["brightness"] > cfg.max_brightness:
        return "washed_out"
    if scores["sharpness"] < cfg.min_sharpness:
        return "blurry"
    return None
