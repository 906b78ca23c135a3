"""Side effects of training go through callbacks; the loop imports no tracker (OLMo-core style).

Hooks (all optional): on_train_start(info), on_step(step, metrics), on_skip(step, info),
on_checkpoint(path, step), on_train_end(summary), on_train_error(error) (the run failed or was interrupted after
on_train_start); `checkpoint_meta()` may add keys to every meta.json.
Only rank 0 gets the default callbacks.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


class Callback:
    def on_train_start(self, info: dict) -> None: ...

    def on_step(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_skip(self, step: int, info: dict) -> None: ...

    def on_checkpoint(self, path: Path, step: int) -> None: ...

    def on_train_end(self, summary: dict) -> None: ...

    def on_train_error(self, error: BaseException) -> None: ...

    def checkpoint_meta(self) -> dict:
        return {}


class CallbackList(Callback):
    def __init__(self, callbacks: list[Callback]):
        self.callbacks = list(callbacks)

    def on_train_start(self, info: dict) -> None:
        for c in self.callbacks:
            c.on_train_start(info)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        for c in self.callbacks:
            c.on_step(step, metrics)

    def on_skip(self, step: int, info: dict) -> None:
        for c in self.callbacks:
            c.on_skip(step, info)

    def on_checkpoint(self, path: Path, step: int) -> None:
        for c in self.callbacks:
            c.on_checkpoint(path, step)

    def on_train_end(self, summary: dict) -> None:
        for c in self.callbacks:
            c.on_train_end(summary)

    def reporting_errors(self, fit, *args):
        """`fit(*args)`; if it fails or is interrupted, every callback hears it (`on_train_error`), then it goes on."""
        try:
            return fit(*args)
        except BaseException as e:
            self.on_train_error(e)
            raise

    def on_train_error(self, error: BaseException) -> None:
        for c in self.callbacks:
            try:
                c.on_train_error(error)
            except Exception as e:  # noqa: BLE001 - the run's own error is the one to report
                log.error("%s.on_train_error failed: %s: %s", type(c).__name__, type(e).__name__, e)

    def checkpoint_meta(self) -> dict:
        meta: dict = {}
        for c in self.callbacks:
            meta.update(c.checkpoint_meta())
        return meta


def default_callbacks(cfg, is_main: bool, section: str = "train") -> list[Callback]:
    """Console progress, MLflow (when tracking is enabled) and the post-checkpoint hooks of the stage whose config
    section is `section` (`train`: SFT, `rl`: GRPO), on rank 0 only."""
    if not is_main:
        return []
    from training.callbacks.console import ConsoleCallback, RLConsole
    from training.callbacks.hooks import CheckpointHooks

    run = getattr(cfg, section)
    console = {"train": ConsoleCallback, "rl": RLConsole}[section]
    callbacks: list[Callback] = [console(run.max_steps, progress=run.progress)]
    if cfg.tracking.enabled:
        from training.callbacks.mlflow_cb import MLflowCallback, RLMLflow

        callbacks.append({"train": MLflowCallback, "rl": RLMLflow}[section](cfg))
    if run.checkpoint_hooks:
        callbacks.append(CheckpointHooks(run.checkpoint_hooks))
    return callbacks
