"""`engine`: what SFT (`train`) and GRPO (`rl`) share about how a model is trained: the distributed engine, the
precision, determinism and offload. Each stage keeps its own ZeRO stage (`train.zero_stage`, `rl.zero_stage`)."""

from typing import Literal

from vtg.config._base import Section


class EngineConfig(Section):
    strategy: Literal["deepspeed", "fsdp"] = "deepspeed"
    """Distributed engine: DeepSpeed ZeRO, or PyTorch FSDP2 (`fully_shard`) as the ZeRO-3 alternative."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Training precision (fp32 on CPU: bf16 is ~40x slower there). fp16 trains with dynamic loss scaling (an overflow
    skips the step and halves the scale, `train/loss_scale`); DeepSpeed refuses it on a CPU without oneDNN fp16, FSDP
    runs it there with fp32 master weights."""
    deterministic: bool = False
    """Deterministic kernels on every rank (cuBLAS workspace, torch deterministic algorithms with warn_only, cuDNN
    deterministic without benchmark); slower on GPUs. Recorded in every checkpoint's meta.json."""
    offload_optimizer: bool = False
    """ZeRO-Offload: optimizer states (and step) on the CPU (stage >= 1)."""
    offload_param: bool = False
    """ZeRO-Infinity style parameter offload to the CPU (stage 3 only)."""


MOVED = ("strategy", "precision", "deterministic", "offload_optimizer", "offload_param")
"""Fields that were `train.<name>` before they moved here: an old key's error names the new one."""
