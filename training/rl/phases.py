"""Where a GRPO step's time goes: seconds per phase, summed over the step's micro-batches (the `*_s` columns of
`steps.csv` after `rollout_s` and `update_s`, `training.rl.outputs.PHASES`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from training.rl.outputs import PHASES


class PhaseClock:
    """Wall seconds per phase of one step. On CUDA each phase ends with a synchronize, so that kernels launched
    asynchronously are charged to the phase that launched them (a few syncs per micro-batch). A phase that never
    ran this step reads NaN (e.g. the reference pass between `rl.kl_every` steps)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise KeyError(f"unknown phase {name!r} (known: {', '.join(PHASES)})")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def row(self) -> dict[str, float]:
        return {k: self.seconds.get(k, float("nan")) for k in PHASES}
