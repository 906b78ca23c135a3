"""The DeepSpeed config, generated from a stage's `EngineSettings` (`train` or `rl`, over the shared `engine`
section; never written by hand, so it cannot drift)."""

from __future__ import annotations

import torch

GPU_BUCKET = 5e8
"""Elements per reduce / all-gather bucket on GPUs (the common ZeRO-2 recipe: overlap_comm + 5e8 buckets)."""
CPU_BUCKET = 5e7
"""Smaller buckets on CPU (gloo): less memory per rank process, and nothing to overlap with."""
LOSS_SCALE_POWER = 16
"""fp16's dynamic loss scaling, one policy for both engines (DeepSpeed's `fp16` section below, FSDP's
`torch.amp.GradScaler` in `training.engine`): start at 2^16; at every step whose gradients hold an inf or a NaN,
skip the optimizer step and halve the scale (hysteresis 1: DeepSpeed's default of 2 skips a first overflow without
lowering the scale); double it after `LOSS_SCALE_WINDOW` steps without one; never below `MIN_LOSS_SCALE`."""
LOSS_SCALE_WINDOW = 1000
MIN_LOSS_SCALE = 1.0


def zero_section(tcfg, gpu: bool) -> dict:
    """`zero_optimization`: on GPUs gradient reduction overlaps the backward pass (a side CUDA stream); on the CPU
    accelerator there are no streams to overlap with, so communication runs in line with small buckets."""
    zero: dict = {"stage": tcfg.zero_stage}
    if tcfg.zero_stage >= 1 and gpu:
        zero.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=GPU_BUCKET)
        if tcfg.zero_stage < 3:
            zero.update(reduce_scatter=True, allgather_partitions=True, allgather_bucket_size=GPU_BUCKET)
    elif tcfg.zero_stage >= 1:
        zero.update(overlap_comm=False, contiguous_gradients=True, reduce_bucket_size=CPU_BUCKET)
    if tcfg.zero_stage == 3:
        # Full weights gathered on rank 0 for the HF export of a sharded model.
        zero.update(stage3_gather_16bit_weights_on_model_save=True, stage3_param_persistence_threshold=0)
    if tcfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": gpu}  # pinned host memory: faster copies
    if tcfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": gpu}
    return zero


def fp16_section(enabled: bool) -> dict:
    """`fp16`: dynamic loss scaling (`loss_scale: 0`) with the policy of `LOSS_SCALE_POWER`."""
    return {"enabled": enabled, "loss_scale": 0, "initial_scale_power": LOSS_SCALE_POWER,
            "loss_scale_window": LOSS_SCALE_WINDOW, "hysteresis": 1, "min_loss_scale": MIN_LOSS_SCALE}


def build_ds_config(tcfg, world_size: int, gpu: bool | None = None) -> dict:
    """Batch, accumulation, clipping, precision, ZeRO stage and offload from `EngineSettings`; `gpu` (default:
    whether CUDA is available) picks the GPU or the CPU (gloo) communication settings."""
    gpu = torch.cuda.is_available() if gpu is None else gpu
    return {
        "train_micro_batch_size_per_gpu": tcfg.micro_batch_size,
        "gradient_accumulation_steps": tcfg.grad_accum,
        "train_batch_size": tcfg.micro_batch_size * tcfg.grad_accum * world_size,
        "gradient_clipping": tcfg.grad_clip,
        "zero_optimization": zero_section(tcfg, gpu),
        "bf16": {"enabled": tcfg.precision == "bf16"},
        "fp16": fp16_section(tcfg.precision == "fp16"),
        # We pass our own optimizer (training/optim.py): torch AdamW, so no fused_adam JIT compile (docs/environment.md),
        # or DeepSpeedCPUAdam with optimizer offload, which DeepSpeed then insists on.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": bool(tcfg.offload_optimizer),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
