"""Failure class 7 (issue 39): one line for every failure, in the new stages too, and no input silently made into
another. The mechanisms, one home each: the model loader (`vtg.model.modeling.load_model_and_tokenizer`: every
model any stage loads, the annotator's proposer and verifier included), the records reader
(`vtg.records.read_records`: annotate and the benchmark), checkpoint resolution (`vtg.checkpoints.
resolve_checkpoint`: a root or its `latest` pointer falls back like training's resume does), identifiers and
visible text in ingest (`ingest.items.as_id`, `ingest.items.visible`), and a record's own `video_path` (never
replaced by an id lookup)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.ckptkit import fake_checkpoint
from support.declared import declared

from ingest import ingest
from vtg import checkpoints as ckpt
from vtg.config import IngestConfig
from vtg.errors import VTGError
from vtg.records import read_jsonl, read_records


# ---- ingest: ids, invisible text, a record's own path --------------------------------------------------------
def _ingest(tmp: Path, name: str, lines: list[dict]) -> tuple[dict, dict]:
    root = tmp / "videos"
    root.mkdir(exist_ok=True)
    for vid in ("a", "b"):
        (root / f"{vid}.mp4").write_bytes(b"stand-in")
    ann = tmp / name
    ann.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = IngestConfig(sources=declared(tmp), annotations=[str(ann)], video_root=str(root),
                       out=str(tmp / "out" / "r.jsonl"), dead_letter=str(tmp / "out" / "d.jsonl"),
                       summary=str(tmp / "out" / "s.json"))
    summary = ingest(cfg)
    assert summary["reconciled"] and summary["inputs"] == len(lines)
    records = {r.annotation_id: r for r in read_records(cfg.out)}
    dead = {d.get("annotation_id") or d.get("line"): d for d in read_jsonl(cfg.dead_letter)}
    assert len(records) + len(dead) == len(lines)
    return records, dead


def _native(**kw) -> dict:
    return {"video_id": "a", "query": "a person opens a door", "windows": [[0.5, 1.5]], "duration_s": 5.0, **kw}


@pytest.mark.parametrize("query", ["\u200b", "\u200b\u200d\u2060", " \ufeff\u200c ", "\u00ad"])
def test_a_query_of_invisible_characters_is_an_empty_query(tmp_path, query):
    records, dead = _ingest(tmp_path, "n.jsonl", [_native(annotation_id="zw", query=query),
                                                   _native(annotation_id="ok")])
    assert set(records) == {"ok"} and dead["zw"]["reason"] == "empty_query"
    assert "invisible" in dead["zw"]["detail"]


def test_a_null_qid_is_a_dead_letter_not_the_id_none(tmp_path):
    qvh = {"query": "a person opens a door", "vid": "a", "duration": 5.0, "relevant_windows": [[0.5, 1.5]]}
    records, dead = _ingest(tmp_path, "q.jsonl", [{**qvh, "qid": None}, {**qvh, "qid": 7}])
    assert set(records) == {"7"} and "None" not in records
    (bad,) = [d for k, d in dead.items()]
    assert bad["reason"] == "unparsable" and "qid" in bad["detail"]


BAD_IDS = [None, True, 1.5, ["a"], "", "\u200b"]


# a null annotation_id is a missing one: derived from the file and line, as documented
@pytest.mark.parametrize(("field", "value"), [("video_id", v) for v in BAD_IDS]
                         + [("annotation_id", v) for v in BAD_IDS if v is not None])
def test_a_native_id_that_is_not_an_id_is_a_dead_letter(tmp_path, field, value):
    row = _native(**{"annotation_id": "x", field: value})
    records, dead = _ingest(tmp_path, "n.jsonl", [row, _native(annotation_id="ok")])
    assert set(records) == {"ok"} and not any(str(value) == r.video_id for r in records.values())
    (bad,) = dead.values()
    assert bad["reason"] == "unparsable" and field in bad["detail"]


def test_an_activitynet_entry_with_an_empty_video_key_is_unparsable(tmp_path):
    """Found by the probe: the key "" was looked up as a video id (missing_video)."""
    ann = tmp_path / "an.json"
    entry = {"duration": 5.0, "timestamps": [[0.5, 1.5]], "sentences": ["a person opens a door"]}
    root = tmp_path / "videos"
    root.mkdir()
    (root / "a.mp4").write_bytes(b"stand-in")
    ann.write_text(json.dumps({"": entry, "a": entry}))
    cfg = IngestConfig(sources=declared(tmp_path), annotations=[str(ann)], video_root=str(root),
                       out=str(tmp_path / "out" / "r.jsonl"), dead_letter=str(tmp_path / "out" / "d.jsonl"),
                       summary=str(tmp_path / "out" / "s.json"))
    summary = ingest(cfg)
    assert summary["records"] == 1 and summary["by_reason"] == {"unparsable": 1}
    (bad,) = read_jsonl(cfg.dead_letter)
    assert "video key" in bad["detail"]


def test_a_native_video_path_that_is_not_there_is_not_replaced_by_the_id(tmp_path):
    records, dead = _ingest(tmp_path, "n.jsonl", [
        _native(annotation_id="gone", video_path=str(tmp_path / "videos" / "elsewhere" / "a.mp4")),
        _native(annotation_id="ok", video_path=str(tmp_path / "videos" / "a.mp4"))])
    assert set(records) == {"ok"}
    assert dead["gone"]["reason"] == "missing_video" and "elsewhere" in dead["gone"]["detail"]


# ---- the model loader: a corrupt checkpoint of any stage -----------------------------------------------------
@pytest.fixture(scope="module")
def tiny_export() -> Path:
    from vtg.model.tiny import build_tiny_model

    return build_tiny_model(seed=0)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing"])
def test_a_corrupt_model_is_one_line_for_every_stage_that_loads_one(tmp_path, tiny_export, damage):
    from annotate import model as annotator
    from vtg.model.modeling import load_model_and_tokenizer

    export = tmp_path / "m"
    shutil.copytree(tiny_export, export)
    weights = export / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        weights.write_bytes(b"not a safetensors file" * 4)
    else:
        weights.unlink()
    for load in (load_model_and_tokenizer, annotator.load):  # training/evaluation/benchmark; annotate's models
        with pytest.raises(VTGError) as e:
            load(export)
        assert str(e.value).startswith(f"cannot load model from {export}") and "\n" not in str(e.value)


# ---- the records reader: a file that is not records ----------------------------------------------------------
@pytest.mark.parametrize(("name", "text"), [
    ("charades.txt", "AO8RW 0.0 6.9##a person is putting a book on a shelf.\n"),
    ("qvh.jsonl", json.dumps({"qid": 1, "query": "q", "vid": "a", "duration": 5, "relevant_windows": [[0, 1]]})
     + "\n"),
    ("truncated.jsonl", '{"video_id": "a", "query": '),
])
def test_a_file_that_is_not_records_is_one_line_naming_the_line(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(VTGError) as e:
        read_records(path)
    assert str(e.value).startswith(f"{path}:1: not a canonical record") and "\n" not in str(e.value)


def test_the_benchmark_refuses_an_annotation_file_before_loading_anything(tmp_path):
    from evaluation.benchmark import run_benchmark
    from vtg.config import load_config

    ann = tmp_path / "charades.txt"
    ann.write_text("AO8RW 0.0 6.9##a person is putting a book on a shelf.\n")
    cfg = load_config(Path(__file__).resolve().parents[2] / "params.yaml", None, [f"benchmark.records={ann}"])
    with pytest.raises(VTGError, match=r"charades.txt:1: not a canonical record"):
        run_benchmark(tmp_path / "no-such-checkpoint", cfg)


# ---- a root whose `latest` pointer is corrupt ----------------------------------------------------------------
def _checkpoint(root: Path, step: int) -> Path:
    return fake_checkpoint(root, step)


@pytest.mark.parametrize("pointer", ["garbage", "{}", '{"checkpoint": "step-000099"}', ""])
@pytest.mark.parametrize("given", ["root", "pointer"])
def test_a_corrupt_latest_pointer_falls_back_like_training(tmp_path, pointer, given, caplog):
    root = tmp_path / "sft"
    _checkpoint(root, 1)
    newest = _checkpoint(root, 2)
    (root / ckpt.LATEST).write_text(pointer)
    assert ckpt.resolve_checkpoint(root if given == "root" else root / ckpt.LATEST) == newest
    assert ckpt.latest_checkpoint(root) == newest  # what training resumes
