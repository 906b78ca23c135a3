"""The evaluate stage (`python -m evaluation` with no `--checkpoint`): what `dvc repro` and the flow both run
after training (SFT, then RL), so both doors evaluate the same checkpoints on the same splits and write the same
outputs.

Every complete checkpoint under `train.out_dir` and, unless `orchestration.rl` is false, under `rl.out_dir`
(missing or empty is fine) is evaluated on val (stored results are reused, so checkpoints the flow already
evaluated while training ran cost nothing). The best of all of them by `evaluate.select_metric` (ties: mIoU,
then the later checkpoint, every RL one counting as later than every SFT one: `registry.order_key`) gets the
pointer `<evaluate.out_dir>/best.json` and the registry alias, and is evaluated on the held-out test split:
`metrics.json`, the report, and `summary.md` (test metrics next to the blind baselines, and the val curve per
checkpoint) in `evaluate.out_dir`. Every checkpoint's grounding and general-task retention on val make a plane:
its Pareto front goes into metrics.json (`pareto`), summary.md and the report (`evaluation.pareto`).

With RL checkpoints, also on test: the best RL checkpoint on val (even when an SFT one is the overall best) and
the SFT checkpoint its run started from (meta.json `parent_checkpoint`); their comparison, overall and by query
type (a distractor object in the window or not: `evaluation.query_types`), goes into metrics.json
(`comparison`), summary.md and the report, with the RL run's reward/KL/entropy curves
(`<rl.report_dir>/steps.csv`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from evaluation import store
from evaluation.api import EvaluationResult, curve_runs, evaluate_checkpoint, public_metrics, write_curve
from evaluation.compare import compare
from evaluation.intervals import format_ci
from evaluation.pareto import plane, plane_lines
from evaluation.query_types import query_types
from evaluation.registry import (
    DEFAULT_STAGE,
    HELDOUT_SPLIT,
    SELECTION_SPLIT,
    checkpoint_label,
    checkpoint_stage,
    order_key,
    pick_best,
    select_best,
)
from evaluation.report import (
    RL_PLOT,
    audit_line,
    card_lines,
    comparison_table,
    forgetting_table,
    metric_rows,
    read_rl_steps,
    write_report,
)
from vtg import checkpoints
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.harness import card_of, require_comparable
from vtg.io import write_json_atomic
from vtg.rl_outputs import STEPS_CSV as RL_STEPS_CSV
from vtg.selection import overfit_signal
from vtg.sources import Sources
from vtg.stages import stage_outputs

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.md"


def checkpoint_roots(cfg: PipelineConfig) -> list[Path]:
    """Where the stage looks for checkpoints: SFT's root, and RL's unless RL is off."""
    return [Path(cfg.train.out_dir)] + ([Path(cfg.rl.out_dir)] if cfg.orchestration.rl else [])


def run_stage(cfg: PipelineConfig) -> dict:
    """Evaluate every checkpoint on val, select the best, evaluate it on test (with RL: also the SFT-vs-RL
    comparison); returns a JSON-able digest."""
    roots = checkpoint_roots(cfg)
    found = [c for root in roots for c in checkpoints.list_checkpoints(root)]
    if not found:
        raise VTGError(f"{' and '.join(map(str, roots))}: no complete checkpoints to evaluate "
                       "(run training first: python -m training)")
    val = [evaluate_checkpoint(c, SELECTION_SPLIT, cfg) for c in found]
    selection = select_best(cfg.tracking, cfg.evaluate, [v.result for v in val])
    if not selection.get("best"):
        raise VTGError(f"no best checkpoint under {' and '.join(map(str, roots))}: {selection.get('reason')}")
    best_val = selection["result"]
    rl_best = pick_best([v.result for v in val if checkpoint_stage(v.result) != DEFAULT_STAGE
                         and Path(v.result["checkpoint"]).is_dir()], cfg.evaluate.select_metric,
                        cfg.evaluate.forgetting.min_for_selection)

    # On test: the comparison's checkpoints first, the overall best last (the stage outputs are the last one's).
    best_path = Path(selection["best"]).resolve()
    tested: dict[Path, EvaluationResult] = {}
    sft_parent, parent_problem = None, None
    if rl_best is not None:
        parent = rl_best.get("parent_checkpoint")
        try:
            if not parent:
                raise VTGError(f"{rl_best['checkpoint']}: its meta.json names no parent_checkpoint")
            sft_parent = checkpoints.resolve_checkpoint(parent)
            if sft_parent != best_path:
                tested[sft_parent] = evaluate_checkpoint(sft_parent, HELDOUT_SPLIT, cfg)
        except VTGError as e:
            sft_parent, parent_problem = None, str(e)
            log.warning("SFT-vs-RL comparison without SFT: %s", e)
        rl_path = Path(rl_best["checkpoint"]).resolve()
        if rl_path != best_path:
            tested[rl_path] = evaluate_checkpoint(rl_path, HELDOUT_SPLIT, cfg)
    test = evaluate_checkpoint(best_path, HELDOUT_SPLIT, cfg)
    tested[best_path] = test

    comparison = None
    if rl_best is not None:
        rl_path = Path(rl_best["checkpoint"]).resolve()
        comparison = _comparison(cfg, tested[rl_path], tested.get(sft_parent) if sft_parent else None,
                                 parent_problem, overall_best=rl_path == best_path)
    report_dir = stage_outputs("rl", cfg).report_dir  # where `python -m training.rl` wrote them
    rl_steps = read_rl_steps(Path(report_dir) / RL_STEPS_CSV) if cfg.orchestration.rl else []
    overfit = overfit_signal(curve_runs(cfg, best_val), cfg.evaluate.overfit_patience)
    pareto = plane([v.result for v in val], cfg.evaluate.select_metric, cfg.evaluate.forgetting.min_for_selection,
                   checkpoint_label(best_val), SELECTION_SPLIT)
    _write_outputs(cfg, test, best_val, comparison, rl_steps, overfit, pareto)
    summary = summary_markdown(test, val, comparison, overfit, pareto)
    (Path(cfg.evaluate.out_dir) / SUMMARY_FILE).write_text(summary)
    return {"best_checkpoint": selection["best"], "best_step": selection["step"],
            "best_stage": checkpoint_stage(best_val), "best_checkpoint_name": checkpoint_label(best_val),
            "test": test.to_dict(), "val": [v.to_dict() for v in val], "comparison": comparison,
            "summary_markdown": summary, "registered_version": selection.get("registered_version"),
            "overfit": overfit, "pareto": pareto}


def _comparison(cfg: PipelineConfig, rl: EvaluationResult, sft: EvaluationResult | None, problem: str | None,
                overall_best: bool) -> dict:
    """metrics.json's `comparison`: the best RL checkpoint vs the SFT checkpoint its run started from, on test,
    overall and by query type. Names only (no absolute paths): metrics.json is the same from both doors."""
    ev = cfg.evaluate
    types, note = query_types(ev.shards_dir, HELDOUT_SPLIT, cfg.corpus.out_dir, Sources.of(cfg.ingest.sources))
    if sft is not None:
        require_comparable([(checkpoint_label(sft.result), card_of(sft.result)),
                            (checkpoint_label(rl.result), card_of(rl.result))], "compare")
    out = compare(store.load_predictions(sft.entry_dir) if sft else None, store.load_predictions(rl.entry_dir),
                  types, ev.iou_thresholds, ev.bootstrap_resamples, ev.confidence)
    rl_info = {"checkpoint": checkpoint_label(rl.result), "step": rl.result["step"], "overall_best": overall_best,
               "parent_step": rl.result.get("parent_step")}
    sft_info = ({"checkpoint": checkpoint_label(sft.result), "step": sft.result["step"],
                 "role": "the checkpoint the RL run started from"} if sft else None)
    extra = {"reason": f"the RL run's start checkpoint could not be evaluated: {problem}"} if sft is None else {}
    return {"split": HELDOUT_SPLIT, "selected_on": SELECTION_SPLIT, "select_metric": ev.select_metric,
            "sft": sft_info, "rl": rl_info, **out, "query_types": note, **extra}


def _write_outputs(cfg: PipelineConfig, test: EvaluationResult, best_val: dict, comparison: dict | None,
                   rl_steps: list[dict], overfit: dict | None = None, pareto: dict | None = None) -> None:
    """metrics.json with the comparison and the grounding-retention front, the val curve of the best's run, and the
    report re-drawn in the stage outputs with the comparison table, the RL curves and the plane."""
    ev, out = cfg.evaluate, Path(cfg.evaluate.out_dir)
    with store.locked(ev.store_dir):
        metrics = public_metrics(test.result)
        if comparison is not None:
            metrics["comparison"] = comparison
        metrics["overfit"] = overfit
        metrics["pareto"] = pareto
        write_json_atomic(out / store.RESULT_FILE, metrics)
        rows = write_curve(cfg, curve_runs(cfg, best_val), best_val["summary"]["baselines"])
        (out / RL_PLOT).unlink(missing_ok=True)  # a previous run's curves
        write_report(out, test.result, store.load_predictions(test.entry_dir), rows, ev.iou_thresholds,
                     ev.report_samples, comparison=comparison, rl_steps=rl_steps,
                     rl_warn=(cfg.rl.kl_warn, cfg.rl.entropy_warn), overfit=overfit, pareto=pareto)


def comparison_markdown(comparison: dict) -> list[str]:
    sft, rl = comparison.get("sft"), comparison["rl"]
    header, rows = comparison_table(comparison)
    counts = ", ".join(f"{k} {v}" for k, v in comparison["query_type_counts"].items())
    sft_line = (f"SFT: `{sft['checkpoint']}` (the RL run's start checkpoint)" if sft else
                f"SFT: none ({comparison.get('reason')})")
    rl_line = (f"RL: `{rl['checkpoint']}` (best RL checkpoint on {comparison['selected_on']} by "
               f"{comparison['select_metric']}{'; the overall best' if rl['overall_best'] else ''})")
    lines = [f"## SFT vs RL on {comparison['split']}", "", sft_line, rl_line, "",
             f"Query types ({counts}): {comparison['query_types']['rule']}.", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return lines


def summary_markdown(test: EvaluationResult, val: list[EvaluationResult], comparison: dict | None = None,
                     overfit: dict | None = None, pareto: dict | None = None) -> str:
    """The evaluation part of the pipeline report: held-out metrics (95% bootstrap intervals) vs blind baselines
    and the visual gain (paired intervals), the SFT-vs-RL comparison (with RL), the harness card, then val per
    checkpoint (SFT, then RL)."""
    t = test.to_dict()
    title = (f"## Held-out {t['split']} metrics of the best checkpoint (`{checkpoint_label(test.result)}`, "
             f"step {t['step']}, chosen on {SELECTION_SPLIT} by {t['select_metric']})")
    lines = [title, "", f"report: {test.out_dir / 'report.html'}", ""]
    if overfit:
        lines += [f"**Warning:** {overfit['message']}", ""]
    s = test.result["summary"]
    metrics = ["miou", *sorted(k for k in s["model"] if k.startswith("r1@"))]
    rows = metric_rows(s, metrics)
    lines += ["| | " + " | ".join(f"{m} [95% CI]" for m in metrics) + " |", "| --- |" + " --- |" * len(metrics)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    extra = {k: v for k, v in s["model"].items() if k not in metrics and isinstance(v, int | float)}
    model_ci = (s.get("intervals") or {}).get("model") or {}
    lines += ["", ", ".join(f"{k} {format_ci(v, model_ci.get(k), 4)}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in extra.items())]
    if comparison:
        lines += ["", *comparison_markdown(comparison)]
    header, rows, notes = forgetting_table(s.get("forgetting"))
    lines += ["", "## General-task retention (forgetting)", ""]
    if rows:
        lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    lines += [f"{'**Warning:** ' if 'retention' in n else ''}{n}" for n in notes]
    if pareto:
        lines += ["", *plane_lines(pareto)]
    lines += ["", "## Annotation audit", "", audit_line(s.get("annotation_audit"))]
    card = s.get("harness")
    lines += ["", "## Harness card", "", "| harness | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in card_lines(card)]
    if card:
        lines += ["", "Prompt as the model gets it:", "", "```", card["prompt"]["text"].rstrip("\n"), "```"]
    keys = ["miou", *sorted(k for k in val[0].metrics if k.startswith("r1@"))] if val else []
    lines += ["", f"## Per-checkpoint evaluation ({SELECTION_SPLIT})", "",
              "| checkpoint | stage | step | " + " | ".join(keys) + " |", "| --- | --- | --- |" + " --- |" * len(keys)]
    for v in sorted(val, key=lambda v: order_key(v.result)):
        lines.append(f"| {checkpoint_label(v.result)} | {checkpoint_stage(v.result)} | {v.result['step']} | "
                     + " | ".join(f"{v.metrics[k]:.4f}" for k in keys) + " |")
    return "\n".join(lines) + "\n"
