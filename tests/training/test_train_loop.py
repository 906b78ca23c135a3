"""The training loop end to end in-process (world size 1, DeepSpeed on CPU/gloo): learning, exact resume, ZeRO
stages, LoRA vs full, FSDP2, stability guards, sanity checks, checkpoint hooks, MLflow lineage."""

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from support.train_fixtures import HOOK_CALLS, Recorder, train_config

from training.sanity import SanityError
from training.sft import train
from vtg.checkpoints import export_dir, read_checkpoint_meta, resolve_checkpoint
from vtg.model.modeling import load_model_and_tokenizer
from vtg.model.processing import collate, encode_example, model_inputs


def _export(root):
    """The HF export of a checkpoint root's latest checkpoint (the pointer is a file, not a directory)."""
    return export_dir(resolve_checkpoint(root))

def _logits(hf_dir):
    model, tok = load_model_and_tokenizer(hf_dir)
    frames = np.random.default_rng(0).integers(0, 256, size=(8, 56, 56, 3), dtype=np.uint8)
    batch = collate([encode_example(tok, frames, [i * 1.5 for i in range(8)], "the red square appears", None)],
                    tok.pad_token_id)
    with torch.no_grad():
        return model(**model_inputs(batch)).logits


def test_loss_falls_zero2(shards_dir, tmp_path):
    cfg = train_config(shards_dir, tmp_path / "ck", "train.max_steps=30", "train.save_every=30")
    losses = train(cfg)["losses"]
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:3])
    meta = read_checkpoint_meta(tmp_path / "ck" / "latest")
    assert meta["step"] == 30 and meta["finetune"] == "full" and meta["data_version"]


@pytest.mark.parametrize("groups", [0, 2])
def test_exact_resume_is_bit_equal(shards_dir, tmp_path, groups):
    common = ("train.max_steps=6", "train.save_every=3", "train.data.num_workers=1",
              f"train.data.length_groups={groups}")
    straight = train(train_config(shards_dir, tmp_path / "a", *common))["losses"]
    first = train(train_config(shards_dir, tmp_path / "b", *common), stop_after=3)["losses"]
    assert read_checkpoint_meta(tmp_path / "b" / "latest")["step"] == 3
    second = train(train_config(shards_dir, tmp_path / "b", *common))["losses"]
    assert first == straight[:3]
    assert second == straight  # steps 4..6 after the resume equal the uninterrupted run's, bit for bit
    assert torch.equal(_logits(_export(tmp_path / "a")), _logits(_export(tmp_path / "b")))


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_zero_stages_train_and_export(shards_dir, tmp_path, stage):
    summary = train(train_config(shards_dir, tmp_path / "ck", f"train.zero_stage={stage}", "train.max_steps=2"))
    assert summary["step"] == 2 and all(np.isfinite(summary["losses"]))
    hf = _export(tmp_path / "ck")
    assert torch.isfinite(_logits(hf)).all()  # a full (gathered under ZeRO-3) export that reloads


def test_lora_vs_full_trainable_parameters(shards_dir, tmp_path):
    lora, full = Recorder(), Recorder()
    train(train_config(shards_dir, tmp_path / "lora", "train.model.finetune=lora", "train.model.lora_r=4",
                       "train.model.freeze_vision=true", "train.max_steps=2"), callbacks=[lora])
    train(train_config(shards_dir, tmp_path / "full", "train.max_steps=2"), callbacks=[full])
    assert 0 < lora.info["trainable_params"] < lora.info["total_params"] / 4
    assert full.info["trainable_params"] == full.info["total_params"]
    hf = _export(tmp_path / "lora")
    assert (hf / "adapter_config.json").is_file() and not (hf / "model.safetensors").exists()
    assert torch.isfinite(_logits(hf)).all()
    # same seed, same data: both runs see the same batches, so the same tokens per example at every step; and a
    # fresh LoRA adapter (lora_B = 0) leaves the base model's output untouched: the same step-1 loss, bit for bit
    assert [s for s, _ in lora.steps] == [s for s, _ in full.steps] == [1, 2]
    for (_, a), (_, b) in zip(lora.steps, full.steps, strict=True):
        assert a["perf/tokens_per_s"] > 0 and b["perf/tokens_per_s"] > 0
        assert a["perf/tokens_per_s"] / a["perf/samples_per_s"] == pytest.approx(
            b["perf/tokens_per_s"] / b["perf/samples_per_s"], rel=1e-12)
        assert b["perf/samples_per_s"] * b["perf/step_time_s"] == pytest.approx(4)  # micro-batch 4 per step
    assert lora.steps[0][1]["train/loss"] == full.steps[0][1]["train/loss"] > 0


def test_fsdp2_strategy_trains_and_resumes(shards_dir, tmp_path):
    common = ("engine.strategy=fsdp", "train.max_steps=4", "train.save_every=2")
    straight = train(train_config(shards_dir, tmp_path / "a", *common))["losses"]
    train(train_config(shards_dir, tmp_path / "b", *common), stop_after=2)
    resumed = train(train_config(shards_dir, tmp_path / "b", *common))["losses"]
    assert resumed == straight
    assert torch.isfinite(_logits(_export(tmp_path / "b"))).all()


def test_nonfinite_loss_batch_is_skipped_with_keys(shards_dir, tmp_path, monkeypatch, caplog):
    from training import engine

    real = engine.DeepSpeedEngine.forward
    calls = {"n": 0}

    def flaky(self, inputs):
        calls["n"] += 1
        loss = real(self, inputs)
        return loss * float("nan") if calls["n"] == 2 else loss

    monkeypatch.setattr(engine.DeepSpeedEngine, "forward", flaky)
    with caplog.at_level(logging.WARNING, logger="training"):
        summary = train(train_config(shards_dir, tmp_path / "ck", "train.max_steps=3"))
    assert summary["skipped_batches"] == 1 and summary["step"] == 3 and all(np.isfinite(summary["losses"]))
    skip = [r.getMessage() for r in caplog.records if "skipped batch" in r.getMessage()]
    assert len(skip) == 1 and "nonfinite_loss" in skip[0] and "vid" in skip[0]


def test_sanity_checks_fail_fast(shards_dir, tmp_path, tiny_model_dir):
    with pytest.raises(SanityError, match="max_seq_len"):
        train(train_config(shards_dir, tmp_path / "ck", "train.data.max_seq_len=40"))
    broken = tmp_path / "no_template"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "chat_template.jinja").unlink()
    cfg_path = broken / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(SanityError, match="chat template"):
        train(train_config(shards_dir, tmp_path / "ck", f"train.model.base={broken}"))
    assert not (tmp_path / "ck").exists()  # nothing trained, nothing written


def test_hooks_and_mlflow_lineage(shards_dir, tmp_path, monkeypatch):
    import mlflow

    from vtg import lineage

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("t")
    with mlflow.start_run(run_name="pipeline") as parent:
        pass
    monkeypatch.setenv(lineage.ENV_PARENT_RUN_ID, parent.info.run_id)
    HOOK_CALLS.clear()
    cfg = train_config(shards_dir, tmp_path / "ck", "tracking.enabled=true", f"tracking.tracking_uri={uri}",
                       "tracking.experiment=t", "train.checkpoint_hooks=[support.train_fixtures:record_hook]")
    summary = train(cfg)
    assert [s for _, s in HOOK_CALLS] == [2, 4] and HOOK_CALLS[-1][0].endswith("step-000004")
    meta = read_checkpoint_meta(tmp_path / "ck" / "latest")
    run = mlflow.get_run(meta["mlflow_run_id"])
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert run.data.tags[lineage.TAG_STAGE] == "train"
    assert run.data.tags[lineage.TAG_DATA_VERSION] == meta["data_version"]
    assert run.data.tags[lineage.TAG_CONFIG_HASH] == meta["config_hash"]
    assert run.data.tags[lineage.TAG_GIT_COMMIT] == meta["git_commit"]
    client = mlflow.MlflowClient(uri)
    losses = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert losses == [(i + 1, pytest.approx(x, rel=1e-12)) for i, x in enumerate(summary["losses"])]  # log_every 1
    assert run.data.metrics["train/loss"] == pytest.approx(meta["metrics"]["train/loss"], rel=1e-12)
    assert meta["metrics"]["train/loss"] == summary["final_loss"] == summary["losses"][-1]
    waits = client.get_metric_history(run.info.run_id, "perf/data_wait_frac")
    assert sorted(m.step for m in waits) == [1, 2, 3, 4] and all(0 <= m.value <= 1 for m in waits)
    assert run.info.status == "FINISHED"
