"""Assembly of the final samples, shard writing (only through `vtg.shards.write_shard`) and the stage's
small outputs (manifest.json, dead_letter.jsonl, location_bias.png). Paths go through Beam FileSystems, so
`out_dir` may be gs://, s3://, ...; shards are built in a local temp file first when the target is remote."""

from __future__ import annotations

import bisect
import json
import logging
import os
import re
import shutil
import tempfile

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from beam_jobs.audit import filter_reason
from beam_jobs.items import FAILED, FILTERED, KEPT, AuditRow, Outcome, QueryItem, StepError, WindowItem, pick
from vtg.io import file_digest
from vtg.shards import SHARD_CONTRACT, SHARD_PATTERN, QueryMeta, SampleMeta, write_shard
from vtg.sources import is_auto
from vtg.splits import split_of

log = logging.getLogger(__name__)
NS = "preprocess"
OUTCOME, DEAD, AUDIT = "outcome", "dead", "audit"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def sample_key(video_id: str, index: int) -> str:
    """Tar member prefix. No dots: plain `webdataset` splits a member name at its first dot."""
    return f"{_UNSAFE.sub('_', video_id)}-{index:04d}"


def query_verdict(annotation_id: str, dup_of: str | None, bias_iou: float, bias_threshold: float,
                  bias_enabled: bool) -> str | None:
    """Drop reason of one query that reached a usable window, or None to keep it."""
    if dup_of is not None and dup_of != annotation_id:
        return "duplicate_query"
    if bias_enabled and bias_iou >= bias_threshold:
        return "text_answerable"
    return None


def failed(err: StepError, q: QueryItem, w: WindowItem):
    """A `processing_error` dead letter and failed outcome for one query (as `ProcessVideoFn` writes them)."""
    yield TaggedOutput(DEAD, {"stage": err.stage, "error": err.error, "reason": "processing_error",
                              "error_type": err.error_type, "annotation_id": q.annotation_id,
                              "video_id": w.video_id, "video_path": w.video_path})
    yield TaggedOutput(OUTCOME, Outcome(q.annotation_id, w.video_id, FAILED, "processing_error", q.span))


class AssembleFn(beam.DoFn):
    """(video_id, {windows, cluster, verdicts, audit}) -> (split, SampleMeta, jpegs) samples + record outcomes +
    the audit's verdict (AUDIT) on every query that reaches a split. Never a crash: a StepError verdict
    (near-duplicate detection or text bias raised for the video or a query; the audit, when it filters) or an
    exception here dead-letters the queries concerned (`processing_error`); a video's outputs are emitted only
    once all of them were built. With `audit.filter` empty the audit decides nothing."""

    def __init__(self, cfg, version: str) -> None:
        self.cfg, self.version = cfg, version
        self.kept = Metrics.counter(NS, "samples_kept")
        self.errors = Metrics.counter(NS, "assemble_processing_error")

    def process(self, item):
        video_id, joined = item
        windows = sorted(joined["windows"], key=lambda w: w.index)
        try:
            out = list(self._assemble(video_id, windows, joined))
        except Exception as e:  # noqa: BLE001 - one bad video must never take the job down
            err = StepError.of("assemble", e)
            log.warning("video %s failed in assemble: %s", video_id, err.error)
            self.errors.inc()
            out = [o for w in windows for q in w.queries for o in failed(err, q, w)]
        self.kept.inc(sum(not isinstance(o, TaggedOutput) for o in out))
        yield from out

    def _assemble(self, video_id: str, windows: list[WindowItem], joined):
        canon = pick(joined["cluster"], video_id)
        if isinstance(canon, StepError):  # near-duplicate detection raised for this video
            yield from (o for w in windows for q in w.queries for o in failed(canon, q, w))
            return
        verdicts = {aid: (dup, iou) for aid, dup, iou in joined["verdicts"]}
        audit = pick(joined.get("audit", ()), {})
        split = split_of(canon, self.cfg.split_fractions)
        for w in windows:
            if canon != video_id:
                for q in w.queries:
                    yield TaggedOutput(OUTCOME, Outcome(q.annotation_id, video_id, FILTERED,
                                                        "near_duplicate_video", q.span, f"of {canon}"))
                continue
            kept = []
            for q in w.queries:
                dup, iou = verdicts.get(q.annotation_id, (None, 0.0))
                err = next((v for v in (dup, iou) if isinstance(v, StepError)), None)
                if err is not None:  # query dedup or text bias raised for this query
                    yield from failed(err, q, w)
                    continue
                reason = query_verdict(q.annotation_id, dup, iou, self.cfg.text_bias.iou_threshold,
                                       self.cfg.text_bias.enabled)
                detail = (f"of {dup}; " if reason == "duplicate_query" else "") + f"blind_iou {iou}" if reason else ""
                if not reason and split != "train" and is_auto(q.source):  # auto labels train only, never score
                    reason, detail = "auto_label_not_train", f"{q.source} label of a {split}-split video"
                if not reason:  # it reaches its split: the audit's turn
                    if isinstance(audit, StepError) and self.cfg.audit.filter:
                        yield from failed(audit, q, w)
                        continue
                    row = self._audit_row(q, w.video_id, split, audit)
                    yield TaggedOutput(AUDIT, row)
                    if row.filtered:
                        reason, detail = row.filtered, json.dumps(row.flags, sort_keys=True)
                status = (FILTERED, reason) if reason else (KEPT, split)
                yield TaggedOutput(OUTCOME, Outcome(q.annotation_id, video_id, *status, q.span, detail))
                if not reason:
                    kept.append(QueryMeta(text=q.text, windows=q.windows, annotation_id=q.annotation_id,
                                          annotation_file=q.annotation_file, source=q.source,
                                          licence=q.licence, text_bias_iou=iou))
            if kept:
                yield split, (self._meta(w, kept, canon, split), w.jpegs)

    def _audit_row(self, q: QueryItem, video_id: str, split: str, audit: dict | StepError) -> AuditRow:
        """The audit's verdict on a query about to be kept (flags None: the audit raised for its video)."""
        if isinstance(audit, StepError):
            return AuditRow(q.annotation_id, video_id, split, None)
        flags = audit.get(q.annotation_id, {})
        return AuditRow(q.annotation_id, video_id, split, flags, filter_reason(flags, self.cfg.audit.filter))

    def _meta(self, w: WindowItem, queries: list[QueryMeta], cluster: str, split: str) -> SampleMeta:
        return SampleMeta(
            key=sample_key(w.video_id, w.index), video_id=w.video_id, window_index=w.index,
            window_start_s=w.start_s, window_end_s=w.end_s, frame_timestamps=w.timestamps, fps=w.fps,
            num_frames=len(w.jpegs), queries=queries, quality=w.quality, cluster_id=cluster, split=split,
            source=w.source, licence=w.licence, preprocess_version=self.version, frame_mode=self.cfg.frame_mode,
            scene_cuts=w.scene_cuts, contract=SHARD_CONTRACT, source_fps=w.source_fps, frame_indices=w.frame_indices)


def _assign_shard(sample, keys: dict, per_shard: int):
    split, (meta, jpegs) = sample
    return (split, bisect.bisect_left(keys[split], meta.key) // per_shard), (meta, jpegs)


class WriteShardFn(beam.DoFn):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.shards = Metrics.counter(NS, "shards_written")

    def process(self, item):
        (split, index), samples = item
        samples = sorted(samples, key=lambda s: s[0].key)
        target = FileSystems.join(self.out_dir, split, SHARD_PATTERN % index)
        with tempfile.TemporaryDirectory() as tmp:
            local = target if "://" not in target else os.path.join(tmp, SHARD_PATTERN % index)
            n = write_shard(local, samples)
            digest = file_digest(local)
            if local != target:
                with open(local, "rb") as src, FileSystems.create(target) as dst:
                    shutil.copyfileobj(src, dst)
        self.shards.inc()
        yield {"split": split, "path": f"{split}/{SHARD_PATTERN % index}", "samples": n, "sha256": digest}


class WriteShards(beam.PTransform):
    """(split, (meta, jpegs)) -> shard info dicts. Samples are sorted by key within a split and cut into
    shards of `per_shard`, so the same samples always give the same shard files."""

    def __init__(self, out_dir: str, per_shard: int) -> None:
        super().__init__()
        self.out_dir, self.per_shard = out_dir, per_shard

    def expand(self, samples):
        keys = (samples
                | "Keys" >> beam.Map(lambda s: (s[0], s[1][0].key))
                | "GroupKeys" >> beam.GroupByKey()
                | "SortKeys" >> beam.Map(lambda kv: (kv[0], sorted(kv[1]))))
        return (samples
                | "AssignShard" >> beam.Map(_assign_shard, beam.pvalue.AsDict(keys), self.per_shard)
                | "GroupShard" >> beam.GroupByKey()
                | "Write" >> beam.ParDo(WriteShardFn(self.out_dir)))


def write_text(path: str, text: str) -> None:
    with FileSystems.create(path) as f:
        f.write(text.encode())
