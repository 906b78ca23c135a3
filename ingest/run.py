"""Ingest every annotation file into canonical records + dead letters + a summary that reconciles."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ingest import reasons as R
from ingest.detect import detect_format, expand_annotation_paths
from ingest.formats import READERS
from ingest.items import Rejected
from ingest.validate import Invalid, Probe, QueryLimit, to_record
from ingest.videos import VideoIndex, probe_duration
from vtg.config import IngestConfig, config_hash
from vtg.errors import VTGError
from vtg.sources import SourceDecl, Sources


class FileTally:
    def __init__(self, path: Path, fmt: str, source: SourceDecl, rel: str):
        self.path, self.format, self.source, self.rel = path, fmt, source, rel
        self.inputs = self.records = self.clipped = 0
        self.reasons: Counter[str] = Counter()
        self.by_source: Counter[str] = Counter()
        """Records per source (a native record may name another declared source than the file's)."""

    def as_dict(self) -> dict:
        """No machine path: the file is named by its source and its path under that source's root."""
        return {"file": self.rel, "source": self.source.id, "format": self.format, "inputs": self.inputs,
                "records": self.records, "dead_letters": sum(self.reasons.values()), "clipped": self.clipped,
                "by_reason": dict(sorted(self.reasons.items()))}


def _read_text(path: Path) -> str:
    """An annotation file's text as written: UTF-8 (a byte-order mark, as Windows editors write, dropped) or
    UTF-16 with its mark; any line ending (`str.splitlines` in the readers)."""
    data = path.read_bytes()
    encoding = "utf-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise VTGError(f"{path}: not UTF-8 text (byte {e.start}); is this an annotation file? (save it as UTF-8)"
                       ) from None


def ingest_file(path: Path, fmt: str, sources: Sources, owner: tuple[SourceDecl, str], videos: VideoIndex,
                tolerance: float, probe: Probe, seen_ids: set[str], records: list, dead: list,
                progress: Progress | None = None, tag: str | None = None,
                query_limit: QueryLimit | None = None) -> FileTally:
    """One annotation file. Its annotation ids must be unique within it; an id another file already used (two
    annotators of one set: ActivityNet's val_1/val_2, `train/ann.jsonl` and `val/ann.jsonl`) is kept, qualified
    by the file (`<id>@<tag>`, `tag` the file's path under the annotation files' common folder). `owner`: the
    declared source whose root holds the file, and the file's path under it (`Sources.owner_of`)."""
    text = _read_text(path)
    in_file: set[str] = set()
    fmt = detect_format(path, text) if fmt == "auto" else fmt
    source, rel = owner
    tally = FileTally(path, fmt, source, rel)
    annotation_file = f"{fmt}:{rel}"
    task = progress.add_task(path.name, total=len(text.splitlines()) or None) if progress else None
    for line, raw, item in READERS[fmt](text, str(path)):
        tally.inputs += 1
        try:
            if isinstance(item, Rejected):
                raise Invalid(item.reason, item.detail)
            if item.annotation_id in in_file:
                raise Invalid(R.DUPLICATE_ANNOTATION_ID, f"annotation id {item.annotation_id!r} is used twice in "
                                                         "this file")
            in_file.add(item.annotation_id)
            if item.annotation_id in seen_ids:  # another file's: the same id in another file is another annotation
                item = dataclasses.replace(item, annotation_id=f"{item.annotation_id}@{tag or path.name}")
                if item.annotation_id in seen_ids:
                    raise Invalid(R.DUPLICATE_ANNOTATION_ID, f"annotation id {item.annotation_id!r} was seen before")
            record, clipped = to_record(item, source, sources, annotation_file, videos, tolerance, probe,
                                        query_limit)
        except Invalid as e:
            tally.reasons[e.reason] += 1
            dead.append({"file": path.as_posix(), "line": line, "format": fmt, "reason": e.reason, "detail": e.detail,
                         "annotation_id": getattr(item, "annotation_id", None), "raw": raw, **e.fields})
        else:
            seen_ids.add(record.annotation_id)
            tally.records += 1
            tally.clipped += clipped
            tally.by_source[record.source] += 1
            records.append(record)
        if task is not None:
            progress.update(task, completed=line)
    return tally


def _write_jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            obj = row.model_dump(mode="json") if hasattr(row, "model_dump") else row
            f.write(json.dumps(obj, sort_keys=True) + "\n")
    os.replace(tmp, path)


def source_table(sources: Sources, counts: Counter[str]) -> dict:
    """{source id: {licence, origin, terms, records}} for every declared source (0 records included: a source
    that gave nothing is worth seeing)."""
    return {d.id: {"licence": d.licence, "origin": d.origin, "terms": d.terms, "records": counts[d.id]}
            for d in sources.decls.values()}


def ingest(cfg: IngestConfig, progress: bool = False, probe: Probe = probe_duration,
           query_limit: QueryLimit | None = None, require_records: bool = False) -> dict:
    """Run ingest with `cfg`; writes `cfg.out`, `cfg.dead_letter`, `cfg.summary` and returns the summary. The
    stage (`python -m ingest`) checks query lengths for the configured model (`QueryLimit.for_base`).
    `require_records` (the CLI): no usable record is an error, and then none of the three files is touched (the
    last good run's stay); the dead letters that say why go to a folder of their own beside them."""
    try:
        return _ingest(cfg, progress, probe, query_limit, require_records)
    except OSError as e:
        raise VTGError(f"{e.filename}: {e.strerror or e}; check the ingest.* paths") from None


def _ingest(cfg: IngestConfig, progress: bool, probe: Probe, query_limit: QueryLimit | None,
            require_records: bool = False) -> dict:
    t0 = time.perf_counter()
    files = expand_annotation_paths(cfg.annotations)
    sources = Sources.of(cfg.sources)
    owners = {f: sources.owner_of(f) for f in files}  # before any file is read: a refusal writes nothing
    videos = VideoIndex(cfg.video_root, cfg.extra_video_roots)
    records: list = []
    dead: list[dict] = []
    seen: set[str] = set()
    cols = (TextColumn("ingest {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, disable=not progress, transient=True) as bar:
        common = Path(os.path.commonpath([f.parent.resolve() for f in files])) if files else None
        tallies = [ingest_file(f, cfg.format, sources, owners[f], videos, cfg.end_tolerance_s, probe, seen, records,
                               dead, bar if progress else None, f.resolve().relative_to(common).as_posix(),
                               query_limit)
                   for f in files]
    inputs = sum(t.inputs for t in tallies)
    assert inputs == len(records) + len(dead), "ingest lost items: inputs != records + dead letters"
    by_reason0 = Counter(d["reason"] for d in dead)
    if require_records and not records:  # fail here, not two stages later in training; overwrite nothing
        failed = Path(cfg.dead_letter).parent / f"ingest-failed-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        if dead:
            _write_jsonl(failed / Path(cfg.dead_letter).name, dead)
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(by_reason0.items())) or "no input lines"
        raise VTGError(f"ingest: no usable record out of {inputs} input line(s) ({reasons}); "
                       + (f"every line is in {failed / Path(cfg.dead_letter).name} with its error; " if dead else "")
                       + f"{cfg.out} and the other outputs are unchanged: fix the annotations or ingest.annotations")
    _write_jsonl(Path(cfg.out), records)
    _write_jsonl(Path(cfg.dead_letter), dead)
    by_reason = Counter(d["reason"] for d in dead)
    by_source: Counter[str] = sum((t.by_source for t in tallies), Counter())
    summary = {
        "inputs": inputs, "records": len(records), "dead_letters": len(dead),
        "reconciled": inputs == len(records) + len(dead),
        "clipped": sum(t.clipped for t in tallies), "by_reason": dict(sorted(by_reason.items())),
        "videos": len({r.video_id for r in records}), "videos_indexed": len(videos),
        "files": [t.as_dict() for t in tallies],
        "sources": source_table(sources, by_source),
        "outputs": {"records": cfg.out, "dead_letter": cfg.dead_letter},
        "config_hash": config_hash(cfg), "seconds": round(time.perf_counter() - t0, 3),
    }
    Path(cfg.summary).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.summary).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary
