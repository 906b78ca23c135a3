"""Forgetting (seed 000): the base model and each checkpoint answer the same general-task suite
(`vtg.general_tasks`); retention per task = checkpoint accuracy / base accuracy.

`ask` scores one loaded model on the suite (greedy answers, exact match), `task_scores` turns the rows into
per-task accuracy with a 95% bootstrap interval, and `retention` puts a checkpoint's scores over its base's, with a
warning for every task below `evaluate.forgetting.warn_below`. Overall, `min_retention` (the task kept worst: what
selection's floor and the grounding-retention plane use) and `mean_retention` (the tasks weighted alike). The base's scores are computed once per (base
export, suite, settings) and kept in the evaluation store (`base_scores`), so each checkpoint costs one pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from pathlib import Path

from evaluation import intervals
from vtg.config import EvaluateConfig
from vtg.errors import VTGError
from vtg.general_tasks import GeneralItem, is_correct, prompt_text, read_suite, suite_frames
from vtg.io import file_digest, write_json_atomic
from vtg.queries import QueryExample

log = logging.getLogger(__name__)


def suite_items(cfg: EvaluateConfig) -> tuple[list[GeneralItem] | None, str | None]:
    """(items, None) or (None, why there is no forgetting measurement)."""
    f = cfg.forgetting
    if not f.suite:
        return None, "evaluate.forgetting.suite is empty"
    if not Path(f.suite).is_file():
        return None, f"no general-task suite at {f.suite}"
    items = read_suite(f.suite)
    if f.max_items:  # the first N of each task, so that a shortened suite still asks every task
        kept, seen = [], defaultdict(int)
        for item in items:
            seen[item.task] += 1
            if seen[item.task] <= f.max_items:
                kept.append(item)
        items = kept
    return items, None


def ask(model, tokenizer, items: list[GeneralItem], cfg: EvaluateConfig, device, batch_size: int) -> list[dict]:
    """One row per item: {id, task, answer, generated, correct}."""
    from vtg.model.generation import greedy_answers

    f = cfg.forgetting
    clips = suite_frames(items, f.num_frames, f.frame_size)  # aligned with items
    rows = []
    for start in range(0, len(items), batch_size):
        batch = []
        for item, (frames, times) in zip(items[start:start + batch_size], clips[start:start + batch_size]):
            batch.append(QueryExample(key=item.id, query=prompt_text(item), windows=[(0.0, 1.0)],
                                      duration_s=max(times[-1], 1.0), source="general", frames=frames,
                                      timestamps=times))
        answers = greedy_answers(model, tokenizer, batch, device, f.max_new_tokens)
        for item, answer in zip(items[start:start + batch_size], answers):
            rows.append({"id": item.id, "task": item.task, "answer": item.answer, "generated": answer,
                         "correct": is_correct(answer, item)})
    return rows


def task_scores(rows: list[dict], cfg: EvaluateConfig) -> dict[str, dict]:
    """{task: {n, accuracy, ci}} (ci: 95% bootstrap interval of the accuracy)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_task[r["task"]].append(float(r["correct"]))
    out = {}
    for task in sorted(by_task):
        scores = by_task[task]
        # a 0/1 score per item: the bootstrap of its mean (`miou` of `intervals`) is the accuracy's interval
        ci = intervals.bootstrap(scores, (), cfg.bootstrap_resamples, cfg.confidence).get("miou")
        out[task] = {"n": len(scores), "accuracy": sum(scores) / len(scores), "ci": ci}
    return out


def retention(checkpoint: dict[str, dict], base: dict[str, dict] | None, warn_below: float) -> dict:
    """Per task: the checkpoint's and the base's accuracy, retention = checkpoint / base (None when the base
    scores 0), and the warnings."""
    tasks, warnings = {}, []
    for task, s in checkpoint.items():
        b = (base or {}).get(task)
        ratio = s["accuracy"] / b["accuracy"] if b and b["accuracy"] > 0 else None
        tasks[task] = {**s, "base_accuracy": b["accuracy"] if b else None, "retention": ratio}
        if ratio is not None and ratio < warn_below:
            warnings.append(f"general task `{task}`: retention {ratio:.2f} (accuracy {s['accuracy']:.3f} vs the "
                            f"base's {b['accuracy']:.3f}) is below {warn_below:g}: grounding training is erasing it")
    ratios = [t["retention"] for t in tasks.values() if t["retention"] is not None]
    return {"tasks": tasks, "min_retention": min(ratios) if ratios else None,
            "mean_retention": sum(ratios) / len(ratios) if ratios else None, "warnings": warnings}


def base_identity(base_path: str | Path) -> list:
    """A cheap identity of a base export for the base-score cache: every file's relative path, size and
    modification time (hashing a multi-GB base's weights on every evaluation would cost more than asking it)."""
    root = Path(base_path)
    return [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(root.rglob("*")) if p.is_file()]


def base_scores(base_path: str | None, cfg: EvaluateConfig, items: list[GeneralItem], device: str,
                store_dir: str | Path, asked: dict | None = None) -> tuple[dict | None, str | None]:
    """(the base export's task scores, None) from the store or computed once; (None, why) without a base.
    `asked` (`asked_as` of the checkpoint): the base gets the questions encoded the same way."""
    from vtg.model.modeling import load_model_and_tokenizer
    from vtg.model.processing import QUERY_POSITION_KEY, TIMESTAMPS_KEY

    if not base_path or not Path(base_path).is_dir():
        return None, f"the checkpoint's base ({base_path}) is not a local export: no base to compare with"
    f = cfg.forgetting
    key = json.dumps([base_identity(base_path), file_digest(f.suite), f.model_dump(mode="json"),
                      cfg.bootstrap_resamples, cfg.confidence, asked], sort_keys=True)
    path = Path(store_dir) / "general" / f"base-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.is_file():
        return json.loads(path.read_text())["scores"], None
    try:
        model, tokenizer = load_model_and_tokenizer(base_path, device=device)
    except VTGError as e:
        return None, f"the base export cannot be loaded: {e}"
    if asked:
        tokenizer.init_kwargs[QUERY_POSITION_KEY] = asked["query_position"]
        tokenizer.init_kwargs[TIMESTAMPS_KEY] = asked["timestamps"]
    rows = ask(model, tokenizer, items, cfg, device, cfg.batch_size)
    scores = task_scores(rows, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"base": str(base_path), "suite": f.suite, "asked": asked, "scores": scores})
    return scores, None


def asked_as(tokenizer) -> dict:
    """How a model's tokenizer encodes a question (the query's place, the frame times): recorded with its scores,
    and the base is asked the same way (`base_scores`), so that retention compares answers to the same prompts."""
    from vtg.model.processing import query_position, timestamp_mode

    return {"query_position": query_position(tokenizer), "timestamps": timestamp_mode(tokenizer)}


def summary(rows: list[dict], cfg: EvaluateConfig, asked: dict | None = None) -> dict:
    """What `evaluate_export` stores: the suite, its digest, the per-task scores and how they were asked
    (retention is added by the caller, which knows the base)."""
    return {"suite": cfg.forgetting.suite, "suite_sha256": file_digest(cfg.forgetting.suite),
            "scores": task_scores(rows, cfg), **({"asked": asked} if asked else {})}
