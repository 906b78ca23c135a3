"""The checkpoint directory contract (`vtg.checkpoints`): atomic finalize, plain-file pointers, pruning that keeps
a protected (best) checkpoint, moving a root aside instead of deleting it, corrupt-dir errors, verified file lists
(truncated, missing or altered files; no meta.json; older checkpoints without a list)."""

import json
import logging
import shutil

import pytest

from vtg.checkpoints import (
    export_dir,
    finalize,
    is_complete,
    latest_checkpoint,
    list_checkpoints,
    move_aside,
    read_checkpoint_meta,
    read_pointer,
    resolve_checkpoint,
    temp_dir_for,
    write_pointer,
)
from vtg.errors import VTGError

META = {"data_version": "d", "git_commit": "c", "mlflow_run_id": None, "config_hash": "h",
        "finetune": "full", "base": "tiny"}


def _save(root, step, keep=2, protect=()):
    tmp = temp_dir_for(root, step)
    export_dir(tmp).mkdir(parents=True)
    (export_dir(tmp) / "config.json").write_text("{}")
    return finalize(root, step, dict(META), {"train": {}}, keep_last=keep, protect=protect)


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
    pointer = tmp_path / "latest"  # a plain JSON file (DVC's cache, object stores and copies keep it)
    assert pointer.is_file() and not pointer.is_symlink()
    assert json.loads(pointer.read_text()) == {"checkpoint": "step-000030", "step": 30}


def test_pointers_survive_a_copy_and_the_protected_checkpoint_is_never_pruned(tmp_path):
    root, reports = tmp_path / "ckpt", tmp_path / "reports"
    first = _save(root, 10)
    write_pointer(reports / "best.json", first, step=10, metric="r1@0.5", value=0.5)
    _save(root, 20, keep=1, protect=[read_pointer(reports / "best.json")["path"]])
    _save(root, 30, keep=1, protect=[read_pointer(reports / "best.json")["path"]])
    assert (root / "step-000010").is_dir() and not (root / "step-000020").exists()
    assert resolve_checkpoint(reports / "best.json").name == "step-000010"
    copy = tmp_path / "clone"  # a copy elsewhere (a clone, `dvc checkout`): relative pointers still resolve
    shutil.copytree(root, copy / "ckpt")
    shutil.copytree(reports, copy / "reports")
    assert resolve_checkpoint(copy / "reports" / "best.json") == (copy / "ckpt" / "step-000010").resolve()
    assert resolve_checkpoint(copy / "ckpt" / "latest") == (copy / "ckpt" / "step-000030").resolve()


def test_older_symlink_pointer_is_read_and_replaced(tmp_path):
    _save(tmp_path, 10)
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").symlink_to("step-000010")
    assert resolve_checkpoint(tmp_path / "latest").name == "step-000010"
    _save(tmp_path, 20)
    assert not (tmp_path / "latest").is_symlink() and resolve_checkpoint(tmp_path).name == "step-000020"


def test_move_aside_keeps_every_file(tmp_path):
    root = tmp_path / "checkpoints" / "sft"
    _save(root, 10)
    moved = move_aside(root, "other train settings")
    # beside the root, inside `checkpoints/`, outside the stage's DVC output `checkpoints/sft`
    assert not root.exists() and moved.name.startswith("sft-superseded-") and moved.parent == root.parent
    assert read_checkpoint_meta(moved / "step-000010")["step"] == 10
    _save(root, 10)
    assert move_aside(root, "again") != moved and moved.is_dir()


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


def test_what_is_not_a_checkpoint_is_named_for_what_it_is(tmp_path):
    """Issue 21 case 11: a random folder or the `hf/` export inside a good checkpoint was called "incomplete
    checkpoint (... the save was interrupted); delete it"."""
    good = _save(tmp_path / "sft", 10)
    with pytest.raises(VTGError) as e:
        read_checkpoint_meta(good / "hf")
    assert "Hugging Face export inside the checkpoint" in str(e.value) and str(good) in str(e.value)
    other = tmp_path / "my_videos"
    other.mkdir()
    with pytest.raises(VTGError) as e:
        read_checkpoint_meta(other)
    assert "not a checkpoint" in str(e.value) and "interrupted" not in str(e.value)
    (tmp_path / "sft" / "latest").unlink()
    with pytest.raises(VTGError) as e:
        read_checkpoint_meta(tmp_path / "sft")
    assert "without a `latest` pointer" in str(e.value) and str(good) in str(e.value) and "delete" not in str(e.value)


# ---- verified checkpoints (issue 15): a file list in meta.json, checked by size (cheap) or sha256 (verify) ----
def _save_with_weights(root, step, keep=3, payload=b"weights" * 100):
    tmp = temp_dir_for(root, step)
    export_dir(tmp).mkdir(parents=True)
    (export_dir(tmp) / "config.json").write_text("{}")
    (export_dir(tmp) / "model.safetensors").write_bytes(payload)
    (tmp / "engine").mkdir()
    (tmp / "engine" / "rank-0.json").write_text('{"run": {}}')
    return finalize(root, step, dict(META), {"train": {}}, keep_last=keep)


def test_finalize_records_every_file_with_size_and_digest(tmp_path):
    import hashlib

    final = _save_with_weights(tmp_path, 10)
    files = {f["path"]: f for f in json.loads((final / "meta.json").read_text())["files"]}
    assert set(files) == {"config.json", "hf/config.json", "hf/model.safetensors", "engine/rank-0.json"}
    weights = (final / "hf" / "model.safetensors").read_bytes()
    assert files["hf/model.safetensors"] == {"path": "hf/model.safetensors", "size": len(weights),
                                             "sha256": hashlib.sha256(weights).hexdigest()}
    assert read_checkpoint_meta(final, verify=True)["step"] == 10


def test_truncated_safetensors_is_not_complete_and_latest_falls_back(tmp_path, caplog):
    _save_with_weights(tmp_path, 10)
    newest = _save_with_weights(tmp_path, 20)
    weights = newest / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])  # a torn write / full disk: meta.json and a non-empty hf/ remain
    assert not is_complete(newest)
    with pytest.raises(VTGError, match=r"hf/model.safetensors has 50 bytes"):
        read_checkpoint_meta(newest)
    with caplog.at_level(logging.WARNING, logger="vtg.checkpoints"):
        assert latest_checkpoint(tmp_path).name == "step-000010"
    assert any("step-000020" in r.getMessage() and "model.safetensors" in r.getMessage() for r in caplog.records)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000010"]


def test_same_size_corruption_is_caught_by_the_full_check(tmp_path, caplog):
    _save_with_weights(tmp_path, 10)
    newest = _save_with_weights(tmp_path, 20)
    (newest / "engine" / "rank-0.json").write_text('{"run": []}')  # same length, other bytes
    assert is_complete(newest)  # the cheap check (sizes) cannot see it
    assert not is_complete(newest, verify=True)
    with caplog.at_level(logging.WARNING, logger="vtg.checkpoints"):
        assert latest_checkpoint(tmp_path, verify=True).name == "step-000010"
    assert any("step-000020" in r.getMessage() and "sha256" in r.getMessage() for r in caplog.records)


def test_missing_file_and_missing_meta_are_skipped_with_a_warning(tmp_path, caplog):
    _save_with_weights(tmp_path, 10)
    middle = _save_with_weights(tmp_path, 20)
    newest = _save_with_weights(tmp_path, 30)
    (newest / "meta.json").unlink()
    (middle / "engine" / "rank-0.json").unlink()
    with caplog.at_level(logging.WARNING, logger="vtg.checkpoints"):
        assert latest_checkpoint(tmp_path, verify=True).name == "step-000010"
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "step-000030" in text and "no meta.json" in text
    assert "step-000020" in text and "missing file engine/rank-0.json" in text


def test_checkpoint_without_file_list_is_usable_unverified_with_a_warning(tmp_path, caplog):
    old = _save(tmp_path, 10)
    meta = json.loads((old / "meta.json").read_text())
    del meta["files"]  # the layout before file lists
    (old / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="vtg.checkpoints"):
        assert latest_checkpoint(tmp_path, verify=True) == old
    assert any("unverified" in r.getMessage() for r in caplog.records)
