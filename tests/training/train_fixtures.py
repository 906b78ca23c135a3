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
    video_id, idx = key.rsplit("-", 1)
    meta = SampleMeta(key=key, video_id=video_id, window_index=int(idx), window_start_s=0.0,
                      window_end_s=duration, frame_timestamps=ts, fps=num_frames / duration,
                      num_frames=num_frames, queries=queries, split=split, source="fixture")
    return meta, [encode_jpeg(f) for f in frames]


def write_fixture_shards(root: str | Path, n_train: int = 24, n_val: int = 6, shards_per_split: int = 2,
                         seed: int = 0, **kw) -> Path:
    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val), ("test", n_val)):
        samples = [synthetic_window(rng, f"{split}vid{i:03d}-0000", split, **kw) for i in range(n)]
        per = -(-n // shards_per_split)
        for s in range(shards_per_split):
            write_shard(root / split / (SHARD_PATTERN % s), samples[s * per:(s + 1) * per])
    return root


HOOK_CALLS: list[tuple[str, int]] = []


def record_hook(checkpoint_dir: str, step: int) -> None:
    """A post-checkpoint hook for tests (`train_fixtures:record_hook`)."""
    HOOK_CALLS.append((checkpoint_dir, step))


def train_config(shards_dir, out_dir, *overrides: str):
    """The shipped params.yaml with small-run overrides (tiny batches, no tracking, no progress bar)."""
    from vtg.config import load_config

    base = [f"train.shards_dir={shards_dir}", f"train.out_dir={out_dir}", "train.micro_batch_size=4",
            "train.max_steps=4", "train.save_every=2", "train.log_every=1", "train.progress=false",
            "train.data.num_workers=0", "train.data.shuffle_buffer=16", "train.data.sanity_examples=4",
            "tracking.enabled=false", "train.guards.min_steps=1000"]
    return load_config(REPO_ROOT / "params.yaml", None, base + list(overrides))


REPO_ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A callback that keeps everything the loop reports (duck-typed: the loop only calls the hooks)."""

    def __init__(self):
        self.info, self.steps, self.skips, self.checkpoints, self.summary = None, [], [], [], None

    def on_train_start(self, info): self.info = info
    def on_step(self, step, metrics): self.steps.append((step, metrics))
    def on_skip(self, step, info): self.skips.append((step, info))
    def on_checkpoint(self, path, step): self.checkpoints.append((str(path), step))
    def on_train_end(self, summary): self.summary = summary
    def checkpoint_meta(self): return {}
