"""Issue 21, input hygiene: text from users is read as written. Annotation files saved by Windows tools (CRLF line
endings, a UTF-8 byte-order mark, UTF-16) kept every line, and a caption holding a character that
`str.splitlines` treats as a line break (U+2028, U+0085, a form feed) is one line, its query unchanged. Before,
the mark made the first line `unparsable`, UTF-16 was "not UTF-8 text", and such a caption was cut in two
dead letters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.declared import declared

from ingest import ingest
from vtg.config import IngestConfig
from vtg.records import read_jsonl

QUERIES = ["a person opens the door", "café au lait\u2028is poured", "two lines\u0085in one caption",
           "a form\x0cfeed", "ünïcödé and 中文 text"]


def _run(tmp_path: Path, name: str, data: bytes) -> tuple[list[dict], list[dict]]:
    videos = tmp_path / "videos"
    videos.mkdir(exist_ok=True)
    (videos / "v.mp4").write_bytes(b"")  # located only: the annotations give the duration
    ann = tmp_path / name
    ann.write_bytes(data)
    out = tmp_path / "out"
    ingest(IngestConfig(sources=declared(tmp_path),
                        annotations=[str(ann)], video_root=str(videos), out=str(out / "r.jsonl"),
                        dead_letter=str(out / "d.jsonl"), summary=str(out / "s.json")))
    return list(read_jsonl(out / "r.jsonl")), list(read_jsonl(out / "d.jsonl"))


def _native(newline: str) -> str:
    return "".join(json.dumps({"annotation_id": f"a{i}", "video_id": "v", "query": q, "windows": [[0.5, 1.5]],
                               "duration_s": 5.0}, ensure_ascii=False) + newline for i, q in enumerate(QUERIES))


@pytest.mark.parametrize("encoding,newline", [("utf-8", "\r\n"), ("utf-8-sig", "\n"), ("utf-8-sig", "\r\n"),
                                              ("utf-16", "\r\n"), ("utf-8", "\r")])
def test_native_jsonl_is_read_as_written(tmp_path, encoding, newline):
    records, dead = _run(tmp_path, "ann.jsonl", _native(newline).encode(encoding))
    assert dead == [] and [r["query"] for r in records] == QUERIES


def test_charades_txt_with_crlf_and_a_mark(tmp_path):
    text = "".join(f"v 0.5 1.5##{q}\r\n" for q in QUERIES[:1] + QUERIES[4:])
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "v.mp4").write_bytes(b"")
    out = tmp_path / "out"
    ann = tmp_path / "charades_sta_test.txt"
    ann.write_bytes(text.encode("utf-8-sig"))
    ingest(IngestConfig(sources=declared(tmp_path),
                        annotations=[str(ann)], video_root=str(videos), out=str(out / "r.jsonl"),
                        dead_letter=str(out / "d.jsonl"), summary=str(out / "s.json")),
           probe=lambda path: (5.0, "probed"))
    assert [r["query"] for r in read_jsonl(out / "r.jsonl")] == [QUERIES[0], QUERIES[4]]
    assert list(read_jsonl(out / "d.jsonl")) == []
