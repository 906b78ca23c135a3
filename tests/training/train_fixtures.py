"""Synthetic fixture shards with the DESIGN.md §3 contract, written with `vtg.shards.write_shard`.

Each window shows a coloured square over one random span (the queried event); the rest is grey. Two queries per
window so that the one-example-per-query expansion is exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vtg.shards import SHARD_PATTERN, QueryMeta, SampleMeta, encode_jpeg, write_shard

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}


def synthetic_window(rng: np.random.Generator, key: str, split: str, num_frames: int = 8, size: int = 56,
                     duration: float = 12.0) -> tuple[SampleMeta, list[bytes]]:
    ts = [(i + 0.5) * duration / num_frames for i in range(num_frames)]
    queries, frames = [], np.full((num_frames, size, size, 3), 128, np.uint8)
    for colour in rng.choice(list(COLOURS), size=2, replace=False):
        a, b = sorted(rng.choice(num_frames, size=2, replace=False))
        y, x = rng.integers(0, size - 16, size=2)
        frames[a:b + 1, y:y + 16, x:x + 16] = COLOURS[colour]
        span = (round(ts[a] - duration / num_frames / 2, 1), round(ts[b] + duration / num_frames / 2, 1))
        queries.append(QueryMeta(text=f"the {colour} square appears", windows=[span],
                                 annotation_id=f"{key}.{colour}"))
    video_id, idx = key.rsplit(".", 1)
    meta = SampleMeta(key=key, video_id=video_id, window_index=int(idx), window_start_s=0.0,
                      window_end_s=duration, frame_timestamps=ts, fps=num_frames / duration,
                      num_frames=num_frames, queries=queries, split=split, source="fixture")
    return meta, [encode_jpeg(f) for f in frames]


def write_fixture_shards(root: str | Path, n_train: int = 24, n_val: int = 6, shards_per_split: int = 2,
                         seed: int = 0, **kw) -> Path:
    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val), ("test", n_val)):
        samples = [synthetic_window(rng, f"{split}vid{i:03d}.0", split, **kw) for i in range(n)]
        per = -(-n // shards_per_split)
        for s in range(shards_per_split):
            write_shard(root / split / (SHARD_PATTERN % s), samples[s * per:(s + 1) * per])
    return root
