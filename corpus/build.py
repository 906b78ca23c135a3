"""Build the corpus: plan -> render videos (worker processes) -> annotations -> ground truth, atomically."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from corpus.annotations import EXTENSIONS, WRITERS, invalid_items, order_items, valid_items
from corpus.general import write_general_suites
from corpus.plan import corpus_counts, plan_corpus
from corpus.render import render_video
from vtg.config import CorpusConfig
from vtg.errors import VTGError

GENERATOR_VERSION = 3
GROUND_TRUTH = "ground_truth.json"
UNREADABLE = {"truncated", "zero_byte", "not_video"}
NOT_CONTENT = {"out_dir", "workers"}  # knobs that do not change a byte of the output


def _render_job(job: tuple[dict, str]) -> dict:
    plan, path = job
    return render_video(plan, Path(path))


def _render_all(plans: list[dict], video_dir: Path, workers: int, progress: bool) -> list[dict]:
    jobs = [(p, str(video_dir / f"{p['video_id']}.mp4")) for p in plans]
    workers = workers or os.cpu_count() or 1
    cols = (TextColumn("rendering videos"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, disable=not progress, transient=True) as bar:
        task = bar.add_task("render", total=len(jobs))
        if workers == 1:
            results = []
            for job in jobs:
                results.append(_render_job(job))
                bar.advance(task)
            return results
        # spawn: safe even when the caller runs threads (Prefect, Beam); output does not depend on it.
        with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
            results = []
            for res in pool.imap(_render_job, jobs, chunksize=4):
                results.append(res)
                bar.advance(task)
            return results


def _video_entry(p: dict, written: dict, ids: dict[tuple[str, int], str]) -> dict:
    fps = p["fps"]
    defect = {k: v for k, v in p["defect"].items() if k != "of_index"}
    events = []
    for e in p["events"]:
        ev = {"annotation_id": ids[(p["video_id"], e["eid"])], "query": e["query"], "kind": e["kind"],
              "start_frame": e["start_frame"], "end_frame": e["end_frame"],
              "start_s": e["start_frame"] / fps, "end_s": e["end_frame"] / fps}
        if "color" in e:
            ev.update(color=e["color"], shape=e["shape"], action=e["action"])
        if e["kind"] in ("duplicate_query", "ambiguous_query"):
            ev["of"] = ids[(p["video_id"], e["of_eid"])]
        if "annotated_s" in e:
            ev.update(imprecise=e["imprecise"], annotated_start_s=e["annotated_s"][0],
                      annotated_end_s=e["annotated_s"][1])
        events.append(ev)
    return {
        "video_id": p["video_id"], "path": f"videos/{p['video_id']}.mp4", "fps": fps, "n_frames": p["n_frames"],
        "duration_s": p["n_frames"] / fps, "width": p["width"], "height": p["height"],
        "readable": defect["kind"] not in UNREADABLE, "bytes": written["bytes"],
        "scenes": [{"start_frame": s["start_frame"], "end_frame": s["end_frame"], "kind": s["kind"]}
                   for s in p["scenes"]],
        "hard_cuts": p["hard_cuts"], "gradual_transitions": p["gradual_transitions"], "events": events,
        "distractors": [{"color": d["color"], "shape": d["shape"], "action": d["action"],
                         "start_s": d["start_frame"] / fps, "end_s": d["end_frame"] / fps} for d in p["distractors"]],
        "defect": defect,
    }


def _annotations(cfg: CorpusConfig, plans: list[dict]) -> tuple[str, dict, list[dict], list[dict]]:
    """Annotation file text, (video_id, eid) -> annotation_id, invalid lines, clipped lines."""
    rng = np.random.default_rng([cfg.seed, 4])
    n_clean = sum(p["defect"]["kind"] == "none" for p in plans)
    per_kind = 0 if cfg.invalid_per_100 == 0 else max(1, round(cfg.invalid_per_100 * n_clean / 100))
    items = order_items(valid_items(plans) + invalid_items(plans, per_kind, rng), cfg.annotation_format, rng)
    text, refs = WRITERS[cfg.annotation_format](items)
    lines = text.splitlines()
    ids, invalid, clipped = {}, [], []
    unreadable = {p["video_id"] for p in plans if p["defect"]["kind"] in UNREADABLE}
    for it, (line, aid) in zip(items, refs):
        raw = lines[line - 1]
        if "invalid" in it:
            invalid.append({"line": line, "annotation_id": aid, "video_id": it["video_id"], "raw": raw,
                            "reason": it["invalid"]})
            continue
        ids[(it["video_id"], it["eid"])] = aid
        if cfg.annotation_format == "charades" and it["video_id"] in unreadable:
            # Charades has no durations: ingest must probe the file, and these files cannot be probed.
            invalid.append({"line": line, "annotation_id": aid, "video_id": it["video_id"], "raw": raw,
                            "reason": "unprobeable_video"})
        elif it["end"] > it["duration"] + 1e-9:
            clipped.append({"line": line, "annotation_id": aid, "video_id": it["video_id"],
                            "end_s_written": it["end"], "end_s": it["duration"]})
    return text, ids, invalid, clipped


def _is_up_to_date(out: Path, digest: str) -> bool:
    gt = out / GROUND_TRUTH
    if not gt.is_file():
        return False
    try:
        data = json.loads(gt.read_text())
    except ValueError:
        return False
    return data.get("config_hash") == digest and all((out / v["path"]).exists() for v in data["videos"])


def load_ground_truth(out_dir: str | Path) -> dict:
    """The ground truth of a built corpus (schema in `corpus`)."""
    path = Path(out_dir) / GROUND_TRUTH
    if not path.is_file():
        raise VTGError(f"{path}: no ground truth here; build the corpus first (python -m corpus)")
    return json.loads(path.read_text())


def build_corpus(cfg: CorpusConfig, force: bool = True, progress: bool = False) -> dict:
    """Write the corpus under `cfg.out_dir`; returns the ground truth (see `corpus` for its schema)."""
    try:
        return _build(cfg, force, progress)
    except OSError as e:
        raise VTGError(f"{cfg.out_dir}: cannot write the corpus ({e.strerror or e}: {e.filename}); "
                       "check corpus.out_dir and free disk space") from None


def _build(cfg: CorpusConfig, force: bool, progress: bool) -> dict:
    out = Path(cfg.out_dir)
    content = cfg.model_dump(mode="json", exclude=NOT_CONTENT)
    digest = f"{hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]}-g{GENERATOR_VERSION}"
    if not force and _is_up_to_date(out, digest):
        gt = json.loads((out / GROUND_TRUTH).read_text())
        write_general_suites(out, gt)  # derived from the ground truth: a corpus built before a task was added gains it
        return gt | {"skipped": True, "out_dir": str(out)}
    if out.exists() and not (out / GROUND_TRUTH).is_file() and any(out.iterdir()):
        raise VTGError(f"{out}: exists and is not a synthetic corpus (no {GROUND_TRUTH}); "
                       "set corpus.out_dir to a new directory or remove it")
    t0 = time.perf_counter()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "videos").mkdir(parents=True)
    (tmp / "annotations").mkdir()
    plans = plan_corpus(cfg)
    written = _render_all(plans, tmp / "videos", cfg.workers, progress)
    text, ids, invalid, clipped = _annotations(cfg, plans)
    ann_name = f"annotations/{cfg.annotation_format}.{EXTENSIONS[cfg.annotation_format]}"
    (tmp / ann_name).write_text(text)
    counts = corpus_counts(cfg)
    gt = {
        "schema_version": 1, "generator_version": GENERATOR_VERSION, "config_hash": digest,
        "config": content, "annotation_format": cfg.annotation_format,
        "annotation_file": ann_name, "annotation_lines": len(text.splitlines()),
        "counts": {"clean_videos": counts.clean, "defective_videos": counts.defects},
        "videos": [_video_entry(p, w, ids) for p, w in zip(plans, written)],
        "invalid_annotations": sorted(invalid, key=lambda x: x["line"]),
        "clipped_annotations": sorted(clipped, key=lambda x: x["line"]),
    }
    (tmp / GROUND_TRUTH).write_text(json.dumps(gt, indent=1, sort_keys=True) + "\n")
    write_general_suites(tmp, gt)  # the general tasks the tiny base is taught, and its retention suite
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    gt["build_seconds"] = time.perf_counter() - t0
    gt["out_dir"] = str(out)
    return gt
