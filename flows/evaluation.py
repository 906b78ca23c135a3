"""Per-checkpoint evaluation: the `evaluate-checkpoint` flow (served deployment, event-triggered) and the embedded
evaluator process (`python -m flows.evaluation --queue FILE`) that runs the same flow while training continues.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from flows.stages import die_with_parent
from vtg import checkpoints, eval_queue, lineage
from vtg.cli_common import run_cli
from vtg.config import MOVED_KEYS, PipelineConfig, load_config
from vtg.errors import VTGError

log = logging.getLogger(__name__)

def checkpoint_config(checkpoint_dir: str | Path, params: str = "params.yaml") -> PipelineConfig:
    """The resolved config the checkpoint was trained with (its `config.json`), else params.yaml."""
    data = checkpoints.read_config(checkpoint_dir)
    if data is not None:
        try:
            return PipelineConfig.model_validate(upgrade_config(data.get("pipeline", data)))
        except ValueError as e:
            log.warning("%s: its config is not a valid pipeline config (%s); using %s", checkpoint_dir,
                        str(e).splitlines()[:3], params)
    return load_config(params)


def upgrade_config(data: dict) -> dict:
    """A stored config from before a key moved (`vtg.config.MOVED_KEYS`, e.g. `train.precision` -> `engine.precision`)
    in today's layout; other content unchanged."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for old, new in MOVED_KEYS.items():
        (old_section, old_key), (new_section, new_key) = old.split("."), new.split(".")
        section = data.get(old_section)
        if isinstance(section, dict) and old_key in section:
            data.setdefault(new_section, {}).setdefault(new_key, section.pop(old_key))
    return data


def resolve_callable(spec: str):
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise VTGError(f"cannot import evaluation API {spec!r} ({e}); check orchestration.stages.evaluate_api")


def as_metrics(result: Any) -> dict[str, Any]:
    """Whatever the evaluation API returns (dict, pydantic model, dataclass) as a flat dict."""
    if hasattr(result, "to_dict"):
        result = result.to_dict()
    elif hasattr(result, "model_dump"):
        result = result.model_dump(mode="json")
    elif hasattr(result, "__dataclass_fields__"):
        import dataclasses

        result = dataclasses.asdict(result)
    return dict(result) if isinstance(result, dict) else {"result": str(result)}


@task(name="evaluate-checkpoint-api", retries=1, retry_delay_seconds=5)
def run_evaluation_api(cfg: PipelineConfig, checkpoint_dir: str, split: str) -> dict[str, Any]:
    fn = resolve_callable(cfg.orchestration.stages.evaluate_api)
    return as_metrics(fn(checkpoint_dir, split, cfg))


def scalar_metrics(result: dict[str, Any], key: str = "metrics") -> dict[str, float]:
    metrics = result.get(key) or result.get("model") or (result if key == "metrics" else {})
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


@flow(name="evaluate-checkpoint", flow_run_name="eval-{split}-step-{step:06d}", log_prints=True)
def evaluate_checkpoint(checkpoint_dir: str, step: int, split: str = "val", parent_run_id: str = "",
                        saved_at: float = 0.0, params: str = "params.yaml", device: str = "") -> dict[str, Any]:
    """Evaluate one checkpoint (idempotent: the evaluation API reuses a stored result) and record it.

    `device` overrides `evaluate.device` (the embedded evaluator gets it from the placement rule)."""
    started = time.time()
    if parent_run_id:
        os.environ[lineage.ENV_PARENT_RUN_ID] = parent_run_id
    if not Path(checkpoint_dir).is_dir():  # rotated away by keep_last before its turn came
        return {"checkpoint_dir": checkpoint_dir, "step": step, "skipped": "checkpoint no longer exists"}
    cfg = checkpoint_config(checkpoint_dir, params)
    if device:
        cfg.evaluate.device = device  # not an output-changing field: the stored result's key is the same
    result = run_evaluation_api(cfg, checkpoint_dir, split)
    record = {"checkpoint_dir": checkpoint_dir, "step": step, "split": split, "saved_at": saved_at,
              "started_at": started, "finished_at": time.time(), "metrics": scalar_metrics(result),
              "baselines": {k: scalar_metrics(v) for k, v in (result.get("baselines") or {}).items()},
              "report": result.get("report"),
              "mlflow_run_id": result.get("mlflow_run_id") or result.get("run_id"),
              "parent_run_id": parent_run_id}
    eval_queue.append(eval_queue.results_path(cfg.orchestration.state_dir), record)
    create_table_artifact(key=f"eval-{split}-step-{step:06d}",
                          table=[{"metric": k, "value": round(v, 4)} for k, v in record["metrics"].items()],
                          description=f"Evaluation of `{checkpoint_dir}` on {split}")
    return record


def follow(queue: Path, poll_s: float = 0.5, parent: int | None = None):
    """The checkpoints of a growing queue (`vtg.eval_queue.follow`) until its closing line, or until the process
    that started this one (`parent`, default: the parent now) is gone: then nobody will close the queue (the flow
    was killed), and the evaluator must not outlive it."""
    parent = os.getppid() if parent is None else parent

    def alive() -> bool:
        if os.getppid() == parent:
            return True
        log.warning("the process that started this evaluator (pid %d) is gone: stopping", parent)
        return False

    yield from eval_queue.follow(queue, poll_s=poll_s, alive=alive)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Embedded evaluator: follow a checkpoint queue file (written by the training checkpoint hook) "
        "and run the evaluate-checkpoint flow on each checkpoint, until a {\"done\": true} line.")
    parser.add_argument("--queue", required=True, help="jsonl file the checkpoint hook appends to")
    parser.add_argument("--split", default="val", help="split to evaluate (default: %(default)s)")
    parser.add_argument("--params", default="params.yaml", help="fallback params when a checkpoint has no config")
    parser.add_argument("--device", default="", help="evaluate on this device (overrides evaluate.device)")
    args = parser.parse_args(argv)
    # SIGKILL, not spawn's SIGTERM, when the flow dies: inside a flow run Prefect's engine catches SIGTERM and then
    # retries the dead flow's API server (an evaluator killed with its flow was still up 20 s later)
    die_with_parent(signal.SIGKILL)
    for item in follow(Path(args.queue)):
        rec = evaluate_checkpoint(checkpoint_dir=item["checkpoint_dir"], step=int(item["step"]), split=args.split,
                                  parent_run_id=item.get("parent_run_id", ""),
                                  saved_at=float(item.get("saved_at", 0.0)), params=args.params,
                                  device=args.device)
        print(json.dumps({"evaluated": rec.get("checkpoint_dir"), "step": rec.get("step"),
                          "metrics": rec.get("metrics"), "skipped": rec.get("skipped")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(_main))
