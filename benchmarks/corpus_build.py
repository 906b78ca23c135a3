"""Corpus build and ingest speed: `python -m benchmarks.corpus_build [--scale 1.0] [--workers 2] [--json PATH]`.

Builds the default corpus (params.yaml) at `--scale` with one worker (the baseline) and with `--workers`,
checks both are byte-identical, ingests it, and prints times and the ratio measured in this run:
`build_speedup` = build wall time with 1 worker / with `--workers`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import tempfile
import time
from pathlib import Path

from benchmarks.figures import Run, default_json
from corpus import build_corpus
from ingest import ingest
from vtg.config import load_config
from vtg.sources import SYNTHETIC


def tree_sha(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the render workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=default_json("corpus_build"), help="where to write the figures")
    args = ap.parse_args(argv)
    run = Run.start()
    base = load_config(args.params).corpus
    with tempfile.TemporaryDirectory() as tmp:
        times, cpu, digests = {}, {}, {}
        for workers in (1, args.workers):
            out = Path(tmp) / f"w{workers}"
            cfg = base.model_copy(update={"out_dir": str(out), "scale": args.scale, "workers": workers})
            t0, c0 = time.perf_counter(), cpu_seconds()
            gt = build_corpus(cfg)
            times[workers] = time.perf_counter() - t0
            cpu[workers] = cpu_seconds() - c0
            digests[workers] = tree_sha(out)
        video_s = sum(v["duration_s"] for v in gt["videos"])
        n_queries = sum(len(v["events"]) for v in gt["videos"])
        icfg = load_config(args.params).ingest.model_copy(update={
            "sources": [SYNTHETIC.model_copy(update={"roots": [str(out)]})],
            "annotations": [str(out / "annotations")], "video_root": str(out / "videos"),
            "out": f"{tmp}/r.jsonl", "dead_letter": f"{tmp}/d.jsonl", "summary": f"{tmp}/s.json"})
        t0 = time.perf_counter()
        summary = ingest(icfg)
        t_ingest = time.perf_counter() - t0
    identical = len(set(digests.values())) == 1
    print(f"corpus scale {args.scale}: {len(gt['videos'])} videos, {n_queries} queries, {video_s / 60:.1f} min of video")
    for w, t in times.items():
        print(f"  build, {w} worker(s): {t:6.1f} s  ({len(gt['videos']) / t:5.1f} videos/s, "
              f"{video_s / t:6.0f} video-s/s), CPU {cpu[w]:5.1f} s; wall speed-up vs 1 worker: {times[1] / t:.2f}x")
    print(f"  load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times are only "
          "comparable on an idle machine; CPU seconds are)")
    print(f"  byte-identical across worker counts: {identical}")
    print(f"ingest: {summary['inputs']} lines in {t_ingest:.2f} s ({summary['inputs'] / t_ingest:,.0f} lines/s), "
          f"{summary['records']} records, {summary['dead_letters']} dead letters")
    run.write(args.json, "corpus_build", ratios={"build_speedup": times[1] / times[args.workers]}, figures={
        "scale": args.scale, "workers": args.workers, "videos": len(gt["videos"]), "queries": n_queries,
        "video_s": round(video_s, 1), "byte_identical": identical,
        "build_s": {str(w): round(t, 2) for w, t in times.items()},
        "build_cpu_s": {str(w): round(c, 2) for w, c in cpu.items()},
        "ingest_s": round(t_ingest, 3), "ingest_lines_per_s": round(summary["inputs"] / t_ingest, 1),
        "ingest_records": summary["records"], "ingest_dead_letters": summary["dead_letters"]})


if __name__ == "__main__":
    main()
