"""`python -m beam_jobs.preprocess`: canonical records + videos -> WebDataset shards (docs/architecture.md).

Reads `preprocess.records` (written by `python -m ingest`), decodes every video once, splits it into
scene-aligned windows, extracts frames, drops low-quality windows, near-duplicate videos, duplicate and
text-answerable queries, partitions by video/duplicate cluster, and writes under `preprocess.out_dir`:
  <split>/shard-%06d.tar   WebDataset samples (one window: f000.jpg ... + json), byte-identical on rerun
  manifest.json            counts (inputs = kept + filtered + failed), drops per reason, lineage digests
  filtered.jsonl           every filtered record with its reason; dead_letter.jsonl: every failed one
  audit.jsonl              the annotation audit: every kept query it flags (ambiguous, boundaries with no visual
                           change, ...), counted per split in manifest.json `audit` (beam_jobs/audit.py)
  location_bias.png        normalized start/end histograms of the moments (all vs kept)

Configuration comes from params.yaml (`preprocess:` section), an optional experiment and dotted overrides.
Anything starting with `--` is a Beam pipeline option, passed through and winning over the runner profile
`preprocess.runner` (e.g. `--runner=FlinkRunner --flink_master=host:8081`, `--direct_num_workers=4`).
Example: python -m beam_jobs.preprocess preprocess.frame_mode=adaptive --direct_running_mode=in_memory
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs import pipeline, summary
from beam_jobs.options import pipeline_options
from vtg import stages
from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.config import PipelineConfig
from vtg.config.keys import output_view, view_hash
from vtg.errors import FULL_B, VTGError, out_of_space
from vtg.shards import MANIFEST, SPLITS
from vtg.sources import Sources

log = logging.getLogger("beam_jobs.preprocess")


def code_version() -> str:
    """Digest of the code that decides the shard bytes: the preprocess stage's code deps in dvc.yaml."""
    return stages.code_digest("preprocess")


def params_hash(cfg: PipelineConfig) -> str:
    """Hash of the preprocess fields that change the shard bytes (fields marked NOT_OUTPUT left out). The audit's
    thresholds count only while it filters: otherwise they change its counts and list, never a shard, so another
    threshold keeps the data version (and the checkpoints trained on it)."""
    view = output_view(cfg.preprocess)
    if not cfg.preprocess.audit.filter:
        del view["audit"]
    return view_hash(view)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with FileSystems.open(path) as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _clear_outputs(out_dir: str) -> None:
    """Remove shards of a previous run so a smaller run leaves no stale shard behind."""
    for split in SPLITS:
        match = FileSystems.match([FileSystems.join(out_dir, split, "shard-*.tar")])[0]
        paths = [m.path for m in match.metadata_list]
        if paths:
            FileSystems.delete(paths)


def check_room(out_dir: str) -> None:
    """Refuse to start on a disk that is already full (`vtg.errors.FULL_B` free or less), in one line, before
    the workers start (a worker's full disk is logged by Beam itself before the run fails)."""
    folder = Path(out_dir)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free <= FULL_B:
        raise VTGError(f"preprocess: {free // 1024} KiB free on the disk of {out_dir}: free space (`df -h {folder}`) "
                       "and rerun")


def lineage(cfg: PipelineConfig) -> dict:
    cv, ph = code_version(), params_hash(cfg)
    return {"code_version": cv, "params_hash": ph, "preprocess_version": f"{cv}+{ph}",
            "records_sha256": _sha256(cfg.preprocess.records)}


def run(cfg: PipelineConfig, beam_argv: list[str] | None = None, test_pipeline: beam.Pipeline | None = None,
        show: bool = True) -> dict:
    """Run the job and return the manifest (also the entry point tests and orchestration call)."""
    pp = cfg.preprocess
    if not FileSystems.exists(pp.records):
        raise VTGError(f"{pp.records}: records file not found (run `python -m ingest` first)")
    local = "://" not in pp.out_dir
    if local:
        check_room(pp.out_dir)
    _clear_outputs(pp.out_dir)
    lin = lineage(cfg)
    progress_dir = tempfile.mkdtemp(prefix="vtg-progress-") if (pp.progress and show and local) else None
    try:
        p = test_pipeline or beam.Pipeline(options=pipeline_options(cfg, beam_argv or []))
        pipeline.build(p, pp, lin, progress_dir, Sources.of(cfg.ingest.sources))
        _run_with_progress(p, progress_dir, pp.records)
    except Exception as e:
        if local and out_of_space(e, pp.out_dir):
            raise VTGError(f"preprocess: the disk of {pp.out_dir} filled up while writing shards (no partial shard "
                           f"is left; the records are untouched): free space (`df -h {pp.out_dir}`) and rerun") from None
        raise
    finally:
        if progress_dir:
            shutil.rmtree(progress_dir, ignore_errors=True)
    with FileSystems.open(FileSystems.join(pp.out_dir, MANIFEST)) as f:
        manifest = json.loads(f.read())
    rec = manifest["records"]
    assert rec["inputs"] == rec["kept"] + rec["filtered"] + rec["failed"], rec
    if show:
        from rich.console import Console

        Console(stderr=True).print(summary.summary_table(manifest))
    return manifest


def _count_videos(records: str) -> int:
    ids = set()
    with FileSystems.open(records) as f:
        for line in f:
            try:
                ids.add(json.loads(line)["video_id"])
            except (ValueError, KeyError, TypeError):
                pass
    return len(ids)


def _run_with_progress(p: beam.Pipeline, progress_dir: str | None, records: str) -> None:
    if not progress_dir:
        p.run().wait_until_finish()
        return
    from tqdm import tqdm

    done = threading.Event()
    bar = tqdm(total=_count_videos(records), desc="videos", unit="video", dynamic_ncols=True)

    def poll() -> None:
        while not done.wait(0.5):
            bar.n = len(os.listdir(progress_dir))
            bar.refresh()

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        p.run().wait_until_finish()
    finally:
        done.set()
        t.join()
        bar.n = len(os.listdir(progress_dir))
        bar.close()


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    args, beam_argv = parser.parse_known_args(argv)
    unknown = [a for a in beam_argv if not a.startswith("--")]
    if unknown:
        raise VTGError(f"unexpected argument(s) {unknown}: overrides are key=value, Beam options --name=value")
    cfg = resolve_config(args, stage="preprocess")
    manifest = run(cfg, beam_argv)
    log.info("wrote %d samples in %d shards to %s", sum(manifest["samples_per_split"].values()),
             len(manifest["shards"]), cfg.preprocess.out_dir)
    check_trainable(manifest, cfg.preprocess.out_dir)
    return 0


def check_trainable(manifest: dict, out_dir: str) -> None:
    """Fail the stage (after writing every output) when the next one cannot run: no train sample. The error gives
    the counts and where every record went; a split without val or test samples is a warning (training runs, the
    evaluate stage will say what it lacks)."""
    per_split, rec = manifest["samples_per_split"], manifest["records"]
    if not per_split.get("train"):
        raise VTGError(f"preprocess: no train sample ({rec['inputs']} records in: {rec['kept']} kept, "
                       f"{rec['filtered']} filtered, {rec['failed']} dead-lettered; see {out_dir}/filtered.jsonl and "
                       f"{out_dir}/dead_letter.jsonl): training cannot run; add data or relax preprocess's filters")
    for split, what in (("val", "checkpoint selection"), ("test", "held-out numbers")):
        if not per_split.get(split):
            log.warning("preprocess: no %s sample: the evaluate stage will have no %s", split, what)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
