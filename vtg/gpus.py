"""How many GPUs this process can use, answered without importing torch on a machine that has no GPU driver.

The flow process asks twice (where the evaluator goes, and which launcher starts the training ranks) and needs
nothing else from torch: importing it for that cost 1.8 s of CPU per flow run (issue 40). Without a driver's device
node, CUDA (NVIDIA), ROCm (AMD, also `torch.cuda`) and WSL's GPU path cannot show torch a device, so the answer is 0;
with one, torch answers (CUDA_VISIBLE_DEVICES respected)."""

from __future__ import annotations

import os

DRIVER_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")
"""Present wherever a GPU driver is loaded: NVIDIA's control device and proc folder, ROCm's kernel driver, WSL."""


def gpu_driver_present() -> bool:
    return any(os.path.exists(p) for p in DRIVER_NODES)


def visible_gpu_count() -> int:
    """GPUs torch would use here (0 without a driver, or without torch)."""
    if not gpu_driver_present():
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
