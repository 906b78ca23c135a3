"""The RL stage's report files (`steps.csv`, `summary.json` in `rl.report_dir`; names in `vtg.rl_outputs`) and the
run summary they hold."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from vtg.io import relative_ref
from vtg.rl_outputs import STEPS_CSV, SUMMARY_JSON

STAGE = "rl"
PHASES = ("generate_s", "forward_s", "backward_s", "optimizer_s", "ref_s", "old_s")
"""Seconds per phase of a step (`training.rl.phases.PhaseClock`; empty where the phase did not run that step):
`generate_s` the policy's `generate` inside the rollout (`rollout_s` adds prompt encoding and rewards);
`forward_s` the teacher-forced forward of the update with its loss, `backward_s` and `optimizer_s` the engine's
backward and step (summed over micro-batches and `rl.updates_per_rollout`); `ref_s` the frozen start policy's
forward (steps that use or measure KL); `old_s` the policy's no-grad forward for the ratio's old log-probs
(`rl.updates_per_rollout` > 1)."""
STEP_METRICS = ("reward_mean", "reward_std", "iou_mean", "parse_failure_rate", "kl", "entropy", "clip_frac",
                "zero_advantage_groups", "rollout_s", "update_s", *PHASES, "prefill_padding_frac",
                "update_padding_frac")
"""Per-step metrics (`rl/<name>` in the tracker; columns of the steps CSV after `step`). The padding shares
(`training.rl.rollout.padding_slots`, all ranks): of the token slots the rollout's prompt prefill computes, and of
those the update's teacher-forced micro-batches compute."""


def run_summary(state, parent: Path, parent_step, max_steps: int, groups: int) -> dict:
    """Run summary: the start, the filter's counts, first/last-10-step means of the metrics, and how many steps
    had no learning signal (every answer unparsed, or all `groups` groups flat)."""
    h = state.history

    def mean(rows: list[dict], k: str) -> float:
        vals = [x[k] for x in rows if x.get(k) is not None and math.isfinite(x[k])]
        return float(np.mean(vals)) if vals else float("nan")

    first, last = h[:10], h[-10:]
    out = {"stage": STAGE, "enabled": True, "step": state.step, "completed": state.step >= max_steps,
           "parent_checkpoint": str(parent), "parent_step": parent_step, "difficulty": state.difficulty,
           "steps_all_unparsed": sum(x.get("parse_failure_rate", 0) >= 1.0 for x in h),
           "steps_without_signal": sum(x.get("parse_failure_rate", 0) >= 1.0
                                       or x.get("zero_advantage_groups", 0) >= groups for x in h)}
    for k in STEP_METRICS:
        a, b = mean(first, k), mean(last, k)
        if k in PHASES and math.isnan(a) and math.isnan(b):
            continue  # a phase this run never has (no reference pass, one update per rollout): no NaN in the file
        out[f"first10/{k}"], out[f"last10/{k}"] = a, b
    return out


def write_outputs(summary: dict, history: list[dict], report_dir: Path) -> None:
    """`steps.csv` (one row per step) and `summary.json` in the RL report folder (what DVC and the report read)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    with (report_dir / STEPS_CSV).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *STEP_METRICS])
        for row in history:
            w.writerow([row["step"], *(_fmt(row.get(k)) for k in STEP_METRICS)])
    if summary.get("parent_checkpoint"):  # a stored path is relative to the file's folder (vtg.io.relative_ref)
        summary = {**summary, "parent_checkpoint": relative_ref(summary["parent_checkpoint"], report_dir)}
    (report_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=1, default=str) + "\n")


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return repr(float(v))
