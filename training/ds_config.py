"""The DeepSpeed config, generated from `train` params (never written by hand, so it cannot drift)."""

from __future__ import annotations


def build_ds_config(tcfg, world_size: int) -> dict:
    """Batch, accumulation, clipping, precision, ZeRO stage and offload from the `train` section."""
    zero: dict = {"stage": tcfg.zero_stage}
    if tcfg.zero_stage >= 1:
        zero.update(overlap_comm=False, contiguous_gradients=True, reduce_bucket_size=5e7)
    if tcfg.zero_stage == 3:
        # Full weights gathered on rank 0 for the HF export of a sharded model.
        zero.update(stage3_gather_16bit_weights_on_model_save=True, stage3_param_persistence_threshold=0)
    if tcfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if tcfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": tcfg.micro_batch_size,
        "gradient_accumulation_steps": tcfg.grad_accum,
        "train_batch_size": tcfg.micro_batch_size * tcfg.grad_accum * world_size,
        "gradient_clipping": tcfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": tcfg.precision == "bf16"},
        "fp16": {"enabled": tcfg.precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        # We pass our own torch.optim.AdamW: no fused_adam / DeepSpeedCPUAdam JIT compile (DESIGN.md §4).
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
