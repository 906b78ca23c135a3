"""The run lifecycle both training stages share (`training.lifecycle`), without training: the resume rules decided
once (a superseded run is moved aside, never deleted; an explicit resume must match), retention keeps the parent
of every RL checkpoint, and the two stages' roots may not overlap."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ckptkit import fake_checkpoint, roots_config

from training.lifecycle import check_roots_apart, protected, resume_source
from vtg import checkpoints as ckpt
from vtg.errors import ConfigError, VTGError

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, *overrides: str):
    return roots_config(tmp_path, *overrides)


def _checkpoint(root: Path, step: int, **meta) -> Path:
    return fake_checkpoint(root, step, keep_last=2, **meta)


@pytest.mark.parametrize(("key", "data", "why"), [("k2", "d1", "other train settings"),
                                                  ("k1", "d2", "trained on data")])
def test_auto_resume_moves_a_superseded_run_aside(tmp_path, caplog, key, data, why):
    cfg = _cfg(tmp_path)
    _checkpoint(tmp_path / "sft", 2)
    assert resume_source(cfg, "train", "train_hash", key, data) is None
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("sft-superseded-")]
    assert len(aside) == 1 and (aside[0] / ckpt.step_dir_name(2) / ckpt.META_FILE).is_file()  # moved, not deleted
    assert why in caplog.text and str(aside[0]) in caplog.text


def test_auto_resume_takes_the_newest_matching_checkpoint(tmp_path):
    cfg = _cfg(tmp_path)
    _checkpoint(tmp_path / "sft", 1)
    newest = _checkpoint(tmp_path / "sft", 2)
    assert resume_source(cfg, "train", "train_hash", "k1", "d1") == newest


def test_explicit_resume_of_other_settings_is_one_line_and_moves_nothing(tmp_path):
    step = _checkpoint(tmp_path / "sft", 2)
    cfg = _cfg(tmp_path, f"train.resume={step}")
    with pytest.raises(VTGError) as e:
        resume_source(cfg, "train", "train_hash", "k2", "d1")
    assert str(e.value).startswith(f"train.resume={step}") and "train_hash k1 != k2" in str(e.value)
    assert "\n" not in str(e.value) and step.is_dir()


def test_never_moves_the_old_root_aside(tmp_path):
    cfg = _cfg(tmp_path, "rl.resume=never")
    _checkpoint(tmp_path / "rl", 3, rl_hash="r1")
    assert resume_source(cfg, "rl", "rl_hash", "r1", "d1") is None
    assert not (tmp_path / "rl").exists() and any(p.name.startswith("rl-superseded-") for p in tmp_path.iterdir())


def test_retention_keeps_the_parent_of_every_rl_checkpoint(tmp_path):
    cfg = _cfg(tmp_path, "train.keep_last=1")
    first = _checkpoint(tmp_path / "sft", 1)
    _checkpoint(tmp_path / "rl", 5, parent_checkpoint=str(first), stage="rl", rl_hash="r1")
    assert first.resolve() in protected(cfg)
    for step in (2, 3):
        tmp = ckpt.temp_dir_for(tmp_path / "sft", step)
        ckpt.export_dir(tmp).mkdir(parents=True)
        (ckpt.export_dir(tmp) / "model.safetensors").write_text(f"weights {step}")
        ckpt.finalize(tmp_path / "sft", step, {"data_version": "d1", "git_commit": "c", "config_hash": "h",
                                                "finetune": "full", "base": "tiny"}, {}, 1, protect=protected(cfg))
    names = [p.name for p in ckpt.list_checkpoints(tmp_path / "sft")]
    assert names == [ckpt.step_dir_name(1), ckpt.step_dir_name(3)]  # step 2 pruned, the RL parent kept


@pytest.mark.parametrize("key,value", [("rl.out_dir", "sft"), ("rl.out_dir", "sft/rl"), ("train.out_dir", "rl/sft"),
                                       ("evaluate.store_dir", "sft/evals")])
def test_overlapping_roots_are_refused_at_config_time(tmp_path, key, value):
    """Issue 21 case 4: `rl.out_dir=checkpoints/sft` used to move the whole SFT root aside (RL's own start
    checkpoint with it), then fail with an unrelated error. Now the config is refused before anything runs."""
    with pytest.raises(ConfigError, match="overlap") as e:
        _cfg(tmp_path, f"{key}={tmp_path / value}")
    assert "<command line>" in str(e.value) and key in str(e.value) and "Value error" not in str(e.value)
    cfg = _cfg(tmp_path)
    cfg.rl.out_dir = str(tmp_path / value) if key == "rl.out_dir" else cfg.rl.out_dir  # assignment skips validation
    if key == "rl.out_dir":
        with pytest.raises(VTGError, match="overlap"):
            check_roots_apart(cfg)  # the lifecycle checks again before it takes a lock
