"""RL's side effects: a console progress bar and an MLflow run nested under the pipeline run, with lineage to
the SFT checkpoint RL started from (the same callback interface as SFT: `training.callbacks`)."""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

from training.callbacks import Callback
from training.callbacks.mlflow_cb import flatten
from vtg import lineage
from vtg.config import config_hash

log = logging.getLogger("training.rl")
REWARD_KEY = "rl/reward_mean"
"""Logged at every logging step: its history tells which steps a resumed run already holds."""


class RLConsole(Callback):
    def __init__(self, max_steps: int, progress: bool = True):
        self.max_steps, self.progress, self.bar = max_steps, progress, None

    def on_train_start(self, info: dict) -> None:
        log.info("GRPO from %s (SFT step %s) on %d rank(s): %s per step, pool %d train queries; %s",
                 info["parent"], info["parent_step"], info["world_size"], info["batch"], info["pool"],
                 f"resumed at step {info['start_step']}" if info["start_step"] else "fresh start")
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.max_steps, initial=info["start_step"], desc="rl", unit="step",
                            dynamic_ncols=True, file=sys.stderr)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        m = metrics
        kl = m["rl/kl"]
        if self.bar is not None:
            self.bar.n = step
            post = {"reward": f"{m['rl/reward_mean']:.3f}", "iou": f"{m['rl/iou_mean']:.3f}",
                    "ent": f"{m['rl/entropy']:.3f}", "roll/upd s": f"{m['rl/rollout_s']:.2f}/{m['rl/update_s']:.2f}"}
            if math.isfinite(kl):
                post["kl"] = f"{kl:.4f}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.refresh()
        else:
            log.info("rl step %d reward %.3f (std %.3f) iou %.3f parse-fail %.2f kl %s entropy %.3f clip %.3f "
                     "flat groups %d rollout %.2fs update %.2fs", step, m["rl/reward_mean"], m["rl/reward_std"],
                     m["rl/iou_mean"], m["rl/parse_failure_rate"], f"{kl:.4f}" if math.isfinite(kl) else "-",
                     m["rl/entropy"], m["rl/clip_frac"], m["rl/zero_advantage_groups"], m["rl/rollout_s"],
                     m["rl/update_s"])

    def on_checkpoint(self, path: Path, step: int) -> None:
        log.info("rl step %d: checkpoint %s", step, path)

    def on_train_end(self, summary: dict) -> None:
        if self.bar is not None:
            self.bar.close()
        log.info("RL done: %d steps in %.1f s; reward %.3f -> %.3f (first/last 10 steps), entropy %.3f -> %.3f",
                 summary["step"], summary["wall_s"], summary["first10/reward_mean"], summary["last10/reward_mean"],
                 summary["first10/entropy"], summary["last10/entropy"])


class RLMLflow(Callback):
    """One MLflow run per RL run, nested under the pipeline run (env VTG_MLFLOW_PARENT_RUN_ID), continued after a
    resume (steps already logged are not logged again)."""

    def __init__(self, cfg):
        self.cfg, self.run, self.logged_through = cfg, None, 0

    def on_train_start(self, info: dict) -> None:
        import mlflow

        mlflow.set_tracking_uri(self.cfg.tracking.tracking_uri)
        mlflow.set_experiment(self.cfg.tracking.experiment)
        tags = {lineage.TAG_STAGE: "rl", lineage.TAG_DATA_VERSION: info["data_version"],
                lineage.TAG_GIT_COMMIT: info["git_commit"], lineage.TAG_CONFIG_HASH: config_hash(self.cfg),
                lineage.TAG_PARENT_CHECKPOINT: info["parent"]}
        if os.environ.get(lineage.ENV_PREFECT_FLOW_RUN_ID):
            tags[lineage.TAG_PREFECT_FLOW_RUN] = os.environ[lineage.ENV_PREFECT_FLOW_RUN_ID]
        parent_run = os.environ.get(lineage.ENV_PARENT_RUN_ID)
        if info.get("mlflow_run_id"):
            self.run = mlflow.start_run(run_id=info["mlflow_run_id"])
            history = mlflow.MlflowClient().get_metric_history(info["mlflow_run_id"], REWARD_KEY)
            self.logged_through = max((m.step for m in history), default=0)
        else:
            self.run = mlflow.start_run(run_name="rl-grpo", parent_run_id=parent_run, nested=parent_run is not None,
                                        tags=tags)
            mlflow.log_params(flatten(self.cfg.rl.model_dump(mode="json"), "rl."))
            d = info.get("difficulty") or {}
            mlflow.log_params({"pool_queries": info["pool"], **{f"difficulty.{k}": v for k, v in d.items()}})
        mlflow.set_tags(tags)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        import mlflow

        if step <= self.logged_through:
            return
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}, step=step)

    def on_checkpoint(self, path: Path, step: int) -> None:
        import mlflow

        mlflow.set_tags({lineage.TAG_CHECKPOINT: str(path), lineage.TAG_STEP: str(step)})

    def on_train_end(self, summary: dict) -> None:
        import mlflow

        if self.run is not None:
            mlflow.log_metrics({k.replace("/", "_"): float(v) for k, v in summary.items()
                                if k.startswith(("first10/", "last10/")) and isinstance(v, float) and math.isfinite(v)})
            mlflow.end_run(status="FINISHED" if summary.get("completed") else "KILLED")
            self.run = None

    def checkpoint_meta(self) -> dict:
        return {"mlflow_run_id": self.run.info.run_id if self.run is not None else None}
