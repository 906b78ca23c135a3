"""MLflow: one run per training run (nested under the pipeline run when the orchestrator says so), tagged with
the lineage keys, params from the resolved config, metrics every `log_every` steps, checkpoints as tags."""

from __future__ import annotations

import os
from pathlib import Path

from training.callbacks import Callback
from training.metrics import RUN_PERF_KEYS
from vtg import lineage
from vtg.config import config_hash

LOSS_KEY = "train/loss"
"""Logged at every logging step: its history tells which steps a resumed run already holds."""


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:500]
    return out


class MLflowCallback(Callback):
    def __init__(self, cfg):
        self.cfg = cfg
        self.run = None
        self.logged_through = 0
        """Steps up to this one are already in the run (a resume replays the steps after its checkpoint)."""

    def on_train_start(self, info: dict) -> None:
        import mlflow

        mlflow.set_tracking_uri(self.cfg.tracking.tracking_uri)
        mlflow.set_experiment(self.cfg.tracking.experiment)
        parent = os.environ.get(lineage.ENV_PARENT_RUN_ID)
        resume_id = info.get("mlflow_run_id")  # continue the same run after a resume
        tags = {
            lineage.TAG_STAGE: "train",
            lineage.TAG_DATA_VERSION: info["data_version"],
            lineage.TAG_GIT_COMMIT: info["git_commit"],
            lineage.TAG_CONFIG_HASH: config_hash(self.cfg),
        }
        if os.environ.get(lineage.ENV_PREFECT_FLOW_RUN_ID):
            tags[lineage.TAG_PREFECT_FLOW_RUN] = os.environ[lineage.ENV_PREFECT_FLOW_RUN_ID]
        if resume_id:
            self.run = mlflow.start_run(run_id=resume_id)
            # steps after the checkpoint that the interrupted run already logged are replayed: log them once
            history = mlflow.MlflowClient().get_metric_history(resume_id, LOSS_KEY)
            self.logged_through = max((m.step for m in history), default=0)
        else:
            self.run = mlflow.start_run(run_name=f"train-{info['finetune']}", parent_run_id=parent,
                                        nested=parent is not None, tags=tags)
            mlflow.log_params({k: v for k, v in flatten(self.cfg.train.model_dump(mode="json"), "train.").items()})
            mlflow.log_params({"effective_batch": info["effective_batch"], "world_size": info["world_size"],
                               "trainable_params": info["trainable_params"]})
        mlflow.set_tags(tags)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        import mlflow

        if step <= self.logged_through:
            return
        mlflow.log_metrics({k.replace("@", "_"): float(v) for k, v in metrics.items()}, step=step)

    def on_checkpoint(self, path: Path, step: int) -> None:
        import mlflow

        mlflow.set_tags({lineage.TAG_CHECKPOINT: str(path), lineage.TAG_STEP: str(step)})

    def on_train_end(self, summary: dict) -> None:
        import mlflow

        if self.run is not None:
            keys = ("skipped_batches", "data_errors", "wall_s", "steps_per_s", *RUN_PERF_KEYS)
            mlflow.log_metrics({f"summary/{k}": float(summary[k]) for k in keys if k in summary})
            mlflow.end_run(status="FINISHED" if summary.get("completed") else "KILLED")
            self.run = None

    def checkpoint_meta(self) -> dict:
        return {"mlflow_run_id": self.run.info.run_id if self.run is not None else None}
