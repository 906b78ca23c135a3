"""`train.early_stop`: end SFT cleanly when the validation loss says the run is overfitting (seeds 000 and 001).

After each checkpoint rank 0 evaluates it on val with the per-checkpoint evaluator (`evaluation.api`, without
refreshing the evaluate stage's outputs; the result is stored, so the flow's evaluator and the evaluate stage
reuse it instead of computing it again), reads the run's stored val results, and asks
`vtg.selection.overfit_signal` (`evaluate.overfit_patience` rising evaluations while the training loss fell).
On the signal every rank stops after that checkpoint; the decision is written to `<train.out_dir>/early_stop.json`
beside the checkpoints, so a rerun of the same run (`train.resume=auto`, either front door) finds the run already
ended there instead of training on to `max_steps`. Selection then picks among the checkpoints that exist: with
`evaluate.select_metric: eval_loss`, the lowest-loss one.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from vtg import checkpoints as ckpt
from vtg.config import PipelineConfig
from vtg.io import write_json_atomic
from vtg.selection import SELECTION_SPLIT, lowest_eval_loss, overfit_signal

log = logging.getLogger(__name__)

EARLY_STOP_FILE = "early_stop.json"


def marker_path(cfg: PipelineConfig) -> Path:
    return Path(cfg.train.out_dir) / EARLY_STOP_FILE


def check(cfg: PipelineConfig, checkpoint: Path) -> dict | None:
    """Evaluate `checkpoint` on val (or reuse its stored result) and return the overfitting signal of its run,
    or None. Rank 0 only."""
    from evaluation.api import curve_runs, evaluate_checkpoint
    from training.lifecycle import LOWEST_EVAL_LOSS

    result = evaluate_checkpoint(checkpoint, SELECTION_SPLIT, cfg, refresh=False).result
    runs = curve_runs(cfg, result)
    lowest = lowest_eval_loss(runs)
    if lowest is not None:  # protected from retention from now on (training.lifecycle.namers)
        ckpt.write_pointer(Path(cfg.train.out_dir) / LOWEST_EVAL_LOSS, lowest["checkpoint"], step=int(lowest["step"]))
    return overfit_signal(runs, cfg.evaluate.overfit_patience)


def record(cfg: PipelineConfig, signal: dict, train_hash: str) -> Path:
    """Write the decision beside the checkpoints (what a resumed run reads)."""
    path = marker_path(cfg)
    write_json_atomic(path, {**signal, "train_hash": train_hash, "reason": "overfitting (train.early_stop)"})
    log.warning("early stop at step %d: %s (%s)", signal["step"], signal["message"], path)
    return path


def stopped_at(cfg: PipelineConfig, train_hash: str) -> dict | None:
    """The recorded early stop of this run (same training settings), or None."""
    path = marker_path(cfg)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("train_hash") == train_hash else None
