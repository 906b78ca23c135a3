"""Checkpoints without training, for the tests of the run lifecycle and its fault classes: a step folder that
honours the checkpoint contract (an export file, the engine folder, rank 0's run state, meta.json written last by
`vtg.checkpoints.finalize`), and the config that points every root into a test's folder."""

from __future__ import annotations

from pathlib import Path

from training.dist import rng_state
from training.lifecycle import write_rank_state
from vtg import checkpoints as ckpt
from vtg.config import load_config

REPO = Path(__file__).resolve().parents[2]
META = {"data_version": "d1", "git_commit": "c", "mlflow_run_id": None, "config_hash": "h", "finetune": "full",
        "base": "tiny", "train_hash": "k1", "rl_hash": "k1", "world_size": 1}


def roots_config(tmp_path: Path, *overrides: str):
    """params.yaml with the SFT, RL, evaluation and orchestration-state folders under `tmp_path`."""
    return load_config(REPO / "params.yaml", None, [f"train.out_dir={tmp_path / 'sft'}",
                                                    f"rl.out_dir={tmp_path / 'rl'}",
                                                    f"evaluate.out_dir={tmp_path / 'eval'}",
                                                    f"orchestration.state_dir={tmp_path / 'state'}", *overrides])


def fake_checkpoint(root: Path, step: int, keep_last: int = 3, protect=(), **meta) -> Path:
    """A complete, verifiable step checkpoint under `root` (`meta` overrides `META`)."""
    tmp = ckpt.temp_dir_for(root, step)
    ckpt.export_dir(tmp).mkdir(parents=True)
    (ckpt.export_dir(tmp) / "model.safetensors").write_text(f"weights {step}")
    ckpt.engine_dir(tmp).mkdir()
    write_rank_state(tmp, 0, {"run": {"step": step}, "guard": {}, "rng": rng_state(), "num_workers": 0})
    return ckpt.finalize(root, step, {**META, **meta}, {}, keep_last=keep_last, protect=protect)
