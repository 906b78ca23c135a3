"""Resuming over damaged checkpoints (issue 15), end to end in-process: a truncated rank file makes the resume
fall back to the previous checkpoint with a warning (and finish, bit-exact); a crafted pickle in a checkpoint is
never executed; after a resume MLflow holds every step once."""

import logging
import shutil

import pytest
import torch
from support.train_fixtures import train_config

from training.sft import train
from vtg import checkpoints as ckpt
from vtg.errors import VTGError


class _Payload:
    """Unpickling this creates `marker`: proof that a checkpoint file ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_truncated_rank_file_falls_back_to_the_previous_checkpoint(shards_dir, tmp_path, caplog):
    out = tmp_path / "ck"
    first = train(train_config(shards_dir, out, "train.max_steps=4", "train.save_every=2"))
    rank_file = ckpt.rank_state_file(out / "step-000004", 0)
    rank_file.write_bytes(rank_file.read_bytes()[:20])  # a torn write; step-000002 is intact
    with caplog.at_level(logging.WARNING):
        resumed = train(train_config(shards_dir, out, "train.max_steps=6", "train.save_every=2"))
    warned = [r.getMessage() for r in caplog.records if "step-000004" in r.getMessage()]
    assert warned and rank_file.name in warned[0] and "skipping" in warned[0]
    assert resumed["step"] == 6 and ckpt.read_checkpoint_meta(out / ckpt.LATEST, verify=True)["step"] == 6
    assert resumed["losses"][:4] == first["losses"]  # steps 3-4 redone from step 2, bit for bit


def test_crafted_pickle_in_a_checkpoint_is_never_executed(shards_dir, tmp_path):
    out, marker = tmp_path / "ck", tmp_path / "pwned"
    train(train_config(shards_dir, out, "train.max_steps=2", "train.save_every=2"))
    step = out / "step-000002"
    torch.save({"run": _Payload(marker)}, ckpt.engine_dir(step) / "rank-0.pt")  # the per-rank file, old and new
    with pytest.raises(VTGError, match="sha256|bytes") as e:
        train(train_config(shards_dir, out, "train.max_steps=4", f"train.resume={step}"))
    assert "\n" not in str(e.value) and "train.resume" in str(e.value)
    assert not marker.exists()


def test_mlflow_holds_each_step_once_after_a_resume(shards_dir, tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "ck"
    args = ("tracking.enabled=true", f"tracking.tracking_uri={uri}", "tracking.experiment=t",
            "train.max_steps=4", "train.save_every=2")
    train(train_config(shards_dir, out, *args), stop_after=3)
    # the run died after logging step 3, before its checkpoint was saved
    shutil.rmtree(out / "step-000003")
    train(train_config(shards_dir, out, *args))
    meta = ckpt.read_checkpoint_meta(out / ckpt.LATEST)
    assert meta["step"] == 4
    mlflow.set_tracking_uri(uri)
    history = mlflow.MlflowClient().get_metric_history(meta["mlflow_run_id"], "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
