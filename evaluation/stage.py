"""The evaluate stage (`python -m evaluation` with no `--checkpoint`): what `dvc repro` and the flow both run
after training, so both doors evaluate the same checkpoint on the same split and write the same outputs.

Every complete checkpoint under `train.out_dir` is evaluated on val (stored results are reused, so checkpoints
the flow already evaluated while training ran cost nothing), the best by `evaluate.select_metric` (ties: mIoU,
then the later step) gets the pointer `<evaluate.out_dir>/best.json` and the registry alias, and the best is
evaluated on the held-out test split: `metrics.json`, the report, and `summary.md` (test metrics next to the
blind baselines, and the val curve per checkpoint) in `evaluate.out_dir`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from evaluation.api import EvaluationResult, evaluate_checkpoint
from evaluation.registry import HELDOUT_SPLIT, SELECTION_SPLIT, select_best
from vtg import checkpoints
from vtg.config import PipelineConfig
from vtg.errors import VTGError

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.md"


def run_stage(cfg: PipelineConfig) -> dict:
    """Evaluate every checkpoint on val, select the best, evaluate it on test; returns a JSON-able digest."""
    root = Path(cfg.train.out_dir)
    found = checkpoints.list_checkpoints(root)
    if not found:
        raise VTGError(f"{root}: no complete checkpoints to evaluate (run training first: python -m training)")
    val = [evaluate_checkpoint(c, SELECTION_SPLIT, cfg) for c in found]
    selection = select_best(cfg.tracking, cfg.evaluate, [v.result for v in val])
    if not selection.get("best"):
        raise VTGError(f"no best checkpoint under {root}: {selection.get('reason')}")
    test = evaluate_checkpoint(selection["best"], HELDOUT_SPLIT, cfg)
    summary = summary_markdown(test, val)
    (Path(cfg.evaluate.out_dir) / SUMMARY_FILE).write_text(summary)
    return {"best_checkpoint": selection["best"], "best_step": selection["step"], "test": test.to_dict(),
            "val": [v.to_dict() for v in val], "summary_markdown": summary,
            "registered_version": selection.get("registered_version")}


def summary_markdown(test: EvaluationResult, val: list[EvaluationResult]) -> str:
    """The evaluation part of the pipeline report: held-out metrics vs blind baselines, then val per checkpoint."""
    t = test.to_dict()
    base = t["baselines"]
    title = (f"## Held-out {t['split']} metrics of the best checkpoint (`{test.result['checkpoint_name']}`, "
             f"step {t['step']}, chosen on {SELECTION_SPLIT} by {t['select_metric']})")
    lines = [title, "",
             f"report: {test.report}", "",
             "| metric | model | " + " | ".join(f"blind: {b}" for b in base) + " |",
             "| --- | --- |" + " --- |" * len(base)]
    for k, v in t["model"].items():
        if isinstance(v, int | float):
            row = " | ".join(f"{base[b][k]:.4f}" if k in base[b] else "-" for b in base)
            lines.append(f"| {k} | {v:.4f} | {row} |")
    keys = ["miou", *sorted(k for k in val[0].metrics if k.startswith("r1@"))] if val else []
    lines += ["", f"## Per-checkpoint evaluation ({SELECTION_SPLIT})", "", "| step | " + " | ".join(keys) + " |",
              "| --- |" + " --- |" * len(keys)]
    for v in sorted(val, key=lambda v: v.result["step"]):
        lines.append(f"| {v.result['step']} | " + " | ".join(f"{v.metrics[k]:.4f}" for k in keys) + " |")
    return "\n".join(lines) + "\n"
