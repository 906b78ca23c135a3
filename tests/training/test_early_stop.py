"""`train.early_stop` on a planted overfit: 8 training queries, many steps. The validation loss rises while the
training loss falls; the run ends cleanly on the signal, records why, and a rerun does not train on. Training
scores its checkpoints itself (the evaluator it is handed; by default its own val split's answer loss), and the
evaluate stage's `eval_loss` of the same checkpoints is the same number, so selection by `eval_loss` picks the
lowest-loss checkpoint early stop named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.train_fixtures import train_config, write_fixture_shards

from evaluation.api import evaluate_checkpoint
from training.early_stop import EARLY_STOP_FILE, HISTORY_FILE
from training.lifecycle import LOWEST_EVAL_LOSS
from training.sft import train
from vtg.checkpoints import list_checkpoints, read_checkpoint_meta
from vtg.selection import pick_best

pytestmark = pytest.mark.slow


def test_early_stop_ends_an_overfitting_run_and_a_rerun_does_not_train_on(tmp_path):
    shards = write_fixture_shards(tmp_path / "shards", n_train=4, n_val=6, shards_per_split=1, seed=3)
    sft = tmp_path / "sft"
    cfg = train_config(shards, sft, "train.max_steps=400", "train.save_every=20", "train.keep_last=2",
                       "train.early_stop=true", "train.early_stop_patience=2", "train.lr=3e-3",
                       "train.warmup_ratio=0.02", f"evaluate.shards_dir={shards}", f"evaluate.out_dir={tmp_path / 'eval'}",
                       f"evaluate.store_dir={tmp_path / 'store'}", "evaluate.baselines=[]",
                       "evaluate.batch_size=12", "evaluate.max_new_tokens=12",
                       "evaluate.select_metric=eval_loss", "evaluate.bootstrap_resamples=0")
    summary = train(cfg)
    early = summary["early_stop"]
    assert early is not None, f"no overfitting signal in 400 steps (losses {summary['losses'][::20]})"
    stopped = summary["step"]
    print(f"early stop at step {stopped}: val eval loss {early['eval_loss']}, train loss {early['train_loss']}")
    assert stopped == early["step"] < 400 and summary["completed"]
    assert early["eval_loss"][0] < early["eval_loss"][1] < early["eval_loss"][2]  # rose twice in a row
    assert early["train_loss"][-1] < early["train_loss"][0]  # while the training loss fell
    marker = json.loads((sft / EARLY_STOP_FILE).read_text())
    assert marker["step"] == stopped and "overfitting" in marker["message"]
    written = list_checkpoints(sft)
    assert read_checkpoint_meta(written[-1])["step"] == stopped and len(written) <= 3  # keep_last 2 + the lowest

    # training scored every checkpoint itself (nothing of evaluation ran); the evaluate side scores the ones
    # that are left the same (eval_loss on val), so selection by eval_loss agrees with early stop's lowest
    history = {r["step"]: r["eval_loss"] for r in json.loads((sft / HISTORY_FILE).read_text())["rows"]}
    assert sorted(history)[-3:] == early["steps"] and not (tmp_path / "store").exists()
    results = [evaluate_checkpoint(c, "val", cfg, refresh=False) for c in written]
    for r in results:
        assert abs(r.metrics["eval_loss"] - history[r.result["step"]]) < 1e-4, (r.result["step"], history)
    best = pick_best([r.result for r in results], "eval_loss")
    assert best["step"] == early["lowest_eval_loss_step"] < stopped
    assert json.loads((sft / LOWEST_EVAL_LOSS).read_text())["step"] == best["step"]
    # issue 39 class 3: with keep_last below the patience window, the checkpoint the decision names is still there
    assert Path(best["checkpoint"]).resolve() in [w.resolve() for w in written]

    # a rerun of the same run (train.resume=auto) finds it ended and trains nothing
    again = train(cfg)
    assert again["step"] == stopped and again["losses"] == summary["losses"] and again["early_stop"]["step"] == stopped
    assert list_checkpoints(sft) == written
