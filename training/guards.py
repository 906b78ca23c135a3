"""Stability guards: skip a batch whose loss is NaN/inf or spikes above a multiple of the running mean.

Each rank judges its own loss; the loop all-reduces the verdict (max) so that every rank skips together
(a rank that stepped alone would deadlock the next collective or desynchronise the replicas).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class StabilityGuard:
    spike_ratio: float = 5.0
    ema_beta: float = 0.95
    min_steps: int = 20
    max_consecutive_skips: int = 20
    mean: float | None = None
    seen: int = 0
    consecutive_skips: int = 0

    def judge(self, loss: float) -> str | None:
        """This rank's reason to skip (`nonfinite_loss` / `loss_spike`), or None."""
        if not math.isfinite(loss):
            return "nonfinite_loss"
        if self.mean is not None and self.seen >= self.min_steps and loss > self.spike_ratio * self.mean:
            return "loss_spike"
        return None

    def accept(self, loss: float) -> None:
        """Fold an accepted (all-rank mean) loss into the running mean."""
        self.mean = loss if self.mean is None else self.ema_beta * self.mean + (1 - self.ema_beta) * loss
        self.seen += 1
        self.consecutive_skips = 0

    def skipped(self) -> bool:
        """Record a skip; True when the run should abort (too many in a row)."""
        self.consecutive_skips += 1
        return self.consecutive_skips >= self.max_consecutive_skips

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    @classmethod
    def from_config(cls, gcfg) -> StabilityGuard:
        return cls(spike_ratio=gcfg.spike_ratio, ema_beta=gcfg.ema_beta, min_steps=gcfg.min_steps,
                   max_consecutive_skips=gcfg.max_consecutive_skips)


# Numeric codes so the verdict can be all-reduced with MAX.
REASONS = {None: 0, "loss_spike": 1, "nonfinite_loss": 2}
REASON_OF = {v: k for k, v in REASONS.items()}
