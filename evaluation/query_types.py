"""Query types for the SFT-vs-RL breakdown: does the window the model sees show a distractor object?

The shards do not say (their format is not changed for this); the synthetic corpus's ground truth does:
`<corpus.out_dir>/ground_truth.json` lists per video its `events` (one per annotation, by `annotation_id`) and its
`distractors` (moving objects no query names, with `start_s`/`end_s` in the video). A query is joined read-only
through its sample's metadata: the query's `source` and `annotation_file` must name the corpus's annotation file
(the declared source whose root holds it, and its path under that root) (shard contract 2: the sample's `source`,
`<format>:<annotation file>`, must be that file), its `video_id` a video of the ground truth, and the query's
`annotation_id` one of that video's events. Then it is

- `distractor`: a distractor is on screen at some time inside the sample's window
  (`[window_start_s, window_end_s)` of the source video), and
- `no_distractor`: none is (the video may have one elsewhere, outside the window the model saw);

and `unknown` when any of the joins fails (real data, no corpus, another annotation file, an id not there), with
the reason counted.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from vtg.queries import ReadStats, example_key, iter_metas
from vtg.shards import list_shards
from vtg.sources import Sources, UndeclaredFile

log = logging.getLogger(__name__)

GROUND_TRUTH_FILE = "ground_truth.json"
"""The corpus stage's ground truth under `corpus.out_dir` (`corpus.GROUND_TRUTH`; a test checks they agree:
evaluation does not import the corpus package)."""
DISTRACTOR, NO_DISTRACTOR, UNKNOWN = "distractor", "no_distractor", "unknown"
QUERY_TYPES = (DISTRACTOR, NO_DISTRACTOR, UNKNOWN)
RULE = ("distractor = the corpus ground truth has a distractor object on screen inside the query's window; "
        "unknown = the query could not be joined to the corpus ground truth (by annotation file, video id and "
        "annotation id)")


def load_truth(corpus_dir: str | Path) -> dict | None:
    """The corpus ground truth, or None when there is none (real data) or it is unreadable."""
    path = Path(corpus_dir) / GROUND_TRUTH_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("videos"), list) else None


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def _from_corpus(meta, query, annotation_file: Path | None, corpus_file: tuple[str, str] | None) -> bool:
    """Whether a query's line is the corpus's annotation file's: by (source id, path under its root) for shard
    contract 3, by the file path in the sample's `source` for contract 2."""
    if annotation_file is None:
        return False
    if meta.contract >= 3:
        return corpus_file is not None and (query.source, query.annotation_file.partition(":")[2]) == corpus_file
    source_file = meta.source.partition(":")[2]
    return bool(source_file) and _same_file(source_file, annotation_file)


def classify_samples(metas, truth: dict | None, corpus_dir: str | Path, sources: Sources | None = None
                     ) -> tuple[dict[str, str], Counter]:
    """({example key: query type}, Counter of why queries are `unknown`) for samples' `SampleMeta`s; `sources`
    (`ingest.sources`) name the corpus's annotation file as records and samples do."""
    types: dict[str, str] = {}
    unknown: Counter = Counter()
    videos = {v["video_id"]: v for v in truth["videos"]} if truth else {}
    annotation_file = Path(corpus_dir) / truth["annotation_file"] if truth and truth.get("annotation_file") else None
    corpus_file = None
    if annotation_file is not None and sources is not None:
        try:
            decl, rel = sources.owner_of(annotation_file)
            corpus_file = (decl.id, rel)
        except UndeclaredFile:
            pass
    for meta in metas:
        video = videos.get(meta.video_id)
        events = {e["annotation_id"] for e in video.get("events", [])} if video else set()
        seen = any(d["start_s"] < meta.window_end_s and d["end_s"] > meta.window_start_s
                   for d in (video or {}).get("distractors", []))
        for qi, q in enumerate(meta.queries):
            key = example_key(meta.key, qi)
            if truth is None:
                reason = "no_ground_truth"
            elif not _from_corpus(meta, q, annotation_file, corpus_file):
                reason = "other_source"
            elif video is None:
                reason = "unknown_video"
            else:
                reason = None if q.annotation_id in events else "unknown_annotation"
            if reason:
                types[key] = UNKNOWN
                unknown[reason] += 1
            else:
                types[key] = DISTRACTOR if seen else NO_DISTRACTOR
    return types, unknown


def query_types(shards_dir: str | Path, split: str, corpus_dir: str | Path, sources: Sources | None = None
                ) -> tuple[dict[str, str], dict]:
    """({example key: query type} for every query of `split`, a JSON-able note on the join)."""
    truth = load_truth(corpus_dir)
    stats = ReadStats()
    types, unknown = classify_samples(iter_metas(list_shards(shards_dir, split), stats), truth, corpus_dir,
                                      sources)
    if truth is None:
        log.info("no corpus ground truth in %s: every query's type is %s", corpus_dir, UNKNOWN)
    return types, {"ground_truth": str(Path(corpus_dir) / GROUND_TRUTH_FILE), "found": truth is not None,
                   "unknown_reasons": dict(sorted(unknown.items())), "rule": RULE}
