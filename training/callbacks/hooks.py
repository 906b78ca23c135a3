"""Post-checkpoint hooks: `module:function` import paths called as fn(checkpoint_dir: str, step: int).

The orchestration layer plugs in here (e.g. a function that emits a Prefect `checkpoint.saved` event or queues
an evaluation); the training loop knows nothing about it. A failing hook is logged, never fatal to training.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path

from training.callbacks import Callback
from vtg.errors import ConfigError

log = logging.getLogger(__name__)


def import_hook(path: str) -> Callable[[str, int], object]:
    module_name, _, func_name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"train.checkpoint_hooks: cannot import {path!r} ({e})") from None
    if not callable(fn):
        raise ConfigError(f"train.checkpoint_hooks: {path!r} is not callable")
    return fn


class CheckpointHooks(Callback):
    def __init__(self, paths: list[str]):
        self.hooks = [(p, import_hook(p)) for p in paths]  # resolved at start: a typo fails before step 1

    def on_checkpoint(self, path: Path, step: int) -> None:
        for name, fn in self.hooks:
            try:
                fn(str(path), step)
            except Exception as e:  # noqa: BLE001 - a hook must never kill a training run
                log.error("checkpoint hook %s failed for %s: %s: %s", name, path, type(e).__name__, e)
