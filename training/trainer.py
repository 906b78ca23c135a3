"""One trainer for every objective (OLMo-core's `Trainer` + `TrainModule`): the outer loop, written once.

`Trainer` owns what is the same for SFT and GRPO: distributed setup, the checkpoint root's lifecycle (lock, resume,
rank state, save, retention: `training.lifecycle.RunLifecycle`), the step loop with its cadence (`log_every`,
`save_every`, `max_steps` or `--stop-after`), the meta every checkpoint carries, error reporting to the callbacks
and the release of the lock. A `TrainModule` owns one objective: its model, engine and data, one optimizer step
(`train_step`), the metrics of a log window, its own meta and its summary. SFT is `training.sft.SFTModule`, GRPO
`training.rl.grpo.GRPOModule`; a new objective is a new module, not a new loop (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.callbacks import Callback, CallbackList, default_callbacks
from training.dist import init_distributed
from training.lifecycle import RunLifecycle
from vtg import lineage
from vtg.cli_common import config_arg_parser, resolve_config
from vtg.config import PipelineConfig, config_hash


class TrainModule:
    """One objective over the shared run. `setup` builds what it trains; the trainer then reads `engine`,
    `tokenizer`, `state` (a dataclass with `step`), `data_version` and `data_sources`."""

    section: str
    """The config section of the stage (`train`, `rl`): its `out_dir`, `resume`, `max_steps`, `save_every`,
    `log_every`, `keep_last`, `progress` and `checkpoint_hooks` apply."""
    key_name: str
    """The meta.json key of the stage's run key (resuming needs a match)."""
    num_workers: int = 0
    """Data loader workers (the data order depends on them: a resume needs the same number)."""

    engine: Any
    tokenizer: Any
    state: Any
    data_version: str
    data_sources: Any

    def setup(self, trainer: Trainer) -> None:
        """Build the model, engine and data on this rank (the lock is held). May call `trainer.decide_resume()`
        early when what it builds depends on whether the run resumes."""
        raise NotImplementedError

    def run_key(self) -> str:
        """What determines the trajectory (`key_name` in meta.json)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """This rank's run state to save beside the engine: `{"run": ..., "guard": ...}` (JSON)."""
        raise NotImplementedError

    def load_state_dict(self, saved: dict, src: Path) -> None:
        """The inverse of `state_dict` (on resume from `src`, after the engine state is loaded); says so in the
        log."""
        raise NotImplementedError

    def run_info(self) -> dict:
        """The stage's part of what `on_train_start` hears."""
        return {}

    def start(self, stop_at: int) -> bool:
        """Before the first step of this call: True when nothing is left to train."""
        return self.state.step >= stop_at

    def train_step(self) -> Any:
        """One optimizer step (every rank); advances `state.step` by one."""
        raise NotImplementedError

    def step_metrics(self) -> dict[str, float]:
        """The metrics logged at this step (every rank calls it at the log cadence; it may reduce over ranks)."""
        return {}

    def checkpoint_meta(self) -> dict:
        """The stage's own keys of meta.json (the trainer adds the common ones)."""
        return {}

    def after_save(self, saved: Path | None, completed: bool) -> bool:
        """After each checkpoint (every rank): True ends the run now (early stop)."""
        return False

    def finish(self) -> None:
        """After the last step of this call (release loaders)."""

    def summary(self, wall_s: float, start_step: int) -> dict:
        """The run summary `fit` returns and `on_train_end` hears."""
        raise NotImplementedError


class Trainer:
    """The outer loop for one `TrainModule` (one stage's run): lock, setup, resume, steps, saves, release."""

    def __init__(self, cfg: PipelineConfig, module: TrainModule, callbacks: list[Callback] | None = None):
        self.cfg, self.module = cfg, module
        self.run_cfg = getattr(cfg, module.section)
        self.dist = init_distributed(cfg.engine.strategy)
        self.run = RunLifecycle(cfg, module.section, module.key_name, self.dist)  # the lock first
        self.run.guarded(self._setup, callbacks)

    def _setup(self, callbacks: list[Callback] | None) -> None:
        self.git_commit = lineage.git_commit()
        self.resume_from: Path | None = None
        self.resumed_meta: dict = {}
        self._decided = False
        self.module.setup(self)
        self.callbacks = CallbackList(default_callbacks(self.cfg, self.dist.is_main, self.module.section)
                                      if callbacks is None else callbacks)
        self.resume()

    def release_lock(self) -> None:
        self.run.release()

    # ---- resume --------------------------------------------------------------------------------------------
    def decide_resume(self) -> Path | None:
        """The checkpoint this run resumes from (None: a fresh run), decided once on rank 0 for every rank (a
        superseded root is moved aside here)."""
        if not self._decided:
            m = self.module
            self.resume_from, self.resumed_meta = self.run.resume_source(m.run_key(), m.data_version)
            self._decided = True
        return self.resume_from

    def resume(self) -> None:
        src = self.decide_resume()
        if src is None:
            return
        m = self.module
        saved = self.run.restore(src, m.engine, m.num_workers)
        m.load_state_dict(saved, src)

    # ---- checkpointing -------------------------------------------------------------------------------------
    def save(self) -> Path | None:
        m = self.module
        meta = {"data_version": m.data_version, "data_sources": m.data_sources, "git_commit": self.git_commit,
                "config_hash": config_hash(self.cfg), m.key_name: m.run_key(),
                "deterministic": self.cfg.engine.deterministic, "mlflow_run_id": None,
                **m.checkpoint_meta(), **self.callbacks.checkpoint_meta()}
        state = {**m.state_dict(), "num_workers": m.num_workers}
        final = self.run.save(m.state.step, m.engine, m.tokenizer, state, meta)
        if final is not None:
            self.callbacks.on_checkpoint(final, m.state.step)
        return final

    # ---- the loop ------------------------------------------------------------------------------------------
    def run_info(self) -> dict:
        m = self.module
        return {"world_size": self.dist.world_size, "data_version": m.data_version, "data_sources": m.data_sources,
                "git_commit": self.git_commit, "start_step": m.state.step,
                "mlflow_run_id": self.resumed_meta.get("mlflow_run_id"), **m.run_info()}

    def fit(self, stop_after: int | None = None) -> dict:
        """Train to the section's `max_steps` (or checkpoint and stop after step `stop_after`); a run that fails or
        is interrupted tells the callbacks (`on_train_error`: the tracker's run ends FAILED) before the error goes
        on."""
        return self.callbacks.reporting_errors(self._fit, stop_after)

    def _fit(self, stop_after: int | None) -> dict:
        m, rc = self.module, self.run_cfg
        stop_at = min(rc.max_steps, stop_after) if stop_after else rc.max_steps
        self.callbacks.on_train_start(self.run_info())
        start_wall, start_step = time.perf_counter(), m.state.step
        completed = m.start(stop_at)
        while not completed:
            m.train_step()
            step = m.state.step
            if step % rc.log_every == 0 or step == stop_at:
                self.callbacks.on_step(step, m.step_metrics())
            completed = step >= stop_at
            if step % rc.save_every == 0 or step == stop_at:
                saved = self.save()
                completed = m.after_save(saved, completed) or completed
        m.finish()
        summary = m.summary(time.perf_counter() - start_wall, start_step)
        self.callbacks.on_train_end(summary)
        return summary


def run_module(cfg: PipelineConfig, module: TrainModule, callbacks: list[Callback] | None = None,
               stop_after: int | None = None) -> tuple[Trainer, dict]:
    """Build the trainer, fit, release the lock (also on failure); returns the trainer and the summary."""
    trainer = Trainer(cfg, module, callbacks)
    try:
        return trainer, trainer.fit(stop_after=stop_after)
    finally:
        trainer.release_lock()


def stage_main(doc: str, prog: str, stage: str, run: Callable[..., dict],
               write_summary: Callable[[dict, Path], None], argv: list[str] | None = None,
               prepare: Callable[[PipelineConfig], PipelineConfig] | None = None) -> int:
    """The module CLI of a training stage (`python -m training`, `python -m training.rl`): the config under the
    stage's declared view, `--stop-after N`, `--summary PATH` (rank 0), and the launchers' `--local_rank`."""
    parser = config_arg_parser(doc)
    parser.prog = prog
    parser.add_argument("--stop-after", type=int, default=None, metavar="N",
                        help="checkpoint and exit after step N (a later run resumes exactly)")
    parser.add_argument("--summary", default=None, metavar="PATH",
                        help="on rank 0, also write the run summary here (JSON; what it holds: the stage's --help "
                             "text above)")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher
    args = parser.parse_args(argv)
    cfg = resolve_config(args, stage=stage)
    if prepare is not None:
        cfg = prepare(cfg)
    summary = run(cfg, stop_after=args.stop_after)
    import torch.distributed as dist

    if args.summary and (not dist.is_initialized() or dist.get_rank() == 0):
        write_summary(summary, Path(args.summary))
    return 0
