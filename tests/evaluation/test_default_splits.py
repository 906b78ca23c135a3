"""The default splits are big enough to rank checkpoints: at least 400 queries each in val and test.

A 95% interval on a split of n queries is about +-1/sqrt(n) wide at R@1 = 0.5 (+-0.05 at 400): fewer and the
report's intervals could not tell the default recipe's steps apart. Counted without rendering a pixel: the
embedded default's corpus plan (`corpus.plan`, what `python -m corpus` renders) through preprocess's own split
rule (`vtg.splits.split_of` of the partition key, a near-duplicate copy under its original's), keeping the
queries preprocess is built to keep: `normal` events of clean videos (a defective video's are filtered, the
planted text-answerable and duplicate queries are filtered by design). Preprocess's data-driven filters (text
bias, audit) can still move a few: on `make run` the shards held 1296 / 464 / 420 (README) against the 1298 /
464 / 418 counted here."""

from __future__ import annotations

from collections import Counter

from corpus.plan import plan_corpus
from vtg.config import PipelineConfig
from vtg.splits import split_of

FLOOR = 400


def split_query_counts(cfg: PipelineConfig) -> Counter:
    """Queries per split that preprocess keeps from the corpus `cfg.corpus` plans, split by `cfg.preprocess`."""
    counts: Counter = Counter()
    for video in plan_corpus(cfg.corpus):
        defect = video["defect"]
        key = defect.get("of", video["video_id"])  # dedup puts a near-duplicate in its original's cluster
        if defect["kind"] != "none":  # defective videos (and near-duplicate copies) reach no shard
            continue
        split = split_of(key, cfg.preprocess.split_fractions)
        counts[split] += sum(e["kind"] == "normal" for e in video["events"])
    return counts


def test_the_default_splits_hold_400_queries_each_in_val_and_test():
    cfg = PipelineConfig()  # the embedded default (params.yaml is rendered from these classes)
    counts = split_query_counts(cfg)
    assert counts["val"] >= FLOOR and counts["test"] >= FLOOR, dict(counts)
    assert sum(counts.values()) == counts["train"] + counts["val"] + counts["test"]
