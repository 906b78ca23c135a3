"""Frame extraction: which decoded candidate frames represent a window, and at what timestamps.

`uniform` spreads frames evenly in time (a fixed count, or a fixed rate when `fps` > 0). `adaptive` spends the
same budget, a share `mix` uniformly and the rest in proportion to content change, so frames gather around cuts
and motion. Both return distinct candidate positions, in time order: a window with fewer candidates than the
budget gets fewer frames, never a repeated one (shard contract 2: a repeated frame would carry the same time
twice and tell the model a wrong frame rate).
"""

from __future__ import annotations

import numpy as np

from vtg.clock import nearest


def window_candidates(cand_t: np.ndarray, start: float, end: float) -> np.ndarray:
    """Positions of candidates inside [start, end) (at least the nearest one)."""
    inside = np.flatnonzero((cand_t >= start - 1e-6) & (cand_t < end - 1e-6))
    return inside if len(inside) else nearest(cand_t, np.array([(start + end) / 2]))


def uniform_frames(cand_t: np.ndarray, start: float, end: float, num_frames: int,
                   fps: float = 0.0) -> np.ndarray:
    """Candidate positions nearest to `n` evenly spaced times from the window's first frame to its last, as the
    families' processors and their published inference code sample a clip (`linspace(0, total - 1, n)` over its
    frames, qwen-vl-utils and transformers' video processors): the first temporal patch starts at the window's
    start, where the answer's clock starts, in training as at inference (issue 35; bin centres, the rule before,
    put a window's first frame 0.25-0.5 s in, so a tiny model never saw the first patch at time 0 and failed on
    whole videos, which start there)."""
    length = end - start
    n = max(1, round(length * fps)) if fps > 0 else num_frames
    pool = window_candidates(cand_t, start, end)
    if len(pool) == 0:
        return pool
    targets = np.linspace(cand_t[pool[0]], cand_t[pool[-1]], n)
    return np.unique(pool[nearest(cand_t[pool], targets)])


def _spread(idx: np.ndarray, m: int) -> np.ndarray:
    """Make sorted positions distinct when there are enough candidates (ties pushed apart, order kept)."""
    n = len(idx)
    if n > m:
        return idx
    idx = idx.copy()
    for k in range(1, n):
        idx[k] = max(idx[k], idx[k - 1] + 1)
    for k in range(n - 1, -1, -1):
        idx[k] = min(idx[k], m - n + k, idx[k + 1] - 1 if k + 1 < n else m - 1)
    return idx


def adaptive_frames(cand_t: np.ndarray, cand_change: np.ndarray, start: float, end: float,
                    num_frames: int, mix: float = 0.5) -> np.ndarray:
    """Same budget as uniform, placed by the inverse CDF of (mix * uniform + (1 - mix) * change)."""
    pool = window_candidates(cand_t, start, end)
    change = np.asarray(cand_change, float)[pool]
    m = len(pool)
    density = np.full(m, mix / m)
    if change.sum() > 0:
        density += (1 - mix) * change / change.sum()
    else:
        density += (1 - mix) / m
    cdf = np.cumsum(density)
    cdf /= cdf[-1]
    q = (np.arange(num_frames) + 0.5) / num_frames
    local = np.minimum(np.searchsorted(cdf, q), m - 1)
    return np.unique(pool[_spread(local, m)])


def candidate_change(change: np.ndarray, cand_idx: np.ndarray) -> np.ndarray:
    """Per candidate: the largest frame change since the previous candidate (so a cut between is seen)."""
    out = np.zeros(len(cand_idx))
    prev = 0
    for k, i in enumerate(cand_idx):
        out[k] = change[prev:i + 1].max() if i >= prev else 0.0
        prev = i + 1
    return out
