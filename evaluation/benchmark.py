"""`python -m evaluation.benchmark --checkpoint DIR [benchmark.profile=... | --profiles a,b,c]`: benchmark numbers a
researcher can put next to a published one.

Windowed evaluation (`evaluation.api`) scores the windows preprocess cut, as training saw them; it selects
checkpoints. Benchmarks score the **whole source video**. This module reads canonical records (`python -m ingest`
writes them from the standard formats: Charades-STA, ActivityNet Captions, QVHighlights, TimeLens-Bench, native
jsonl), decodes
each video once over its full duration, and scores one answer per query under a **profile**:

- `full_video`: the model family's own sampling policy (`vtg.model.families`: 2 fps within its frame bounds),
  capped by `benchmark.max_frames` and `benchmark.max_video_tokens`, frame indices spread over the whole video as
  the families' processors spread them (`linspace(0, total - 1, n)` rounded), time from the video's start; the
  model's own prompt and `vtg.answer`'s parser.
- `lmms_eval_charades`: lmms-eval 0.7.3's Charades-STA task held as data (evaluation/profiles/): 32 uniform frames,
  its prompt, its answer reading (`evaluation.lmms_parse`, pinned to lmms-eval's own by test) with its rule that an
  answer without a time pair scores 0, and its metric names in percent beside ours. The card names the lmms-eval
  version, so numbers read under two versions are never ranked against each other.
- `lmms_eval_timelens`: lmms-eval 0.7.3's `timelens` task (TimeLens-Bench) the same way: its prompt, 32 uniform
  frames, its reader (the first pair as written), the first ground-truth span, `timelens_IOU@3/5/7`, `timelens_mIOU`.
- `timelens` and `timelens2`: the budgets TimeLens (2 fps, 64-14,336 video tokens of 28x28 px) and TimeLens2 (4 fps
  up to 2,048 frames, 32x32-640x640 px a frame, 128,000 x 32 x 32 px a video) evaluate TimeLens-Bench with: the
  frames their code takes and the size it gives them (`evaluation.budgets`), TimeLens's prompt, lmms-eval's port
  of TimeLens's answer reader. The card carries every number, its source, the size asked for and whether the
  model kept it; each profile lists its caveats (what could not be checked against the peer's own code).

`run_benchmarks` scores several profiles with the model loaded once and writes one table of them
(`evaluation.bench_table`). Every result carries its harness card (`evaluation.harness`, protocol `full_video`, the profile named) and 95%
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
from evaluation.budgets import Budget
from evaluation.core import resolve_device
from evaluation.harness import FULL_VIDEO, build_card, frame_facts, spread
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
    """`policy` (the family's), `uniform` (`num_frames` over the whole video) or `fps` (a peer's budget: `budget`)."""
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
    budget: Budget | None = None
    """`frames: fps`: the peer's frame and pixel rules (`evaluation.budgets`)."""
    spec: dict | None = None
    """`frames: fps`: the profile's `frames` and `pixels` as written (every number and rule), for the card."""
    windows: str = "best"
    """`best`: a query's best-matching ground-truth window scores; `first`: its first (lmms-eval's timelens task)."""
    caveats: tuple[str, ...] = ()
    """What of the peer's protocol the profile does not reproduce or could not check against the peer's own
    code (summary and table, not the card)."""


def load_profile(name: str) -> Profile:
    if name == "full_video":
        return Profile(name="full_video", frames="policy")
    path = PROFILE_DIR / f"{name}.json"
    if not path.is_file():
        known = ["full_video", *sorted(p.stem for p in PROFILE_DIR.glob("*.json"))]
        raise VTGError(f"benchmark.profile={name}: no such profile (known: {', '.join(known)})")
    d = json.loads(path.read_text())
    version = d.get("lmms_eval_version")
    task, reads = d["parser"]["task"], {version, d["parser"].get("lmms_eval_version", version)} - {None}
    if task not in lmms_parse.TASK_FILES or reads != {lmms_parse.LMMS_EVAL_VERSION}:
        raise VTGError(f"{path}: task {task} of lmms-eval {', '.join(sorted(reads)) or '(none)'}, but "
                       f"evaluation.lmms_parse reads {sorted(lmms_parse.TASK_FILES)} as lmms-eval "
                       f"{lmms_parse.LMMS_EVAL_VERSION} does")
    frames, budget, spec = d["frames"], None, None
    mode = frames.get("mode", "uniform")
    if mode == "fps":
        budget, spec = Budget.of(frames, d["pixels"]), {"frames": frames, "pixels": d["pixels"]}
    elif mode != "uniform":
        raise VTGError(f"{path}: frames.mode must be uniform or fps, got {mode!r}")
    return Profile(name=d["name"], frames=mode, num_frames=int(frames.get("count", 0)),
                   query_template=d["query_template"], max_new_tokens=int(d["decoding"]["max_new_tokens"]),
                   parser=d["parser"], metric_names=d["metric_names"], scale=float(d["scale"]), source=d["source"],
                   lmms_eval_version=version, budget=budget, spec=spec, windows=d.get("windows", "best"),
                   caveats=tuple(d.get("caveats", ())))


def frame_indices(total: int, count: int, profile: Profile) -> np.ndarray:
    """Which decoded frames a profile takes from a video of `total` frames: `count` spread over all of it (the
    families' processors round the linspace, lmms-eval's wrappers floor it); distinct, in order."""
    if total <= 0:
        return np.zeros(0, int)
    count = max(1, min(count, total))
    points = np.linspace(0, total - 1, count)
    idx = points.astype(int) if profile.frames == "uniform" else np.round(points).astype(int)
    return np.unique(idx)


def video_files(records: list[CanonicalRecord], sources: Sources) -> dict[str, str]:
    """Each record's video file (`ingest.sources` find it), before any work: a source that is not declared, or a
    path two roots hold, is a configuration error of the whole command (one line, rc 2), never a video scored 0."""
    return {rec.annotation_id: sources.resolve(rec.video_owner, rec.video_path) for rec in records}


def _resize(frames: list[np.ndarray], height: int, width: int) -> np.ndarray:
    from PIL import Image

    return np.stack([f if f.shape[:2] == (height, width) else
                     np.asarray(Image.fromarray(f).resize((width, height), resample=Image.BICUBIC)) for f in frames])


def _budget_frames(path: str, total: int, fps: float, budget: Budget, factor: int) -> tuple[np.ndarray, list]:
    """The frames a peer's budget takes (indices may repeat: each decoded once), resized to the budget's size."""
    wanted = budget.indices_for(total, fps)
    decoded, got, times = decode_at(path, np.unique(wanted))
    at = {i: k for k, i in enumerate(got)}
    keep = [at[i] for i in wanted if i in at]  # a container that reports more frames than it holds: those it has
    frames = [decoded[k] for k in keep]
    height, width = budget.frame_size(len(frames), *frames[0].shape[:2], factor)
    return _resize(frames, height, width), [times[k] for k in keep]


def sample_video(record: CanonicalRecord, path: str, profile: Profile, vision,
                 cfg: PipelineConfig) -> tuple[np.ndarray, list]:
    """(frames, their presentation times in seconds from the video's start, `vtg.clock`) of one whole video under
    `profile` (`path`: its file, `video_files`): the frames chosen by index as the family's processor (or the
    profile's peer) chooses them, each told its own time; under a peer's budget, resized to the budget's size."""
    from vtg.model.geometry import policy_frames
    total, fps, height, width = video_facts(path)
    if fps <= 0 or total <= 0:
        raise VTGError(f"{path}: the decoder reports {total} frames at {fps} fps")
    if profile.budget is not None:
        try:
            frames, times = _budget_frames(path, total, fps, profile.budget, vision.patch_size * vision.merge_size)
        except ValueError as e:  # a video too short for the peer's rule (qwen-vl-utils refuses it too)
            raise VTGError(f"{path}: {e}") from None
        return frames, [round(t, 4) for t in times]
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
    return pred, best_iou(pred, windows[:1] if profile.windows == "first" else windows)[0]


def parser_entry(profile: Profile) -> dict:
    """The card's `parser`: the reader's version and rule, and (not compared: the two give the same spans, by
    test) which code read the answers: lmms-eval's own function where installed, else ours."""
    if not profile.parser:
        from vtg.answer import PARSER_RULE, PARSER_VERSION
        return {"version": PARSER_VERSION, "rule": PARSER_RULE}
    _, implementation = lmms_parse.reader(profile.parser["task"])
    return {"version": profile.parser["version"], "rule": profile.parser["rule"], "implementation": implementation}


def profile_entry(profile: Profile, cfg: PipelineConfig) -> dict:
    """The card's `profile`: its name, frames, query template, source and the lmms-eval version it matches; under
    a peer's budget every number and rule of it (`budget`), and which window scores where that is not the best."""
    entry = {"name": profile.name, "frames": profile.frames, "num_frames": profile.num_frames,
             "max_frames": cfg.benchmark.max_frames, "max_video_tokens": cfg.benchmark.max_video_tokens,
             "query_template": profile.query_template, "source": profile.source,
             "lmms_eval_version": profile.lmms_eval_version}
    if profile.spec is not None:
        entry["budget"] = profile.spec
    if profile.windows != "best":
        entry["windows"] = profile.windows
    return entry


def budget_used(profile: Profile, vision, clips) -> dict:
    """The card's `profile.used` under a peer's budget: the factor its sizes were computed with (the model's patch
    x merge), the sizes asked for, and whether the model kept them: a model whose own bounds shrink the frames
    further saw less than the peer's budget, and its number must not pass for one measured under it."""
    from vtg.model.geometry import resized_size

    asked = [h * w for _, h, w, _ in clips]
    kept = all(resized_size(n, h, w, vision.geometry) == (h, w) for n, h, w, _ in clips)
    return {"factor": vision.patch_size * vision.merge_size, "requested_pixels_per_frame": spread(asked, 0),
            "kept_by_model": kept}


def budget_words(profile: Profile, vision, cfg: PipelineConfig, used: dict | None = None) -> str:
    """The budget a result was measured under, in words (the table's `budget` column)."""
    if profile.budget is not None:
        words = profile.budget.words(vision.patch_size * vision.merge_size)
        if used:
            words += ("; kept by the model" if used["kept_by_model"] else
                      "; FRAMES SHRUNK BY THE MODEL'S OWN BOUNDS: not the peer's budget")
        return words
    if profile.frames == "uniform":
        return f"{profile.num_frames} uniform frames over the whole video (linspace, floored); the model's pixel bounds"
    policy = vision.model_family.sampling
    caps = [f"at most {cfg.benchmark.max_frames} frames" if cfg.benchmark.max_frames else "",
            f"at most {cfg.benchmark.max_video_tokens:,} video tokens" if cfg.benchmark.max_video_tokens else ""]
    rate = f"{policy['fps']:g} fps within {policy['min_frames']}-{policy['max_frames']} frames ({vision.family}'s policy)"
    return ", ".join([rate, *filter(None, caps)]) + "; the model's pixel bounds"


def _card(profile: Profile, model, tokenizer, cfg: PipelineConfig, records_path: str, clips, n: int) -> dict:
    from vtg.model.generation import vision_params
    from vtg.model.processing import query_position, timestamp_mode

    vision = vision_params(model)
    entry = profile_entry(profile, cfg)
    if profile.budget is not None:
        entry["used"] = budget_used(profile, vision, clips)
    card = build_card(
        protocol=FULL_VIDEO, split=Path(records_path).name, split_digest=file_digest(records_path),
        data_version=f"records:{file_digest(records_path)[:12]}", queries=n, vision=vision, tokenizer=tokenizer,
        timestamps=timestamp_mode(tokenizer), frames=frame_facts(clips, vision),
        decoding={"strategy": "greedy", "max_new_tokens": profile.max_new_tokens or cfg.benchmark.max_new_tokens},
        thresholds=THRESHOLDS, query_position=query_position(tokenizer),
        intervals={"method": intervals.METHOD, "resamples": cfg.evaluate.bootstrap_resamples,
                   "confidence": cfg.evaluate.confidence, "seed": intervals.SEED},
        parser=parser_entry(profile), profile=entry)
    if profile.windows == "first":
        card["scoring"]["several_windows"] = "the first window (the task scores span[0])"
    return card


def _records(cfg: PipelineConfig) -> list[CanonicalRecord]:
    bench = cfg.benchmark
    if not Path(bench.records).is_file():
        raise VTGError(f"{bench.records}: no benchmark records (write them with `python -m ingest "
                       "ingest.annotations=[<annotation file>] ingest.video_root=<videos> "
                       f"ingest.out={bench.records}`)")
    records = read_records(bench.records)  # not records (an annotation file): one line, before any work
    if bench.max_examples:
        records = records[: bench.max_examples]
    if not records:
        raise VTGError(f"{bench.records}: no records to score")
    return records


def run_benchmark(checkpoint: str | Path, cfg: PipelineConfig) -> dict:
    """Score one checkpoint on `benchmark.records` under `benchmark.profile`; writes and returns the result."""
    return run_benchmarks(checkpoint, cfg, [cfg.benchmark.profile], table=False)[0]


def run_benchmarks(checkpoint: str | Path, cfg: PipelineConfig, profiles: list[str], table: bool = True) -> list[dict]:
    """Score one checkpoint on `benchmark.records` under each of `profiles` (the model loaded once): each
    profile's result written as `run_benchmark` writes it, and with `table`, one table of them all beside
    (`evaluation.bench_table`). Every profile is loaded, and every video found, before any work."""
    if len(set(profiles)) != len(profiles) or not profiles:
        raise VTGError(f"--profiles {','.join(profiles)}: name each profile once")
    loaded = [load_profile(p) for p in profiles]
    records = _records(cfg)
    files = video_files(records, Sources.of(cfg.ingest.sources))
    ckpt = checkpoints.resolve_checkpoint(checkpoint)
    meta = checkpoints.read_checkpoint_meta(ckpt)
    device = resolve_device(cfg.benchmark.device)
    model, tokenizer = load_model_and_tokenizer(checkpoints.export_dir(ckpt), device=device)
    results = [_run_profile(profile, model, tokenizer, device, records, files, ckpt, meta, cfg)
               for profile in loaded]
    if table:
        from evaluation.bench_table import write_table
        write_table(results, cfg)
    return results


def _run_profile(profile: Profile, model, tokenizer, device, records: list[CanonicalRecord], files: dict,
                 ckpt: Path, meta: dict, cfg: PipelineConfig) -> dict:
    from vtg.model.generation import greedy_answers, vision_params

    bench = cfg.benchmark
    t0 = time.perf_counter()
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
        log.info("benchmark %s: %d / %d queries", profile.name, len(rows), len(records))
    ious = [r["iou"] for r in rows]
    metrics = {**summarize(ious, THRESHOLDS), "parse_failure_rate": sum(r["pred"] is None for r in rows) / len(rows)}
    ci = intervals.bootstrap(ious, THRESHOLDS, cfg.evaluate.bootstrap_resamples, cfg.evaluate.confidence)
    card = _card(profile, model, tokenizer, cfg, bench.records, clips, len(rows))
    result = {"checkpoint": checkpoint_label({**meta, "checkpoint": str(ckpt)}), "step": int(meta["step"]),
              "stage": meta.get("stage") or "sft", "split": card["data"]["split"], "profile": profile.name,
              "budget": budget_words(profile, vision, cfg, card["profile"].get("used")),
              "caveats": list(profile.caveats),
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
    if result.get("budget"):
        lines += ["", f"Budget: {result['budget']}"]
    if result.get("caveats"):
        lines += ["", "Caveats (what the profile does not reproduce, or could not check against the peer's code):",
                  "", *(f"- {c}" for c in result["caveats"])]
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
        "(the model family's policy and prompt), lmms_eval_charades / lmms_eval_timelens (lmms-eval 0.7.3's "
        "tasks), timelens (TimeLens's 2 fps, 14,336-token budget) or timelens2 (TimeLens2's 4 fps budget); "
        "--profiles a,b,c scores several with the model loaded once and writes one table of them.")
    parser.add_argument("--checkpoint", required=True,
                        help="checkpoint step dir, pointer file (reports/eval/best.json) or checkpoint root")
    parser.add_argument("--profiles", default=None,
                        help="comma-separated profiles to score in one call (else benchmark.profile alone)")
    args = parser.parse_args(argv)
    cfg = resolve_config(args)
    if args.profiles is None:
        result = run_benchmark(args.checkpoint, cfg)
        print(summary_markdown(result), end="")
        print(f"outputs: {result['out_dir']}")
        return 0
    from evaluation.bench_table import table_markdown

    results = run_benchmarks(args.checkpoint, cfg, [p.strip() for p in args.profiles.split(",") if p.strip()])
    print(table_markdown(results), end="")
    print(f"table: {results[0]['table_dir']}")
    print("outputs: " + ", ".join(r["out_dir"] for r in results))
    return 0


if __name__ == "__main__":
    import sys

    from vtg.cli_common import run_cli

    sys.exit(run_cli(main))
