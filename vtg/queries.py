"""Stream a split's shards into query examples: one per query, frames decoded, bad samples counted.

Shared by evaluation (scoring a split) and RL (its query pool); the shard format itself is `vtg.shards`.

Shards are read member by member (tar stream, any fsspec URL), so evaluation never holds a split in memory.
A sample that cannot be read (bad JSON, undecodable JPEG, frame count mismatch) is skipped and counted by
reason; an unreadable shard is skipped and counted too, so `queries + skipped` reconcile with the input.
"""

from __future__ import annotations

import json
import logging
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from pydantic import ValidationError

from vtg.shards import SampleMeta, decode_jpegs, member_key

log = logging.getLogger(__name__)


def example_key(sample_key: str, query_index: int) -> str:
    """`<sample key>#<query index>`: names one query of one window in predictions.jsonl."""
    return f"{sample_key}#{query_index}"


@dataclass
class QueryExample:
    """One query of one window, with what scoring and the report need."""

    key: str
    """`<sample key>#<query index>`."""
    query: str
    windows: list[tuple[float, float]]
    duration_s: float
    source: str
    frames: np.ndarray
    timestamps: list[float]


@dataclass
class ReadStats:
    samples: int = 0
    queries: int = 0
    skipped: Counter = field(default_factory=Counter)
    """Reason -> number of samples (or shards) skipped."""


def _group_members(tar: tarfile.TarFile) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Consecutive tar members with the same sample key -> (key, {suffix: bytes})."""
    current, parts = None, {}
    for info in tar:
        if not info.isfile():
            continue
        key, suffix = member_key(info.name)
        if key != current and current is not None:
            yield current, parts
            parts = {}
        current = key
        parts[suffix] = tar.extractfile(info).read()
    if current is not None:
        yield current, parts


def _decode_sample(key: str, parts: dict[str, bytes]) -> tuple[SampleMeta, np.ndarray]:
    if "json" not in parts:
        raise ValueError("missing_json")
    try:
        meta = SampleMeta.model_validate(json.loads(parts["json"]))
    except (ValueError, ValidationError):
        raise ValueError("bad_json") from None
    frame_keys = sorted(k for k in parts if k.endswith(".jpg"))
    if len(frame_keys) != meta.num_frames or len(meta.frame_timestamps) != meta.num_frames or not frame_keys:
        raise ValueError("frame_count_mismatch")
    try:
        frames = decode_jpegs([parts[k] for k in frame_keys])
    except ValueError:
        raise ValueError("bad_jpeg") from None
    return meta, frames


def iter_examples(shards: list[str], stats: ReadStats, limit: int = 0) -> Iterator[QueryExample]:
    """Examples of the given shards in order (one per query); `limit` > 0 stops after that many."""
    import fsspec

    n = 0
    for url in shards:
        try:
            with fsspec.open(url, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
                for key, parts in _group_members(tar):
                    try:
                        meta, frames = _decode_sample(key, parts)
                    except ValueError as e:
                        stats.skipped[str(e)] += 1
                        log.warning("skipping sample %s in %s: %s", key, url, e)
                        continue
                    stats.samples += 1
                    for qi, q in enumerate(meta.queries):
                        stats.queries += 1
                        yield QueryExample(
                            key=example_key(meta.key, qi), query=q.text, windows=[tuple(w) for w in q.windows],
                            duration_s=meta.duration_s, source=meta.source_id,
                            frames=frames, timestamps=list(meta.frame_timestamps))
                        n += 1
                        if limit and n >= limit:
                            return
        except (tarfile.TarError, OSError) as e:
            stats.skipped["unreadable_shard"] += 1
            log.warning("skipping unreadable shard %s: %s", url, e)


def iter_metas(shards: list[str], stats: ReadStats) -> Iterator[SampleMeta]:
    """Every readable sample's `SampleMeta`, reading only the JSON members (fast: no JPEGs)."""
    import fsspec

    for url in shards:
        try:
            with fsspec.open(url, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
                for info in tar:
                    if not (info.isfile() and info.name.endswith(".json")):
                        continue
                    try:
                        meta = SampleMeta.model_validate(json.loads(tar.extractfile(info).read()))
                    except (ValueError, ValidationError):
                        stats.skipped["bad_json"] += 1
                        continue
                    stats.samples += 1
                    yield meta
        except (tarfile.TarError, OSError) as e:
            stats.skipped["unreadable_shard"] += 1
            log.warning("skipping unreadable shard %s: %s", url, e)


def iter_spans(shards: list[str], stats: ReadStats) -> Iterator[tuple[float, list[tuple[float, float]]]]:
    """(window duration, ground-truth windows) per query, reading only the JSON members (fast: no JPEGs)."""
    for meta in iter_metas(shards, stats):
        for q in meta.queries:
            stats.queries += 1
            yield meta.duration_s, [tuple(w) for w in q.windows]
