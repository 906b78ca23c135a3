"""Failure class 4 (issue 39), the data half: a decision uses the data it says it uses. Early stop with
`train.shards_dir` changed still judged on `data/shards/val`, silently. Every decision made on val by evaluation
(RL's start checkpoint in the select stage, the evaluate stage's best) goes through
`evaluation.api.evaluate_checkpoint`, which checks `evaluate.shards_dir`'s data version against the one the
checkpoint was trained on (`vtg.selection.check_judged_on_training_data`); early stop scores training's own val
split (`train.shards_dir`), so it cannot judge on other data. An ad-hoc evaluation on other data (`python -m
evaluation --checkpoint`) is not a decision and still may."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vtg.config import load_config
from vtg.errors import VTGError
from vtg.selection import check_judged_on_training_data

REPO = Path(__file__).resolve().parents[2]


def _shards(root: Path, version: str) -> Path:
    root.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"data_version": version}))
    return root


def test_judging_on_other_data_than_training_is_one_line(tmp_path):
    train, other = _shards(tmp_path / "mine", "a" * 64), _shards(tmp_path / "default", "b" * 64)
    cfg = load_config(REPO / "params.yaml", None, [f"train.shards_dir={train}", f"evaluate.shards_dir={other}"])
    with pytest.raises(VTGError) as e:
        check_judged_on_training_data(cfg, "a" * 64, "train.early_stop")
    msg = str(e.value)
    assert "train.early_stop" in msg and str(other) in msg and str(train) in msg and "\n" not in msg
    check_judged_on_training_data(load_config(REPO / "params.yaml", None, [f"evaluate.shards_dir={train}"]),
                                  "a" * 64, "train.early_stop")  # the same data: fine


def test_every_decision_goes_through_the_check():
    """The paths: evaluate_checkpoint for everything but ad hoc, which the select stage (RL's `rl.init=best`) and
    the evaluate stage call. Early stop is no such decision any more: training scores its own val split
    (`train.shards_dir`), the data it trains on, and reads nothing of `evaluate.shards_dir`."""
    api = (REPO / "evaluation" / "api.py").read_text()
    assert "if not adhoc:" in api and "check_judged_on_training_data(cfg, meta.get(\"data_version\")" in api
    for caller in ("evaluation/select.py", "evaluation/stage.py"):
        text = (REPO / caller).read_text()
        assert "evaluate_checkpoint(" in text and "adhoc=True" not in text, caller
    early = (REPO / "training" / "early_stop.py").read_text()
    assert "list_shards(cfg.train.shards_dir, SELECTION_SPLIT)" in early and "cfg.evaluate" not in early
