"""Synthetic, contract-true shards without Beam: for tests, benchmarks and the GPU check (`training.gpu_check`),
where the real preprocess job is not wanted or not installed. They are written with the real writer
(`vtg.shards.write_shard`), so producers and consumers cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vtg.shards import SHARD_CONTRACT, SHARD_PATTERN, QueryMeta, SampleMeta, encode_jpeg, write_shard

_COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}


def synthetic_window(rng: np.random.Generator, key: str, split: str, num_frames: int = 8, size: int = 56,
                     duration: float = 12.0, square: int = 16, source: str = "synthetic"
                     ) -> tuple[SampleMeta, list[bytes]]:
    """One contract-true window without Beam: a coloured square over a random span per query (two queries), the
    rest grey. For tests and the GPU check, where the real preprocess job is not wanted or not installed."""
    ts = [(i + 0.5) * duration / num_frames for i in range(num_frames)]
    queries, frames = [], np.full((num_frames, size, size, 3), 128, np.uint8)
    for colour in rng.choice(list(_COLOURS), size=2, replace=False):
        a, b = sorted(rng.choice(num_frames, size=2, replace=False))
        y, x = rng.integers(0, size - square, size=2)
        frames[a:b + 1, y:y + square, x:x + square] = _COLOURS[colour]
        span = (round(ts[a] - duration / num_frames / 2, 1), round(ts[b] + duration / num_frames / 2, 1))
        queries.append(QueryMeta(text=f"the {colour} square appears", windows=[span],
                                 annotation_id=f"{key}.{colour}"))
    video_id, idx = key.rsplit("-", 1)
    meta = SampleMeta(key=key, video_id=video_id, window_index=int(idx), window_start_s=0.0,
                      window_end_s=duration, frame_timestamps=ts, fps=num_frames / duration,
                      num_frames=num_frames, queries=queries, split=split, source=source, contract=SHARD_CONTRACT)
    return meta, [encode_jpeg(f) for f in frames]


def write_synthetic_shards(root: str | Path, n_train: int = 24, n_val: int = 6, shards_per_split: int = 2,
                           seed: int = 0, **window: Any) -> Path:
    """`<root>/{train,val,test}/shard-NNNNNN.tar` of `synthetic_window`s (val and test get `n_val` each)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val), ("test", n_val)):
        samples = [synthetic_window(rng, f"{split}vid{i:03d}-0000", split, **window) for i in range(n)]
        per = -(-n // shards_per_split)
        for s in range(shards_per_split):
            write_shard(root / split / (SHARD_PATTERN % s), samples[s * per:(s + 1) * per])
    return root
