"""Stability guards triggered for real: a poisoned example whose loss spikes far above the running mean is skipped
(counted, logged, reported to callbacks) and training goes on; a run whose every batch spikes (lr far too high)
aborts after `guards.max_consecutive_skips`. Plus the guard's rules on their own."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from support.train_fixtures import Recorder, synthetic_window, train_config

from training.guards import StabilityGuard
from training.sft import train
from vtg import shards
from vtg.errors import VTGError

SPAN, POISON_SPAN = (1.5, 4.5), (7.5, 10.5)
N_CLEAN = 12
POISONED = f"trainvid{N_CLEAN:03d}-0000"
"""The one window whose two queries answer POISON_SPAN; every other query answers SPAN."""


@pytest.fixture(scope="module")
def poisoned_shards(tmp_path_factory):
    """One train shard: 12 windows (24 queries) that all answer the same span, which the tiny model learns to
    answer with a loss near 0, and one window whose queries answer another span: once the model has learned the
    common answer, that example's loss is hundreds of times the running mean (a real spike, no patched loss)."""
    root = tmp_path_factory.mktemp("poisoned_shards")
    rng = np.random.default_rng(0)

    def window(i: int, split: str, span: tuple[float, float]):
        meta, jpegs = synthetic_window(rng, f"{split}vid{i:03d}-0000", split)
        for q in meta.queries:
            q.windows = [span]
        return meta, jpegs

    train_windows = [window(i, "train", SPAN) for i in range(N_CLEAN)] + [window(N_CLEAN, "train", POISON_SPAN)]
    shards.write_shard(root / "train" / (shards.SHARD_PATTERN % 0), train_windows)
    for split in ("val", "test"):
        shards.write_shard(root / split / (shards.SHARD_PATTERN % 0), [window(i, split, SPAN) for i in range(2)])
    return root


def _ema(losses: list[float], beta: float) -> float | None:
    """The guard's running mean after accepting `losses` (StabilityGuard.accept, replayed)."""
    mean = None
    for x in losses:
        mean = x if mean is None else beta * mean + (1 - beta) * x
    return mean


def test_loss_spike_is_skipped_counted_logged_and_training_goes_on(poisoned_shards, tmp_path, caplog):
    """60 steps of one example each (micro-batch 1, no accumulation: a step's loss is its batch's loss). The
    poisoned example comes round again after the model has learned the common answer: skipped as `loss_spike`
    (summary, train/skipped_batches, on_skip, one warning naming its key), and the run still completes all 60
    steps. The guard's rule is replayed on the real losses: every skipped loss lies above spike_ratio x the running
    mean at that point, and no accepted loss after min_steps does (nothing else was skipped or let through)."""
    ratio, beta, min_steps, steps = 5.0, 0.5, 5, 60
    cfg = train_config(poisoned_shards, tmp_path / "ck", f"train.max_steps={steps}", "train.save_every=1000",
                       "train.micro_batch_size=1", "train.lr=1e-2", f"train.guards.min_steps={min_steps}",
                       f"train.guards.spike_ratio={ratio}", f"train.guards.ema_beta={beta}")
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="training"):
        summary = train(cfg, callbacks=[rec])
    losses = summary["losses"]
    assert summary["step"] == steps and summary["completed"] and len(losses) == steps
    assert all(math.isfinite(x) for x in losses)
    assert summary["skipped_batches"] >= 1 and summary["skipped_batches"] == len(rec.skips)
    assert summary["samples_seen"] == steps  # a skipped example is not counted as trained on
    assert rec.steps[-1][0] == steps and rec.steps[-1][1]["train/skipped_batches"] == summary["skipped_batches"]
    warned = [r.getMessage() for r in caplog.records if "skipped batch" in r.getMessage()]
    assert len(warned) == len(rec.skips)
    for (step, info), line in zip(rec.skips, warned, strict=True):
        assert info["reason"] == "loss_spike" and info["keys"][0].startswith(POISONED) and len(info["keys"]) == 1
        assert "loss_spike" in line and info["keys"][0] in line and f"step {step}:" in line
        assert min_steps <= step < steps
        mean = _ema(losses[:step], beta)
        assert info["loss"] > ratio * mean * (1 - 1e-9), (step, info["loss"], mean)
        assert info["loss"] > 100 * mean  # a real spike, not a borderline one
    for i in range(min_steps, steps):  # step i + 1 was accepted: its loss was within the limit
        assert losses[i] <= ratio * _ema(losses[:i], beta) * (1 + 1e-9), (i + 1, losses[i])
    assert losses[-1] < 0.1 * losses[0]  # it kept learning after the skips


def test_every_batch_spiking_aborts_after_max_consecutive_skips(shards_dir, tmp_path):
    """lr 1.0 without warmup: the first update wrecks the model, every later batch's loss is several times the
    running mean, and the run stops with a one-line VTGError after guards.max_consecutive_skips (3) in a row."""
    cfg = train_config(shards_dir, tmp_path / "ck", "train.max_steps=8", "train.save_every=100", "train.lr=1.0",
                       "train.warmup_ratio=0", "train.guards.min_steps=1", "train.guards.max_consecutive_skips=3")
    import mlflow

    from training.callbacks.mlflow_cb import MLflowCallback

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={
        "enabled": True, "tracking_uri": uri, "experiment": "guards"})})
    rec, mlf = Recorder(), MLflowCallback(cfg)
    with pytest.raises(VTGError, match=r"^3 batches skipped in a row \(loss_spike\): the run has diverged") as e:
        train(cfg, callbacks=[rec, mlf])
    run = mlflow.MlflowClient(uri).get_run(_last_run(uri))
    assert run.info.status == "FAILED" and "batches skipped in a row" in run.data.tags["vtg.error"]
    assert mlflow.active_run() is None  # not left active for the next run in this process
    assert "\n" not in str(e.value)
    assert rec.error is e.value and rec.summary is None  # the callbacks hear of the failure (the tracker run ends FAILED)
    assert len(rec.skips) == 3 and len({step for step, _ in rec.skips}) == 1  # no step in between: consecutive
    step = rec.skips[0][0]
    accepted = [m["train/loss"] for s, m in rec.steps]  # log_every=1: every accepted step's loss
    assert len(accepted) == step >= 1
    mean = _ema(accepted, cfg.train.guards.ema_beta)
    for _, info in rec.skips:
        assert info["reason"] == "loss_spike" and math.isfinite(info["loss"])
        assert info["loss"] > cfg.train.guards.spike_ratio * mean


def _last_run(uri: str) -> str:
    import mlflow

    (run,) = mlflow.MlflowClient(uri).search_runs([mlflow.get_experiment_by_name("guards").experiment_id])
    return run.info.run_id


def test_guard_rules():
    g = StabilityGuard(spike_ratio=2.0, ema_beta=0.5, min_steps=2, max_consecutive_skips=2)
    assert g.judge(float("nan")) == "nonfinite_loss" and g.judge(float("inf")) == "nonfinite_loss"
    assert g.judge(1e9) is None  # no running mean yet
    g.accept(1.0)
    assert g.judge(100.0) is None  # fewer than min_steps accepted: no spike detection yet
    g.accept(3.0)
    assert g.mean == 2.0 and g.seen == 2
    assert g.judge(4.0) is None and g.judge(4.0001) == "loss_spike"  # strictly above ratio x mean
    assert g.skipped() is False and g.skipped() is True  # the 2nd skip in a row aborts
    g.accept(2.0)
    assert g.consecutive_skips == 0 and g.skipped() is False  # an accepted step resets the count
    restored = StabilityGuard()
    restored.load_state_dict(g.state_dict())
    assert restored == g
