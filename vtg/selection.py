"""The best-checkpoint rule: which split selects, and how results rank. The one home of `pick_best`.

The evaluate stage (`evaluation.registry.select_best`: pointer and registry alias) and RL (picking its start
checkpoint among the SFT ones) both rank with it. A result is evaluation's result dict (or the same shape):
{"checkpoint", "step", "stage", "summary": {"model": {<metrics>}}}.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from vtg.harness import card_of, require_comparable

log = logging.getLogger(__name__)

SELECTION_SPLIT = "val"
HELDOUT_SPLIT = "test"
STAGES = ("sft", "rl")
"""Training stages in the order they run: checkpoints of a later stage come after all of an earlier one's."""
DEFAULT_STAGE = "sft"
"""The stage of a checkpoint whose meta.json names none (SFT checkpoints; every one written before RL existed)."""


def checkpoint_stage(result: dict) -> str:
    """`sft` or `rl` (meta.json's `stage`), for a result or a checkpoint meta; results stored before stages
    existed are SFT."""
    return str(result.get("stage") or DEFAULT_STAGE)


def checkpoint_label(result: dict) -> str:
    """`sft/step-000100` or `rl/step-000100`: tells apart checkpoints of two stages with the same step."""
    return f"{checkpoint_stage(result)}/{Path(result['checkpoint']).name}"


def order_key(result: dict) -> tuple[int, int]:
    """(stage rank, step): an RL step number is never compared with an SFT one as if they were one sequence."""
    stage = checkpoint_stage(result)
    return (STAGES.index(stage) if stage in STAGES else len(STAGES), int(result["step"]))


LOWER_IS_BETTER = frozenset({"eval_loss"})
"""Selection metrics minimised (every other one is maximised)."""


def rank_key(result: dict, select: str) -> tuple[float, float, tuple[int, int]]:
    """Higher ranks better: the selection metric (negated when lower is better), then mIoU, then the later
    checkpoint."""
    m = result["summary"]["model"]
    value = m[select]
    return (-value if select in LOWER_IS_BETTER else value, m["miou"], order_key(result))


def min_retention_of(result: dict) -> float | None:
    """The lowest general-task retention of a result (`evaluation.forgetting`), None when not measured."""
    value = ((result.get("summary") or {}).get("forgetting") or {}).get("min_retention")
    return float(value) if isinstance(value, int | float) else None


def pick_best(results: Sequence[dict], select: str, min_retention: float = 0.0) -> dict | None:
    """The best result by `select`; refuses (`vtg.harness.HarnessMismatch`) to rank results whose harness cards
    differ. `min_retention` > 0: only results whose every general task kept at least that share of the base's
    accuracy compete (`evaluate.forgetting.min_for_selection`); when none did, all do, with a warning."""
    require_comparable([(checkpoint_label(r), card_of(r)) for r in results], "rank")
    pool = list(results)
    if min_retention > 0 and pool:
        kept = [r for r in pool if (m := min_retention_of(r)) is not None and m >= min_retention]
        if kept:
            pool = kept
        else:
            log.warning("no checkpoint kept a general-task retention of %g or more: selecting among all", min_retention)
    return max(pool, key=lambda r: rank_key(r, select)) if pool else None


TRAIN_LOSS_AVG = "train/loss_avg"
"""meta.json `metrics` key: the mean training loss over the steps since the previous checkpoint (at most
`train.save_every`), which the overfitting signal compares with the eval loss (`vtg.selection.overfit_signal`)."""


def window_mean(losses: list[float], window: int) -> float | None:
    """Mean of the last `window` losses (None without any)."""
    tail = [x for x in losses[-window:] if math.isfinite(x)]
    return sum(tail) / len(tail) if tail else None


def train_loss_of_meta(meta: dict) -> float | None:
    """The checkpoint's training loss for the overfitting signal: `TRAIN_LOSS_AVG`, else the step's own loss."""
    metrics = meta.get("metrics") or {}
    value = metrics.get(TRAIN_LOSS_AVG, metrics.get("train/loss"))
    return float(value) if isinstance(value, int | float) else None

def train_loss_of(result: dict) -> float:
    """The training loss a result's checkpoint was saved at (meta.json's mean over the steps since the previous
    checkpoint; NaN when unknown)."""
    value = result.get("train_loss")
    return float(value) if isinstance(value, int | float) else math.nan


def lowest_eval_loss(results: Sequence[dict]) -> dict | None:
    """The SFT result with the lowest eval loss (what early stop names as the checkpoint to keep), or None."""
    sft = [r for r in results if checkpoint_stage(r) == DEFAULT_STAGE]
    return min(sft, key=lambda r: float(r["summary"]["model"].get("eval_loss", math.inf)), default=None)


def overfit_signal(results: Sequence[dict], patience: int) -> dict | None:
    """Overfitting, from one training run's evaluated SFT checkpoints on one split: the eval loss rose at each
    of the last `patience` evaluations (each higher than the one before) while the training loss fell over the
    same checkpoints. Returns what was seen (steps, both losses, the lowest-loss checkpoint) or None."""
    sft = sorted((r for r in results if checkpoint_stage(r) == DEFAULT_STAGE), key=order_key)
    if len(sft) < patience + 1:
        return None
    span = sft[-(patience + 1):]
    val = [float(r["summary"]["model"].get("eval_loss", math.nan)) for r in span]
    train = [train_loss_of(r) for r in span]
    rising = all(b > a for a, b in itertools.pairwise(val))
    falling = all(math.isfinite(t) for t in train) and train[-1] < train[0]
    if not (rising and falling):
        return None
    lowest = lowest_eval_loss(sft)
    return {"split": span[-1].get("split"), "patience": patience, "steps": [int(r["step"]) for r in span],
            "eval_loss": val, "train_loss": train, "step": int(span[-1]["step"]),
            "lowest_eval_loss_checkpoint": checkpoint_label(lowest), "lowest_eval_loss_step": int(lowest["step"]),
            "message": (f"overfitting: {span[-1].get('split')} eval loss rose at {patience} consecutive "
                        f"checkpoints (steps {', '.join(str(int(r['step'])) for r in span)}: "
                        f"{' -> '.join(f'{v:.4f}' for v in val)}) while the training loss fell "
                        f"({train[0]:.4f} -> {train[-1]:.4f}); the lowest eval loss was at "
                        f"{checkpoint_label(lowest)}")}


def check_judged_on_training_data(cfg, trained_on: str | None, judge: str) -> None:
    """A decision made on val (early stop, the RL start checkpoint, the evaluate stage's best) uses the data the
    checkpoint was trained on: the data version of `evaluate.shards_dir` (all its splits) must be the one the
    checkpoint records (`trained_on`, from `train.shards_dir`). Otherwise one line naming both, before any work;
    an ad-hoc evaluation on other data (`python -m evaluation --checkpoint ...`) is not a decision and may."""
    from vtg.errors import VTGError
    from vtg.shards import data_version

    if not trained_on:
        return
    judged = data_version(cfg.evaluate.shards_dir)
    if judged != trained_on:
        raise VTGError(f"{judge} judges on evaluate.shards_dir={cfg.evaluate.shards_dir} (data {judged[:12]}), but "
                       f"the training data is {trained_on[:12]} (train.shards_dir={cfg.train.shards_dir}): set "
                       "evaluate.shards_dir to the shards training reads, or evaluate ad hoc (`python -m evaluation "
                       "--checkpoint ...`)")


# ---- RL's start: the select stage's pointer -------------------------------------------------------------------
START_POINTER = "start.json"
"""`<evaluate.select_dir>/start.json`: the SFT checkpoint best on val, written by the select stage (`python -m
evaluation.select`) and read by RL with `rl.init: best` (a dvc.yaml dep of the rl stage): `checkpoint` (relative to
the pointer), `step` and `identity` (`checkpoint_identity`). It holds only the choice, so a change of evaluation
settings that picks the same checkpoint leaves it byte-identical and RL up to date."""
CANDIDATES = "candidates.json"
"""`<evaluate.select_dir>/candidates.json`: every SFT checkpoint's val score the choice was made from."""


def start_pointer_path(cfg) -> Path:
    return Path(cfg.evaluate.select_dir) / START_POINTER


def checkpoint_identity(checkpoint: str | Path) -> str:
    """A checkpoint's identity: its meta.json's file list (sizes and sha256 of every file) and step."""
    from vtg import checkpoints as ckpt
    from vtg.config.keys import view_hash

    meta = ckpt.read_checkpoint_meta(Path(checkpoint))
    return view_hash({"files": meta.get(ckpt.FILES_KEY) or [], "step": meta.get("step")})


def read_start(cfg, found: Sequence[Path]) -> Path:
    """The checkpoint the select stage chose among `found` (the SFT checkpoints there are now). One line when the
    pointer is missing or names a checkpoint that is gone or changed since it was chosen (SFT ran again)."""
    from vtg import checkpoints as ckpt
    from vtg.errors import VTGError

    path = start_pointer_path(cfg)
    rerun = "run the select stage (`python -m evaluation.select`; `dvc repro rl` and `make run` run it first)"
    pointer = ckpt.read_pointer(path)
    if pointer is None:
        raise VTGError(f"rl.init=best: {path} does not exist: {rerun}, or set rl.init=latest or a checkpoint")
    chosen = Path(pointer["path"]).resolve()
    if chosen not in {Path(f).resolve() for f in found}:
        raise VTGError(f"rl.init=best: {path} names {pointer['checkpoint']}, which is not among the SFT checkpoints "
                       f"in {cfg.train.out_dir} now (SFT ran again?): {rerun}")
    if pointer.get("identity") != checkpoint_identity(chosen):
        raise VTGError(f"rl.init=best: {chosen} changed since {path} chose it: {rerun}")
    return chosen
