"""The annotate stage: ingest's records in, the records preprocess reads out (docs/stages.md#annotate).

Off (`annotate.enabled: false`, the embedded default) it copies the records byte for byte. On:
1. **Which videos.** `annotate.videos` (files or folders of videos without annotations, each under a declared
   source's root) and, for a measurement on labelled data, the train-split videos whose annotations
   `annotate.hide_fraction` withholds (written to `annotate.withheld`, never to preprocess).
2. **Who.** The proposer and the verifier (`taught`: a tiny base taught dense captioning and grounding on the
   labelled train-split records, `annotate.model`; or checkpoints).
3. **Propose.** Each video, whole, at `num_frames` frames: a greedy captioning gives the proposals, `samples`
   sampled captionings their confidence (the share that propose the same query with a window of IoU >=
   `verify_iou`).
4. **Verify.** The verifier grounds each proposed query; a proposal is accepted when that window's IoU with the
   proposal is at least `verify_iou` and its confidence at least `min_confidence`.
5. **Records.** Each accepted proposal becomes a record of source `auto:<annotator weights digest>`, with the video's
   own source as `video_source` (its path and licence), its confidence and the verifier's verdict. Preprocess
   keeps auto records out of val and test (`auto_label_not_train`); SFT mixes them by `train.data.auto_share`.
Every proposal is listed in `annotate.proposals` with its verdict; counts reconcile in `annotate.summary`
(records in = passed + withheld; proposals = accepted + rejected), with the precision of the accepted labels
against the withheld truth when there is one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from annotate import model as annotator
from annotate.captions import normalize, parse_captions
from vtg.answer import parse_answer
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.records import CanonicalRecord, read_records, write_jsonl
from vtg.sources import AmbiguousName, Sources, UndeclaredFile, auto_source, refuse_ambiguous
from vtg.spans import temporal_iou
from vtg.splits import split_of, stable_fraction

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".webm", ".mov")
TAUGHT = "taught"
ACCEPTED = "accepted"


@dataclass
class Target:
    """A video to annotate: where its file is and whose it is."""

    video_id: str
    video_path: str
    """Relative to a root of `video_source`."""
    video_source: str
    licence: str
    duration_s: float
    withheld: bool


def hidden(video_id: str, cfg: PipelineConfig) -> bool:
    """Whether `annotate.hide_fraction` withholds this video's annotations (train-split videos only, by the split
    preprocess gives a video that is its own partition key, and a stable hash)."""
    a = cfg.annotate
    return (a.hide_fraction > 0 and split_of(video_id, cfg.preprocess.split_fractions) == "train"
            and stable_fraction(f"annotate:hide:{video_id}") < a.hide_fraction)


def _video_files(paths: list[str]) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.suffix.lower() in VIDEO_SUFFIXES and f.is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise VTGError(f"annotate.videos: {p} does not exist")
    return out


def _targets(cfg: PipelineConfig, by_video: dict[str, list[CanonicalRecord]], sources: Sources,
             skipped: list[dict]) -> list[Target]:
    from vtg.frames import declared_duration_s, video_facts

    targets = []
    for vid, recs in by_video.items():
        if hidden(vid, cfg):
            r = recs[0]
            targets.append(Target(vid, r.video_path, r.video_owner, r.licence,
                                  statistics.median_low([x.duration_s for x in recs]), True))
    files = _video_files(cfg.annotate.videos)
    stems: dict[str, list[Path]] = {}
    for f in files:
        stems.setdefault(f.stem, []).append(f)
    for stem, same in stems.items():  # a video's id is its file's stem: one id, one file
        refuse_ambiguous(stem, same, "annotate.videos: the video id", "rename one of them (the id is the file name "
                         "without its extension)")
    for f in files:
        vid = f.stem
        if vid in by_video:
            skipped.append({"video_id": vid, "verdict": "has_records", "detail": f"{len(by_video[vid])} records"})
            continue
        try:
            decl, rel = sources.owner_of(f)
        except UndeclaredFile as e:
            raise VTGError(f"annotate.videos: {e}") from None
        frames, fps, _, _ = video_facts(str(f))
        targets.append(Target(vid, rel, decl.id, decl.licence, round(declared_duration_s(frames, fps, str(f)), 3),
                              False))
    return sorted(targets, key=lambda t: t.video_id)


def _clip(t: Target, sources: Sources, cfg: PipelineConfig) -> annotator.Clip:
    from vtg.frames import clip_frames

    frames, times = clip_frames(sources.resolve(t.video_source, t.video_path), 0.0, None, cfg.annotate.num_frames,
                                cfg.annotate.frame_size)
    return annotator.Clip(t.video_id, frames, times, t.duration_s)


def _progress(items, desc: str, on: bool, unit: str = "video"):
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit=unit, disable=not on, mininterval=1.0)


def _batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _pass_through(cfg: PipelineConfig, records: list[CanonicalRecord], t0: float) -> dict:
    a = cfg.annotate
    if a.videos or a.hide_fraction:
        log.warning("annotate.enabled is false: annotate.videos and annotate.hide_fraction are ignored")
    shutil.copyfile(a.records, a.out)
    for path in (a.proposals, a.withheld):
        Path(path).write_text("")
    return {"enabled": False, "records_in": len(records), "passed": len(records), "withheld": 0,
            "auto_records": 0, "records_out": len(records), "proposals": 0, "accepted": 0, "rejected": 0,
            "seconds": round(time.perf_counter() - t0, 2)}


def run(cfg: PipelineConfig, progress: bool = True) -> dict:
    """Run the stage; writes `annotate.out`, `.proposals`, `.withheld` and `.summary`; returns the summary."""
    a, t0 = cfg.annotate, time.perf_counter()
    if not Path(a.records).is_file():
        raise VTGError(f"annotate.records: {a.records} does not exist: run ingest first (`python -m ingest`)")
    records = read_records(a.records)
    for path in (a.out, a.proposals, a.withheld, a.summary):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    summary = _pass_through(cfg, records, t0) if not a.enabled else _annotate(cfg, records, t0, progress)
    if summary["records_in"] != summary["passed"] + summary["withheld"] or \
            summary["proposals"] != summary["accepted"] + summary["rejected"] or \
            summary["records_out"] != summary["passed"] + summary["auto_records"]:
        raise VTGError(f"annotate: counts do not reconcile: {summary}")  # a bug, never silent
    tmp = Path(f"{a.summary}.tmp")
    tmp.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, a.summary)
    return summary


def _annotate(cfg: PipelineConfig, records: list[CanonicalRecord], t0: float, progress: bool) -> dict:
    a = cfg.annotate
    sources = Sources.of(cfg.ingest.sources)
    by_video: dict[str, list[CanonicalRecord]] = defaultdict(list)
    for r in records:
        by_video[r.video_id].append(r)
    rows: list[dict] = []  # the proposals file: every proposal, and every video that got none, with its verdict
    targets = _targets(cfg, by_video, sources, rows)
    withheld_ids = {t.video_id for t in targets if t.withheld}
    withheld = [r for r in records if r.video_id in withheld_ids]
    passed = [r for r in records if r.video_id not in withheld_ids]
    write_jsonl(a.withheld, withheld)

    clips: dict[str, annotator.Clip] = {}
    for t in _progress(targets, "annotate: decode", progress):
        if t.duration_s > a.max_duration_s:
            rows.append({"video_id": t.video_id, "verdict": "too_long",
                         "detail": f"{t.duration_s} s > annotate.max_duration_s {a.max_duration_s}"})
            continue
        try:
            clips[t.video_id] = _clip(t, sources, cfg)
        except AmbiguousName:
            raise  # which file is meant is the user's to say: one line, before anything is written
        except (VTGError, OSError, ValueError) as e:
            rows.append({"video_id": t.video_id, "verdict": "unreadable_video", "detail": str(e).splitlines()[0]})

    proposer_path, verifier_path, teach_report = _models(cfg, by_video, withheld_ids, sources, progress)
    digest = annotator.weights_digest(proposer_path)
    source_id = auto_source(digest)
    from vtg.model.modeling import resolve_device

    device = resolve_device(a.device, "annotate.device")
    model, tok = annotator.load(proposer_path, device)
    order = [t for t in targets if t.video_id in clips]
    proposals: list[tuple[Target, str, tuple[float, float], float]] = []
    for i, batch in enumerate(_progress(_batches(order, a.batch_size), "annotate: propose", progress, "batch")):
        bclips = [clips[t.video_id] for t in batch]
        greedy, sampled = annotator.captionings(model, tok, bclips, samples=a.samples, temperature=a.temperature,
                                                max_new_tokens=a.max_new_tokens, seed=a.teach.seed * 100_003 + i)
        for t, text, samples in zip(batch, greedy, sampled, strict=True):
            found = parse_captions(text, t.duration_s)
            if not found:
                rows.append({"video_id": t.video_id, "verdict": "no_proposal", "detail": text[:200]})
            others = [parse_captions(s, t.duration_s) for s in samples]
            for query, window in found:
                agree = sum(any(normalize(q) == normalize(query) and temporal_iou(w, window) >= a.verify_iou
                                for q, w in o) for o in others)
                proposals.append((t, query, window, round(agree / len(others), 4) if others else 1.0))
    if verifier_path != proposer_path:
        model, tok = annotator.load(verifier_path, device)
    auto: list[CanonicalRecord] = []
    counters: Counter = Counter()  # verdicts
    per_video: Counter = Counter()  # proposals verified so far per video: each auto record's index
    for batch in _progress(_batches(proposals, a.batch_size), "annotate: verify", progress, "batch"):
        answers = annotator.ground(model, tok, [clips[t.video_id] for t, *_ in batch], [q for _, q, *_ in batch])
        for (t, query, window, conf), answer in zip(batch, answers, strict=True):
            span = parse_answer(answer)
            iou = round(temporal_iou(span, window), 4) if span else 0.0
            verdict = {"verifier": _name(verifier_path), "window": list(span) if span else None, "iou": iou}
            reason = ("verifier_disagrees" if iou < a.verify_iou else
                      "low_confidence" if conf < a.min_confidence else ACCEPTED)
            counters[reason] += 1
            k = per_video[t.video_id]
            per_video[t.video_id] += 1
            row = {"video_id": t.video_id, "query": query, "window": list(window), "confidence": conf,
                   "verdict": reason, "verifier": verdict, "withheld_video": t.withheld}
            if reason == ACCEPTED:
                rec = CanonicalRecord(
                    video_id=t.video_id, video_path=t.video_path, duration_s=t.duration_s, query=query,
                    windows=[window], source=source_id, annotation_id=f"{source_id}:{t.video_id}:{k}",
                    licence=t.licence, annotation_file=f"{source_id}:{Path(a.proposals).name}",
                    video_source=t.video_source, confidence=conf, verdict={**verdict, "accepted": True})
                auto.append(rec)
                row["annotation_id"] = rec.annotation_id
            rows.append(row)
    write_jsonl(a.proposals, rows)
    write_jsonl(a.out, [*passed, *auto])
    accepted = counters[ACCEPTED]
    summary = {
        "enabled": True, "records_in": len(records), "passed": len(passed), "withheld": len(withheld),
        "withheld_videos": len(withheld_ids), "videos_to_annotate": len(targets), "videos_decoded": len(clips),
        "videos_without_proposal": sum(r["verdict"] in ("no_proposal", "too_long", "unreadable_video",
                                                        "has_records") for r in rows),
        "proposals": len(proposals), "accepted": accepted, "rejected": len(proposals) - accepted,
        "rejected_by_reason": {k: v for k, v in sorted(counters.items()) if k != ACCEPTED},
        "videos_by_verdict": dict(sorted(Counter(r["verdict"] for r in rows if "query" not in r).items())),
        "auto_records": len(auto), "records_out": len(passed) + len(auto),
        "annotator": {"source": source_id, "proposer": _name(proposer_path), "verifier": _name(verifier_path),
                      "teach": teach_report, "samples": a.samples, "verify_iou": a.verify_iou,
                      "min_confidence": a.min_confidence},
        "precision": precision(auto, withheld),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return summary


def _name(path: str | Path) -> str:
    """A model as the summary and the records name it: a cached taught annotator by its folder name, a checkpoint in
    the project by its path from there (no machine path reaches a record or MLflow), any other as configured."""
    p = Path(path)
    if ".cache" in p.parts:
        return p.name
    if p.is_absolute() and p.resolve().is_relative_to(Path.cwd().resolve()):
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    return str(path)


def _models(cfg: PipelineConfig, by_video: dict, withheld: set[str], sources: Sources,
            progress: bool) -> tuple[str, str, dict | None]:
    """(proposer, verifier, teaching report): `taught` teaches the base on the labelled train-split videos (at most
    `max_duration_s`), the ones neither withheld nor annotated here."""
    a = cfg.annotate
    if TAUGHT not in (a.proposer, a.verifier):
        return a.proposer, a.verifier, None
    labelled = sorted(v for v in by_video if v not in withheld
                      and split_of(v, cfg.preprocess.split_fractions) == "train")
    clips, events = [], {}
    for vid in _progress(labelled, "annotate: decode labelled", progress):
        recs = by_video[vid]
        t = Target(vid, recs[0].video_path, recs[0].video_owner, recs[0].licence,
                   statistics.median_low([r.duration_s for r in recs]), False)
        if t.duration_s > a.max_duration_s:
            continue
        try:
            clips.append(_clip(t, sources, cfg))
        except (VTGError, OSError, ValueError):
            continue  # preprocess dead-letters it; the annotator just does not learn from it
        events[vid] = [(r.query, tuple(r.windows[0])) for r in sorted(recs, key=lambda r: r.annotation_id)]
    s = a.teach
    from vtg.model.modeling import resolve_base
    from vtg.model.teach import teach_if_tiny

    base = teach_if_tiny(cfg, a.base, resolve_base(a.base))  # a tiny base knows colours first, as SFT's does
    taught = str(annotator.taught_annotator(base, clips, events, steps=s.steps, lr=s.lr, batch_size=s.batch_size,
                                            seed=s.seed))
    report_path = Path(taught) / "annotator_report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    return (taught if a.proposer == TAUGHT else a.proposer), (taught if a.verifier == TAUGHT else a.verifier), report


def precision(auto: list[CanonicalRecord], withheld: list[CanonicalRecord]) -> dict | None:
    """The accepted auto labels scored against the withheld truth of their videos: `window` the share whose window
    has IoU >= 0.5 with some true window of the video; `text` the share whose query is one of the video's true
    queries (case and space folded); `both` the share with the true query's own window at IoU >= 0.5; `recall` the
    share of withheld records that got an accepted label at IoU >= 0.5. None without withheld truth."""
    if not withheld:
        return None
    truth: dict[str, list[CanonicalRecord]] = defaultdict(list)
    for r in withheld:
        truth[r.video_id].append(r)
    scored = [r for r in auto if r.video_id in truth]
    win = txt = both = 0
    for r in scored:
        w = r.windows[0]
        win += any(temporal_iou(w, tw) >= 0.5 for t in truth[r.video_id] for tw in t.windows)
        same = [t for t in truth[r.video_id] if normalize(t.query) == normalize(r.query)]
        txt += bool(same)
        both += any(temporal_iou(w, tw) >= 0.5 for t in same for tw in t.windows)
    found = sum(any(temporal_iou(r.windows[0], tw) >= 0.5 for r in auto if r.video_id == t.video_id
                    for tw in t.windows) for t in withheld)
    n = len(scored)
    return {"scored": n, "window_iou_0.5": round(win / n, 4) if n else None,
            "query_exact": round(txt / n, 4) if n else None, "query_and_window": round(both / n, 4) if n else None,
            "withheld_records": len(withheld), "recall_iou_0.5": round(found / len(withheld), 4)}
