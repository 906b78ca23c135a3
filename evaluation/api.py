"""Evaluate a checkpoint by path: the one call the CLI, DVC and the orchestrator's event trigger share.

`evaluate_checkpoint(path, split, cfg)` validates the checkpoint (a half-written or corrupt one is a one-line
`VTGError`, and nothing is logged or registered), reuses a stored result for the same checkpoint content,
split, settings and eval data (idempotent), else evaluates it, stores the result, logs an MLflow run, and then,
under a lock: refreshes the stage outputs (`evaluate.out_dir`), the step curve, and the best-checkpoint pointer
and registry alias.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from evaluation import forgetting, store, tracking
from evaluation.core import evaluate_export, resolve_device
from evaluation.metrics import metric_name
from evaluation.registry import (
    DEFAULT_STAGE,
    SELECTION_SPLIT,
    checkpoint_label,
    checkpoint_stage,
    order_key,
    select_best,
)
from evaluation.report import PLOTS, plot_step_curve, write_report
from vtg import checkpoints
from vtg.config import PipelineConfig, load_config
from vtg.config.keys import output_view, view_hash
from vtg.errors import VTGError
from vtg.io import file_digest, tree_digest, write_json_atomic
from vtg.records import write_jsonl
from vtg.selection import check_judged_on_training_data, overfit_signal, train_loss_of_meta
from vtg.shards import list_shards

log = logging.getLogger(__name__)

PUBLISHED = (store.PREDICTIONS_FILE, "report.html", *PLOTS)
STEPS_FILE = "steps.csv"


@dataclass
class EvaluationResult:
    result: dict
    """Everything in metrics.json: checkpoint, step, split, lineage, summary (model, baselines, gain, ...)."""
    entry_dir: Path
    """Where this evaluation is stored (metrics.json, predictions.jsonl, report.html, plots)."""
    out_dir: Path
    """The stage's fixed outputs (the last evaluated checkpoint) plus steps.csv."""
    reused: bool
    """True when a stored result was returned instead of evaluating again."""
    selection: dict = field(default_factory=dict)
    """Best-checkpoint decision: best checkpoint, pointer moved, registered version."""

    @property
    def metrics(self) -> dict:
        return self.result["summary"]["model"]

    @property
    def report(self) -> Path:
        return self.entry_dir / "report.html"

    def to_dict(self) -> dict:
        """A JSON-able digest for callers (the orchestrator's report, a Prefect task result)."""
        r, s = self.result, self.result["summary"]
        return {"checkpoint": r["checkpoint"], "checkpoint_name": checkpoint_label(r), "stage": checkpoint_stage(r),
                "step": r["step"], "split": r["split"],
                "model": s["model"], "baselines": {name: {m: v for m, v in b.items() if m != "fit"}
                              for name, b in s["baselines"].items()},
                "visual_gain": s["visual_gain"], "select_metric": r["select_metric"],
                "select_value": r["select_value"], "mlflow_run_id": r.get("mlflow_run_id"),
                "report": str(self.report), "entry_dir": str(self.entry_dir), "reused": self.reused,
                "selection": self.selection}


def _metric_names(cfg: PipelineConfig) -> list[str]:
    return ["miou"] + [metric_name(t) for t in cfg.evaluate.iou_thresholds]


def settings_hash(cfg: PipelineConfig) -> str:
    """Hash of the evaluate fields that change what is computed (fields marked NOT_OUTPUT left out)."""
    return view_hash(output_view(cfg.evaluate))


def _data_digest(cfg: PipelineConfig, split: str) -> str:
    splits = [split] + (["train"] if "prior" in cfg.evaluate.baselines else [])
    h = hashlib.sha256()
    for s in splits:
        for shard in list_shards(cfg.evaluate.shards_dir, s):
            h.update(f"{s}/{Path(shard).name}:{file_digest(shard)}\n".encode())
    return h.hexdigest()


def _checkpoint_digest(ckpt: Path) -> str:
    return hashlib.sha256(f"{tree_digest(checkpoints.export_dir(ckpt))}:{file_digest(ckpt / checkpoints.META_FILE)}"
                          .encode()).hexdigest()


def _lineage(ckpt: Path, meta: dict, depth: int = 0) -> str:
    """The training run a checkpoint's evaluations are grouped (step curve) and selected in: its run id, else
    its checkpoint root. An RL checkpoint belongs to the run of the checkpoint it started from (meta.json's
    `parent_checkpoint`), so that SFT and RL checkpoints compete for one `best`."""
    parent = (checkpoints.parent_checkpoint(ckpt, meta) if checkpoint_stage(meta) != DEFAULT_STAGE
              and meta.get("parent_checkpoint") else None)
    if not parent or depth > 8:
        return meta.get("mlflow_run_id") or str(Path(ckpt).resolve().parent)
    try:
        parent_meta = checkpoints.read_checkpoint_meta(parent)
    except VTGError as e:
        log.warning("%s: its parent checkpoint is not readable (%s); grouping it under the parent's root", ckpt, e)
        return meta.get("parent_mlflow_run_id") or str(parent.parent)
    return _lineage(checkpoints.resolve_checkpoint(parent), parent_meta, depth + 1)


def checkpoint_identity(ckpt: Path, meta: dict) -> dict:
    """Which training stage wrote the checkpoint and its name that says so (`rl/step-000100`); for RL, the
    checkpoint it started from."""
    stage = checkpoint_stage(meta)
    out = {"stage": stage, "checkpoint_name": checkpoint_label({"stage": stage, "checkpoint": str(ckpt)})}
    if meta.get("parent_checkpoint"):
        out.update(parent_checkpoint=str(checkpoints.parent_checkpoint(ckpt, meta)), parent_step=meta.get("parent_step"))
    return out


def _new_result(ckpt: Path, meta: dict, split: str, cfg: PipelineConfig, key: str, digests: tuple) -> dict:
    return {
        "key": key, "checkpoint": str(ckpt), **checkpoint_identity(ckpt, meta), "checkpoint_digest": digests[0],
        "step": int(meta["step"]), "split": split, "train_run_id": meta.get("mlflow_run_id") or None,
        "lineage": _lineage(ckpt, meta), "data_version": meta.get("data_version"),
        "data_sources": meta.get("data_sources"), "eval_data_digest": digests[1], "settings_hash": settings_hash(cfg),
        "select_metric": cfg.evaluate.select_metric, "train_loss": train_loss_of_meta(meta),
    }


GENERAL_ANSWERS = "general_answers.jsonl"
"""Per general-task item: the checkpoint's answer and whether it is right (`evaluation.forgetting`)."""


def add_retention(summary: dict, meta: dict, ev) -> list[dict]:
    """Put the base's general-task scores beside the checkpoint's (`summary.forgetting`: retention per task and
    warnings, logged); returns the checkpoint's per-item answers (kept beside predictions.jsonl)."""
    general = summary.get("forgetting") or {}
    answers = general.pop("answers", [])
    if "scores" not in general:
        return answers
    items, _ = forgetting.suite_items(ev)
    base, why = forgetting.base_scores(meta.get("base_path"), ev, items, resolve_device(ev.device), ev.store_dir,
                                       general.get("asked"))
    general.update(forgetting.retention(general["scores"], base, ev.forgetting.warn_below),
                   base=Path(meta.get("base_path") or "").name or None, base_note=why)
    for warning in general["warnings"]:
        log.warning("%s", warning)
    return answers


def _evaluate_new(ckpt: Path, meta: dict, split: str, cfg: PipelineConfig, key: str, digests: tuple,
                  to_train_run: bool = True) -> dict:
    ev = cfg.evaluate
    summary, predictions = evaluate_export(checkpoints.export_dir(ckpt), ev, split)  # raises before anything is logged
    general_answers = add_retention(summary, meta, ev)
    result = {**_new_result(ckpt, meta, split, cfg, key, digests), "summary": summary,
              "select_value": summary["model"][ev.select_metric]}
    entry = store.entry_dir(ev.store_dir, split, result["checkpoint_name"], key)
    run_id = tracking.start_eval_run(cfg.tracking, result) if cfg.tracking.enabled else None
    try:
        result["mlflow_run_id"] = run_id
        store.save_predictions(entry, predictions)
        if general_answers:
            write_jsonl(entry / GENERAL_ANSWERS, general_answers)
        past = store.history(ev.store_dir, split, result["lineage"], result["settings_hash"])
        runs = [r for r in past if order_key(r) != order_key(result)] + [result]
        write_report(entry, result, predictions, store.step_rows(runs, _metric_names(cfg), ev.select_metric),
                     ev.iou_thresholds, ev.report_samples)
        store.save_result(entry, result)  # last: marks the entry complete
        if run_id:
            params = {f"evaluate.{k}": v for k, v in ev.model_dump(mode="json").items()}
            tracking.finish_eval_run(cfg.tracking, run_id, result, entry, params)
            if to_train_run:
                tracking.log_to_train_run(cfg.tracking, result)
    except BaseException:
        if run_id:
            tracking.fail_eval_run(cfg.tracking, run_id)
        raise
    return result


def public_metrics(result: dict) -> dict:
    """metrics.json of the stage outputs: what was measured, on what, and nothing run-specific (no run ids, no
    absolute paths), so both front doors write the same file for the same checkpoint and data."""
    s = result["summary"]
    return {"checkpoint": checkpoint_label(result), "stage": checkpoint_stage(result), "step": result["step"],
            "split": result["split"],
            "data_version": result.get("data_version"), "settings_hash": result["settings_hash"],
            "select_metric": result["select_metric"], "model": s["model"], "counts": s["counts"],
            "baselines": {name: {m: v for m, v in b.items() if m != "fit"} for name, b in s["baselines"].items()},
            "visual_gain": s["visual_gain"], "intervals": s.get("intervals"), "harness": s.get("harness"),
            "forgetting": s.get("forgetting"), "annotation_audit": s.get("annotation_audit")}


def overfit_check(cfg: PipelineConfig, runs: list[dict]) -> dict | None:
    """The overfitting signal of one run's val results (`vtg.selection.overfit_signal`): a warning in the log and
    a tag on the training run in MLflow; returned for the report."""
    signal = overfit_signal(runs, cfg.evaluate.overfit_patience)
    if signal is None:
        return None
    log.warning("%s", signal["message"])
    train_run = next((r.get("train_run_id") for r in reversed(runs) if r.get("train_run_id")), None)
    if cfg.tracking.enabled and train_run:
        tracking.tag_run(cfg.tracking, train_run, {"vtg.overfit": signal["message"][:500]})
    return signal


def curve_runs(cfg: PipelineConfig, result: dict) -> list[dict]:
    """The stored results on `result`'s split of its lineage (its training run and the RL runs started from it)
    and settings, SFT then RL; only SFT when RL is off (`orchestration.rl` false: stale RL results aside)."""
    runs = store.history(cfg.evaluate.store_dir, result["split"], result["lineage"], result["settings_hash"])
    return runs if cfg.orchestration.rl else [r for r in runs if checkpoint_stage(r) == DEFAULT_STAGE]


def write_curve(cfg: PipelineConfig, runs: list[dict], baselines: dict) -> list[dict]:
    """steps.csv and step_curve.png of the stage outputs from `runs`; returns the rows. Call under the lock."""
    ev, metrics = cfg.evaluate, _metric_names(cfg)
    rows = store.step_rows(runs, metrics, ev.select_metric)
    store.write_steps_csv(Path(ev.out_dir) / STEPS_FILE, rows)
    plot_step_curve(rows, metrics, baselines, ev.select_metric, Path(ev.out_dir) / "step_curve.png")
    return rows


def _refresh_outputs(cfg: PipelineConfig, result: dict, entry: Path) -> dict:
    """Stage outputs; on the selection split also the step curve, best pointer and registry alias (under the
    store lock)."""
    ev = cfg.evaluate
    out = Path(ev.out_dir)
    with store.locked(ev.store_dir):
        store.publish(entry, out, PUBLISHED)
        write_json_atomic(out / store.RESULT_FILE, public_metrics(result))
        if result["split"] != SELECTION_SPLIT:
            return {}
        runs = curve_runs(cfg, result)
        write_curve(cfg, runs, result["summary"]["baselines"])
        overfit = overfit_check(cfg, runs)
        return {**select_best(cfg.tracking, ev, runs), "overfit": overfit}


def evaluate_checkpoint(checkpoint_dir: str | Path, split: str | None = None,
                        cfg: PipelineConfig | None = None, refresh: bool = True,
                        adhoc: bool = False) -> EvaluationResult:
    """Evaluate one checkpoint (a step dir, a `latest`/`best` pointer, or a checkpoint root) on `split`.

    `refresh=False` only computes (or reuses) the stored result: the evaluate stage's outputs (curve, report,
    best pointer, registry alias) are left alone, for callers that are not the evaluate stage (RL picking its
    start checkpoint). `adhoc=True` (the CLI's `--checkpoint`, any settings) also leaves the training run's MLflow
    metrics alone: the result lives in the content-addressed store and its own MLflow run only, so a side command
    never moves a shared result (docs/faults.md)."""
    refresh = refresh and not adhoc
    cfg = cfg or load_config()
    split = split or cfg.evaluate.split
    meta = checkpoints.read_checkpoint_meta(checkpoint_dir)  # a half-written or corrupt checkpoint stops here
    ckpt = checkpoints.resolve_checkpoint(checkpoint_dir)
    if not adhoc:  # a result that selects (best, RL's start, early stop) is judged on the training data
        check_judged_on_training_data(cfg, meta.get("data_version"), f"evaluating {ckpt.name} for selection")
    digests = (_checkpoint_digest(ckpt), _data_digest(cfg, split))
    key = store.eval_key(digests[0], split, settings_hash(cfg), digests[1])
    with store.locked(cfg.evaluate.store_dir, key):
        found = store.find(cfg.evaluate.store_dir, split, key) if cfg.evaluate.reuse else None
        if found is not None:
            log.info("reusing stored evaluation of %s on %s: %s", ckpt.name, split, found)
            result, entry, reused = store.load_result(found), found, True
            # the checkpoint at hand (the same content: the key holds its digest), with its name and parent
            result = {**result, "checkpoint": str(ckpt), **checkpoint_identity(ckpt, meta)}
        else:
            result = _evaluate_new(ckpt, meta, split, cfg, key, digests, to_train_run=not adhoc)
            entry, reused = store.entry_dir(cfg.evaluate.store_dir, split, result["checkpoint_name"], key), False
    selection = _refresh_outputs(cfg, result, entry) if refresh else {}
    return EvaluationResult(result, entry, Path(cfg.evaluate.out_dir), reused, selection)
