"""Stand-in evaluation API: `evaluate_checkpoint(checkpoint_dir, split, cfg)`, idempotent per (checkpoint, split)."""

import json
import os
import time
from pathlib import Path

from standin_stages import record_call
from vtg import checkpoints, lineage
from vtg.io import tree_digest


def evaluate_checkpoint(checkpoint_dir: str, split: str, cfg) -> dict:
    record_call(f"evaluate:{Path(checkpoint_dir).name}:{split}")
    meta = checkpoints.read_checkpoint_meta(checkpoint_dir)
    content = tree_digest(Path(checkpoint_dir).resolve())[:16]
    stored = Path(cfg.evaluate.store_dir) / f"{Path(checkpoint_dir).resolve().name}-{content}-{split}.json"
    stored.parent.mkdir(parents=True, exist_ok=True)
    if stored.is_file():
        return json.loads(stored.read_text())
    time.sleep(float(os.environ.get("STANDIN_EVAL_S", "0.1")))
    step = meta["step"]
    metrics = {"r1@0.5": min(1.0, step / cfg.train.max_steps), "r1@0.7": min(1.0, step / cfg.train.max_steps) / 2,
               "miou": 0.5}
    if meta.get("stage") == "rl":  # RL improves on its SFT start: an RL checkpoint is the best on val
        metrics = {"r1@0.5": 1.0, "r1@0.7": 0.5 + 0.25 * min(1.0, step / cfg.rl.max_steps), "miou": 0.6}
    run_id = None
    if cfg.tracking.enabled:
        import mlflow

        mlflow.set_tracking_uri(cfg.tracking.tracking_uri)
        client = mlflow.MlflowClient()
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(cfg.tracking.experiment)
        parent = os.environ.get(lineage.ENV_PARENT_RUN_ID)
        tags = {lineage.TAG_STAGE: "evaluate", "vtg.split": split, lineage.TAG_CHECKPOINT: str(Path(checkpoint_dir).resolve()),
                lineage.TAG_STEP: str(step), lineage.TAG_TRAIN_RUN: meta.get("mlflow_run_id") or "",
                **({"mlflow.parentRunId": parent} if parent else {})}
        run = client.create_run(exp_id, run_name=f"eval-{split}-{step}", tags=tags)
        run_id = run.info.run_id
        for k, v in metrics.items():
            client.log_metric(run_id, k.replace("@", "_at_"), v, step=step)
        client.set_terminated(run_id)
    result = {"metrics": metrics, "split": split, "step": step, "mlflow_run_id": run_id}
    stored.write_text(json.dumps(result))
    publish(cfg, result)
    return result


def publish(cfg, result: dict) -> None:
    """The stage outputs DVC tracks (same names as the real evaluation)."""
    out = Path(cfg.evaluate.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(result["metrics"], sort_keys=True))
    (out / "predictions.jsonl").write_text(json.dumps({"step": result["step"]}) + "\n")
    (out / "report.html").write_text(f"<html>step {result['step']}</html>")
    (out / "steps.csv").write_text(f"step,r1@0.5\n{result['step']},{result['metrics']['r1@0.5']}\n")
    for png in ("step_curve.png", "iou_hist.png"):
        (out / png).write_bytes(b"\x89PNG stand-in")

