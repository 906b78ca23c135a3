"""System metrics the loop reports: process RSS, and GPU memory + utilization (NVML) when a GPU exists."""

from __future__ import annotations

import functools

import psutil
import torch


@functools.cache
def _nvml_handle(index: int):
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # noqa: BLE001 - NVML is optional (nvidia-ml-py in the gpu extra)
        return None


def memory_metrics(device: torch.device) -> dict[str, float]:
    out = {"sys/rss_gb": psutil.Process().memory_info().rss / 2**30}
    if device.type == "cuda":
        out["gpu/mem_allocated_gb"] = torch.cuda.memory_allocated(device) / 2**30
        out["gpu/max_mem_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        handle = _nvml_handle(device.index or 0)
        if handle is not None:
            import pynvml

            out["gpu/utilization"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    return out
