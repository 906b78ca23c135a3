"""Where and when per-checkpoint evaluation runs beside training on one node: the one placement rule.

`place_evaluation(n_visible_gpus, train_num_gpus, base, requested)` is a pure function (no torch, no environment);
the orchestrator (`flows.tasks.train`) counts the GPUs, applies the result and logs `Placement.line()`.

`requested` is `evaluate.device`:
- `auto` (default): the tiny rung (`train.model.base: tiny`) and a machine without GPUs evaluate on the CPU,
  beside training. Otherwise evaluation takes the *last* visible GPU when training leaves one free
  (visible GPUs > `train.num_gpus`): it runs concurrently there and training is launched on the others. When
  training needs every visible GPU, evaluation starts on that GPU only once training has ended: it never runs
  concurrently on a training GPU, where generation would cost training throughput and memory.
- `cuda`: as `auto`, without the CPU cases (an error without a GPU).
- `cuda:<i>`: that GPU (an explicit device wins); concurrently when training still has `train.num_gpus` other
  GPUs (it is launched on them), else after training.
- `cpu`: the CPU, concurrently.

It lives with the orchestrator, its only user (flows import no stage package); `evaluate.device`
(vtg/config/evaluate.py) documents it and validates its values. The served path does not use this rule: there
`checkpoint.saved` events start each evaluation on the `gpu-eval` work pool, a GPU node of its own (infra/prefect/).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vtg.errors import ConfigError

CONCURRENT = "concurrent"
AFTER_TRAINING = "after_training"
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(?::(\d+))?")
"""The values `evaluate.device` accepts."""


@dataclass(frozen=True)
class Placement:
    device: str
    """`cpu` or `cuda:<i>`, `i` a GPU index as the orchestrator sees them (its CUDA_VISIBLE_DEVICES order)."""
    when: Literal["concurrent", "after_training"]
    """`concurrent`: the evaluator follows training's checkpoints as they come; `after_training`: it starts once
    training has ended."""
    reason: str
    """Why, in words (logged and shown in the run report)."""
    train_gpus: tuple[int, ...] | None = None
    """GPU indices training is launched on, when evaluation holds one of the node's GPUs concurrently; None: the
    launcher's default (the first `train.num_gpus`)."""

    @property
    def gpu(self) -> int | None:
        """The GPU index evaluation uses, or None on the CPU."""
        return int(self.device.split(":")[1]) if self.device.startswith("cuda:") else None

    def line(self) -> str:
        """The decision in one line."""
        train = f"; training on {_span(self.train_gpus)}" if self.train_gpus else ""
        return f"evaluation on {self.device}, {self.when.replace('_', ' ')}{train} ({self.reason})"


def _span(gpus: Sequence[int]) -> str:
    gpus = list(gpus)
    if len(gpus) > 2 and gpus == list(range(gpus[0], gpus[-1] + 1)):
        return f"cuda:{gpus[0]}-{gpus[-1]}"
    return ",".join(f"cuda:{g}" for g in gpus)


def place_evaluation(n_visible_gpus: int, train_num_gpus: int, base: str, requested: str = "auto") -> Placement:
    """The placement rule (module docstring). `base` is `train.model.base`, `requested` is `evaluate.device`."""
    m = DEVICE_PATTERN.fullmatch(requested)
    if m is None:
        raise ConfigError(f"evaluate.device={requested!r}: expected auto, cpu, cuda or cuda:<index>")
    n, ranks = max(0, n_visible_gpus), max(1, train_num_gpus)
    if requested == "cpu":
        return Placement("cpu", CONCURRENT, "evaluate.device=cpu")
    if requested == "auto" and base == "tiny":
        return Placement("cpu", CONCURRENT, "tiny rung: the CPU evaluates beside training")
    if n == 0:
        if requested == "auto":
            return Placement("cpu", CONCURRENT, "no GPU visible")
        raise ConfigError(f"evaluate.device={requested} but no GPU is visible on this node; use auto or cpu")
    if m.group(1) is not None:
        gpu = int(m.group(1))
        if gpu >= n:
            raise ConfigError(f"evaluate.device={requested} but only {n} GPU(s) are visible (cuda:0-{n - 1})")
        why = f"evaluate.device={requested}"
    else:
        gpu, why = n - 1, f"the last of {n} visible GPUs"
    others = [i for i in range(n) if i != gpu]
    if len(others) >= ranks:
        return Placement(f"cuda:{gpu}", CONCURRENT, f"{why}; training uses {ranks} of the others",
                         tuple(others[:ranks]))
    return Placement(f"cuda:{gpu}", AFTER_TRAINING,
                     f"{why}, but training (train.num_gpus={ranks}) needs it: evaluation waits for training to end")


def device_ids(indices: Sequence[int], visible: str | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES entries for GPU `indices` (the orchestrator's view), given its own
    CUDA_VISIBLE_DEVICES (None or unset: index i is device i)."""
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else None
    if ids is None:
        return [str(i) for i in indices]
    if any(i >= len(ids) for i in indices):
        raise ConfigError(f"GPU indices {list(indices)} outside CUDA_VISIBLE_DEVICES={visible!r}")
    return [ids[i] for i in indices]
