"""The preprocess pipeline graph: records + videos -> shards, manifest.json, dead_letter.jsonl, plot.

    ReadRecords -> GroupByVideo -> ProcessVideo (decode once: scenes, windows, frames, quality, audit flags)
                                     |-> VideoDedup (MinHash LSH bands, GroupByKey, Jaccard, clusters)
    ReadRecords -> QueryDedup, TextBias (cross-fitted blind predictor)
    join by annotation, then by video (+ ProcessVideo's audit) -> Assemble (drops, partition, audit rows)
    -> WriteShards -> Finalize
"""

from __future__ import annotations

import json

import apache_beam as beam

from beam_jobs import summary
from beam_jobs.audit import AUDIT_LOG, manifest_entry
from beam_jobs.items import pick
from beam_jobs.sink import AssembleFn, WriteShards, write_text
from beam_jobs.text_bias import plot_location_bias
from beam_jobs.transforms import (
    AUDIT,
    DEAD,
    DIGEST,
    ERROR,
    OUTCOME,
    SIG,
    WINDOW_EVENT,
    NearDuplicates,
    ProcessVideoFn,
    ReadRecords,
    TextBias,
    annotation_id_of,
    guarded,
    licence_filter,
    query_dedup_items,
    video_dedup_items,
)
from vtg.config.preprocess import PreprocessConfig
from vtg.shards import MANIFEST
from vtg.sources import Sources

DEAD_LETTER, FILTERED_LOG, LOCATION_PLOT = ("dead_letter.jsonl", "filtered.jsonl",
                                                     "location_bias.png")


def _verdicts(item):
    """Per annotation: (video, (annotation, duplicate of, blind IoU)); either verdict may be a StepError."""
    aid, j = item
    for video_id in j["video"]:
        yield video_id, (aid, pick(j["dup"]), pick(j["bias"], 0.0))


def build(p: beam.Pipeline, cfg: PreprocessConfig, lineage: dict, progress_dir: str | None = None,
          sources: Sources | None = None) -> None:
    """Add the whole job to pipeline `p`. `lineage` goes into the manifest (version, params hash, digest);
    `sources` (`ingest.sources`) say where the records' videos are."""
    rec = p | "ReadRecords" >> ReadRecords(cfg.records)
    licensed = rec["records"] | "LicenceFilter" >> beam.FlatMap(
        licence_filter, frozenset(cfg.allowed_licences)).with_outputs(OUTCOME, main="records")
    records = licensed.records
    videos = (records
              | "KeyByVideo" >> beam.Map(lambda r: (r.video_id, r))
              | "GroupByVideo" >> beam.GroupByKey()
              | "ProcessVideo" >> beam.ParDo(ProcessVideoFn(cfg, progress_dir, sources)).with_outputs(
                  DEAD, OUTCOME, SIG, DIGEST, WINDOW_EVENT, AUDIT, main="windows"))
    d = cfg.dedup
    video_items = videos[SIG] | "VideoDedupItems" >> beam.FlatMap(
        guarded("video_dedup", lambda sig: [video_dedup_items(sig)], lambda sig: sig.video_id)).with_outputs(
        ERROR, main="items")
    clusters = ((video_items.items | "VideoDedup" >> NearDuplicates(d, d.video_jaccard, stage="video_dedup"),
                 video_items[ERROR]) | "VideoDedupErrors" >> beam.Flatten())
    query_items = records | "QueryDedupItems" >> beam.FlatMap(
        guarded("query_dedup", lambda r, n: [query_dedup_items(r, n)], annotation_id_of),
        d.query_ngram).with_outputs(ERROR, main="items")
    query_dups = ((query_items.items | "QueryDedup" >> NearDuplicates(d, d.query_jaccard, span_iou=0.5,
                                                                       stage="query_dedup"),
                   query_items[ERROR]) | "QueryDedupErrors" >> beam.Flatten())
    bias = records | "TextBias" >> TextBias(cfg.text_bias)
    verdicts = ({"video": records | "AnnotationVideo" >> beam.Map(lambda r: (r.annotation_id, r.video_id)),
                 "dup": query_dups, "bias": bias}
                | "JoinPerAnnotation" >> beam.CoGroupByKey()
                | "VerdictsByVideo" >> beam.FlatMap(_verdicts))
    assembled = ({"windows": videos.windows, "cluster": clusters, "verdicts": verdicts, "audit": videos[AUDIT]}
                 | "JoinPerVideo" >> beam.CoGroupByKey()
                 | "Assemble" >> beam.ParDo(AssembleFn(cfg, lineage["preprocess_version"])).with_outputs(
                     OUTCOME, DEAD, AUDIT, main="samples"))
    shards = assembled.samples | "WriteShards" >> WriteShards(cfg.out_dir, cfg.samples_per_shard)

    bins = cfg.text_bias.histogram_bins
    facts = ((p | "Start" >> beam.Create([(summary.INPUTS, 0)]),  # so there is a manifest even for no input
              rec["lines"] | "LineFacts" >> beam.Map(lambda _: (summary.INPUTS, 1)),
              (rec[OUTCOME], licensed[OUTCOME], videos[OUTCOME], assembled[OUTCOME]) | "AllOutcomes" >> beam.Flatten()
              | "OutcomeFacts" >> beam.FlatMap(summary.outcome_facts, bins),
              videos[WINDOW_EVENT] | "WindowDropFacts" >> beam.Map(lambda r: (summary.WINDOW_DROPS, r)),
              shards | "ShardFacts" >> beam.Map(lambda s: (summary.SHARDS, s)),
              (rec[DEAD], videos[DEAD], assembled[DEAD]) | "AllDead" >> beam.Flatten()
              | "DeadFacts" >> beam.Map(lambda d: (summary.DEAD, d)),
              videos[DIGEST] | "DigestFacts" >> beam.Map(lambda d: (summary.DIGESTS, d)),
              assembled[AUDIT] | "AuditFacts" >> beam.FlatMap(summary.audit_facts),
              rec["records"] | "SourceInputFacts" >> beam.Map(summary.source_input_fact),
              assembled.samples | "SourceKeptFacts" >> beam.FlatMap(summary.source_kept_facts))
             | "AllFacts" >> beam.Flatten())
    (facts
     | "Summarize" >> beam.CombineGlobally(SummaryFn()).without_defaults()
     | "Finalize" >> beam.ParDo(FinalizeFn(cfg, lineage)))


class SummaryFn(beam.CombineFn):
    """(kind, value) facts -> one `Facts` (counts add up in each worker before they are merged)."""

    def create_accumulator(self) -> summary.Facts:
        return summary.Facts()

    def add_input(self, acc: summary.Facts, fact) -> summary.Facts:
        acc.add(*fact)
        return acc

    def merge_accumulators(self, accs) -> summary.Facts:
        accs = iter(accs)
        out = next(accs)
        for a in accs:
            out.merge(a)
        return out

    def extract_output(self, acc: summary.Facts) -> summary.Facts:
        return acc


class FinalizeFn(beam.DoFn):
    """Writes dead_letter.jsonl, filtered.jsonl, audit.jsonl, manifest.json and the location-bias plot (once,
    after everything)."""

    def __init__(self, cfg: PreprocessConfig, lineage: dict) -> None:
        self.cfg, self.lineage = cfg, lineage

    def process(self, facts: summary.Facts):
        out = self.cfg.out_dir
        dead = sorted(facts.dead, key=lambda d: json.dumps(d, sort_keys=True))
        write_text(f"{out}/{DEAD_LETTER}", "".join(json.dumps(d, sort_keys=True) + "\n" for d in dead))
        rows = sorted(facts.filtered)
        write_text(f"{out}/{FILTERED_LOG}", "".join(json.dumps(dict(zip(
            ("annotation_id", "video_id", "reason", "detail"), r))) + "\n" for r in rows))
        lineage = {**self.lineage, "inputs_digest": summary.inputs_digest(self.lineage["records_sha256"],
                                                                          facts.digests),
                   "videos": len(set(facts.digests))}
        manifest = summary.build_manifest(
            n_inputs=facts.inputs, cells=dict(facts.cells), window_events=dict(facts.window_drops),
            shards=list(facts.shards), n_dead=len(dead), lineage=lineage, bins=self.cfg.text_bias.histogram_bins,
            sources=dict(facts.sources))
        audit_rows = sorted(facts.audit_rows, key=lambda r: (r["split"], r["video_id"], r["annotation_id"]))
        write_text(f"{out}/{AUDIT_LOG}", "".join(json.dumps(r, sort_keys=True) + "\n" for r in audit_rows))
        manifest["audit"] = manifest_entry(facts.audited, self.cfg.audit)
        manifest["outputs"] = {"dead_letter": DEAD_LETTER, "filtered": FILTERED_LOG,
                               "location_bias_plot": LOCATION_PLOT, "audit": AUDIT_LOG}
        plot_location_bias(manifest["location_bias"], f"{out}/{LOCATION_PLOT}")
        write_text(f"{out}/{MANIFEST}", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        yield manifest["records"]
