"""AdamW and the warmup + cosine schedule, built from the `train` config (one source of truth)."""

from __future__ import annotations

import math

import torch


def lr_factor(step: int, max_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warmup, cosine to `min_ratio`."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class WarmupCosine:
    """Picklable lr lambda (LambdaLR state must survive a checkpoint)."""

    def __init__(self, max_steps: int, warmup_steps: int, min_ratio: float):
        self.max_steps, self.warmup_steps, self.min_ratio = max_steps, warmup_steps, min_ratio

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.max_steps, self.warmup_steps, self.min_ratio)


def build_optimizer(model: torch.nn.Module, tcfg) -> torch.optim.Optimizer:
    """AdamW over trainable params; no decay on biases and norms. torch's AdamW (nothing JIT-compiled), except
    with DeepSpeed optimizer offload: then DeepSpeed's CPU Adam (AVX C++ kernel, the same AdamW update), which
    steps the offloaded fp32 states on the host; it JIT-compiles once (~90 s) into TORCH_EXTENSIONS_DIR."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if tcfg.offload_optimizer and tcfg.strategy == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(groups, lr=tcfg.lr, betas=tuple(tcfg.betas), adamw_mode=True)
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=tuple(tcfg.betas))


def build_scheduler(optimizer: torch.optim.Optimizer, tcfg) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = round(tcfg.warmup_ratio * tcfg.max_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(tcfg.max_steps, warmup, tcfg.min_lr_ratio))
