"""Best-checkpoint selection: the checkpoint root's `best` pointer and the MLflow model registry alias.

Selection happens only on the `val` split (selecting on test would leak it). Among the evaluations of one
training run (same settings; an RL run belongs to the run of the SFT checkpoint it started from), the best by
`evaluate.select_metric` (ties: higher mIoU, then the later checkpoint: every RL checkpoint counts as later than
every SFT one, whatever their step numbers, as `order_key` says) gets the best-checkpoint pointer
(`<evaluate.out_dir>/best.json`, in this stage's own outputs) and a model version whose source is its HF export,
with the alias `evaluate.registry_alias`. Re-running on the same state changes nothing; a newer training run
takes the alias once its first checkpoint is evaluated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from evaluation.tracking import TAG_CHECKPOINT_DIGEST, TAG_CHECKPOINT_STAGE, TAG_SPLIT, client
from vtg import checkpoints
from vtg.config import EvaluateConfig, TrackingConfig
from vtg.lineage import TAG_CHECKPOINT, TAG_STEP, TAG_TRAIN_RUN
from vtg.selection import (  # noqa: F401 (the selection rule lives in the core; re-exported for evaluation)
    DEFAULT_STAGE,
    HELDOUT_SPLIT,
    SELECTION_SPLIT,
    STAGES,
    checkpoint_label,
    checkpoint_stage,
    order_key,
    pick_best,
    rank_key,
)

log = logging.getLogger(__name__)

def best_pointer(cfg: EvaluateConfig) -> Path:
    return Path(cfg.out_dir) / checkpoints.BEST_POINTER


def update_pointer(cfg: EvaluateConfig, best: dict) -> bool:
    """Write the best-checkpoint pointer (skipped when the checkpoint is gone). Returns True if it moved."""
    ckpt = Path(best["checkpoint"])
    if not ckpt.is_dir():
        log.warning("best checkpoint %s no longer exists; pointer not moved", ckpt)
        return False
    pointer = best_pointer(cfg)
    current = checkpoints.read_pointer(pointer)
    select = cfg.select_metric
    checkpoints.write_pointer(pointer, ckpt, step=best["step"], stage=checkpoint_stage(best), metric=select,
                              split=best["split"], value=best["summary"]["model"][select])
    return current is None or current["path"] != ckpt.resolve()


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
    if (current is not None and current.tags.get(TAG_CHECKPOINT_DIGEST) == best["checkpoint_digest"]
            and Path(current.tags.get(TAG_CHECKPOINT) or "/").resolve() == Path(best["checkpoint"]).resolve()):
        return current.version  # the same content at the same place (a copied project registers its own)
    select = cfg.select_metric
    version = c.create_model_version(
        name, source=str(checkpoints.export_dir(best["checkpoint"])), run_id=best.get("mlflow_run_id"),
        tags={TAG_CHECKPOINT: best["checkpoint"], TAG_STEP: str(best["step"]),
              TAG_CHECKPOINT_STAGE: checkpoint_stage(best),
              TAG_TRAIN_RUN: best.get("train_run_id") or "", TAG_CHECKPOINT_DIGEST: best["checkpoint_digest"],
              TAG_SPLIT: best["split"], "vtg.select_metric": select,
              "vtg.select_value": str(best["summary"]["model"][select])},
        description=f"{checkpoint_label(best)}: {select}={best['summary']['model'][select]:.4f} on {best['split']}")
    c.set_registered_model_alias(name, alias, version.version)
    log.info("registered %s version %s (%s) as @%s", name, version.version, checkpoint_label(best), alias)
    return version.version


def select_best(tracking: TrackingConfig, cfg: EvaluateConfig, results: Sequence[dict]) -> dict:
    """Pick the best of `results` (one training run with its RL runs, val split) and move the pointer and the
    alias to it."""
    if any(r["split"] != SELECTION_SPLIT for r in results):
        return {"best": None, "reason": f"selection happens on {SELECTION_SPLIT} only"}
    best = pick_best([r for r in results if Path(r["checkpoint"]).is_dir()], cfg.select_metric,
                     cfg.forgetting.min_for_selection)
    if best is None:
        return {"best": None, "reason": "no evaluated checkpoint exists any more"}
    info = {"best": best["checkpoint"], "step": best["step"], "stage": checkpoint_stage(best),
            "checkpoint_name": checkpoint_label(best), "result": best,
            "pointer_moved": update_pointer(cfg, best)}
    if tracking.enabled:
        info["registered_version"] = register_best(tracking, cfg, best)
    return info
