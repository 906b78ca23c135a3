"""MLflow: one run per training run of a stage (nested under the pipeline run when the orchestrator says so),
tagged with the lineage keys, params from the resolved config, metrics every `log_every` steps, checkpoints as
tags; a resumed run continues the same MLflow run and logs the replayed steps once. One base, one subclass per
stage (SFT: `MLflowCallback`; GRPO: `RLMLflow`)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from training.callbacks import Callback
from training.metrics import RUN_PERF_KEYS
from vtg import lineage
from vtg.config import config_hash
from vtg.net import check_tracking_server
from vtg.sources import describe
from vtg.util import flatten

LOSS_KEY = "train/loss"
"""Logged at every SFT logging step: its history tells which steps a resumed run already holds."""
REWARD_KEY = "rl/reward_mean"
"""The same for RL."""


def _params(sections: dict) -> dict[str, str]:
    """Every field of each config section, flattened under the section's name (`train.lr`, `engine.precision`)."""
    return {k: str(v)[:500] for name, section in sections.items()
            for k, v in flatten(section.model_dump(mode="json"), name).items()}


class StageMLflow(Callback):
    stage = "train"
    history_key = LOSS_KEY

    def __init__(self, cfg):
        self.cfg = cfg
        self.run = None
        self.logged_through = 0
        """Steps up to this one are already in the run (a resume replays the steps after its checkpoint)."""

    # ---- what differs per stage -----------------------------------------------------------------------------
    def run_name(self, info: dict) -> str:
        return self.stage

    def extra_tags(self, info: dict) -> dict[str, str]:
        return {}

    def params(self, info: dict) -> dict:
        return {}

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return metrics

    def end_metrics(self, summary: dict) -> dict[str, float]:
        return {}

    # ---- the hooks ----------------------------------------------------------------------------------------------
    def on_train_start(self, info: dict) -> None:
        import mlflow

        check_tracking_server(self.cfg.tracking.tracking_uri)
        mlflow.set_tracking_uri(self.cfg.tracking.tracking_uri)
        mlflow.set_experiment(self.cfg.tracking.experiment)
        parent = os.environ.get(lineage.ENV_PARENT_RUN_ID)
        resume_id = info.get("mlflow_run_id")  # continue the same run after a resume
        tags = {lineage.TAG_STAGE: self.stage, lineage.TAG_DATA_VERSION: info["data_version"],
                lineage.TAG_DATA_SOURCES: describe(info.get("data_sources") or []),
                lineage.TAG_GIT_COMMIT: info["git_commit"], lineage.TAG_CONFIG_HASH: config_hash(self.cfg),
                **self.extra_tags(info)}
        if os.environ.get(lineage.ENV_PREFECT_FLOW_RUN_ID):
            tags[lineage.TAG_PREFECT_FLOW_RUN] = os.environ[lineage.ENV_PREFECT_FLOW_RUN_ID]
        if resume_id:
            self.run = mlflow.start_run(run_id=resume_id)
            # steps after the checkpoint that the interrupted run already logged are replayed: log them once
            history = mlflow.MlflowClient().get_metric_history(resume_id, self.history_key)
            self.logged_through = max((m.step for m in history), default=0)
        else:
            self.run = mlflow.start_run(run_name=self.run_name(info), parent_run_id=parent,
                                        nested=parent is not None, tags=tags)
            mlflow.log_params(self.params(info))
        mlflow.set_tags(tags)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        import mlflow

        if step <= self.logged_through:
            return
        mlflow.log_metrics(self.step_metrics(metrics), step=step)

    def on_checkpoint(self, path: Path, step: int) -> None:
        import mlflow

        mlflow.set_tags({lineage.TAG_CHECKPOINT: str(path), lineage.TAG_STEP: str(step)})

    def on_train_end(self, summary: dict) -> None:
        import mlflow

        if self.run is not None:
            mlflow.log_metrics(self.end_metrics(summary))
            if summary.get("early_stop"):  # train.early_stop ended the run on the overfitting signal
                mlflow.set_tag("vtg.early_stop", str(summary["early_stop"].get("message", ""))[:500])
            mlflow.end_run(status="FINISHED" if summary.get("completed") else "KILLED")
            self.run = None

    def on_train_error(self, error: BaseException) -> None:
        """The run did not finish: FAILED (or KILLED for Ctrl-C), never left active for the next run in this process
        nor marked FINISHED by MLflow's exit handler."""
        import mlflow

        if self.run is not None:
            mlflow.set_tag("vtg.error", f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500])
            mlflow.end_run(status="KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
            self.run = None

    def checkpoint_meta(self) -> dict:
        return {"mlflow_run_id": self.run.info.run_id if self.run is not None else None}


class MLflowCallback(StageMLflow):
    """SFT: params `train.*`, `engine.*` and the batch layout; summary metrics `summary/*` at the end."""

    def run_name(self, info: dict) -> str:
        return f"train-{info['finetune']}"

    def params(self, info: dict) -> dict:
        return {**_params({"train": self.cfg.train, "engine": self.cfg.engine}), "effective_batch": info["effective_batch"],
                "world_size": info["world_size"], "trainable_params": info["trainable_params"]}

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return {k.replace("@", "_"): float(v) for k, v in metrics.items()}

    def end_metrics(self, summary: dict) -> dict[str, float]:
        keys = ("skipped_batches", "data_errors", "wall_s", "steps_per_s", *RUN_PERF_KEYS)
        return {f"summary/{k}": float(summary[k]) for k in keys if k in summary}


class RLMLflow(StageMLflow):
    """GRPO: tagged with the SFT checkpoint it started from; params `rl.*`, `engine.*` and the difficulty filter's counts;
    first/last-10-step means at the end."""

    stage = "rl"
    history_key = REWARD_KEY

    def run_name(self, info: dict) -> str:
        return "rl-grpo"

    def extra_tags(self, info: dict) -> dict[str, str]:
        return {lineage.TAG_PARENT_CHECKPOINT: info["parent"]}

    def params(self, info: dict) -> dict:
        d = info.get("difficulty") or {}
        return {**_params({"rl": self.cfg.rl, "engine": self.cfg.engine}), "pool_queries": info["pool"],
                **{f"difficulty.{k}": v for k, v in d.items()}}

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}

    def end_metrics(self, summary: dict) -> dict[str, float]:
        return {k.replace("/", "_"): float(v) for k, v in summary.items()
                if k.startswith(("first10/", "last10/")) and isinstance(v, float) and math.isfinite(v)}
