"""Evaluate one model export on one split: generation, eval loss, blind baselines, metrics. No side effects."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from evaluation import forgetting, intervals
from evaluation.baselines import fit_prior, prior_prediction
from evaluation.harness import WINDOWED, build_card, frame_facts
from evaluation.metrics import metric_name
from evaluation.predict import predict_batch
from evaluation.scoring import aggregate, breakdowns, score_answers, score_spans, visual_gain
from vtg.config import EvaluateConfig
from vtg.errors import VTGError
from vtg.harness import digest
from vtg.io import file_digest
from vtg.model.modeling import load_model_and_tokenizer, resolve_device
from vtg.queries import QueryExample, ReadStats, iter_examples, iter_spans
from vtg.shards import list_shards, read_manifest

log = logging.getLogger(__name__)


def _batched(examples: Iterator[QueryExample], size: int) -> Iterator[list[QueryExample]]:
    batch: list[QueryExample] = []
    for ex in examples:
        batch.append(ex)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _select_threshold(select_metric: str) -> float | None:
    return float(select_metric.split("@")[1]) if select_metric.startswith("r1@") else None


def fit_prior_from_train(cfg: EvaluateConfig) -> tuple[tuple[float, float], dict]:
    """The moment prior from the train split's shards (JSON members only)."""
    stats = ReadStats()
    moments = list(iter_spans(list_shards(cfg.shards_dir, "train"), stats))
    if not moments:
        raise VTGError(f"{cfg.shards_dir}/train: no readable queries to fit the moment prior on")
    span, fit = fit_prior(moments, _select_threshold(cfg.select_metric), cfg.prior_grid)
    fit["skipped"] = dict(stats.skipped)
    return span, fit


def _stream(model, tokenizer, examples: Iterator[QueryExample], cfg: EvaluateConfig, device: str) -> dict:
    """One pass over the split, batch by batch (frames are dropped after each batch): answers and losses of the
    model and, when configured, of the model on blank frames, plus the light per-query metadata."""
    blank = "blank" in cfg.baselines
    acc = {"meta": [], "answers": [], "blank_answers": [], "loss": [0.0, 0], "blank_loss": [0.0, 0],
           "query_loss": [], "query_tokens": []}
    with tqdm(desc="evaluating", unit="query", leave=False) as bar:
        for batch in _batched(examples, cfg.batch_size):
            for out_key, loss_key, is_blank in (("answers", "loss", False), ("blank_answers", "blank_loss", True)):
                if is_blank and not blank:
                    continue
                out = predict_batch(model, tokenizer, batch, device, cfg.max_new_tokens, blank=is_blank)
                acc[out_key].extend(out.answers)
                acc[loss_key][0] += out.loss_sum
                acc[loss_key][1] += out.loss_tokens
                if not is_blank:
                    acc["query_loss"].extend(out.losses)
                    acc["query_tokens"].extend(out.tokens)
            acc["meta"].extend({"key": ex.key, "query": ex.query, "windows": ex.windows, "source": ex.source,
                                "duration_s": ex.duration_s,
                                "clip": (len(ex.frames), *ex.frames.shape[1:3], ex.duration_s)} for ex in batch)
            bar.update(len(batch))
    return acc


def _mean_loss(pair: list) -> float:
    return pair[0] / max(pair[1], 1)


def harness_card(model, tokenizer, cfg: EvaluateConfig, split: str, examples: list[dict], shards_digest: str) -> dict:
    """The harness card of a windowed evaluation (`evaluation.harness`): what the model saw and how it was scored."""
    from vtg.model.generation import vision_params
    from vtg.model.processing import query_position, timestamp_mode

    manifest = read_manifest(cfg.shards_dir) or {}
    vision = vision_params(model)
    return build_card(
        protocol=WINDOWED, split=split, split_digest=shards_digest, data_version=manifest.get("data_version"),
        queries=len(examples), vision=vision, tokenizer=tokenizer, timestamps=timestamp_mode(tokenizer),
        frames=frame_facts((ex["clip"] for ex in examples), vision),
        decoding={"strategy": "greedy", "max_new_tokens": cfg.max_new_tokens},
        thresholds=cfg.iou_thresholds, query_position=query_position(tokenizer),
        intervals={"method": intervals.METHOD, "resamples": cfg.bootstrap_resamples, "confidence": cfg.confidence,
                   "seed": intervals.SEED})


def annotation_audit(cfg: EvaluateConfig, split: str) -> dict | None:
    """The split's line of the preprocess annotation audit (manifest.json `audit`): queries, flagged, per flag,
    and where the list of flagged queries is; None for shards written without the audit."""
    audit = (read_manifest(cfg.shards_dir) or {}).get("audit")
    if not audit:
        return None
    return {"split": split, "queries": audit["queries"].get(split, 0), "flagged": audit["flagged"].get(split, 0),
            "per_flag": audit["per_flag"].get(split, {}), "filter": audit.get("filter", []),
            "list": str(Path(cfg.shards_dir) / audit.get("list", "audit.jsonl"))}


def metric_intervals(rows: list[dict], baseline_rows: dict[str, list[dict]], best_blind: dict[str, str],
                     cfg: EvaluateConfig, losses: tuple[list, list] = ([], [])) -> dict:
    """Bootstrap intervals of the model's and each baseline's metrics (the model's eval loss and parse-failure
    rate too), and the paired interval of the visual gain (model minus the best blind baseline of each metric)."""
    kw = {"thresholds": cfg.iou_thresholds, "resamples": cfg.bootstrap_resamples, "confidence": cfg.confidence}
    ious = [r["iou"] for r in rows]
    model_ci = intervals.bootstrap(ious, **kw)
    extra = intervals.mean_and_ratio(
        {"parse_failure_rate": ([float(r["pred"] is None) for r in rows], None), "eval_loss": losses},
        cfg.bootstrap_resamples, cfg.confidence)
    gain = {}
    for metric, name in best_blind.items():
        entry = intervals.paired([r["iou"] for r in baseline_rows[name]], ious, **kw).get(metric)
        if entry:
            gain[metric] = {**entry, "baseline": name}
    return {"model": {**model_ci, **extra},
            "baselines": {name: intervals.bootstrap([r["iou"] for r in b], **kw) for name, b in baseline_rows.items()},
            "visual_gain": gain}


def split_digest(shards: list[str]) -> str:
    """A digest of a split's shard files (names and contents): the card's `data.split_digest`."""
    return digest([[Path(s).name, file_digest(s)] for s in shards])


def evaluate_export(hf_dir: str | Path, cfg: EvaluateConfig, split: str) -> tuple[dict, list[dict]]:
    """(metrics summary, prediction rows) of the HF export `hf_dir` on `split`."""
    t0 = time.perf_counter()
    device = resolve_device(cfg.device)
    shards = list_shards(cfg.shards_dir, split)
    model, tokenizer = load_model_and_tokenizer(hf_dir, device=device)  # a broken export: one line
    stats = ReadStats()
    acc = _stream(model, tokenizer, iter_examples(shards, stats, cfg.max_examples), cfg, device)
    examples = acc["meta"]
    if not examples:
        raise VTGError(f"{cfg.shards_dir}/{split}: no readable queries to evaluate "
                       f"(skipped: {dict(stats.skipped) or 'none'})")
    t_model = time.perf_counter() - t0
    thresholds = cfg.iou_thresholds
    gts = [ex["windows"] for ex in examples]
    rows = score_answers(acc["answers"], gts)
    model_metrics = {**aggregate(rows, thresholds), "eval_loss": _mean_loss(acc["loss"])}

    baselines: dict[str, dict] = {}
    blank_rows = prior_rows = None
    card = harness_card(model, tokenizer, cfg, split, examples, split_digest(shards))
    if "blank" in cfg.baselines:
        blank_rows = score_answers(acc["blank_answers"], gts)
        baselines["blank"] = {**aggregate(blank_rows, thresholds), "eval_loss": _mean_loss(acc["blank_loss"])}
    if "prior" in cfg.baselines:
        span, fit = fit_prior_from_train(cfg)
        prior_rows = score_spans([prior_prediction(span, ex["duration_s"]) for ex in examples], gts)
        baselines["prior"] = {**aggregate(prior_rows, thresholds), "span_normalized": list(span), "fit": fit}

    names = ["miou"] + [metric_name(t) for t in thresholds]
    gain, best_blind = visual_gain(model_metrics, baselines, names)
    predictions = []
    for i, (ex, row) in enumerate(zip(examples, rows)):
        pred = {"key": ex["key"], "query": ex["query"], "source": ex["source"], "duration_s": ex["duration_s"],
                "gt": [list(w) for w in ex["windows"]], "raw": row["raw"], "pred": row["pred"],
                "parsed": row["pred"] is not None, "iou": row["iou"], "best_gt": row["best_gt"]}
        if blank_rows:
            pred.update(blank_raw=blank_rows[i]["raw"], blank_pred=blank_rows[i]["pred"],
                        blank_iou=blank_rows[i]["iou"])
        if prior_rows:
            pred.update(prior_pred=prior_rows[i]["pred"], prior_iou=prior_rows[i]["iou"])
        predictions.append(pred)
    items, why = forgetting.suite_items(cfg)
    if items:
        general_rows = forgetting.ask(model, tokenizer, items, cfg, device, cfg.batch_size)
        general = {**forgetting.summary(general_rows, cfg, forgetting.asked_as(tokenizer)), "answers": general_rows}
    else:
        general = {"skipped": why}
    elapsed = time.perf_counter() - t0
    baseline_rows = {name: r for name, r in (("blank", blank_rows), ("prior", prior_rows)) if r}
    summary = {
        "model": model_metrics,
        "baselines": baselines,
        "visual_gain": gain,
        "best_blind_baseline": best_blind,
        "intervals": metric_intervals(rows, baseline_rows, best_blind, cfg,
                                      (acc["query_loss"], acc["query_tokens"])),
        "forgetting": general,
        "annotation_audit": annotation_audit(cfg, split),
        "harness": card,
        **breakdowns(rows, gts, [ex["source"] for ex in examples], thresholds, cfg.length_edges_s),
        "counts": {"samples": stats.samples, "queries": stats.queries, "scored": len(rows),
                   "skipped": dict(stats.skipped)},
        "timing": {"seconds": elapsed, "model_seconds": t_model, "queries_per_s": len(rows) / max(t_model, 1e-9),
                   "device": device, "batch_size": cfg.batch_size},
    }
    return summary, predictions
