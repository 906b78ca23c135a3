"""`python -m evaluation.benchmark --checkpoint DIR [benchmark.profile=...]`: benchmark numbers a researcher can put
next to a published one.

Windowed evaluation (`evaluation.api`) scores the windows preprocess cut, as training saw them; it selects
checkpoints. Benchmarks score the **whole source video**. This module reads canonical records (`python -m ingest`
writes them from the standard formats: Charades-STA, ActivityNet Captions, QVHighlights, native jsonl), decodes
each video once over its full duration, and scores one answer per query under a **profile**:

- `full_video`: the model family's own sampling policy (`vtg.model.families`: 2 fps within its frame bounds),
  capped by `benchmark.max_frames` and `benchmark.max_video_tokens`, frame indices spread over the whole video as
  the families' processors spread them (`linspace(0, total - 1, n)` rounded), time from the video's start; the
  model's own prompt and `vtg.answer`'s parser.
- `lmms_eval_charades`: lmms-eval 0.7.3's Charades-STA task held as data (evaluation/profiles/): 32 uniform frames,
  its prompt, its answer reading (`evaluation.lmms_parse`, pinned to lmms-eval's own by test) with its rule that an
  answer without a time pair scores 0, and its metric names in percent beside ours. The card names the lmms-eval
  version, so numbers read under two versions are never ranked against each other.

Every result carries its harness card (`evaluation.harness`, protocol `full_video`, the profile named) and 95%
bootstrap intervals; two results under different cards are never ranked against each other (`require_comparable`).
Outputs: `<benchmark.out_dir>/<checkpoint>-<profile>-<records stem>-<key>/` (keyed by the records' and the
checkpoint's content) metrics.json, predictions.jsonl, summary.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evaluation import intervals, lmms_parse
from evaluation.core import resolve_device
from evaluation.harness import FULL_VIDEO, build_card, frame_facts
from vtg import checkpoints
from vtg.answer import parse_answer
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.frames import decode_at, video_facts
from vtg.harness import card_digest
from vtg.io import file_digest, write_json_atomic
from vtg.model.modeling import load_model_and_tokenizer
from vtg.queries import QueryExample
from vtg.records import CanonicalRecord, read_records, write_jsonl
from vtg.selection import checkpoint_label
from vtg.sources import Sources
from vtg.spans import best_iou, metric_name, summarize

log = logging.getLogger(__name__)

PROFILE_DIR = Path(__file__).parent / "profiles"
THRESHOLDS = (0.3, 0.5, 0.7)
"""The standard R@1 thresholds of the grounding benchmarks."""


@dataclass(frozen=True)
class Profile:
    """How one harness samples, prompts, parses and names its metrics."""

    name: str
    frames: str
    """`policy` (the family's) or `uniform` (`num_frames` over the whole video)."""
    num_frames: int = 0
    query_template: str = "{query}"
    max_new_tokens: int = 0
    """0: `benchmark.max_new_tokens`."""
    parser: dict | None = None
    """None: `vtg.answer` (its version and rule go on the card); else an lmms-eval task's reader (`task`)."""
    metric_names: dict | None = None
    scale: float = 1.0
    source: dict | None = None
    lmms_eval_version: str | None = None
    """The lmms-eval release whose task the profile is (None: not an lmms-eval task); the card carries it."""


def load_profile(name: str) -> Profile:
    if name == "full_video":
        return Profile(name="full_video", frames="policy")
    path = PROFILE_DIR / f"{name}.json"
    if not path.is_file():
        known = ["full_video", *sorted(p.stem for p in PROFILE_DIR.glob("*.json"))]
        raise VTGError(f"benchmark.profile={name}: no such profile (known: {', '.join(known)})")
    d = json.loads(path.read_text())
    version = d.get("lmms_eval_version")
    if d["parser"]["task"] not in lmms_parse.TASK_FILES or version != lmms_parse.LMMS_EVAL_VERSION:
        raise VTGError(f"{path}: task {d['parser']['task']} of lmms-eval {version}, but evaluation.lmms_parse reads "
                       f"{sorted(lmms_parse.TASK_FILES)} as lmms-eval {lmms_parse.LMMS_EVAL_VERSION} does")
    return Profile(name=d["name"], frames="uniform", num_frames=int(d["frames"]["count"]),
                   query_template=d["query_template"], max_new_tokens=int(d["decoding"]["max_new_tokens"]),
                   parser=d["parser"], metric_names=d["metric_names"], scale=float(d["scale"]), source=d["source"],
                   lmms_eval_version=version)


def frame_indices(total: int, count: int, profile: Profile) -> np.ndarray:
    """Which decoded frames a profile takes from a video of `total` frames: `count` spread over all of it (the
    families' processors round the linspace, lmms-eval's wrappers floor it); distinct, in order."""
    if total <= 0:
        return np.zeros(0, int)
    count = max(1, min(count, total))
    spread = np.linspace(0, total - 1, count)
    idx = spread.astype(int) if profile.frames == "uniform" else np.round(spread).astype(int)
    return np.unique(idx)


def video_files(records: list[CanonicalRecord], sources: Sources) -> dict[str, str]:
    """Each record's video file (`ingest.sources` find it), before any work: a source that is not declared, or a
    path two roots hold, is a configuration error of the whole command (one line, rc 2), never a video scored 0."""
    return {rec.annotation_id: sources.resolve(rec.video_owner, rec.video_path) for rec in records}


def sample_video(record: CanonicalRecord, path: str, profile: Profile, vision,
                 cfg: PipelineConfig) -> tuple[np.ndarray, list]:
    """(frames, their presentation times in seconds from the video's start, `vtg.clock`) of one whole video under
    `profile` (`path`: its file, `video_files`): the frames chosen by index as the family's processor chooses them,
    each told its own time."""
    from vtg.model.geometry import policy_frames
    total, fps, height, width = video_facts(path)
    if fps <= 0 or total <= 0:
        raise VTGError(f"{path}: the decoder reports {total} frames at {fps} fps")
    if profile.frames == "uniform":
        count = profile.num_frames
    else:
        policy = vision.model_family.sampling
        most = min(policy["max_frames"], cfg.benchmark.max_frames or policy["max_frames"])
        count = policy_frames(total / fps, height, width, vision.geometry, policy["fps"], policy["min_frames"],
                              most, cfg.benchmark.max_video_tokens)
    frames, _, times = decode_at(path, frame_indices(total, count, profile))
    return np.stack(frames), [round(t, 4) for t in times]


def _score(answer: str, windows, profile: Profile) -> tuple[tuple | None, float]:
    pred = lmms_parse.task_span(profile.parser["task"], answer) if profile.parser else parse_answer(answer)
    return pred, best_iou(pred, windows)[0]


def parser_entry(profile: Profile) -> dict:
    """The card's `parser`: the reader's version and rule, and (not compared: the two give the same spans, by
    test) which code read the answers: lmms-eval's own function where installed, else ours."""
    if not profile.parser:
        from vtg.answer import PARSER_RULE, PARSER_VERSION
        return {"version": PARSER_VERSION, "rule": PARSER_RULE}
    _, implementation = lmms_parse.reader(profile.parser["task"])
    return {"version": profile.parser["version"], "rule": profile.parser["rule"], "implementation": implementation}


def profile_entry(profile: Profile, cfg: PipelineConfig) -> dict:
    """The card's `profile`: its name, frames, query template, source and the lmms-eval version it matches."""
    return {"name": profile.name, "frames": profile.frames, "num_frames": profile.num_frames,
            "max_frames": cfg.benchmark.max_frames, "max_video_tokens": cfg.benchmark.max_video_tokens,
            "query_template": profile.query_template, "source": profile.source,
            "lmms_eval_version": profile.lmms_eval_version}


def _card(profile: Profile, model, tokenizer, cfg: PipelineConfig, records_path: str, clips, n: int) -> dict:
    from vtg.model.generation import vision_params
    from vtg.model.processing import query_position, timestamp_mode

    vision = vision_params(model)
    return build_card(
        protocol=FULL_VIDEO, split=Path(records_path).name, split_digest=file_digest(records_path),
        data_version=f"records:{file_digest(records_path)[:12]}", queries=n, vision=vision, tokenizer=tokenizer,
        timestamps=timestamp_mode(tokenizer), frames=frame_facts(clips, vision),
        decoding={"strategy": "greedy", "max_new_tokens": profile.max_new_tokens or cfg.benchmark.max_new_tokens},
        thresholds=THRESHOLDS, query_position=query_position(tokenizer),
        intervals={"method": intervals.METHOD, "resamples": cfg.evaluate.bootstrap_resamples,
                   "confidence": cfg.evaluate.confidence, "seed": intervals.SEED},
        parser=parser_entry(profile), profile=profile_entry(profile, cfg))


def run_benchmark(checkpoint: str | Path, cfg: PipelineConfig) -> dict:
    """Score one checkpoint on `benchmark.records` under `benchmark.profile`; writes and returns the result."""
    bench = cfg.benchmark
    profile = load_profile(bench.profile)
    if not Path(bench.records).is_file():
        raise VTGError(f"{bench.records}: no benchmark records (write them with `python -m ingest "
                       "ingest.annotations=[<annotation file>] ingest.video_root=<videos> "
                       f"ingest.out={bench.records}`)")
    records = read_records(bench.records)  # not records (an annotation file): one line, before any work
    if bench.max_examples:
        records = records[: bench.max_examples]
    if not records:
        raise VTGError(f"{bench.records}: no records to score")
    files = video_files(records, Sources.of(cfg.ingest.sources))
    ckpt = checkpoints.resolve_checkpoint(checkpoint)
    meta = checkpoints.read_checkpoint_meta(ckpt)
    device = resolve_device(bench.device)
    t0 = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(checkpoints.export_dir(ckpt), device=device)
    from vtg.model.generation import greedy_answers, vision_params

    vision = vision_params(model)
    max_new = profile.max_new_tokens or bench.max_new_tokens
    rows, clips, failed = [], [], []
    for start in range(0, len(records), bench.batch_size):
        batch, kept = [], []
        for rec in records[start:start + bench.batch_size]:
            try:
                frames, times = sample_video(rec, files[rec.annotation_id], profile, vision, cfg)
            except VTGError as e:  # a broken video: counted, scored 0 (a benchmark never drops a query)
                failed.append({"annotation_id": rec.annotation_id, "video_id": rec.video_id, "error": str(e)})
                rows.append({"key": rec.annotation_id, "query": rec.query, "video_id": rec.video_id,
                             "gt": [list(w) for w in rec.windows], "raw": None, "pred": None, "iou": 0.0,
                             "error": str(e)})
                continue
            clips.append((len(frames), *frames.shape[1:3], rec.duration_s))
            batch.append(QueryExample(key=rec.annotation_id, query=profile.query_template.format(query=rec.query),
                                      windows=list(rec.windows), duration_s=rec.duration_s,
                                      source=rec.source, frames=frames, timestamps=times))
            kept.append((rec, times))
        if not batch:
            continue
        answers = greedy_answers(model, tokenizer, batch, device, max_new)
        for (rec, times), answer in zip(kept, answers):
            pred, iou = _score(answer, rec.windows, profile)
            rows.append({"key": rec.annotation_id, "query": rec.query, "video_id": rec.video_id,
                         "duration_s": rec.duration_s, "gt": [list(w) for w in rec.windows], "raw": answer,
                         "pred": list(pred) if pred else None, "iou": iou, "frames": len(times),
                         "first_s": times[0], "last_s": times[-1]})
        log.info("benchmark: %d / %d queries", len(rows), len(records))
    ious = [r["iou"] for r in rows]
    metrics = {**summarize(ious, THRESHOLDS), "parse_failure_rate": sum(r["pred"] is None for r in rows) / len(rows)}
    ci = intervals.bootstrap(ious, THRESHOLDS, cfg.evaluate.bootstrap_resamples, cfg.evaluate.confidence)
    card = _card(profile, model, tokenizer, cfg, bench.records, clips, len(rows))
    result = {"checkpoint": checkpoint_label({**meta, "checkpoint": str(ckpt)}), "step": int(meta["step"]),
              "stage": meta.get("stage") or "sft", "split": card["data"]["split"], "profile": profile.name,
              "summary": {"model": metrics, "intervals": {"model": ci}, "harness": card,
                          "counts": {"records": len(records), "scored": len(rows), "video_errors": len(failed)}},
              "harness_digest": card_digest(card), "seconds": time.perf_counter() - t0, "errors": failed,
              "inputs": {"records": str(bench.records), "records_digest": file_digest(bench.records),
                         "checkpoint_dir": str(ckpt),
                         "checkpoint_meta_digest": file_digest(ckpt / checkpoints.META_FILE)}}
    if profile.metric_names:
        result["as_reported"] = {profile.metric_names[m]: round(metrics[m] * profile.scale, 2)
                                 for m in profile.metric_names}
    _write(result, rows, cfg)
    return result


def _out_dir(result: dict, cfg: PipelineConfig) -> Path:
    """`<out_dir>/<checkpoint>-<profile>-<records stem>-<key>`: keyed by what the result was computed from (the
    records file's content, the checkpoint's meta.json, which lists every file's digest, and the profile), so a
    run on other records or another checkpoint at the same step never overwrites this one."""
    inputs = result["inputs"]
    key = hashlib.sha256(f"{inputs['records_digest']}:{inputs['checkpoint_meta_digest']}:{result['profile']}"
                         .encode()).hexdigest()[:8]
    name = f"{result['checkpoint'].replace('/', '-')}-{result['profile']}-{Path(inputs['records']).stem}-{key}"
    return Path(cfg.benchmark.out_dir) / name


def _write(result: dict, rows: list[dict], cfg: PipelineConfig) -> Path:
    out = _out_dir(result, cfg)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "predictions.jsonl", rows)
    (out / "summary.md").write_text(summary_markdown(result))
    write_json_atomic(out / "metrics.json", result)
    result["out_dir"] = str(out)
    return out


def summary_markdown(result: dict) -> str:
    """The benchmark result as markdown: metrics with intervals, lmms-style names where the profile has them, and
    the harness card with the prompt text."""
    from evaluation.report import card_lines

    s = result["summary"]
    ci = s["intervals"]["model"]
    names = ["miou", *(metric_name(t) for t in THRESHOLDS)]
    lines = [f"## Benchmark `{result['profile']}`: {result['checkpoint']} on {s['harness']['data']['split']}", "",
             (f"{s['counts']['scored']} queries ({s['counts']['video_errors']} unreadable videos, scored 0); "
              f"answers without a span: {s['model']['parse_failure_rate']:.1%}"), "",
             "| " + " | ".join(f"{n} [95% CI]" for n in names) + " |", "|" + " --- |" * len(names),
             "| " + " | ".join(intervals.format_ci(s["model"][n], ci.get(n)) for n in names) + " |"]
    if result.get("as_reported"):
        lines += ["", "As the profile's harness reports them: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in result["as_reported"].items())]
    lines += ["", "| harness | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in card_lines(s["harness"]))]
    lines += ["", "Prompt template:", "", "```", s["harness"]["prompt"]["text"].rstrip("\n"), "```",
              "", f"Query template: `{s['harness']['profile']['query_template']}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from vtg.cli_common import config_arg_parser, resolve_config

    parser = config_arg_parser(
        "Benchmark one checkpoint on whole videos (the benchmark protocol): canonical records from a standard "
        "format (`python -m ingest`), frames over each video's full duration, one answer per query, R@1 at IoU "
        "0.3/0.5/0.7 and mIoU with 95% bootstrap intervals and the harness card. benchmark.profile=full_video "
        "(the model family's policy and prompt) or lmms_eval_charades (lmms-eval 0.7.3's Charades-STA settings, "
        "for numbers next to lmms-eval's).")
    parser.add_argument("--checkpoint", required=True,
                        help="checkpoint step dir, pointer file (reports/eval/best.json) or checkpoint root")
    args = parser.parse_args(argv)
    cfg = resolve_config(args)
    result = run_benchmark(args.checkpoint, cfg)
    print(summary_markdown(result), end="")
    print(f"outputs: {result['out_dir']}")
    return 0


if __name__ == "__main__":
    import sys

    from vtg.cli_common import run_cli

    sys.exit(run_cli(main))
