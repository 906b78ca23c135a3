"""Failure class 3 (issue 39): a checkpoint that anything names is never removed, and never moved from under the
run that uses it. One protection set (`training.lifecycle.namers`), used by retention (`vtg.checkpoints.prune`
through every save) and by move-aside (`training.lifecycle.move_aside`, every superseded or `resume=never` root
and `orchestration.rl=false`). Without training: each kind of namer names an old checkpoint, then a save with
`keep_last=1` must keep it; `rl.init` inside `rl.out_dir` of a superseded RL run is one line and nothing moves.
(The early-stop case trained for real: tests/training/test_early_stop.py with keep_last below the patience.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ckptkit import fake_checkpoint, roots_config

from training.lifecycle import LOWEST_EVAL_LOSS, namers, protected, resume_source
from vtg import checkpoints as ckpt
from vtg import eval_queue, lineage
from vtg.errors import VTGError

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, *overrides: str):
    return roots_config(tmp_path, *overrides)


def _checkpoint(root: Path, step: int, protect=(), keep_last: int = 10, **meta) -> Path:
    return fake_checkpoint(root, step, keep_last=keep_last, protect=protect, **meta)


# each namer: (what it writes or sets so that it names `old`, the config overrides it needs)
def _best(tmp_path, old):
    ckpt.write_pointer(tmp_path / "eval" / ckpt.BEST_POINTER, old)
    return []


def _pending(tmp_path, old, monkeypatch):
    queue = tmp_path / "state" / "queue.jsonl"
    eval_queue.append(queue, {"checkpoint_dir": str(old), "step": 1})
    monkeypatch.setenv(lineage.ENV_CHECKPOINT_QUEUE, str(queue))
    return []


def _rl_parent(tmp_path, old):
    _checkpoint(tmp_path / "rl", 1, parent_checkpoint=ckpt.parent_ref(tmp_path / "rl" / ckpt.step_dir_name(1), old))
    return []


def _early_stop(tmp_path, old):
    ckpt.write_pointer(tmp_path / "sft" / LOWEST_EVAL_LOSS, old, step=1)
    return ["train.early_stop=true"]


def _rl_init(tmp_path, old):
    return [f"rl.init={old}"]


def _train_resume(tmp_path, old):
    return [f"train.resume={old}"]


NAMERS = {"best": _best, "pending": _pending, "rl_parent": _rl_parent, "early_stop": _early_stop,
          "rl_init": _rl_init, "train_resume": _train_resume}


@pytest.mark.parametrize("kind", sorted(NAMERS))
def test_retention_keeps_what_any_namer_names(tmp_path, monkeypatch, kind):
    old = _checkpoint(tmp_path / "sft", 1)
    _checkpoint(tmp_path / "sft", 2)
    setup = NAMERS[kind]
    overrides = setup(tmp_path, old, monkeypatch) if kind == "pending" else setup(tmp_path, old)
    cfg = _cfg(tmp_path, *overrides)
    assert old.resolve() in [p.resolve() for p in protected(cfg)]
    _checkpoint(tmp_path / "sft", 3, protect=protected(cfg), keep_last=1)  # what every save does
    assert old.is_dir() and ckpt.is_complete(old, verify=True)
    assert not (tmp_path / "sft" / ckpt.step_dir_name(2)).exists()  # retention itself still works


def test_the_namers_are_the_documented_set(tmp_path, monkeypatch):
    """Every kind above is one entry of `namers`, so a new kind of reference must be added there (and here)."""
    old = _checkpoint(tmp_path / "sft", 1)
    overrides = []
    for kind, setup in NAMERS.items():
        overrides += setup(tmp_path, old, monkeypatch) if kind == "pending" else setup(tmp_path, old)
    who = {w for _, w in namers(_cfg(tmp_path, *overrides))}
    assert len(who) == len(NAMERS), who
    doc = (REPO / "docs" / "faults.md").read_text()
    assert "protection set" in doc and all(k in doc for k in ("best.json", "rl.init", "early_stop", "parent"))


def test_rl_init_inside_a_superseded_rl_root_is_one_line_and_nothing_moves(tmp_path):
    init = _checkpoint(tmp_path / "rl", 4)
    cfg = _cfg(tmp_path, f"rl.init={init}")
    with pytest.raises(VTGError) as e:
        resume_source(cfg, "rl", "rl_hash", "another-run", "d1")  # another RL run: its root would go aside
    msg = str(e.value)
    assert "rl.init" in msg and str(init) in msg and "nothing moved" in msg and "\n" not in msg
    assert init.is_dir() and not any(p.name.startswith("rl-superseded-") for p in tmp_path.iterdir())


def test_a_superseded_root_without_checkpoints_in_use_still_moves_aside(tmp_path):
    _checkpoint(tmp_path / "sft", 1)
    ckpt.write_pointer(tmp_path / "eval" / ckpt.BEST_POINTER, tmp_path / "sft" / ckpt.step_dir_name(1))
    assert resume_source(_cfg(tmp_path), "train", "train_hash", "k2", "d1") is None  # the run's own best goes along
    assert any(p.name.startswith("sft-superseded-") for p in tmp_path.iterdir())
