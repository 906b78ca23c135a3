"""DoFns and composite PTransforms. They only wire the pure steps (probe, scenes, frames, quality, dedup,
text_bias, partition) into Beam: resolve inputs, call the core, count, and route bad input to dead letters."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
from pathlib import Path

import apache_beam as beam
import cv2
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from pydantic import ValidationError

from beam_jobs import dedup
from beam_jobs.items import FAILED, FILTERED, Outcome, StepError, VideoSig
from beam_jobs.probe import DecodeError, duration_slack_s, file_sha256, local_copy
from beam_jobs.text_bias import add_stats, blind_iou, blind_predict, fold_of, normalized_span, token_stats
from beam_jobs.video import audit_records, build_windows, decode, too_short, video_signature
from vtg.config.preprocess import DedupConfig, PreprocessConfig, TextBiasConfig
from vtg.records import CanonicalRecord
from vtg.sources import AmbiguousName, Sources

log = logging.getLogger(__name__)
NS = "preprocess"
DEAD, OUTCOME, SIG, DIGEST, WINDOW_EVENT, ERROR, AUDIT = ("dead", "outcome", "sig", "digest", "window_event",
                                                          "error", "audit")


def dead_letter(stage: str, error: str, record: CanonicalRecord | None = None, line: str | None = None,
                reason: str | None = None) -> dict:
    d = {"stage": stage, "error": error}
    if reason is not None:
        d["reason"] = reason
    if record is not None:
        d.update(annotation_id=record.annotation_id, video_id=record.video_id, video_path=record.video_path)
    if line is not None:
        d["line"] = line[:500]
    return d


def guarded(stage: str, fn, key):
    """`fn` (element, *args) -> iterable of outputs, for one element; if it raises, none of its outputs but one
    `(key(element), StepError)` on the ERROR output instead, which reaches assembly as that element's verdict
    (its records: `processing_error` dead letters). So one bad element never takes the job down."""

    def run(element, *args, **kwargs):
        try:
            out = list(fn(element, *args, **kwargs))
        except Exception as e:  # noqa: BLE001 - one bad element must never take the job down
            err = StepError.of(stage, e)
            log.warning("%s failed for %r: %s", stage, key(element), err.error)
            yield TaggedOutput(ERROR, (key(element), err))
            return
        yield from out

    return run


def annotation_id_of(r: CanonicalRecord) -> str:
    return r.annotation_id


# ---------------------------------------------------------------- records


class ParseRecordFn(beam.DoFn):
    """jsonl line -> CanonicalRecord; an invalid line becomes a dead letter (and a failed outcome)."""

    def __init__(self) -> None:
        self.bad = Metrics.counter(NS, "records_invalid")

    def process(self, line: str):
        try:
            yield CanonicalRecord.model_validate(json.loads(line))
        except Exception as e:  # noqa: BLE001 - any bad line is a dead letter (e.g. RecursionError: deep nesting)
            self.bad.inc()
            if isinstance(e, ValidationError):
                msg = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
            else:
                first = (str(e).splitlines() or [""])[0]
                msg = first if isinstance(e, ValueError) else f"{type(e).__name__}: {first}"
            yield TaggedOutput(DEAD, dead_letter("parse", f"invalid record: {msg}", line=line,
                                                 reason="invalid_record"))
            aid = hashlib.sha256(line.encode()).hexdigest()[:16]
            yield TaggedOutput(OUTCOME, Outcome(f"line:{aid}", "", FAILED, "invalid_record"))


def _first_of_duplicates(item):
    aid, recs = item
    recs = sorted(recs, key=lambda r: r.model_dump_json())
    yield recs[0]
    for r in recs[1:]:
        yield TaggedOutput(DEAD, dead_letter("parse", f"duplicate annotation_id {aid!r}", record=r,
                                             reason="duplicate_annotation_id"))
        yield TaggedOutput(OUTCOME, Outcome(f"{aid}#dup", r.video_id, FAILED, "duplicate_annotation_id",
                                            normalized_span(r.windows, r.duration_s)))


class ReadRecords(beam.PTransform):
    """Lines of the records jsonl (any Beam filesystem) -> valid, unique records (+ DEAD, OUTCOME, "lines")."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def expand(self, pbegin):
        lines = (pbegin | "Read" >> beam.io.ReadFromText(self.path)
                 | "NonEmpty" >> beam.Filter(lambda s: bool(s.strip())))
        parsed = lines | "Parse" >> beam.ParDo(ParseRecordFn()).with_outputs(DEAD, OUTCOME, main="records")
        unique = (parsed.records
                  | "KeyByAnnotation" >> beam.Map(lambda r: (r.annotation_id, r))
                  | "GroupByAnnotation" >> beam.GroupByKey()
                  | "FirstOfDuplicates" >> beam.FlatMap(_first_of_duplicates).with_outputs(
                      DEAD, OUTCOME, main="records"))
        return {
            "records": unique.records,
            DEAD: (parsed[DEAD], unique[DEAD]) | "FlattenDead" >> beam.Flatten(),
            OUTCOME: (parsed[OUTCOME], unique[OUTCOME]) | "FlattenOutcome" >> beam.Flatten(),
            "lines": lines,
        }


def licence_filter(record: CanonicalRecord, allowed: frozenset[str]):
    """A record whose source's licence is not in `preprocess.allowed_licences` (when set) is filtered
    `licence_not_allowed`, with its source and licence; the others pass."""
    if not allowed or record.licence in allowed:
        yield record
        return
    yield TaggedOutput(OUTCOME, Outcome(record.annotation_id, record.video_id, FILTERED, "licence_not_allowed",
                                        _span_or_none(record), f"source {record.source} is "
                                        f"{record.licence or 'without a declared licence'}; allowed: "
                                        f"{', '.join(sorted(allowed))}"))


# ---------------------------------------------------------------- videos


def _span_or_none(r: CanonicalRecord):
    """The record's normalized moment for the location histogram; None if even that fails (a failed record
    must still be counted)."""
    try:
        return normalized_span(r.windows, r.duration_s)
    except Exception:  # noqa: BLE001
        return None


class AmbiguousVideo(ValueError):
    """One video_id names more than one file."""


class DurationMismatch(ValueError):
    """An annotation's duration disagrees with its decoded video."""


def duration_disagrees(annotated_s: float, decoded_s: float) -> bool:
    """Beyond the decoder's own tolerance (`probe.duration_slack_s`, the truncation check's)."""
    return abs(annotated_s - decoded_s) > duration_slack_s(max(annotated_s, decoded_s))


class ProcessVideoFn(beam.DoFn):
    """(video_id, records) -> windows; decode once. Never a crash: an unreadable video -> `unreadable_video`
    dead letters; a video too short to split -> `too_short` (filtered); any other exception while one video is
    processed -> `processing_error` dead letters (exception type, message, stage) for all its records. A video's
    outputs are computed first and emitted only once it succeeded, so a late failure leaks no window."""

    def __init__(self, cfg: PreprocessConfig, progress_dir: str | None = None, sources: Sources | None = None) -> None:
        self.cfg = cfg
        self.progress_dir = progress_dir
        self.sources = sources or Sources([])
        """Where a record's `video_path` (relative to its source's root) is (`Sources.resolve`)."""
        self.ok = Metrics.counter(NS, "videos_decoded")
        self.failed = Metrics.counter(NS, "videos_failed")
        self.errors = Metrics.counter(NS, "videos_processing_error")
        self.short = Metrics.counter(NS, "videos_too_short")
        self.windows = Metrics.counter(NS, "windows_built")
        self.seconds = Metrics.counter(NS, "video_seconds")

    def setup(self) -> None:
        cv2.setNumThreads(1)

    def process(self, item):
        video_id, records = item
        stage = "group"
        try:
            records = sorted(records, key=lambda r: r.annotation_id)
            try:
                paths = sorted({self.sources.resolve(r.video_owner, r.video_path) for r in records})
            except AmbiguousName as e:  # a file of that name appeared in another of the source's roots
                yield from self._fail(records, "group", "ambiguous_video_id", e)
                return
            if len(paths) > 1:  # one id, two files: never merged (whose frames would the queries get?)
                yield from self._fail(records, "group", "ambiguous_video_id", AmbiguousVideo(
                    f"video_id {video_id!r} names {len(paths)} files ({', '.join(paths)}): give each video its own id"))
                return
            path = paths[0]
            named = f"{records[0].source}:{records[0].video_path}"  # lineage names a video by source and path
            # the annotations' majority duration is what the file must hold (a truncated file fails against it);
            # a line that disagrees with the decoded video is rejected alone, not the video
            expected = statistics.median_low([r.duration_s for r in records])
            try:
                stage = "read"
                with local_copy(path) as local:
                    digest = file_sha256(local)[0] if os.path.exists(local) else "missing"
                    yield TaggedOutput(DIGEST, (named, digest))
                    stage = "decode"
                    video = decode(local, self.cfg, expected_duration_s=expected)
            except (DecodeError, OSError, ValueError, cv2.error) as e:
                self.failed.inc()
                yield from self._fail(records, "decode", "unreadable_video", e)
                return
            self.ok.inc()
            off = [r for r in records if duration_disagrees(r.duration_s, video.duration_s)]
            if off:
                records = [r for r in records if r not in off]
                for r in off:
                    yield from self._fail([r], "decode", "duration_mismatch", DurationMismatch(
                        f"the annotation says {r.duration_s:g} s but {path} decodes to {video.duration_s:.2f} s"))
                if not records:
                    return
            self.seconds.inc(round(video.duration_s))
            stage = "too_short"
            short = too_short(video, self.cfg)
            if short is not None:
                self.short.inc()
                for r in records:
                    yield TaggedOutput(OUTCOME, Outcome(r.annotation_id, r.video_id, FILTERED, "too_short",
                                                        normalized_span(r.windows, r.duration_s), short))
                return
            stage = "build_windows"
            windows, dropped, window_drops = build_windows(video_id, records, video, self.cfg)
            stage = "signature"
            sig = video_signature(video_id, video, len(windows), self.cfg)
        except Exception as e:  # noqa: BLE001 - one bad video must never take the job down
            log.warning("video %s failed in %s: %s: %s", video_id, stage, type(e).__name__, e)
            self.errors.inc()
            yield from self._fail(list(records), stage, "processing_error", e)
            return
        finally:
            self._tick(video_id)
        self.windows.inc(len(windows))
        for w in windows:
            yield (video_id, w)
        for o in dropped:
            yield TaggedOutput(OUTCOME, o)
        for reason in window_drops:
            yield TaggedOutput(WINDOW_EVENT, reason)
        yield TaggedOutput(SIG, sig)
        yield TaggedOutput(AUDIT, (video_id, self._audit(video_id, records, video)))

    def _audit(self, video_id: str, records, video) -> dict | StepError:
        """The audit's flags, or the StepError it raised: the audit never takes a video down (assembly fails the
        video's queries only when they would be filtered by it)."""
        try:
            return audit_records(records, video, self.cfg)
        except Exception as e:  # noqa: BLE001 - one bad video must never take the job down
            log.warning("audit failed for video %s: %s: %s", video_id, type(e).__name__, e)
            return StepError.of("audit", e)

    def _fail(self, records, stage: str, reason: str, e: BaseException):
        error = str(e) if isinstance(e, (DecodeError, AmbiguousVideo, DurationMismatch)) else f"{type(e).__name__}: {e}"
        for r in records:
            d = dead_letter(stage, error, record=r)
            d.update(reason=reason, error_type=type(e).__name__)
            yield TaggedOutput(DEAD, d)
            yield TaggedOutput(OUTCOME, Outcome(r.annotation_id, r.video_id, FAILED, reason,
                                                _span_or_none(r)))

    def _tick(self, video_id: str) -> None:
        if self.progress_dir:
            name = hashlib.sha256(video_id.encode()).hexdigest()[:24]
            Path(self.progress_dir, name).touch()


# ---------------------------------------------------------------- near-duplicates


def _band_keys(item, num_perm: int, seed: int, bands: int):
    """(id, shingles, rank, scope, span) -> ((scope, band, band hash), id) per band: ids only, so the bucket
    shuffle moves ~50 bytes per band rather than the shingles (1.5 KB per video, times 32 bands)."""
    hv = dedup.signatures([item[1]], num_perm, seed)[0]
    return [((item[3], *k), item[0]) for k in dedup.band_keys(hv, bands)]


def _payload(item):
    """What verification needs of an item: (id, (packed shingles, rank, span))."""
    return item[0], (dedup.pack(item[1]), item[2], item[4])


def _first_halves(kv):
    """An item with the partners it was paired with (in any band) -> (partner, (id, payload)) once per partner:
    every candidate pair reaches its second member with the first member's shingles."""
    a, joined = kv
    for payload in joined["item"]:
        for b in sorted(set(joined["pair"])):
            yield b, (a, payload)


class _VerifyPairs(beam.DoFn):
    """(b, {item: [b's payload], half: [(a, a's payload) per candidate pair]}) -> verified edges
    (a, rank a, b, rank b)."""

    def __init__(self, threshold: float, span_iou: float | None, stage: str = "dedup") -> None:
        self.threshold = threshold
        self.span_iou = span_iou
        self.stage = stage
        self.pairs = Metrics.counter(NS, "dedup_candidate_pairs")

    def process(self, kv):
        yield from guarded(self.stage, self._verify, key=lambda kv: kv[0])(kv)

    def _verify(self, kv):
        b, joined = kv
        halves = sorted(joined["half"])
        if not halves:  # b was no pair's second member
            return
        for blob_b, rank_b, span_b in joined["item"]:
            shingles_b = set(dedup.unpack(blob_b))
            for a, (blob_a, rank_a, span_a) in halves:
                self.pairs.inc()
                if dedup.jaccard(dedup.unpack(blob_a), shingles_b) < self.threshold:
                    continue
                if self.span_iou is not None:
                    from beam_jobs.text_bias import SCALE, iou

                    if iou((span_a[0] / SCALE, span_a[1] / SCALE),
                           (span_b[0] / SCALE, span_b[1] / SCALE)) < self.span_iou:
                        continue
                yield (a, rank_a, b, rank_b)


def _resolve(edges):
    """Verified edges -> sorted (member, canonical) pairs."""
    edges = sorted(set(edges))
    rank = {}
    for a, ra, b, rb in edges:
        rank[a], rank[b] = ra, rb
    return sorted(dedup.resolve_clusters([(a, b) for a, _, b, _ in edges], rank).items())


class NearDuplicates(beam.PTransform):
    """(id, shingles, rank, scope[, span]) items -> (id, canonical id) for members of duplicate clusters, and
    (id, StepError) for an item whose hashing or verification raised.

    Band keys are scoped (videos: one global scope; queries: their video) and grouped with a GroupByKey into
    candidate pairs of ids; each pair meets its two members' shingles in two more GroupByKeys (by its first,
    then its second member) and is verified by exact Jaccard; only the verified edges (duplicates, not the
    data set) are gathered to resolve clusters."""

    def __init__(self, cfg: DedupConfig, threshold: float, span_iou: float | None = None,
                 stage: str = "dedup") -> None:
        super().__init__()
        self.cfg, self.threshold, self.span_iou, self.stage = cfg, threshold, span_iou, stage

    def expand(self, items):
        c, key = self.cfg, (lambda item: item[0])
        payloads = items | "Payload" >> beam.FlatMap(
            guarded(self.stage, lambda item: [_payload(item)], key)).with_outputs(ERROR, main="ok")
        bands = items | "BandKeys" >> beam.FlatMap(
            guarded(self.stage, _band_keys, key), c.num_perm, c.seed, c.bands).with_outputs(ERROR, main="ok")
        pairs = (bands.ok
                 | "GroupBands" >> beam.GroupByKey()
                 | "CandidatePairs" >> beam.FlatMap(lambda kv: dedup.candidate_pairs(kv[1])))  # (first, second)
        halves = ({"item": payloads.ok, "pair": pairs}
                  | "ByFirst" >> beam.CoGroupByKey()
                  | "FirstHalves" >> beam.FlatMap(_first_halves))
        verified = ({"item": payloads.ok, "half": halves}
                    | "BySecond" >> beam.CoGroupByKey()
                    | "Verify" >> beam.ParDo(_VerifyPairs(self.threshold, self.span_iou, self.stage)).with_outputs(
                        ERROR, main="edges"))
        clusters = (verified.edges
                    | "OneKey" >> beam.Map(lambda edge: (None, edge))
                    | "GatherEdges" >> beam.GroupByKey()
                    | "Resolve" >> beam.FlatMap(lambda kv: _resolve(kv[1])))
        # an item that failed here: (id, StepError) beside the (member, canonical) pairs
        return (clusters, payloads[ERROR], bands[ERROR], verified[ERROR]) | "WithErrors" >> beam.Flatten()


def video_dedup_items(sig: VideoSig):
    return (sig.video_id, sig.shingles, sig.rank, "", None)


def query_dedup_items(r: CanonicalRecord, ngram: int):
    return (r.annotation_id, dedup.query_shingles(r.query, ngram), (r.annotation_id,), r.video_id,
            normalized_span(r.windows, r.duration_s))


# ---------------------------------------------------------------- text bias


class TextBias(beam.PTransform):
    """records -> (annotation_id, blind IoU), cross-fitted by source-video folds; (annotation_id, StepError) for
    a record whose statistics or score raised (it then adds nothing to the statistics)."""

    def __init__(self, cfg: TextBiasConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def expand(self, records):
        folds = self.cfg.folds
        tokens = records | "TokenStats" >> beam.FlatMap(
            guarded("text_bias", _token_stats, annotation_id_of), folds).with_outputs(ERROR, main="stats")
        stats = (tokens.stats
                 | "SumPerTokenFold" >> beam.CombinePerKey(add_stats)
                 | "ByToken" >> beam.Map(lambda kv: (kv[0][0], ((kv[0][1], kv[0][2]), kv[1])))
                 | "GroupByToken" >> beam.GroupByKey()
                 | "TokenTable" >> beam.Map(lambda kv: (kv[0], dict(kv[1]))))
        scores = records | "BlindIoU" >> beam.FlatMap(
            guarded("text_bias", lambda r, st, cfg: [_score(r, st, cfg)], annotation_id_of),
            beam.pvalue.AsDict(stats), self.cfg).with_outputs(ERROR, main="scores")
        return (scores.scores, scores[ERROR], tokens[ERROR]) | "WithErrors" >> beam.Flatten()


def _token_stats(r: CanonicalRecord, folds: int):
    fold = fold_of(r.video_id, folds)
    return [((tok, param, fold), st) for (tok, param), st in token_stats(r.query, r.windows, r.duration_s)]


def _score(r: CanonicalRecord, stats: dict, cfg: TextBiasConfig) -> tuple[str, float]:
    pred = blind_predict(r.query, r.duration_s, fold_of(r.video_id, cfg.folds), stats, cfg.min_count,
                         cfg.max_std)
    return r.annotation_id, blind_iou(pred, r.windows)
