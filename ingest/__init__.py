"""Annotation ingest: Charades-STA txt, QVHighlights jsonl, ActivityNet Captions json or native jsonl ->
canonical records (`vtg.records.CanonicalRecord`, docs/architecture.md).

`python -m ingest [--params P] [-e EXP] [key=value ...]` (or `ingest(cfg.ingest)`) reads
`ingest.annotations` (files, or directories of *.txt/*.json/*.jsonl), locates each video by id under
`ingest.video_root` (.mp4 .avi .mkv .webm .mov, recursively) and writes:

- `ingest.out`: one canonical record per valid (video, query), in input order;
- `ingest.dead_letter`: one JSON object per rejected item: file, line (1-based; ActivityNet: the video's
  line), format, reason (codes in `ingest.reasons`), detail, annotation_id, raw;
- `ingest.summary`: counts per file and reason; `inputs == records + dead_letters` is asserted.

Ends beyond the duration by at most `ingest.end_tolerance_s` are clipped (counted as `clipped`). Ingest
checks only that a video file exists -- except for Charades, whose annotations carry no durations: there the
video is probed with OpenCV and an unreadable file is a dead letter (`unprobeable_video`). Zero-byte or corrupt
videos otherwise pass through to preprocess, which dead-letters them.
"""

from ingest.run import ingest

__all__ = ["ingest"]
