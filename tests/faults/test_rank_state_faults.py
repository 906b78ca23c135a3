"""Fault injection on the per-rank run state and on `train.resume` (issue 15), without training: even with its
digest rewritten into meta.json a crafted pickle in a rank file is refused by the loader (JSON, and tensors
under `weights_only=True`), never run; an explicit resume of a checkpoint that does not verify is one clear line."""

import json
from pathlib import Path

import pytest
import torch

from training.lifecycle import read_rank_state, resume_source, write_rank_state
from training.sft import TRAIN_KEY, train_hash
from vtg import checkpoints as ckpt
from vtg.config import load_config
from vtg.errors import VTGError

REPO = Path(__file__).resolve().parents[2]
META = {"data_version": "d", "git_commit": "c", "mlflow_run_id": None, "config_hash": "h", "finetune": "full",
        "base": "tiny"}


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _checkpoint(root: Path, step: int = 2) -> Path:
    tmp = ckpt.temp_dir_for(root, step)
    ckpt.export_dir(tmp).mkdir(parents=True)
    (ckpt.export_dir(tmp) / "model.safetensors").write_bytes(b"w" * 64)
    ckpt.engine_dir(tmp).mkdir()
    from training.dist import rng_state

    write_rank_state(tmp, 0, {"run": {"step": step, "batches": 3}, "guard": {"seen": 2}, "rng": rng_state(),
                               "num_workers": 0})
    return ckpt.finalize(root, step, dict(META), {}, keep_last=3)


def _rewrite_digests(checkpoint: Path) -> None:
    """What an attacker who can also write meta.json would do."""
    meta = json.loads((checkpoint / ckpt.META_FILE).read_text())
    meta[ckpt.FILES_KEY] = ckpt.file_list(checkpoint)
    (checkpoint / ckpt.META_FILE).write_text(json.dumps(meta))


def test_rank_state_round_trips_without_pickle(tmp_path):
    state = read_rank_state(_checkpoint(tmp_path), 0)
    assert state["run"] == {"step": 2, "batches": 3} and state["guard"] == {"seen": 2}
    assert isinstance(state["rng"]["torch"], torch.Tensor) and len(state["rng"]["python"][1]) == 625


@pytest.mark.parametrize("target", ["rank-0.pt", "rank-0.json"])
def test_crafted_rank_file_with_matching_digest_is_refused_not_run(tmp_path, target):
    step, marker = _checkpoint(tmp_path / "ck"), tmp_path / "pwned"
    torch.save({"run": _Payload(marker)}, ckpt.engine_dir(step) / target)
    _rewrite_digests(step)
    assert ckpt.is_complete(step, verify=True)
    with pytest.raises(VTGError, match="unreadable run state for rank 0"):
        read_rank_state(step, 0)
    assert not marker.exists()


def test_explicit_resume_that_does_not_verify_is_one_clear_line(tmp_path):
    step = _checkpoint(tmp_path / "ck")
    weights = ckpt.export_dir(step) / "model.safetensors"
    weights.write_bytes(b"x" * 64)  # same size, other bytes
    cfg = load_config(REPO / "params.yaml", None, [f"train.out_dir={tmp_path / 'ck'}", f"train.resume={step}"])
    with pytest.raises(VTGError) as e:
        resume_source(cfg, "train", TRAIN_KEY, train_hash(cfg), "d")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"train.resume={step}") and "hf/model.safetensors" in msg
    (step / ckpt.META_FILE).unlink()
    with pytest.raises(VTGError, match="no meta.json"):
        resume_source(cfg, "train", TRAIN_KEY, train_hash(cfg), "d")


def test_older_pickled_rank_file_still_loads_with_weights_only(tmp_path):
    import random

    import numpy as np

    step = _checkpoint(tmp_path / "ck")
    ckpt.rank_state_file(step, 0).unlink()  # the layout before JSON: one torch.save'd dict in rank-0.pt
    old_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
               "cuda": None}
    torch.save({"run": {"step": 2}, "guard": {}, "rng": old_rng, "num_workers": 0}, ckpt.rank_rng_file(step, 0))
    state = read_rank_state(step, 0)
    assert state["run"] == {"step": 2} and (state["rng"]["numpy"][1] == old_rng["numpy"][1]).all()
    from training.dist import set_rng_state

    set_rng_state(state["rng"])
    assert random.getstate() == old_rng["python"]
