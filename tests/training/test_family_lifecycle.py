"""Issue 22: every family goes through the whole pipeline the Qwen2.5-VL tiny model does, through the one loader:
SFT under DeepSpeed (checkpoint, export with its processor configs), a reload with plain `from_pretrained`, GRPO
steps from that checkpoint (rollout, reward, update, RL checkpoint), and a checkpoint evaluation (greedy answers,
parsed and scored), on fixture shards, with each family's own inputs (Qwen3-VL/3.5: `<t seconds>` text)."""

from __future__ import annotations

import json
import math

import pytest
from support.train_fixtures import train_config, write_fixture_shards

from vtg import checkpoints

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_fixture_shards(tmp_path_factory.mktemp("family_shards"), n_train=16, n_val=4, shards_per_split=1)


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_sft_export_reload_rl_and_evaluation(family, shards, tmp_path):
    from transformers import AutoModelForImageTextToText

    from evaluation.api import evaluate_checkpoint
    from training.rl.grpo import run_rl
    from training.sft import train
    from vtg.model.families import family_of
    from vtg.model.processing import VIDEO_PROCESSOR_CONFIG, VisionParams

    cfg = train_config(shards, tmp_path / "sft", f"train.model.base=tiny-{family}", "train.max_steps=60",
                       "train.save_every=30", "train.micro_batch_size=8", f"evaluate.shards_dir={shards}", f"evaluate.out_dir={tmp_path / 'eval'}",
                       f"evaluate.store_dir={tmp_path / 'store'}", "evaluate.max_examples=4",
                       f"rl.out_dir={tmp_path / 'rl'}", f"rl.report_dir={tmp_path / 'rlrep'}", "rl.max_steps=2",
                       "rl.queries_per_step=2", "rl.group_size=4", "rl.log_every=1", "rl.progress=false",
                       "rl.save_every=2", "rl.init=latest", "rl.kl_every=0")
    summary = train(cfg)
    assert summary["step"] == 60 and math.isfinite(summary["final_loss"])

    export = checkpoints.export_dir(checkpoints.latest_checkpoint(tmp_path / "sft"))
    assert (export / VIDEO_PROCESSOR_CONFIG).is_file()  # the family's clip-level pixel bounds travel along
    model = AutoModelForImageTextToText.from_pretrained(export)
    assert family_of(model.config).name == family
    assert VisionParams.from_model(model).family == family

    rl = run_rl(cfg)
    h = rl["history"]
    assert len(h) == 2 and all(math.isfinite(r["reward_mean"]) and math.isfinite(r["entropy"]) for r in h)
    assert min(r["parse_failure_rate"] for r in h) < 1.0  # 60 SFT steps answer in the span format: rewards flow
    rl_latest = checkpoints.latest_checkpoint(tmp_path / "rl")
    assert checkpoints.read_checkpoint_meta(rl_latest)["step"] == 2

    result = evaluate_checkpoint(rl_latest, "val", cfg)
    assert result.result["summary"]["counts"]["scored"] == 4
    assert 0.0 <= result.metrics["miou"] <= 1.0 and result.metrics["eval_loss"] > 0
    rows = [json.loads(line) for line in (result.entry_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(isinstance(r["raw"], str) for r in rows)
