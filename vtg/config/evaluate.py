"""`evaluate`: per-checkpoint evaluation (mIoU, R@1 at IoU 0.3/0.5/0.7, blind baselines, report)."""

import re
from typing import Literal

from pydantic import Field, model_validator

from vtg.config._base import NOT_OUTPUT, Section


class ForgettingConfig(Section):
    suite: str = "data/raw/synthetic/general/eval_all.jsonl"
    """General-task items (`vtg.general_tasks` format: video or image questions, multiple choice or short answer,
    scored exactly) asked of the base model and of every evaluated checkpoint; retention per task = checkpoint
    accuracy / base accuracy, overall the lowest and the mean of the tasks'. Default: the corpus's colour (chance
    1/8) and presence (chance 1/2) questions on held-out videos (`corpus.general`). Empty, or a file that does not exist: no forgetting measurement (the result says
    why)."""
    num_frames: int = Field(8, ge=1)
    """Frames per clip, spread uniformly over the item's [start_s, end_s) (also what `train.teach` teaches with)."""
    frame_size: int = Field(56, ge=16)
    """Frames are resized like the shards' (about frame_size^2 pixels, aspect kept; also `train.teach`'s)."""
    max_new_tokens: int = Field(8, ge=1)
    """Generated tokens per answer."""
    max_items: int = Field(0, ge=0)
    """Ask only the first N items of each task (0: all)."""
    warn_below: float = Field(0.9, ge=0)
    """Warn (log, MLflow tag, report) when a task's retention falls below this."""
    min_for_selection: float = Field(0.9, ge=0)
    """Best-checkpoint selection skips checkpoints whose lowest task retention is below this (0: no such rule;
    when no checkpoint qualifies, selection says so and uses all). 0.9 (was 0): the default keeps what the base
    knew as it grounds (`train.data.mix` replays it; issue 41), and RL's start and the evaluate stage's pick are
    chosen among the checkpoints that did; docs/stages.md says how to choose the floor."""


class EvaluateConfig(Section):
    split: Literal["val", "test"] = Field("val", json_schema_extra=NOT_OUTPUT)
    """Split evaluated per checkpoint."""
    shards_dir: str = "data/shards"
    """Shard root: the evaluated split, and `train/` for the moment-prior baseline."""
    out_dir: str = Field("reports/eval", json_schema_extra=NOT_OUTPUT)
    """metrics.json, predictions.jsonl, report.html, plots and steps.csv of the last evaluated checkpoint."""
    store_dir: str = Field("reports/eval_runs", json_schema_extra=NOT_OUTPUT)
    """One directory per evaluated (checkpoint content, split, settings): makes re-evaluation a no-op."""
    select_dir: str = Field("reports/select", json_schema_extra=NOT_OUTPUT)
    """The select stage's outputs (`python -m evaluation.select`): `start.json`, the SFT checkpoint best on val
    that RL starts from with `rl.init: best`, and `candidates.json`, the scores it was chosen from."""
    batch_size: int = Field(16, ge=1, json_schema_extra=NOT_OUTPUT)
    """Generation batch size."""
    max_new_tokens: int = Field(16, ge=1)
    """Generated tokens per answer."""
    max_examples: int = Field(0, ge=0)
    """Evaluate only the first N queries of the split (0: all)."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", json_schema_extra=NOT_OUTPUT)
    """`auto`, `cpu`, `cuda` or `cuda:<i>` (explicit wins). Beside training (flows/placement.py), `auto` takes the
    last GPU if training leaves one free (training runs on the others), else waits for training to end; the CPU
    only for the tiny rung or without GPUs. Alone (CLI, served runs): cuda when available, else cpu."""
    iou_thresholds: list[float] = Field(default_factory=lambda: [0.3, 0.5, 0.7])
    """R@1 is reported at each of these IoU thresholds."""
    length_edges_s: list[float] = Field(default_factory=lambda: [4.0, 6.0])
    """Moment-length buckets short/middle/long: short < edges[0] <= middle < edges[1] <= long (default synthetic
    corpus: moments 1.5-6 s, normal events 2.5-6 s; Moment-DETR uses [10, 30] on real data)."""
    baselines: list[Literal["prior", "blank"]] = Field(default_factory=lambda: ["prior", "blank"])
    """Blind baselines: `prior` (best constant span from the train split's moments), `blank` (the model on blank frames)."""
    prior_grid: int = Field(20, ge=2)
    """The prior searches normalized (start, end) on a grid of this many steps per axis."""
    select_metric: str = "r1@0.7"
    """Metric that picks the best checkpoint (`miou` or `r1@<threshold>`: highest wins; `eval_loss`: the
    answer tokens' teacher-forced loss on the split, lowest wins)."""
    bootstrap_resamples: int = Field(1000, ge=0)
    """Bootstrap resamples of the queries behind every metric's interval and every comparison's paired interval
    of the difference (`evaluation.intervals`; 0: no intervals)."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Coverage of the bootstrap intervals."""
    forgetting: ForgettingConfig = ForgettingConfig()
    """General-capability retention (seed 000: forgetting): the base model vs each checkpoint on a general-task
    suite."""
    overfit_patience: int = Field(3, ge=1, json_schema_extra=NOT_OUTPUT)
    """Overfitting signal: the split's eval loss rose at this many consecutive evaluated SFT checkpoints while
    the training loss fell (a warning in the log, MLflow and the report; `train.early_stop` acts on it)."""
    registry_alias: str = Field("best", json_schema_extra=NOT_OUTPUT)
    """Alias of the best checkpoint's version in the MLflow model registry."""
    report_samples: int = Field(12, ge=0)
    """Queries drawn in the report's ground-truth vs predicted timelines."""
    reuse: bool = Field(True, json_schema_extra=NOT_OUTPUT)
    """Reuse a stored result for the same checkpoint content, split and settings instead of recomputing."""

    @model_validator(mode="after")
    def _check(self) -> "EvaluateConfig":
        if any(not 0 < t <= 1 for t in self.iou_thresholds):
            raise ValueError(f"iou_thresholds must lie in (0, 1], got {self.iou_thresholds}")
        if len(self.length_edges_s) != 2 or not 0 < self.length_edges_s[0] < self.length_edges_s[1]:
            raise ValueError(f"length_edges_s must be two increasing positive numbers, got {self.length_edges_s}")
        known = ["miou", "eval_loss"] + [f"r1@{t:g}" for t in self.iou_thresholds]
        m = re.fullmatch(r"r1@([\d.]+)", self.select_metric)
        if m:
            self.__dict__["select_metric"] = f"r1@{float(m.group(1)):g}"
        if self.select_metric not in known:
            raise ValueError(f"select_metric {self.select_metric!r} is not one of {known}")
        return self
