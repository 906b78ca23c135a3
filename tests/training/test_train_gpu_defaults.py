"""GPU-correct defaults, checked on the CPU: flash-attn only with bf16/fp16, ZeRO communication settings for GPUs vs
gloo, DeepSpeed's CPU Adam under optimizer offload, the `engine.deterministic` switch, and the bf16 +
gradient-checkpointing path of the real loop on the tiny model."""

import logging
import os

import numpy as np
import pytest
import torch
from support.train_fixtures import Recorder, train_config

from training.dist import CUBLAS_WORKSPACE, set_determinism
from training.ds_config import build_ds_config
from training.engine import EngineSettings
from training.optim import build_optimizer
from vtg.checkpoints import read_checkpoint_meta
from vtg.errors import VTGError
from vtg.model.modeling import choose_attn_implementation


@pytest.fixture
def fake_gpu_with_flash_attn(monkeypatch):
    import transformers.utils

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)


def test_auto_attention_needs_16_bit_for_flash_attn(fake_gpu_with_flash_attn, caplog):
    with caplog.at_level(logging.INFO, logger="vtg.model.modeling"):
        assert choose_attn_implementation("auto", "cuda", torch.float32) == "sdpa"
    assert [r.message for r in caplog.records] == [
        "attention implementation: sdpa (flash-attn needs bf16/fp16, the model is float32)"]
    assert choose_attn_implementation("auto", "cuda", torch.bfloat16) == "flash_attention_2"
    assert choose_attn_implementation("auto", "cuda", torch.float16) == "flash_attention_2"
    assert choose_attn_implementation("auto", "cuda") == "sdpa"  # no dtype: torch's default, fp32


def test_explicit_flash_attn_with_fp32_is_an_error(fake_gpu_with_flash_attn, tmp_path):
    with pytest.raises(VTGError, match="needs bf16 or fp16"):
        choose_attn_implementation("flash_attention_2", "cuda", torch.float32)
    assert choose_attn_implementation("flash_attention_2", "cuda", torch.bfloat16) == "flash_attention_2"
    with pytest.raises(Exception, match="flash_attention_2 needs engine.precision bf16 or fp16"):
        train_config(tmp_path, tmp_path / "ck", "train.model.attn_implementation=flash_attention_2")
    train_config(tmp_path, tmp_path / "ck", "train.model.attn_implementation=flash_attention_2",
                 "engine.precision=bf16")


def _tcfg(tmp_path, *overrides):
    """SFT's engine settings (`train` over `engine`), what the DeepSpeed config and the optimizer are built from."""
    return EngineSettings.for_sft(train_config(tmp_path, tmp_path / "ck", *overrides))


def test_ds_config_overlaps_communication_on_gpus_only(tmp_path):
    tcfg = _tcfg(tmp_path, "train.zero_stage=2", "train.micro_batch_size=2", "train.grad_accum=4")
    gpu = build_ds_config(tcfg, world_size=8, gpu=True)
    assert gpu["zero_optimization"] == {
        "stage": 2, "overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True,
        "allgather_partitions": True, "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}
    assert gpu["train_batch_size"] == 64 and gpu["zero_force_ds_cpu_optimizer"] is False
    cpu = build_ds_config(tcfg, world_size=2, gpu=False)
    assert cpu["zero_optimization"] == {"stage": 2, "overlap_comm": False, "contiguous_gradients": True,
                                        "reduce_bucket_size": 5e7}
    assert {k: v for k, v in gpu.items() if k != "zero_optimization" and k != "train_batch_size"} == \
        {k: v for k, v in cpu.items() if k != "zero_optimization" and k != "train_batch_size"}
    z3 = build_ds_config(_tcfg(tmp_path, "train.zero_stage=3", "engine.offload_optimizer=true",
                               "engine.offload_param=true", "rl.zero_stage=3"), 8, gpu=True)
    zero = z3["zero_optimization"]
    assert zero["overlap_comm"] is True and "allgather_bucket_size" not in zero  # a ZeRO-1/2 setting
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert z3["zero_force_ds_cpu_optimizer"] is True
    z3_cpu = build_ds_config(_tcfg(tmp_path, "train.zero_stage=3", "engine.offload_optimizer=true"), 2, gpu=False)
    assert z3_cpu["zero_optimization"]["offload_optimizer"]["pin_memory"] is False
    assert build_ds_config(_tcfg(tmp_path, "train.zero_stage=0"), 1, gpu=True)["zero_optimization"] == {"stage": 0}
    assert build_ds_config(tcfg, 1) == build_ds_config(tcfg, 1, gpu=torch.cuda.is_available())


def test_torch_adamw_without_deepspeed_offload(tmp_path):
    model = torch.nn.Linear(4, 4)
    assert type(build_optimizer(model, _tcfg(tmp_path))) is torch.optim.AdamW
    fsdp = _tcfg(tmp_path, "engine.strategy=fsdp", "engine.offload_optimizer=true")  # FSDP ignores offload
    assert type(build_optimizer(model, fsdp)) is torch.optim.AdamW


@pytest.mark.slow  # DeepSpeedCPUAdam JIT-compiles on first use (~90-150 s here), then it is cached
def test_optimizer_offload_trains_with_deepspeed_cpu_adam(shards_dir, tmp_path):
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from training.sft import SFTModule
    from training.trainer import Trainer

    cfg = train_config(shards_dir, tmp_path / "ck", "engine.offload_optimizer=true", "train.max_steps=3",
                       "train.save_every=3", "train.micro_batch_size=2")
    trainer = Trainer(cfg, SFTModule(cfg), callbacks=[])
    assert isinstance(trainer.module.engine.engine.client_optimizer, DeepSpeedCPUAdam)
    assert trainer.module.engine.ds_config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    losses = trainer.fit()["losses"]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_deterministic_switch_before_the_model_and_in_meta(shards_dir, tmp_path, monkeypatch):
    from training import sft

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = {}
    real_build = sft.build_model

    def spy(tcfg, device):
        seen.update(deterministic=torch.are_deterministic_algorithms_enabled(),
                    warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
                    cublas=os.environ.get("CUBLAS_WORKSPACE_CONFIG"), cudnn=torch.backends.cudnn.deterministic,
                    benchmark=torch.backends.cudnn.benchmark)
        return real_build(tcfg, device)

    monkeypatch.setattr(sft, "build_model", spy)
    try:
        summary = sft.train(train_config(shards_dir, tmp_path / "ck", "engine.deterministic=true",
                                          "train.max_steps=2", "train.micro_batch_size=2"))
        assert all(np.isfinite(summary["losses"]))
        assert seen == {"deterministic": True, "warn_only": True, "cublas": CUBLAS_WORKSPACE, "cudnn": True,
                        "benchmark": False}
        assert read_checkpoint_meta(tmp_path / "ck" / "latest")["deterministic"] is True
    finally:
        set_determinism(False)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic


def test_bf16_with_gradient_checkpointing_trains_on_cpu(shards_dir, tmp_path):
    """bf16 weights (DeepSpeed bf16, pixels cast by model_inputs) and activation recomputation, 2 tiny steps."""
    from training.sft import SFTModule
    from training.trainer import Trainer

    cfg = train_config(shards_dir, tmp_path / "ck", "engine.precision=bf16", "train.model.gradient_checkpointing=true",
                       "train.max_steps=2", "train.save_every=2", "train.micro_batch_size=2")
    rec = Recorder()
    trainer = Trainer(cfg, SFTModule(cfg), callbacks=[rec])
    module = trainer.module.engine.module
    assert module.is_gradient_checkpointing and {p.dtype for p in module.parameters()} == {torch.bfloat16}
    calls = []
    # A module inside a checkpointed decoder layer (the layer's own hooks stay outside the checkpoint); a pre-hook,
    # since the recomputation stops early once the tensors backward needs exist.
    module.model.language_model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    losses = trainer.fit()["losses"]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert len(calls) == 2 * len(losses)  # each micro-batch: the forward, and its recomputation in backward
    for _, m in rec.steps:  # the throughput of real bf16 steps: positive, and 2 examples per step
        assert 0 < m["perf/tokens_per_s"] < float("inf")
        assert m["perf/samples_per_s"] * m["perf/step_time_s"] == pytest.approx(2)
