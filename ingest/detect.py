"""`ingest.format: auto`: decide a file's annotation format from its extension and content."""

from __future__ import annotations

import json
from pathlib import Path

from ingest.items import lines
from vtg.errors import VTGError

FORMATS = ("charades", "qvhighlights", "activitynet", "timelens", "jsonl")
ANNOTATION_EXTENSIONS = (".txt", ".json", ".jsonl")
_HINT = "set ingest.format to one of " + ", ".join(FORMATS)


def _first_json_object(text: str) -> dict | None:
    for line in lines(text):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def detect_format(path: Path, text: str) -> str:
    ext = path.suffix.lower()
    if ext == ".txt" and any("##" in line for line in lines(text)[:20]):
        return "charades"
    if ext in (".jsonl", ".json"):
        obj = _first_json_object(text) if ext == ".jsonl" else None
        if obj is not None:
            if "relevant_windows" in obj or "qid" in obj:
                return "qvhighlights"
            if "windows" in obj or "video_id" in obj:
                return "jsonl"
        if ext == ".json" and text.lstrip().startswith("{"):
            return "timelens" if _timelens(text) else "activitynet"
    raise VTGError(f"{path}: cannot tell the annotation format (Charades .txt with `##`, QVHighlights .jsonl, "
                   f"ActivityNet .json, TimeLens-Bench .json, native .jsonl); {_HINT}")


def _timelens(text: str) -> bool:
    """A .json object whose first video entry has TimeLens-Bench's `spans` and `queries` (ActivityNet's has
    `timestamps` and `sentences`); JSON that does not parse is left to the ActivityNet reader's dead letter."""
    from ingest.formats.timelens import looks_like

    try:
        return looks_like(json.loads(text))
    except ValueError:
        return False


def expand_annotation_paths(paths: list[str]) -> list[Path]:
    """Files as given; directories expand to their annotation files (sorted, non-recursive)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in ANNOTATION_EXTENSIONS)
            if not found:
                raise VTGError(f"{p}: no annotation files (*.txt, *.json, *.jsonl) in this directory; "
                               "set ingest.annotations to your files or build the corpus first (python -m corpus)")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise VTGError(f"{p}: annotation file not found; set ingest.annotations=[<file or directory>] "
                           "or build the synthetic corpus first (python -m corpus)")
    return out
