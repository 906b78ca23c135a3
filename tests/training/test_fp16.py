"""fp16 with dynamic loss scaling (issue 37), through the real SFT loop on the tiny model (world size 1).

What runs on this CPU (measured, docs/gpu.md "fp16"): FSDP2 in fp16 (fp32 master weights, fp16 compute, `torch.amp`
grad scaler). DeepSpeed refuses fp16 here: its CPU accelerator allows it only with oneDNN fp16 support (AVX512-FP16 /
AMX-FP16), which these CPUs lack; the engine says so before `deepspeed.initialize`. DeepSpeed's own fp16 optimizer
and loss scaler do run on this CPU once that capability answer is lifted, so the DeepSpeed case lifts it (the one
thing here that stands in for hardware: the CPU's fp16 flag) to exercise the real loss scaler; `make gpu-check`
runs both engines in fp16 on a GPU with nothing lifted.

An overflow is forced by a loss spike (x1e6) at one step: its fp16 gradients overflow, so the step is skipped (the
weights do not move, the lr schedule does not advance), the scale halves, `train/loss_scale` and
`train/overflow_steps` log it, and training goes on; a resume after it keeps the halved scale."""

import pytest
import torch
from support.train_fixtures import Recorder, train_config

from training import engine as engines
from training.ds_config import LOSS_SCALE_POWER, build_ds_config
from training.engine import EngineSettings
from training.sft import train
from vtg.checkpoints import read_checkpoint_meta
from vtg.errors import VTGError

SPIKE = 1e6
SCALE = 2.0 ** LOSS_SCALE_POWER


def _cpu_has_fp16() -> bool:
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_fp16_supported())


def test_deepspeed_fp16_section_is_dynamic_and_halves_at_every_overflow():
    s = EngineSettings(lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0, grad_clip=1.0, warmup_ratio=0.0,
                       min_lr_ratio=1.0, max_steps=4, micro_batch_size=1, grad_accum=2, zero_stage=2,
                       offload_optimizer=False, offload_param=False, precision="fp16", strategy="deepspeed")
    cfg = build_ds_config(s, world_size=1, gpu=False)
    assert cfg["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                           "hysteresis": 1, "min_loss_scale": 1.0}  # 0: dynamic; hysteresis 1: halve at once
    assert not cfg["bf16"]["enabled"]
    assert not build_ds_config(s.__class__(**{**vars(s), "precision": "bf16"}), 1, gpu=False)["fp16"]["enabled"]


@pytest.mark.skipif(_cpu_has_fp16(), reason="this CPU has oneDNN fp16: DeepSpeed trains fp16 on it")
def test_deepspeed_fp16_is_refused_on_this_cpu_with_the_reason(shards_dir, tmp_path):
    with pytest.raises(VTGError, match=r"engine.precision=fp16 with engine.strategy=deepspeed: DeepSpeed's cpu "
                                       r"accelerator refuses fp16 on this machine.*AVX512-FP16.*engine.strategy=fsdp"):
        train(train_config(shards_dir, tmp_path / "ck", "engine.precision=fp16"))
    assert not list((tmp_path / "ck").glob("step-*"))  # refused before step 1


def lift_cpu_fp16_flag(monkeypatch) -> None:
    """DeepSpeed's CPU accelerator answers "no fp16" on a CPU without oneDNN fp16; say yes (module doc)."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)


def _flat(module: torch.nn.Module) -> torch.Tensor:
    """Every weight of the module (this rank's shards under FSDP2), as one fp32 vector."""
    return torch.cat([(p.to_local() if hasattr(p, "to_local") else p).detach().float().flatten()
                      for p in module.parameters()])


def _planted_spike(monkeypatch, cls, at: int | None) -> list[torch.Tensor]:
    """Spike the loss at the `at`-th forward of the next run (grad_accum 1: step `at`); returns the weights seen at
    each forward (the weights every step starts from)."""
    real = cls.forward
    seen: list[torch.Tensor] = []

    def forward(self, inputs):
        seen.append(_flat(self.module))
        loss = real(self, inputs)
        return loss * SPIKE if len(seen) == at else loss

    monkeypatch.setattr(cls, "forward", forward)
    return seen


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_overflow_skips_the_step_halves_the_scale_and_training_goes_on(shards_dir, tmp_path, monkeypatch, strategy):
    cls = {"fsdp": engines.FSDPEngine, "deepspeed": engines.DeepSpeedEngine}[strategy]
    if strategy == "deepspeed":
        lift_cpu_fp16_flag(monkeypatch)
    common = (f"engine.strategy={strategy}", "engine.precision=fp16", "train.max_steps=4", "train.save_every=2")
    rec = Recorder()
    seen = _planted_spike(monkeypatch, cls, at=2)
    summary = train(train_config(shards_dir, tmp_path / "a", *common), callbacks=[rec])

    m = dict(rec.steps)
    assert [m[s]["train/loss_scale"] for s in (1, 2, 3, 4)] == [SCALE, SCALE / 2, SCALE / 2, SCALE / 2]
    assert [m[s]["train/overflow_steps"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    assert summary["loss_scale"] == SCALE / 2 and summary["overflow_steps"] == 1 and summary["step"] == 4
    assert not torch.equal(seen[1], seen[0])  # step 1 trained
    assert torch.equal(seen[2], seen[1])      # step 2 overflowed: skipped, the weights did not move
    assert not torch.equal(seen[3], seen[2])  # and training went on
    assert m[3]["train/lr"] == m[2]["train/lr"] != m[4]["train/lr"]  # the skipped step did not advance the schedule
    assert all(torch.isfinite(torch.tensor(summary["losses"])))

    # a resume after the overflow keeps the scaler's state: the same scale, the same steps, bit for bit
    _planted_spike(monkeypatch, cls, at=2)
    train(train_config(shards_dir, tmp_path / "b", *common), stop_after=2)
    assert read_checkpoint_meta(tmp_path / "b" / "latest")["step"] == 2
    _planted_spike(monkeypatch, cls, at=None)
    resumed = Recorder()
    again = train(train_config(shards_dir, tmp_path / "b", *common), callbacks=[resumed])
    assert [s for s, _ in resumed.steps] == [3, 4]
    assert [x["train/loss_scale"] for _, x in resumed.steps] == [SCALE / 2, SCALE / 2]
    assert again["losses"] == summary["losses"] and again["overflow_steps"] == 1
