"""The pipeline report and the shard-manifest artifact as markdown: pure functions of what the flow collected
(the `write-report` and `beam-preprocess` tasks write and publish them)."""

from __future__ import annotations

import json
from typing import Any

from vtg.config import PipelineConfig

REPORT_KEYS = ("flow_run_id", "mlflow_parent_run_id", "git_commit", "config_hash", "source_digest", "data_version",
               "dvc", "train_run_id", "rl", "best_checkpoint", "eval_mode", "seconds")
"""The rows of the report's first table, in order (`rl`: `rl_line`; `eval_placement` follows `eval_mode`)."""


def manifest_markdown(cfg: PipelineConfig, manifest: dict[str, Any], version: str) -> str:
    """The shard manifest as a table (lists of 20 items or more left out)."""
    rows = [f"| {k} | {json.dumps(v) if isinstance(v, dict | list) else v} |" for k, v in manifest.items()
            if not isinstance(v, list) or len(v) < 20]
    return "\n".join([f"# Shards `{cfg.preprocess.out_dir}`", f"data version: `{version}`", "",
                      "| field | value |", "| --- | --- |", *rows])


def rl_line(step: dict[str, Any] | None) -> str:
    """The report's RL row: the RL run, the SFT checkpoint it started from and how many steps, or why none."""
    if not step:
        return "not run"
    if not step.get("enabled", True):
        return "off (`orchestration.rl` false): no RL checkpoints"
    if not step.get("latest_checkpoint"):
        return "no RL checkpoint"
    start = step.get("start_checkpoint")
    at = f" (step {step['start_step']})" if step.get("start_step") is not None else ""
    return (f"run `{step.get('rl_run_id')}` from `{start}`{at}, {step.get('steps')} steps -> "
            f"`{step.get('latest_checkpoint')}`")


def report_markdown(s: dict[str, Any]) -> str:
    """The pipeline report: lineage and steps from the flow, the evaluation part as the evaluate stage wrote it."""
    lines = ["# Post-training run report", "", "| | |", "| --- | --- |"]
    steps = s.get("stages") or {}
    placement = s.get("eval_placement") or next(
        (steps.get(k, {}).get("eval_placement") for k in ("train", "rl") if steps.get(k, {}).get("eval_placement")),
        None)
    for k in REPORT_KEYS:
        lines.append(f"| rl | {rl_line(steps.get('rl'))} |" if k == "rl" else f"| {k} | `{s.get(k)}` |")
        if k == "eval_mode" and placement:
            lines.append(f"| eval_placement | {placement} |")
    if s.get("evaluation_markdown"):
        lines += ["", s["evaluation_markdown"].rstrip()]
    if steps:
        lines += ["", "## Steps", "", "| step | status | stage process s | dvc.lock s | MLflow run |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {k} | {v.get('status', 'ran')} | {v.get('seconds', 0):.1f} | {v.get('dvc_s', 0):.1f} | "
                  f"{v.get('mlflow_run_id') or '-'} |" for k, v in steps.items()]
    return "\n".join(lines) + "\n"


def eval_table(evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per evaluated checkpoint: its step and its metrics (4 decimals), for the `eval-metrics` artifact."""
    return [{"step": e["step"], **{k: round(v, 4) for k, v in e.get("metrics", {}).items()}} for e in evaluations]
