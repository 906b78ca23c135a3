"""Issue 24 item 1: declared sources. An annotation file under no declared root is refused before anything is
written; records name their source and licence and hold paths under the source's root; a declaration with a
licence that is not an SPDX id is a config error that says how to write it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from support.declared import declared

from ingest import ingest
from vtg.config import IngestConfig, PreprocessConfig
from vtg.records import read_jsonl, read_records
from vtg.sources import SourceDecl, Sources, UndeclaredFile


def _native(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"query": "a person opens a door", "windows": [[0.5, 1.5]],
                                        "duration_s": 5.0, **r}) + "\n" for r in rows))
    return path


def test_a_file_under_no_declared_root_is_refused_and_nothing_is_written(tmp_path, ingest_config):
    ann = _native(tmp_path / "elsewhere" / "ann.jsonl", [{"annotation_id": "a", "video_id": "a"}])
    cfg = ingest_config(ann, sources=declared(tmp_path / "videos"))
    with pytest.raises(UndeclaredFile, match=r"elsewhere/ann\.jsonl: belongs to no declared data source "
                                             r"\(declared roots: test-set: .*videos\)"):
        ingest(cfg)
    assert not Path(cfg.out).exists() and not Path(cfg.summary).exists()


def test_records_name_source_and_licence_with_paths_under_the_root(tmp_path, ingest_config):
    """Two sources, one root nested in the other: a file belongs to the deepest root that holds it."""
    sources = [*declared(tmp_path, id="outer", licence="CC-BY-4.0"),
               *declared(tmp_path / "nc", tmp_path / "videos", id="inner", licence="LicenseRef-Research-Only")]
    a = _native(tmp_path / "ann" / "a.jsonl", [{"annotation_id": "a1", "video_id": "a"}])
    b = _native(tmp_path / "nc" / "b.jsonl", [{"annotation_id": "b1", "video_id": "a"},
                                              {"annotation_id": "b2", "video_id": "b"}])
    cfg = ingest_config(a, b, sources=sources)
    summary = ingest(cfg)
    records = {r.annotation_id: r for r in read_records(cfg.out)}
    assert {k: (r.source, r.licence, r.annotation_file) for k, r in records.items()} == {
        "a1": ("outer", "CC-BY-4.0", "jsonl:ann/a.jsonl"),
        "b1": ("inner", "LicenseRef-Research-Only", "jsonl:b.jsonl"),
        "b2": ("inner", "LicenseRef-Research-Only", "jsonl:b.jsonl")}
    assert records["a1"].video_path == "videos/a.mp4"  # under outer's root
    assert records["b1"].video_path == "a.mp4" and records["b2"].video_path == "sub/b.avi"  # under inner's videos
    assert {k: v["records"] for k, v in summary["sources"].items()} == {"outer": 1, "inner": 2}
    assert [(f["source"], f["file"]) for f in summary["files"]] == [("outer", "ann/a.jsonl"), ("inner", "b.jsonl")]
    text = Path(cfg.out).read_text() + json.dumps([summary["files"], summary["sources"]])
    assert str(tmp_path) not in text  # no machine path in records or in what the summary says of the inputs
    resolved = Sources.of(sources).resolve(records["b2"].source, records["b2"].video_path)
    assert Path(resolved).samefile(tmp_path / "videos" / "sub" / "b.avi")


def test_native_records_naming_sources_are_checked(tmp_path, ingest_config):
    sources = [*declared(tmp_path, id="mine"), *declared(tmp_path / "videos", id="other", licence="CC-BY-NC-4.0")]
    ann = _native(tmp_path / "ann.jsonl", [
        {"annotation_id": "undeclared", "video_id": "a", "source": "nobody"},
        {"annotation_id": "mismatch", "video_id": "a", "source": "other", "licence": "MIT"},
        {"annotation_id": "named", "video_id": "a", "source": "other", "licence": "CC-BY-NC-4.0"},
        {"annotation_id": "outside", "video_id": "x", "video_path": str(tmp_path / "ann.jsonl")}])
    cfg = ingest_config(ann, sources=sources[1:] + [
        {**sources[0], "roots": [str(tmp_path / "ann.jsonl")]}])  # "mine" holds the annotation file only
    summary = ingest(cfg)
    records = {r.annotation_id: r for r in read_records(cfg.out)}
    dead = {d["annotation_id"]: d for d in read_jsonl(cfg.dead_letter)}
    assert set(records) == {"named"} and records["named"].source == "other"
    assert records["named"].video_path == "a.mp4"
    assert dead["undeclared"]["reason"] == "undeclared_source" and "'nobody'" in dead["undeclared"]["detail"]
    assert dead["mismatch"]["reason"] == "licence_mismatch" and "'CC-BY-NC-4.0'" in dead["mismatch"]["detail"]
    assert summary["inputs"] == len(records) + len(dead) == 4


def test_a_video_outside_its_source_is_a_dead_letter(tmp_path, ingest_config):
    ann = _native(tmp_path / "ann" / "a.jsonl", [{"annotation_id": "a1", "video_id": "a"}])
    cfg = ingest_config(ann, sources=declared(tmp_path / "ann"))
    ingest(cfg)
    (d,) = read_jsonl(cfg.dead_letter)
    assert d["reason"] == "video_outside_source" and "add its folder to that source's roots" in d["detail"]


@pytest.mark.parametrize(("licence", "hint"), [("cc-by-4.0", "did you mean 'CC-BY-4.0'"),
                                               ("Charades terms", "LicenseRef-Charades-terms")])
def test_a_licence_that_is_not_spdx_says_how_to_write_it(licence, hint):
    with pytest.raises(ValidationError, match=hint):
        SourceDecl(id="x", licence=licence, origin="o", roots=["r"])
    with pytest.raises(ValidationError, match=hint):
        PreprocessConfig(allowed_licences=[licence])


def test_declarations_are_checked():
    with pytest.raises(ValidationError, match="lower-case"):
        SourceDecl(id="Charades STA", licence="MIT", origin="o", roots=["r"])
    with pytest.raises(ValidationError):
        IngestConfig(sources=[{"id": "x", "licence": "MIT", "origin": "o", "roots": []}])
    with pytest.raises(Exception, match="declared twice"):
        Sources.of(declared("a") + declared("b"))
