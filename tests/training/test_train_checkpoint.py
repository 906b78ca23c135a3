"""The checkpoint directory contract: atomic finalize, pointers, pruning, best, corrupt-dir errors."""

import json

import pytest

from training.checkpoint import (
    finalize,
    latest_checkpoint,
    list_checkpoints,
    read_checkpoint_meta,
    resolve_checkpoint,
    temp_dir_for,
    update_best,
)
from vtg.errors import VTGError

META = {"data_version": "d", "git_commit": "c", "mlflow_run_id": None, "config_hash": "h",
        "finetune": "full", "base": "tiny"}


def _save(root, step, keep=2):
    tmp = temp_dir_for(root, step)
    (tmp / "hf").mkdir(parents=True)
    (tmp / "hf" / "config.json").write_text("{}")
    return finalize(root, step, dict(META), {"train": {}}, keep_last=keep)


def test_finalize_points_latest_and_prunes(tmp_path):
    for step in (10, 20, 30):
        _save(tmp_path, step)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000020", "step-000030"]
    assert latest_checkpoint(tmp_path).name == "step-000030"
    assert resolve_checkpoint(tmp_path / "latest").name == "step-000030"
    assert resolve_checkpoint(tmp_path).name == "step-000030"
    meta = read_checkpoint_meta(tmp_path / "latest")
    assert meta["step"] == 30 and meta["data_version"] == "d"
    assert not list(tmp_path.glob(".tmp-*"))


def test_best_is_never_pruned(tmp_path):
    _save(tmp_path, 10)
    assert update_best(tmp_path, tmp_path / "step-000010", "r1@0.5", 0.5)
    _save(tmp_path, 20, keep=1)
    assert not update_best(tmp_path, tmp_path / "step-000020", "r1@0.5", 0.4)
    _save(tmp_path, 30, keep=1)
    assert (tmp_path / "step-000010").is_dir() and not (tmp_path / "step-000020").exists()
    assert json.loads((tmp_path / "best.json").read_text())["step"] == 10
    assert update_best(tmp_path, tmp_path / "latest", "r1@0.5", 0.9)
    assert resolve_checkpoint(tmp_path / "best").name == "step-000030"


def test_half_written_and_corrupt_checkpoints_are_clear_errors(tmp_path):
    half = tmp_path / "step-000005"
    (half / "hf").mkdir(parents=True)
    with pytest.raises(VTGError, match="incomplete checkpoint"):
        read_checkpoint_meta(half)
    (half / "meta.json").write_text("{not json")
    with pytest.raises(VTGError, match="corrupt checkpoint metadata"):
        read_checkpoint_meta(half)
    (half / "meta.json").write_text(json.dumps({"step": 5}))
    with pytest.raises(VTGError, match="lacks"):
        read_checkpoint_meta(half)
    with pytest.raises(VTGError, match="no checkpoint directory"):
        read_checkpoint_meta(tmp_path / "nope")
    assert latest_checkpoint(tmp_path) is None
