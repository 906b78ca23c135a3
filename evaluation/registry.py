"""Best-checkpoint selection: the checkpoint root's `best` pointer and the MLflow model registry alias.

Selection happens only on the `val` split (selecting on test would leak it). Among the evaluations of one
training run (same settings), the best by `evaluate.select_metric` (ties: higher mIoU, then later step) gets
the `best` pointer (training's `update_best`) and a model version whose source is its HF export, with the alias
`evaluate.registry_alias`. Re-running on the same state changes nothing; a newer training run takes the alias
once its first checkpoint is evaluated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from evaluation.tracking import TAG_CHECKPOINT_DIGEST, TAG_SPLIT, client
from vtg.config import EvaluateConfig, TrackingConfig
from vtg.lineage import TAG_CHECKPOINT, TAG_STEP, TAG_TRAIN_RUN

log = logging.getLogger(__name__)

SELECTION_SPLIT = "val"


def rank_key(result: dict, select: str) -> tuple[float, float, int]:
    m = result["summary"]["model"]
    return (m[select], m["miou"], result["step"])


def pick_best(results: Sequence[dict], select: str) -> dict | None:
    return max(results, key=lambda r: rank_key(r, select)) if results else None


def update_pointer(best: dict, select: str) -> bool:
    """Training's `best` pointer in the checkpoint root (skipped when the checkpoint is gone)."""
    from training.checkpoint import update_best

    ckpt = Path(best["checkpoint"])
    if not ckpt.is_dir():
        log.warning("best checkpoint %s no longer exists; pointer not moved", ckpt)
        return False
    # `best` was ranked over every evaluated checkpoint with tie-breaks, so it wins even on an equal value.
    return update_best(ckpt.parent, ckpt, select, best["summary"]["model"][select], force=True)


def register_best(tracking: TrackingConfig, cfg: EvaluateConfig, best: dict) -> str | None:
    """Point the registry alias at `best` (a new model version unless it already holds the alias)."""
    from mlflow.exceptions import MlflowException

    c = client(tracking)
    name, alias = tracking.registered_model, cfg.registry_alias
    try:
        c.get_registered_model(name)
    except MlflowException:
        c.create_registered_model(name, description="Best temporal-grounding checkpoint per training run "
                                                    "(selected on val by evaluate.select_metric).")
    try:
        current = c.get_model_version_by_alias(name, alias)
    except MlflowException:
        current = None
    if current is not None and current.tags.get(TAG_CHECKPOINT_DIGEST) == best["checkpoint_digest"]:
        return current.version
    select = cfg.select_metric
    version = c.create_model_version(
        name, source=str(Path(best["checkpoint"]) / "hf"), run_id=best.get("mlflow_run_id"),
        tags={TAG_CHECKPOINT: best["checkpoint"], TAG_STEP: str(best["step"]),
              TAG_TRAIN_RUN: best.get("train_run_id") or "", TAG_CHECKPOINT_DIGEST: best["checkpoint_digest"],
              TAG_SPLIT: best["split"], "vtg.select_metric": select,
              "vtg.select_value": str(best["summary"]["model"][select])},
        description=f"{best['checkpoint_name']}: {select}={best['summary']['model'][select]:.4f} on {best['split']}")
    c.set_registered_model_alias(name, alias, version.version)
    log.info("registered %s version %s (%s) as @%s", name, version.version, best["checkpoint_name"], alias)
    return version.version


def select_best(tracking: TrackingConfig, cfg: EvaluateConfig, results: Sequence[dict]) -> dict:
    """Pick the best of `results` (one training run, val split) and move the pointer and the alias to it."""
    best = pick_best(results, cfg.select_metric)
    if best is None or best["split"] != SELECTION_SPLIT:
        return {"best": None, "reason": f"selection happens on {SELECTION_SPLIT} only"}
    info = {"best": best["checkpoint"], "step": best["step"], "pointer_moved": update_pointer(best, cfg.select_metric)}
    if tracking.enabled:
        info["registered_version"] = register_best(tracking, cfg, best)
    return info
