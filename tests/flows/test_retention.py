"""Retention never deletes a checkpoint whose evaluation is pending (or the best one).

The trainer decides (`training.lifecycle.protected`): while the orchestrator runs per-checkpoint evaluation it
sets the checkpoint queue, where the hook (`flows.events`) reports every checkpoint; a reported checkpoint without
a record in the evaluation index (`vtg.eval_queue.results_path`, appended after each finished evaluation) is
kept, and a later save prunes it once evaluated. The evaluation never writes into the checkpoint root."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from flows.events import on_checkpoint_saved
from training.lifecycle import protected
from vtg import checkpoints as ckpt
from vtg import eval_queue, lineage
from vtg.config import load_config

REPO = Path(__file__).resolve().parents[2]
META = {"data_version": "d", "git_commit": "c", "mlflow_run_id": None, "config_hash": "h", "finetune": "full",
        "base": "tiny"}


@pytest.fixture
def cfg(tmp_path):
    return load_config(REPO / "params.yaml", None, [
        f"train.out_dir={tmp_path / 'ck'}", "train.keep_last=1", f"evaluate.out_dir={tmp_path / 'eval'}",
        f"orchestration.state_dir={tmp_path / 'state'}"])


def results_path(cfg) -> Path:
    return eval_queue.results_path(cfg.orchestration.state_dir)


def save(cfg, step: int) -> Path:
    """What the trainer does on rank 0 (`Trainer.save`): finalize with the protected set, then the hook."""
    root = Path(cfg.train.out_dir)
    tmp = ckpt.temp_dir_for(root, step)
    ckpt.export_dir(tmp).mkdir(parents=True)
    (ckpt.export_dir(tmp) / "model.safetensors").write_text(f"step {step}")
    final = ckpt.finalize(root, step, dict(META), {}, cfg.train.keep_last, protect=protected(cfg))
    on_checkpoint_saved(str(final), step)
    return final


def evaluated(cfg, step: int) -> None:
    """The evaluation index line `flows.evaluation.evaluate_checkpoint` appends once it has evaluated `step`."""
    queue = Path(os.environ[lineage.ENV_CHECKPOINT_QUEUE])
    (item,) = [json.loads(x) for x in queue.read_text().splitlines()
               if json.loads(x).get("step") == step][-1:]
    eval_queue.append(results_path(cfg), {"checkpoint_dir": item["checkpoint_dir"], "step": step,
                                          "saved_at": item["saved_at"], "metrics": {}})


def on_disk(cfg) -> list[int]:
    return [int(p.name.split("-")[1]) for p in ckpt.list_checkpoints(cfg.train.out_dir)]


def test_reported_checkpoints_are_kept_until_evaluated_then_pruned(cfg, tmp_path, monkeypatch):
    monkeypatch.setenv(lineage.ENV_CHECKPOINT_QUEUE, str(tmp_path / "state" / "queue.jsonl"))
    (tmp_path / "state").mkdir()
    monkeypatch.delenv(lineage.ENV_CHECKPOINT_EVENTS, raising=False)
    save(cfg, 1)
    save(cfg, 2)
    save(cfg, 3)
    assert on_disk(cfg) == [1, 2, 3]  # keep_last=1, but none of them is evaluated yet
    evaluated(cfg, 1)
    save(cfg, 4)
    assert on_disk(cfg) == [2, 3, 4]  # step 1 evaluated: pruned at the next save
    ckpt.write_pointer(Path(cfg.evaluate.out_dir) / ckpt.BEST_POINTER, Path(cfg.train.out_dir) / "step-000002")
    evaluated(cfg, 2)
    evaluated(cfg, 3)
    save(cfg, 5)
    assert on_disk(cfg) == [2, 4, 5]  # 2 is the best, 4 pending, 3 evaluated and not the best
    evaluated(cfg, 4)
    evaluated(cfg, 5)
    save(cfg, 6)
    assert on_disk(cfg) == [2, 6]


def test_a_checkpoint_saved_again_is_pending_again(cfg, tmp_path, monkeypatch):
    monkeypatch.setenv(lineage.ENV_CHECKPOINT_QUEUE, str(tmp_path / "queue.jsonl"))
    save(cfg, 1)
    evaluated(cfg, 1)
    time.sleep(0.01)
    save(cfg, 1)  # the same step re-saved (a resumed run redoing it): another checkpoint, not evaluated yet
    save(cfg, 2)
    assert on_disk(cfg) == [1, 2]
    with results_path(cfg).open("a") as f:
        f.write('{"checkpoint_dir": "half a li')  # a line being appended right now is not a record yet
    save(cfg, 3)
    assert on_disk(cfg) == [1, 2, 3]


def test_without_per_checkpoint_evaluation_retention_is_keep_last_and_the_best(cfg, monkeypatch):
    monkeypatch.delenv(lineage.ENV_CHECKPOINT_QUEUE, raising=False)
    for step in (1, 2, 3):
        save(cfg, step)
    assert on_disk(cfg) == [3]
    ckpt.write_pointer(Path(cfg.evaluate.out_dir) / ckpt.BEST_POINTER, Path(cfg.train.out_dir) / "step-000003")
    save(cfg, 4)
    save(cfg, 5)
    assert on_disk(cfg) == [3, 5]


SLOW_EVAL = '''
import os, time
from pathlib import Path
from vtg import checkpoints


def evaluate(checkpoint_dir, split, cfg):
    """A slow evaluation that fails if its checkpoint disappears while it runs."""
    checkpoints.read_checkpoint_meta(checkpoint_dir)
    time.sleep(float(os.environ["SLOW_EVAL_S"]))
    meta = checkpoints.read_checkpoint_meta(checkpoint_dir)
    with open(os.environ["SLOW_EVAL_LOG"], "a") as f:
        f.write(f"{meta['step']} {cfg.evaluate.device}\\n")
    return {"metrics": {"r1@0.5": 0.5}, "step": meta["step"]}
'''


@pytest.mark.slow
def test_slow_evaluator_loses_no_checkpoint_with_the_real_trainer(tmp_path, monkeypatch):
    """keep_last=1 and a checkpoint every step, evaluated slower than they come, by the real embedded evaluator
    process (started as the orchestrator starts it) while the real trainer runs: every checkpoint is evaluated,
    none is pruned before its evaluation record exists, and the evaluated ones are pruned by later saves."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    from support.train_fixtures import train_config, write_fixture_shards

    from flows import evaluator as ev
    from flows.stages import ConfigArgs
    from training.callbacks import default_callbacks
    from training.sft import train

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "slow_eval.py").write_text(SLOW_EVAL)
    monkeypatch.chdir(tmp_path)
    for k, v in {"PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), str(REPO)]),
                 "PREFECT_HOME": str(tmp_path / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180", "SLOW_EVAL_S": "1.5",
                 "SLOW_EVAL_LOG": str(tmp_path / "evaluated.txt")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    shards = write_fixture_shards(tmp_path / "shards", n_train=24, n_val=6, shards_per_split=2)
    state = tmp_path / "state"
    state.mkdir()
    overrides = ["train.save_every=1", "train.keep_last=1", f"evaluate.out_dir={tmp_path / 'eval'}",
                 f"evaluate.store_dir={tmp_path / 'eval_runs'}", f"orchestration.state_dir={state}",
                 "orchestration.stages.evaluate_api=slow_eval:evaluate",
                 "train.checkpoint_hooks=[flows.events:on_checkpoint_saved]"]
    cfg = train_config(shards, tmp_path / "ck", "train.max_steps=5", *overrides)
    queue = state / "checkpoint_queue-test.jsonl"
    monkeypatch.setenv(lineage.ENV_CHECKPOINT_QUEUE, str(queue))

    def records() -> set[str]:
        path = results_path(cfg)
        return {json.loads(x)["checkpoint_dir"] for x in path.read_text().splitlines()} if path.is_file() else set()

    seen, early = [], []
    real_prune = ckpt.prune

    def watched_prune(root, keep_last, protect=()):
        done = records()
        deleted = real_prune(root, keep_last, protect)
        early.extend(str(p) for p in deleted if str(p.resolve()) not in done)
        seen.append((sorted(p.name for p in deleted), len(ckpt.list_checkpoints(root))))
        return deleted

    monkeypatch.setattr(ckpt, "prune", watched_prune)

    class WaitForFirstEvaluation:
        """At step 2, wait until step 1 is evaluated (the evaluator's Prefect start takes seconds), so that later
        saves meet both evaluated and pending checkpoints."""

        def on_train_start(self, info): pass
        def on_step(self, step, metrics): pass
        def on_skip(self, step, info): pass
        def on_train_end(self, summary): pass
        def checkpoint_meta(self): return {}

        def on_checkpoint(self, path, step):
            deadline = time.time() + 240
            while step == 2 and not any(d.endswith("step-000001") for d in records()):
                assert time.time() < deadline, (queue.with_suffix(".log").read_text()
                                                if queue.with_suffix(".log").is_file() else "no evaluator log")
                time.sleep(0.2)

    placement = ev.evaluation_placement(cfg)  # this machine: the CPU, concurrently
    assert placement.when == "concurrent" and placement.device == "cpu"
    evaluator = ev.start_evaluator(cfg, queue, ConfigArgs(str(REPO / "params.yaml")), None, placement)
    try:
        train(cfg, callbacks=default_callbacks(cfg, True) + [WaitForFirstEvaluation()])
        eval_queue.close(queue)
        assert evaluator.wait(timeout=300) == 0, queue.with_suffix(".log").read_text()
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
    log = queue.with_suffix(".log").read_text()
    reported = [json.loads(x) for x in queue.read_text().splitlines() if "checkpoint_dir" in x]
    assert [r["step"] for r in reported] == [1, 2, 3, 4, 5]
    assert early == [], f"pruned before their evaluation was recorded: {early}"
    assert records() == {r["checkpoint_dir"] for r in reported}, log  # every checkpoint evaluated
    assert '"skipped": null' in log and "no longer exists" not in log
    lines = (tmp_path / "evaluated.txt").read_text().split()
    assert sorted(int(s) for s in lines[0::2]) == [1, 2, 3, 4, 5] and set(lines[1::2]) == {"cpu"}
    assert any("step-000001" in d for d, _ in seen), seen  # pruned by a save during training, once evaluated
    assert max(n for _, n in seen) > 1, seen  # retention held pending checkpoints beyond keep_last=1

    # A later save (the run extended by one step) prunes every evaluated checkpoint.
    more = train_config(shards, tmp_path / "ck", "train.max_steps=6", *overrides)
    train(more)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "ck")] == ["step-000006"]
    assert early == []
