"""Preprocess speed: `python -m benchmarks.preprocess [--n-videos 1200] [--size PX ...] [--corpus DIR] [--json PATH]
[beam options]`.

For each frame size (default: the params.yaml corpus at 112 px, then the same corpus at 448 px), on the same
videos in one run, measures source-video seconds processed per wall second for
  1. OpenCV decode-only (every frame read into a reused buffer, nothing else; one process), twice over: with
     OpenCV's default decoder threading (FFmpeg frame threads, one per CPU: what a plain `cv2.VideoCapture`
     loop and PySceneDetect get) and single-threaded (`CAP_PROP_N_THREADS=1`, what the job uses: on small
     frames the faster of the two). Each is run before and after the job; the fastest run of all is the
     baseline,
  2. PySceneDetect `detect()` with ContentDetector alone (one process),
  3. the job's per-video core alone (decode once + cuts + windows + frames + quality + JPEGs + signature; one
     process, no Beam: shows what the Beam runner adds),
  4. the whole preprocess job (`beam_jobs.preprocess.run`: decode, scenes, windows, frames, quality, dedup,
     text bias, partition, shards, manifest; DirectRunner multi_processing with `preprocess.direct_num_workers`
     workers unless options say otherwise),
  5. the same job on a single video, before and after the whole job (the faster of the two: the first run in a
     process also pays one-time imports): Beam's fixed start-up and tear-down cost, to separate it from the
     steady-state rate (whole-job seconds minus that fixed cost; when the difference is under 5% of the job, a
     corpus too small for the machine's load, the steady-state ratios are null and `steady_unmeasured` says why),
and prints the job's speed as ratios of the baselines (targets: >= 1x detect(), >= 0.5x decode-only): raw
(whole job, wall clock) and, because the baselines use one process and the job N worker processes, also per
worker (raw / N); the ratio to the default-threading decode is printed too. The machine's load average is
printed: on a shared machine every number moves with it.
Each corpus is built (`corpus`, params.yaml corpus section with `corpus.n_videos=N` and the frame size) and
ingested (`ingest`) into a temp dir unless --corpus is given. A summary table, one row per frame size, closes the run.
The JSON's ratios are keyed `<frames>.<ratio>` (`112px.job_vs_decode`, ...; `corpus.` with --corpus): `RATIOS`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path

import cv2

from benchmarks.figures import Run, default_json
from vtg.config import load_config
from vtg.records import read_records
from vtg.sources import SYNTHETIC, Sources

RATIOS = ("job_vs_detect", "job_vs_decode", "job_vs_detect_per_worker", "job_vs_decode_per_worker",
          "steady_vs_detect", "steady_vs_decode", "job_vs_decode_default_threads", "core_vs_detect", "core_vs_decode")
"""The ratios each frame size reports (job: the whole Beam job; steady: the job minus its fixed start-up; core: the
per-video work in one process; decode: the fastest decode-only baseline; detect: PySceneDetect `detect()`)."""


def decode_only(paths: list[str], threads: int = 0) -> float:
    """Seconds of video decoded (frames / fps) by reading every frame (into one reused buffer: OpenCV's fastest
    full decode here, ~20 us/frame faster than grab() + retrieve()). `threads`: FFmpeg decoder threads (0:
    OpenCV's default)."""
    total = 0.0
    params = [cv2.CAP_PROP_N_THREADS, threads] if threads > 0 else []
    for p in paths:
        cap = cv2.VideoCapture(p, cv2.CAP_ANY, params)
        fps, n, frame = cap.get(cv2.CAP_PROP_FPS) or 0.0, 0, None
        while True:
            ok, frame = cap.read(frame)
            if not ok:
                break
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


def declared_at(corpus: Path) -> str:
    """The `ingest.sources` override that declares a corpus built (or given) here as the synthetic source."""
    return "ingest.sources=" + json.dumps([SYNTHETIC.model_copy(update={"roots": [str(corpus)]}).model_dump()])


def core_only(cfg, records: list, sources: Sources) -> int:
    """The job's per-video core (decode once, cuts, windows, frames, JPEGs, signature) in this process, no Beam."""
    from beam_jobs.probe import DecodeError
    from beam_jobs.video import build_windows, decode, video_signature

    pp, by_video, n = cfg.preprocess, {}, 0
    for r in records:
        by_video.setdefault(r.video_id, []).append(r)
    for vid, recs in sorted(by_video.items()):
        try:
            v = decode(sources.resolve(recs[0].source, recs[0].video_path), pp)
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


def job_workers(cfg, beam_argv: list[str]) -> int:
    """Worker processes the job's DirectRunner uses (1 for in-memory runs; other runners: reported as 1)."""
    from beam_jobs.options import pipeline_options

    opts = pipeline_options(cfg, beam_argv).get_all_options()
    runner = str(opts.get("runner") or "DirectRunner")
    if "Direct" not in runner or opts.get("direct_running_mode") == "in_memory":
        return 1
    return int(opts.get("direct_num_workers") or 1) or (os.cpu_count() or 1)


def frame_size(text: str) -> tuple[int, int] | None:
    """`--size` values: `448` (a square side), `1280x720` (width x height), `0` (params.yaml's corpus size)."""
    w, _, h = text.lower().partition("x")
    width, height = int(w), int(h or w)
    if width < 0 or height < 0 or (width == 0) != (height == 0):
        raise argparse.ArgumentTypeError(f"--size {text!r}: a side in px (448), WxH (1280x720) or 0")
    return (width, height) if width else None


def measure(args, size: tuple[int, int] | None, beam_argv: list[str]) -> dict:
    """Every measurement of the docstring on one corpus (built at frame side `size`, or --corpus); prints them."""
    tmp = Path(tempfile.mkdtemp(prefix="vtg-bench-pp-"))
    corpus = Path(args.corpus) if args.corpus else tmp / "corpus"
    over = [f"corpus.out_dir={corpus}", f"corpus.n_videos={args.n_videos}",
            f"ingest.annotations=[{corpus}/annotations]", f"ingest.video_root={corpus}/videos",
            f"ingest.out={tmp}/records.jsonl", f"ingest.dead_letter={tmp}/ingest_dead.jsonl",
            f"ingest.summary={tmp}/ingest_summary.json", f"preprocess.records={tmp}/records.jsonl",
            f"preprocess.out_dir={tmp}/shards", "preprocess.progress=false", declared_at(corpus),
            *([f"corpus.width={size[0]}", f"corpus.height={size[1]}"] if size else [])]
    cfg = load_config(args.params, None, over)
    if not args.corpus:
        from corpus import build_corpus

        _, t = timed(build_corpus, cfg.corpus)
        print(f"\nbuilt corpus ({args.n_videos} clean videos, {cfg.corpus.width}x{cfg.corpus.height} px) in {t:.1f} s")
    from ingest import ingest

    ingest(cfg.ingest)
    records, sources = read_records(cfg.preprocess.records), Sources.of(cfg.ingest.sources)
    path = {r.annotation_id: sources.resolve(r.source, r.video_path) for r in records}
    paths = sorted(set(path.values()))
    readable = [p for p in paths if os.path.getsize(p) > 0 and cv2.VideoCapture(p).isOpened()]
    one = next(r for r in records if path[r.annotation_id] == readable[0])
    (tmp / "one.jsonl").write_text(one.model_dump_json() + "\n")
    cfg_one = load_config(args.params, None, [*over, f"preprocess.records={tmp}/one.jsonl",
                                              f"preprocess.out_dir={tmp}/shards_one"])
    cap = cv2.VideoCapture(readable[0])
    frame_px = f"{int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))}x{int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))} px"
    cap.release()
    load = [os.getloadavg()[0]]

    decode = {0: [], 1: []}  # decoder threads -> wall seconds of each run
    for threads, runs in decode.items():
        video_s, t = timed(decode_only, readable, threads)
        runs.append(t)
    _, t_detect = timed(detect_only, readable, cfg.preprocess.scenes.threshold)
    from beam_jobs.preprocess import run

    _, t_core = timed(core_only, cfg, records, sources)
    load.append(os.getloadavg()[0])
    _, t_fixed = timed(run, cfg_one, beam_argv, None, False)
    manifest, t_job = timed(run, cfg, beam_argv, None, False)
    t_fixed = min(t_fixed, timed(run, cfg_one, beam_argv, None, False)[1])
    for threads, runs in decode.items():  # again after the job: the fastest run is the baseline
        runs.append(timed(decode_only, readable, threads)[1])
    load.append(os.getloadavg()[0])
    t_decode, t_decode_default = min(min(v) for v in decode.values()), min(decode[0])
    one_s = one.duration_s
    separable = t_job - t_fixed > 0.05 * t_job
    t_steady = t_job - t_fixed if separable else math.nan
    unmeasured = None if separable else (
        f"the whole job ({t_job:.1f} s) is within 5% of its one-video run ({t_fixed:.1f} s, Beam's start-up): too few "
        "videos for this machine's load to separate a steady state")
    workers = job_workers(cfg, beam_argv)
    times = {"opencv decode-only": t_decode, "pyscenedetect detect()": t_detect,
             "job core, 1 process": t_core, "preprocess job": t_job}
    rates = {name: video_s / t for name, t in times.items()}
    print(f"{len(paths)} videos ({len(readable)} decodable, first one {frame_px}), {video_s:.0f} s of source video, "
          f"{os.cpu_count()} CPUs, load average {min(load):.1f}-{max(load):.1f} during the run, "
          f"options {beam_argv or '(runner profile)'}")
    runs = "; ".join(f"{'default threads' if k == 0 else f'{k} thread'}: " + ", ".join(f"{t:.2f} s" for t in v)
                     for k, v in decode.items())
    print(f"baselines run in 1 process; the job ran {workers} worker process(es); decode-only ran before and "
          f"after the job ({runs}): the fastest run is the baseline")
    for name, t in times.items():
        print(f"  {name:24s} {t:7.2f} s wall  {rates[name]:8.1f} video-s per wall-s")
    print(f"  {'job fixed start-up':24s} {t_fixed:7.2f} s wall  (the job on 1 video, {one_s:.1f} s long, faster of "
          "2 runs)")
    print(f"  {'job steady state':24s} {t_steady:7.2f} s wall  {video_s / t_steady:8.1f} video-s per wall-s "
          f"(whole job minus the fixed start-up)")
    if unmeasured:
        print(f"  steady state not measured: {unmeasured}")
    dec, det = rates["opencv decode-only"], rates["pyscenedetect detect()"]
    job, steady = rates["preprocess job"], video_s / t_steady
    for name, base, target in (("detect()", det, 1.0), ("decode-only", dec, 0.5)):
        print(f"job / {name:12s} = {job / base:.2f}x raw (target >= {target}), {job / base / workers:.2f}x per "
              f"worker; steady state {steady / base:.2f}x raw, {steady / base / workers:.2f}x per worker")
    print(f"job / decode-only with OpenCV's default threading ({t_decode_default:.2f} s) = "
          f"{t_decode_default / t_job:.2f}x raw, steady state {t_decode_default / t_steady:.2f}x")
    core = rates["job core, 1 process"]
    print(f"core / detect()    = {core / det:.2f}x, core / decode-only = {core / dec:.2f}x  "
          f"(the per-video work in 1 process, without Beam)")
    print(f"records: {manifest['records']}")
    ratios = {"job_vs_detect": job / det, "job_vs_decode": job / dec, "job_vs_detect_per_worker": job / det / workers,
              "job_vs_decode_per_worker": job / dec / workers, "steady_vs_detect": steady / det,
              "steady_vs_decode": steady / dec, "job_vs_decode_default_threads": t_decode_default / t_job,
              "core_vs_detect": core / det, "core_vs_decode": core / dec}
    return {"frames": frame_px, "videos": len(readable), "video_s": video_s, "job": t_job, "fixed": t_fixed,
            "detect": t_detect, "decode": t_decode, "decode_default": t_decode_default, "core": t_core,
            "workers": workers, "records": manifest["records"], "load_average": [min(load), max(load)],
            "steady_unmeasured": unmeasured, "ratios": ratios}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-videos", type=int, default=1200,
                    help="clean videos in each built corpus (a small corpus is dominated by Beam's fixed start-up)")
    ap.add_argument("--size", type=frame_size, nargs="+", default=[None, (448, 448)], metavar="PX|WxH",
                    help="frame sizes of the built corpora, one measurement each: a side (448) or WxH (1280x720, "
                         "1920x1080: real clips' sizes); default: 0 448 (0 = params.yaml, 112 px). A 112-px frame "
                         "decodes in ~25 us, so the job's fixed per-frame work (a thumbnail of every frame, "
                         "candidates, blur scores) weighs several times the decode there; 448 px is about the size "
                         "of real 360p-480p video")
    ap.add_argument("--corpus", default=None, help="measure this built corpus directory instead (ignores --size)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--json", default=default_json("preprocess"), help="where to write the figures")
    args, beam_argv = ap.parse_known_args(argv)
    run = Run.start()
    logging.disable(logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cv2.setNumThreads(1)  # all measure one thread per process (the job's workers set the same)
    sizes = [None] if args.corpus else list(args.size)
    default = load_config(args.params).corpus
    labels = ["corpus"] if args.corpus else [
        f"{w}px" if w == h else f"{w}x{h}px" for w, h in (s or (default.width, default.height) for s in sizes)]
    results = [measure(args, size, beam_argv) for size in sizes]
    print("\nsummary (targets: job >= 1x detect(), >= 0.5x decode-only; decode-only: the fastest threading)")
    print(f"{'frames':>12s} {'videos':>6s} {'video-h':>7s} {'job s':>6s} {'start-up':>8s} {'detect s':>8s} "
          f"{'decode s':>8s} {'/detect':>7s} {'/decode':>7s} {'steady':>6s}")
    for r in results:
        q = r["ratios"]
        print(f"{r['frames']:>12s} {r['videos']:6d} {r['video_s'] / 3600:7.2f} {r['job']:6.1f} {r['fixed']:8.1f} "
              f"{r['detect']:8.1f} {r['decode']:8.1f} {q['job_vs_detect']:6.2f}x {q['job_vs_decode']:6.2f}x "
              f"{q['steady_vs_decode']:5.2f}x")
    run.write(args.json, "preprocess", ratios={f"{label}.{k}": v for label, r in zip(labels, results, strict=True)
                                               for k, v in r.pop("ratios").items()},
              figures={"n_videos": args.n_videos, "beam_options": beam_argv,
                       "sizes": dict(zip(labels, results, strict=True))})


if __name__ == "__main__":
    main()
