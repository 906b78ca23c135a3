"""Failure class 1 (issue 39): one name, one file, one source. A multi-root source resolved a record's relative
path under the first root holding a file of that name, so a shard held another video's frames with this query;
`annotate.videos` with `a/clip.mp4` and `b/clip.mp4` annotated both from one. The rule has one home,
`vtg.sources.refuse_ambiguous`, and every resolver goes through it. One ambiguity matrix (two roots of one source
holding `clip.mp4`, two sources declaring one root, two folders holding one id, two annotate inputs with one stem)
runs through every resolver: each refuses with one line naming both files (or both sources), never picks one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.declared import declared

from ingest import ingest
from vtg.config import IngestConfig, load_config
from vtg.errors import VTGError
from vtg.records import CanonicalRecord, read_jsonl, read_records, write_jsonl
from vtg.sources import AmbiguousName, SourceDecl, Sources

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def matrix(tmp_path: Path) -> dict:
    """videos/a/clip.mp4 and videos/b/clip.mp4 (different bytes), a source `two` with roots [videos/a, videos/b]."""
    a, b = tmp_path / "videos" / "a", tmp_path / "videos" / "b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (a / "clip.mp4").write_bytes(b"video A")
    (b / "clip.mp4").write_bytes(b"video B")
    two = SourceDecl(id="two", licence="CC-BY-4.0", origin="test", roots=[str(a), str(b)])
    return {"tmp": tmp_path, "a": a / "clip.mp4", "b": b / "clip.mp4", "two": two}


def _names_both(e: pytest.ExceptionInfo | str, m: dict) -> None:
    msg = e if isinstance(e, str) else str(e.value)
    assert str(m["a"]) in msg and str(m["b"]) in msg and "\n" not in msg, msg


# ---- the resolvers ------------------------------------------------------------------------------------------
def test_the_root_of_a_record(matrix):
    with pytest.raises(AmbiguousName) as e:
        Sources([matrix["two"]]).resolve("two", "clip.mp4")
    _names_both(e, matrix)


def test_the_relative_path_of_a_file(matrix):
    with pytest.raises(AmbiguousName) as e:  # b's clip would be stored as `clip.mp4`, which resolves to a's
        Sources([matrix["two"]]).relative("two", matrix["b"])
    _names_both(e, matrix)


def test_the_source_of_a_file(matrix):
    """Two sources may share a video folder (two annotation sets over one collection); a file there, asked for
    its source, is ambiguous: which licence would it take?"""
    root = str(matrix["a"].parent)
    s = Sources([SourceDecl(id="one", licence="MIT", origin="t", roots=[root]),
                 SourceDecl(id="other", licence="CC-BY-4.0", origin="t", roots=[root])])
    with pytest.raises(AmbiguousName, match=r"sources (one and other|other and one) both declare") as e:
        s.owner_of(matrix["a"])
    assert str(matrix["a"]) in str(e.value) and "\n" not in str(e.value)


def _ingest(m: dict, rows: list[dict]) -> tuple[dict, dict]:
    tmp = m["tmp"]
    ann = tmp / "ann.jsonl"
    ann.write_text("".join(json.dumps({"query": "q", "windows": [[0.5, 1.5]], "duration_s": 5.0, **r}) + "\n"
                           for r in rows))
    cfg = IngestConfig(sources=[m["two"].model_dump(), *declared(tmp)], annotations=[str(ann)],
                       video_root=str(tmp / "videos"), out=str(tmp / "out" / "r.jsonl"),
                       dead_letter=str(tmp / "out" / "d.jsonl"), summary=str(tmp / "out" / "s.json"))
    summary = ingest(cfg)
    assert summary["reconciled"]
    return ({r.annotation_id: r for r in read_records(cfg.out)},
            {d["annotation_id"]: d for d in read_jsonl(cfg.dead_letter)})


def test_ingest_of_a_record_whose_path_two_roots_hold(matrix):
    records, dead = _ingest(matrix, [{"annotation_id": "b", "video_id": "clip", "video_path": str(matrix["b"]),
                                      "source": "two"}])
    assert not records and dead["b"]["reason"] == "ambiguous_video_id"
    _names_both(dead["b"]["detail"], matrix)


def test_ingest_of_an_id_two_folders_hold(matrix):
    records, dead = _ingest(matrix, [{"annotation_id": "x", "video_id": "clip"}])
    assert not records and dead["x"]["reason"] == "ambiguous_video_id"
    assert "a/clip.mp4" in dead["x"]["detail"] and "b/clip.mp4" in dead["x"]["detail"]


def test_ingest_of_an_id_with_two_extensions_in_one_folder(matrix):
    """Found by the probe: `a.mp4` and `a.mkv` side by side were resolved to the .mp4."""
    (matrix["a"].parent / "clip.mkv").write_bytes(b"video A, another container")
    matrix["b"].unlink()
    records, dead = _ingest(matrix, [{"annotation_id": "x", "video_id": "clip"}])
    assert not records and dead["x"]["reason"] == "ambiguous_video_id"
    assert "a/clip.mp4" in dead["x"]["detail"] and "a/clip.mkv" in dead["x"]["detail"]


def test_annotate_inputs_with_one_stem(matrix):
    from annotate.run import _targets

    cfg = load_config(REPO / "params.yaml", None, [f"annotate.videos=[{matrix['a']}, {matrix['b']}]"])
    with pytest.raises(AmbiguousName) as e:
        _targets(cfg, {}, Sources([matrix["two"]]), [])
    _names_both(e, matrix)


def test_benchmark_records_refuse_before_loading_anything(matrix):
    from evaluation.benchmark import run_benchmark

    records = matrix["tmp"] / "bench.jsonl"
    write_jsonl(records, [CanonicalRecord(video_id="clip", video_path="clip.mp4", duration_s=5.0, query="q",
                                          windows=[(0.5, 1.5)], source="two", licence="CC-BY-4.0",
                                          annotation_file="t", annotation_id="t:1")])
    sources = json.dumps([matrix["two"].model_dump()])
    cfg = load_config(REPO / "params.yaml", None, [f"benchmark.records={records}", f"ingest.sources={sources}"])
    with pytest.raises(AmbiguousName) as e:
        run_benchmark(matrix["tmp"] / "no-checkpoint-needed", cfg)
    _names_both(e, matrix)


def test_preprocess_dead_letters_a_record_whose_name_became_ambiguous(matrix):
    """A file of the same name appeared in another root after ingest: preprocess's resolver refuses it too."""
    from beam_jobs.transforms import ProcessVideoFn
    from vtg.config import PreprocessConfig

    fn = ProcessVideoFn(PreprocessConfig(), sources=Sources([matrix["two"]]))
    rec = CanonicalRecord(video_id="clip", video_path="clip.mp4", duration_s=5.0, query="q", windows=[(0.5, 1.5)],
                          source="two", licence="CC-BY-4.0", annotation_file="t", annotation_id="t:1")
    out = list(fn.process(("clip", [rec])))
    dead = [o.value for o in out if getattr(o, "tag", None) == "dead"]
    assert dead and dead[0]["reason"] == "ambiguous_video_id"
    _names_both(dead[0]["error"], matrix)


def test_an_unambiguous_multi_root_source_still_resolves(matrix):
    matrix["b"].rename(matrix["b"].with_name("other.mp4"))
    s = Sources([matrix["two"]])
    assert s.resolve("two", "clip.mp4") == str(matrix["a"]) and s.relative("two", matrix["a"]) == "clip.mp4"
    assert s.resolve("two", "other.mp4") == str(matrix["b"].with_name("other.mp4"))


def test_every_resolver_uses_the_one_rule():
    """The resolvers above, by name: a new resolver must call `refuse_ambiguous` or a function that does."""
    src = (REPO / "vtg" / "sources.py").read_text()
    assert src.count("refuse_ambiguous(") >= 2  # the definition and `resolve` (`relative` goes through resolve)
    assert "self.resolve(source_id, rel)" in src
    assert "refuse_ambiguous(" in (REPO / "annotate" / "run.py").read_text()
    with pytest.raises(VTGError):
        raise AmbiguousName("is a VTGError: every CLI prints it as one line, rc 2")
