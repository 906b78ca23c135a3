"""Synthetic fixture shards with the docs/architecture.md contract, written with `vtg.shards.write_shard`.

Each window shows a coloured square over one random span (the queried event); the rest is grey. Two queries per
window so that the one-example-per-query expansion is exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vtg import shards
from vtg.shards import SampleMeta
from vtg.testing import shards as synthetic


def synthetic_window(rng: np.random.Generator, key: str, split: str, **window) -> tuple[SampleMeta, list[bytes]]:
    """One fixture window (the shared synthetic writer, `source: fixture`)."""
    return synthetic.synthetic_window(rng, key, split, source="fixture", **window)


def write_undecodable_shard(root: str | Path, n: int = 4) -> Path:
    """`<root>/train/shard-000000.tar` of `n` contract-true windows whose frames are raw pixel bytes, not JPEG: a
    shard every sample of which the loader skips as bad data. Returns the shard's path."""
    rng = np.random.default_rng(0)
    raw = np.full((56, 56, 3), 128, np.uint8).tobytes()
    samples = []
    for i in range(n):
        meta, _ = synthetic_window(rng, f"trainvid{i:03d}-0000", "train")
        samples.append((meta, [raw] * meta.num_frames))
    path = Path(root) / "train" / (shards.SHARD_PATTERN % 0)
    shards.write_shard(path, samples)
    return path


def write_fixture_shards(root: str | Path, n_train: int = 24, n_val: int = 6, shards_per_split: int = 2,
                         seed: int = 0, **kw) -> Path:
    return synthetic.write_synthetic_shards(root, n_train, n_val, shards_per_split, seed, source="fixture", **kw)


def three_paths(model, tokenizer, shards_root, split: str = "train") -> dict[str, dict]:
    """The first `split` sample's encoded inputs as training's reader, the RL rollout and evaluation build them
    (issue 22's time invariant: tests/training/test_time_invariant.py, test_family_parity.py, test_clock_*.py)."""
    from training.data import read_examples
    from training.rl.rollout import encode_prompts
    from vtg.model.generation import encode_queries
    from vtg.model.processing import VisionParams
    from vtg.queries import ReadStats, iter_examples

    vp = VisionParams.from_model(model)
    urls = shards.list_shards(shards_root, split)
    [train], errors = read_examples(urls, tokenizer, vp, 1, 4096)
    assert errors == []
    [ex] = list(iter_examples(urls, ReadStats(), 1))
    [rl] = encode_prompts(tokenizer, [ex], 1, vp)
    [ev] = encode_queries(tokenizer, [ex], vp)
    return {"training": train, "rl": rl, "evaluation": ev}


HOOK_CALLS: list[tuple[str, int]] = []


def record_hook(checkpoint_dir: str, step: int) -> None:
    """A post-checkpoint hook for tests (`support.train_fixtures:record_hook`)."""
    HOOK_CALLS.append((checkpoint_dir, step))


def train_config(shards_dir, out_dir, *overrides: str):
    """The shipped params.yaml with small-run overrides (tiny batches, no tracking, no progress bar)."""
    from vtg.config import load_config

    base = [f"train.shards_dir={shards_dir}", f"train.out_dir={out_dir}", "train.micro_batch_size=4",
            "train.max_steps=4", "train.save_every=2", "train.log_every=1", "train.progress=false",
            "train.data.num_workers=0", "train.data.shuffle_buffer=16", "train.data.sanity_examples=4",
            "tracking.enabled=false", "train.guards.min_steps=1000", "train.teach.steps=0",
            "evaluate.forgetting.suite="]  # the suites' default paths are relative: a checkout after `make run` has them
    return load_config(REPO_ROOT / "params.yaml", None, base + list(overrides))


REPO_ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A callback that keeps everything the loop reports (duck-typed: the loop only calls the hooks)."""

    def __init__(self):
        self.info, self.steps, self.skips, self.checkpoints, self.summary = None, [], [], [], None
        self.error = None

    def on_train_start(self, info): self.info = info
    def on_step(self, step, metrics): self.steps.append((step, metrics))
    def on_skip(self, step, info): self.skips.append((step, info))
    def on_checkpoint(self, path, step): self.checkpoints.append((str(path), step))
    def on_train_end(self, summary): self.summary = summary
    def on_train_error(self, error): self.error = error
    def checkpoint_meta(self): return {}
