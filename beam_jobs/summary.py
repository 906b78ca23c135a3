"""The stage's accounting: manifest.json (counts that reconcile, drops per reason, lineage) and the
end-of-run summary table. Pure functions over the small outputs gathered at the end of the pipeline."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from beam_jobs.items import FAILED, FILTERED, KEPT, AuditRow, Outcome
from beam_jobs.text_bias import histogram_bins
from vtg.shards import SHARD_CONTRACT, data_version_of


class ReconcileError(AssertionError):
    """inputs != kept + filtered + failed: a record was lost or counted twice (a bug, never user error)."""


def inputs_digest(records_sha256: str, video_digests: Iterable[tuple[str, str]]) -> str:
    h = hashlib.sha256(b"records\0" + records_sha256.encode() + b"\n")
    for path, digest in sorted(set(video_digests)):
        h.update(path.encode() + b"\0" + digest.encode() + b"\n")
    return h.hexdigest()


def outcome_cell(o: Outcome, bins: int) -> tuple[str, str, int, int]:
    """(status, reason, start bin, end bin): what the manifest needs of one outcome (-1 bins: no moment)."""
    bs, be = histogram_bins(o.span, bins) if o.span is not None else (-1, -1)
    return o.status, o.reason, bs, be


INPUTS, CELLS, FILTERED_ROWS, WINDOW_DROPS, SHARDS, DEAD, DIGESTS, AUDITED, AUDIT_ROWS, SOURCES = (
    "inputs", "cells", "filtered", "window_drops", "shards", "dead", "digests", "audited", "audit_rows", "sources")
COUNTERS = (CELLS, WINDOW_DROPS, AUDITED, SOURCES)
LISTS = (FILTERED_ROWS, SHARDS, DEAD, DIGESTS, AUDIT_ROWS)


@dataclass
class Facts:
    """Everything the manifest and the logs are built from, gathered from (kind, value) facts."""

    inputs: int = 0
    cells: Counter = field(default_factory=Counter)
    """(status, reason, start bin, end bin) -> records."""
    window_drops: Counter = field(default_factory=Counter)
    filtered: list = field(default_factory=list)
    """(annotation_id, video_id, reason, detail) per filtered record."""
    shards: list = field(default_factory=list)
    dead: list = field(default_factory=list)
    digests: list = field(default_factory=list)
    """(video path, sha256) per video read."""
    audited: Counter = field(default_factory=Counter)
    """(split, flags or None) -> queries the audit saw (None: the audit raised for their video)."""
    audit_rows: list = field(default_factory=list)
    """One audit.jsonl row per flagged query."""
    sources: Counter = field(default_factory=Counter)
    """(source, licence, "records" | split) -> records read / queries kept in that split."""

    def add(self, kind: str, value) -> None:
        if kind == INPUTS:
            self.inputs += value
        elif kind == SOURCES:
            key, n = value
            self.sources[key] += n
        elif kind in COUNTERS:
            getattr(self, kind)[value] += 1
        else:
            getattr(self, kind).append(value)

    def merge(self, other: Facts) -> None:
        self.inputs += other.inputs
        for name in COUNTERS:
            getattr(self, name).update(getattr(other, name))
        for name in LISTS:
            getattr(self, name).extend(getattr(other, name))


def outcome_facts(o: Outcome, bins: int):
    """An outcome's facts: its manifest cell, and its row of filtered.jsonl when it was filtered."""
    yield CELLS, outcome_cell(o, bins)
    if o.status == FILTERED:
        yield FILTERED_ROWS, (o.annotation_id, o.video_id, o.reason, o.detail)


def audit_facts(row: AuditRow):
    """An audited query's facts: its count under (split, flags), and its audit.jsonl row when flagged."""
    yield AUDITED, (row.split, None if row.flags is None else tuple(row.flags))
    if row.flags:
        yield AUDIT_ROWS, {"annotation_id": row.annotation_id, "video_id": row.video_id, "split": row.split,
                           "flags": list(row.flags), "detail": row.flags, "filtered": row.filtered}


def source_input_fact(record) -> tuple[str, tuple]:
    """A parsed record, counted under its source and licence."""
    return SOURCES, ((record.source, record.licence, "records"), 1)


def source_kept_facts(sample):
    """A written sample's queries, each counted under its source, licence and split."""
    split, (meta, _) = sample
    for q in meta.queries:
        yield SOURCES, ((q.source, q.licence, split), 1)


def source_rows(counts: dict[tuple, int]) -> list[dict]:
    """Per (source, licence): records read and queries kept per split (the manifest's `sources`)."""
    rows: dict[tuple[str, str], dict] = {}
    for (source, licence, what), n in counts.items():
        row = rows.setdefault((source, licence), {"source": source, "licence": licence, "records": 0, "kept": {}})
        if what == "records":
            row["records"] += n
        else:
            row["kept"][what] = row["kept"].get(what, 0) + n
    return [{**r, "kept": dict(sorted(r["kept"].items()))} for _, r in sorted(rows.items())]


def location_histograms(cells: dict[tuple, int], bins: int) -> dict[str, dict[str, list[int]]]:
    hist = {pop: {"start": [0] * bins, "end": [0] * bins} for pop in ("all", "kept")}
    for (status, _, bs, be), n in cells.items():
        if bs < 0:
            continue
        for pop in ("all", "kept") if status == KEPT else ("all",):
            hist[pop]["start"][bs] += n
            hist[pop]["end"][be] += n
    return hist


def build_manifest(*, n_inputs: int, cells: dict[tuple, int], window_events: dict[str, int],
                   shards: list[dict], n_dead: int, lineage: dict, bins: int,
                   sources: dict[tuple, int] | None = None) -> dict:
    """Raises ReconcileError unless inputs = kept + filtered + failed and failed = dead letters."""
    by = {s: Counter() for s in (KEPT, FILTERED, FAILED)}
    for (status, reason, _, _), n in cells.items():
        by[status][reason] += n
    counts = {"inputs": n_inputs, **{s: sum(c.values()) for s, c in by.items()}}
    if counts["inputs"] != counts[KEPT] + counts[FILTERED] + counts[FAILED]:
        raise ReconcileError(f"counts do not reconcile: {counts}")
    if counts[FAILED] != n_dead:
        raise ReconcileError(f"{counts[FAILED]} failed records but {n_dead} dead letters")
    samples = Counter()
    for s in shards:
        samples[s["split"]] += s["samples"]
    return {
        **lineage,
        "data_version": data_version_of(shards),
        "shard_contract": SHARD_CONTRACT,
        "records": counts,
        "kept_per_split": dict(sorted(by[KEPT].items())),
        "dropped_per_reason": dict(sorted(by[FILTERED].items())),
        "failed_per_reason": dict(sorted(by[FAILED].items())),
        "samples_per_split": dict(sorted(samples.items())),
        "windows_dropped_per_reason": dict(sorted(window_events.items())),
        "shards": sorted(shards, key=lambda s: s["path"]),
        "location_bias": location_histograms(cells, bins),
        "sources": source_rows(sources or {}),
    }


def summary_table(manifest: dict):
    """A rich Table: in, kept (per split), filtered (per reason), failed (per reason)."""
    from rich.table import Table

    rec = manifest["records"]
    t = Table(title="preprocess summary (records = queries)", show_footer=False)
    t.add_column("outcome")
    t.add_column("reason / split")
    t.add_column("records", justify="right")
    t.add_row("[bold]in", "", str(rec["inputs"]))
    for label, key, total in (("kept", "kept_per_split", rec[KEPT]), ("filtered", "dropped_per_reason",
                              rec[FILTERED]), ("failed", "failed_per_reason", rec[FAILED])):
        t.add_row(f"[bold]{label}", "total", str(total))
        for reason, n in manifest[key].items():
            t.add_row("", reason, str(n))
    samples = ", ".join(f"{k}={v}" for k, v in manifest["samples_per_split"].items())
    t.caption = (f"in = kept + filtered + failed: {rec['inputs']} = {rec[KEPT]} + {rec[FILTERED]} + "
                 f"{rec[FAILED]}  |  samples: {samples or 'none'}  |  {len(manifest['shards'])} shards")
    if manifest.get("sources"):
        t.caption += "  |  kept queries by source (licence): " + ", ".join(
            f"{r['source']} ({r['licence'] or 'no licence'}) {sum(r['kept'].values())} of {r['records']}"
            for r in manifest["sources"])
    if "audit" in manifest:
        a = manifest["audit"]
        t.caption += (f"  |  audit: {sum(a['flagged'].values())} of {sum(a['queries'].values())} queries "
                      f"flagged ({a['list']})")
    return t
