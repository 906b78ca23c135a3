"""Helpers for evaluation tests: synthetic shards (train/val/test) and a tiny checkpoint honouring the contract.

A module with a unique name (not `conftest`), so test files in several directories can import it together."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vtg.shards import QueryMeta, SampleMeta, encode_jpeg, write_shard

N_FRAMES = 4
SIZE = 56


def make_sample(video: str, index: int, duration: float, windows: list[list[tuple[float, float]]],
                split: str, source: str = "synthetic:annotations.jsonl") -> tuple[SampleMeta, list[bytes]]:
    """A window whose frames show a red square while the first query's moment is on screen."""
    ts = [duration * (i + 0.5) / N_FRAMES for i in range(N_FRAMES)]
    jpegs = []
    for t in ts:
        frame = np.full((SIZE, SIZE, 3), 128, np.uint8)
        if any(s <= t <= e for s, e in windows[0]):
            frame[10:30, 10:30] = (220, 30, 30)
        jpegs.append(encode_jpeg(frame))
    meta = SampleMeta(
        key=f"{video}.{index}", video_id=video, window_index=index, window_start_s=0.0, window_end_s=duration,
        frame_timestamps=ts, fps=N_FRAMES / duration, num_frames=N_FRAMES,
        queries=[QueryMeta(text=f"when does the red square appear {qi}", windows=w, annotation_id=f"{video}-{qi}")
                 for qi, w in enumerate(windows)],
        split=split, source=source)
    return meta, jpegs


def write_fixture_shards(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 3), ("test", 2)):
        samples = []
        for i in range(n):
            duration = float(rng.uniform(10, 20))
            s = float(rng.uniform(0, duration - 4))
            windows = [[(round(s, 1), round(s + 3, 1))]]
            if i == 0:  # a second query with two ground-truth windows
                windows.append([(0.0, 2.0), (duration - 3, duration)])
            source = "charades:x.txt" if i % 2 else "synthetic:annotations.jsonl"
            samples.append(make_sample(f"{split}v{i}", 0, duration, windows, split, source))
        write_shard(root / split / "shard-000000.tar", samples)
    return root


def _examples(shards: Path, split: str):
    from vtg.queries import ReadStats, iter_examples

    return list(iter_examples([str(shards / split / "shard-000000.tar")], ReadStats()))


def train_briefly(model_dir: Path, shards: Path, steps: int, seed: int = 0) -> None:
    """A few full fine-tuning steps (plain AdamW) so the model emits answers in the canonical format."""
    import torch

    from vtg.model.modeling import load_model_and_tokenizer
    from vtg.model.processing import answer_text, collate, encode_example, model_inputs

    torch.manual_seed(seed)
    model, tok = load_model_and_tokenizer(model_dir, trainable=True)
    encoded = [encode_example(tok, ex.frames, ex.timestamps, ex.query, answer_text(ex.windows))
               for ex in _examples(shards, "train")]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    for step in range(steps):
        batch = model_inputs(collate(encoded[(step * 8) % len(encoded):][:8], tok.pad_token_id))
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    model.save_pretrained(model_dir)


def make_checkpoint(root: Path, step: int, shards: Path, train_steps: int, run_id: str = "",
                    extra_meta: dict | None = None) -> Path:
    """A checkpoint dir honouring training's contract (temp dir -> finalize: meta last, `latest` moved);
    `extra_meta` e.g. `{"stage": "rl", "parent_checkpoint": ..., "parent_step": ...}` for an RL checkpoint."""
    import shutil

    from vtg.checkpoints import HF_DIR, finalize, temp_dir_for
    from vtg.model.modeling import build_tiny_model

    tmp = temp_dir_for(root, step)
    shutil.copytree(build_tiny_model(), tmp / HF_DIR)
    if train_steps:
        train_briefly(tmp / HF_DIR, shards, train_steps)
    from vtg.shards import data_version

    # the version of the shards it was "trained" on: decisions on val check it (issue 39 class 4)
    meta = {"step": step, "data_version": data_version(shards), "git_commit": "test", "config_hash": "cfg",
            "finetune": "full", "base": "tiny", "mlflow_run_id": run_id, **(extra_meta or {})}
    return finalize(root, step, meta, {"fixture": True}, keep_last=10)
