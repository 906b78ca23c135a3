"""Preprocess speed: `python benchmarks/preprocess.py [--n-videos 120] [--corpus DIR] [beam options ...]`.

On the same videos in one run, measures source-video seconds processed per wall second for
  1. OpenCV decode-only (every frame read, nothing else; one process),
  2. PySceneDetect `detect()` with ContentDetector alone (one process),
  3. the job's per-video core alone (decode once + cuts + windows + frames + JPEGs + signature; one process,
     no Beam: shows what the Beam runner adds),
  4. the whole preprocess job (`beam_jobs.preprocess.run`: decode, scenes, windows, frames, quality, dedup,
     text bias, partition, shards, manifest; DirectRunner multi_processing unless options say otherwise),
and prints the job's speed as ratios of the two baselines (targets: >= 1x detect(), >= 0.5x decode-only).
The corpus is built (`vtg.corpus`) and ingested (`vtg.ingest`) into a temp dir unless --corpus is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import cv2

from vtg.config import load_config
from vtg.records import read_records


def decode_only(paths: list[str]) -> float:
    """Seconds of video decoded (frames / fps) by reading every frame."""
    total = 0.0
    for p in paths:
        cap = cv2.VideoCapture(p)
        fps, n = cap.get(cv2.CAP_PROP_FPS) or 0.0, 0
        while cap.grab() and cap.retrieve()[0]:
            n += 1
        cap.release()
        total += n / fps if fps > 0 else 0.0
    return total


def detect_only(paths: list[str], threshold: float) -> int:
    from scenedetect import ContentDetector, detect

    cuts = 0
    for p in paths:
        cuts += len(detect(p, ContentDetector(threshold=threshold)))
    return cuts


def core_only(cfg, records: list) -> int:
    """The job's per-video core (decode once, cuts, windows, frames, JPEGs, signature) in this process, no Beam."""
    from beam_jobs.probe import DecodeError
    from beam_jobs.video import build_windows, decode, video_signature

    pp, by_video, n = cfg.preprocess, {}, 0
    for r in records:
        by_video.setdefault(r.video_id, []).append(r)
    for vid, recs in sorted(by_video.items()):
        try:
            v = decode(recs[0].video_path, pp)
        except DecodeError:
            continue
        windows, _, _ = build_windows(vid, recs, v, pp)
        video_signature(vid, v, len(windows), pp)
        n += len(windows)
    return n


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-videos", type=int, default=120, help="clean videos in the built corpus")
    ap.add_argument("--corpus", default=None, help="use this built corpus directory instead of building one")
    ap.add_argument("--params", default="params.yaml")
    args, beam_argv = ap.parse_known_args()
    logging.disable(logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cv2.setNumThreads(1)  # all three measure one thread per process (the job's workers set the same)
    tmp = Path(tempfile.mkdtemp(prefix="vtg-bench-pp-"))
    corpus = Path(args.corpus) if args.corpus else tmp / "corpus"
    over = [f"corpus.out_dir={corpus}", f"corpus.n_videos={args.n_videos}",
            f"ingest.annotations=[{corpus}/annotations]", f"ingest.video_root={corpus}/videos",
            f"ingest.out={tmp}/records.jsonl", f"ingest.dead_letter={tmp}/ingest_dead.jsonl",
            f"ingest.summary={tmp}/ingest_summary.json", f"preprocess.records={tmp}/records.jsonl",
            f"preprocess.out_dir={tmp}/shards", "preprocess.progress=false"]
    cfg = load_config(args.params, None, over)
    if not args.corpus:
        from vtg.corpus import build_corpus

        _, t = timed(build_corpus, cfg.corpus)
        print(f"built corpus ({args.n_videos} clean videos) in {t:.1f} s")
    from vtg.ingest import ingest

    ingest(cfg.ingest)
    records = read_records(cfg.preprocess.records)
    paths = sorted({r.video_path for r in records})
    readable = [p for p in paths if os.path.getsize(p) > 0 and cv2.VideoCapture(p).isOpened()]

    video_s, t_decode = timed(decode_only, readable)
    _, t_detect = timed(detect_only, readable, cfg.preprocess.scenes.threshold)
    from beam_jobs.preprocess import run

    _, t_core = timed(core_only, cfg, records)
    manifest, t_job = timed(run, cfg, beam_argv, None, False)
    times = {"opencv decode-only": t_decode, "pyscenedetect detect()": t_detect,
             "job core, 1 process": t_core, "preprocess job": t_job}
    rates = {name: video_s / t for name, t in times.items()}
    print(f"{len(paths)} videos ({len(readable)} decodable), {video_s:.0f} s of source video, "
          f"{os.cpu_count()} CPUs, options {beam_argv or '(runner profile)'}")
    for name, t in times.items():
        print(f"  {name:24s} {t:7.2f} s wall  {rates[name]:8.1f} video-s per wall-s")
    job = rates["preprocess job"]
    print(f"job / detect()     = {job / rates['pyscenedetect detect()']:.2f}x  (target >= 1.0)")
    print(f"job / decode-only  = {job / rates['opencv decode-only']:.2f}x  (target >= 0.5)")
    core = rates["job core, 1 process"]
    print(f"core / detect()    = {core / rates['pyscenedetect detect()']:.2f}x, core / decode-only = "
          f"{core / rates['opencv decode-only']:.2f}x  (the per-video work without Beam)")
    print(f"records: {manifest['records']}")


if __name__ == "__main__":
    main()
