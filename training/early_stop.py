"""`train.early_stop`: end SFT cleanly when the validation loss says the run is overfitting (seeds 000 and 001).

The Trainer is handed an evaluator (OLMo-core's `EvaluatorCallback`: a callable `checkpoint -> val loss`); by
default `val_loss_evaluator`, which scores the saved checkpoint on training's own val split (`train.shards_dir`,
`vtg.selection.SELECTION_SPLIT`) with the answer tokens' teacher-forced loss, the function the evaluate stage's
`eval_loss` comes from (`vtg.model.generation.answer_losses`). So training needs nothing of the evaluation package and
reads no `evaluate.*` setting: the decision depends on `train.*` and the shards alone, which the train stage
declares. After each checkpoint rank 0 appends its score to `<train.out_dir>/early_stop_history.json` and asks
`vtg.selection.overfit_signal` (`train.early_stop_patience` rising val losses while the training loss fell). On
the signal every rank stops after that checkpoint; the decision is written to `<train.out_dir>/early_stop.json`, so
a rerun of the same run (`train.resume=auto`, either front door) finds the run already ended there instead of
training on to `max_steps`. The lowest-loss checkpoint so far is named in `lowest_eval_loss.json`
(`training.lifecycle.LOWEST_EVAL_LOSS`: retention keeps it); selection with `evaluate.select_metric: eval_loss`
picks the same one from the evaluate stage's own scores.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from training.lifecycle import LOWEST_EVAL_LOSS
from vtg import checkpoints as ckpt
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.io import write_json_atomic
from vtg.queries import ReadStats, iter_examples
from vtg.selection import SELECTION_SPLIT, lowest_eval_loss, overfit_signal, train_loss_of_meta
from vtg.shards import list_shards

log = logging.getLogger(__name__)

EARLY_STOP_FILE = "early_stop.json"
HISTORY_FILE = "early_stop_history.json"
"""`<train.out_dir>/early_stop_history.json`: this run's val loss per evaluated checkpoint (its `train_hash` and
one row per step), what the overfitting signal reads after a resume too."""

Evaluator = Callable[[Path], float]
"""What early stopping is handed: the val score of a saved checkpoint (lower is better)."""


def marker_path(cfg: PipelineConfig) -> Path:
    return Path(cfg.train.out_dir) / EARLY_STOP_FILE


def val_loss_evaluator(cfg: PipelineConfig, device: str = "cpu", batch_size: int = 16) -> Evaluator:
    """The default evaluator: the mean answer-token loss of the checkpoint's export on `train.shards_dir`'s val
    split, every query, in batches of `batch_size` (rank 0 loads the export as evaluation does)."""
    from vtg.model.generation import answer_losses
    from vtg.model.modeling import load_model_and_tokenizer

    shards = list_shards(cfg.train.shards_dir, SELECTION_SPLIT)

    def evaluate(checkpoint: Path) -> float:
        model, tokenizer = load_model_and_tokenizer(ckpt.export_dir(checkpoint), device=device)
        stats, batch, total, tokens = ReadStats(), [], 0.0, 0

        def flush() -> None:
            nonlocal total, tokens
            losses, counts = answer_losses(model, tokenizer, batch, device)
            total, tokens = total + sum(losses), tokens + sum(counts)
            batch.clear()

        for ex in iter_examples(shards, stats):
            batch.append(ex)
            if len(batch) == batch_size:
                flush()
        if batch:
            flush()
        if not tokens:
            raise VTGError(f"{cfg.train.shards_dir}/{SELECTION_SPLIT}: no readable queries to score for "
                           f"train.early_stop (skipped: {dict(stats.skipped) or 'none'})")
        return total / tokens

    return evaluate


class EarlyStop:
    """Rank 0's side of `train.early_stop`: score each saved checkpoint, keep the history, read the signal."""

    def __init__(self, cfg: PipelineConfig, evaluator: Evaluator, train_hash: str, resumed_step: int):
        self.cfg, self.evaluator, self.hash = cfg, evaluator, train_hash
        self.path = Path(cfg.train.out_dir) / HISTORY_FILE
        rows = _read(self.path)
        # a resumed run keeps what its own trajectory scored up to the checkpoint it resumed from
        self.rows = [r for r in rows.get("rows", []) if int(r["step"]) <= resumed_step] \
            if rows.get("train_hash") == train_hash else []

    def results(self) -> list[dict]:
        """The history in the result shape `vtg.selection` ranks (SFT results on the selection split)."""
        return [{"checkpoint": r["checkpoint"], "step": r["step"], "stage": "sft", "split": SELECTION_SPLIT,
                 "train_loss": r["train_loss"], "summary": {"model": {"eval_loss": r["eval_loss"]}}}
                for r in self.rows]

    def check(self, checkpoint: Path) -> dict | None:
        """Score `checkpoint`, record it, and return the overfitting signal of the run so far (or None)."""
        meta = ckpt.read_checkpoint_meta(checkpoint)
        loss = float(self.evaluator(checkpoint))
        train_loss = train_loss_of_meta(meta)
        self.rows = [r for r in self.rows if int(r["step"]) != int(meta["step"])]
        self.rows.append({"checkpoint": str(checkpoint), "step": int(meta["step"]), "eval_loss": loss,
                          "train_loss": train_loss})
        write_json_atomic(self.path, {"train_hash": self.hash, "split": SELECTION_SPLIT, "rows": self.rows})
        log.info("early stop: %s val loss %.4f (train loss %s)", checkpoint.name, loss,
                 "n/a" if train_loss is None else f"{train_loss:.4f}")
        results = self.results()
        lowest = lowest_eval_loss(results)
        if lowest is not None:  # protected from retention from now on (training.lifecycle.namers)
            ckpt.write_pointer(Path(self.cfg.train.out_dir) / LOWEST_EVAL_LOSS, lowest["checkpoint"],
                               step=int(lowest["step"]))
        return overfit_signal(results, self.cfg.train.early_stop_patience)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def record(cfg: PipelineConfig, signal: dict, train_hash: str) -> Path:
    """Write the decision beside the checkpoints (what a resumed run reads)."""
    path = marker_path(cfg)
    write_json_atomic(path, {**signal, "train_hash": train_hash, "reason": "overfitting (train.early_stop)"})
    log.warning("early stop at step %d: %s (%s)", signal["step"], signal["message"], path)
    return path


def stopped_at(cfg: PipelineConfig, train_hash: str) -> dict | None:
    """The recorded early stop of this run (same training settings), or None."""
    data = _read(marker_path(cfg))
    return data if data and data.get("train_hash") == train_hash else None
