"""Issue 21 cases 1 and 2 (identity of inputs): a record is identified by its source file and annotation, a video
by its path. An ambiguity (one id, two files) is a dead letter, never a merge; annotation ids are unique per
file, so the official multi-file sets (ActivityNet's val_1/val_2 by two annotators over the same videos) and
same-named files in two folders keep every line; a duration that disagrees with the video rejects that line,
not the video (the Beam half is in tests/beam_jobs/test_preprocess_identity.py)."""

from __future__ import annotations

import json
from pathlib import Path

from support.declared import declared
from support.videokit import write_video as _write

from ingest import ingest
from vtg.config import IngestConfig
from vtg.records import read_jsonl, read_records


def write_video(path: Path, n_frames: int = 40) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, n_frames, size=(32, 32))
    return path


def _cfg(tmp: Path, root: Path, *annotations: Path) -> IngestConfig:
    return IngestConfig(sources=declared(tmp), annotations=[str(a) for a in annotations], video_root=str(root),
                        out=str(tmp / "out/r.jsonl"), dead_letter=str(tmp / "out/d.jsonl"),
                        summary=str(tmp / "out/s.json"))


def test_activitynet_val_1_and_val_2_keep_every_sentence(tmp_path):
    root = tmp_path / "videos"
    write_video(root / "v_a.mp4")
    write_video(root / "v_b.mp4")
    ann = tmp_path / "captions"
    ann.mkdir()
    for name, text in (("val_1.json", "opens"), ("val_2.json", "shuts")):
        (ann / name).write_text(json.dumps({
            vid: {"duration": 5.0, "timestamps": [[0.5, 1.5], [2.0, 4.0]],
                  "sentences": [f"a person {text} a door", f"someone {text} the {vid} box"]}
            for vid in ("v_a", "v_b")}))
    summary = ingest(_cfg(tmp_path, root, ann / "val_1.json", ann / "val_2.json"))
    assert summary["inputs"] == 8 and summary["records"] == 8 and summary["dead_letters"] == 0
    ids = sorted(r.annotation_id for r in read_records(tmp_path / "out/r.jsonl"))
    assert "v_a#0" in ids and "v_a#0@val_2.json" in ids and len(set(ids)) == 8


def test_same_named_native_files_in_two_folders_both_count(tmp_path):
    root = tmp_path / "videos"
    write_video(root / "a.mp4")
    for split in ("train", "val"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "ann.jsonl").write_text("".join(
            json.dumps({"video_id": "a", "query": f"{split} query {i}", "windows": [[0.5, 1.5]], "duration_s": 5.0})
            + "\n" for i in range(3)))
    summary = ingest(_cfg(tmp_path, root, tmp_path / "train/ann.jsonl", tmp_path / "val/ann.jsonl"))
    assert summary["records"] == 6 and summary["dead_letters"] == 0
    ids = {r.annotation_id for r in read_records(tmp_path / "out/r.jsonl")}
    assert {"ann:1", "ann:1@val/ann.jsonl"} <= ids


def test_duplicate_ids_inside_one_file_are_still_dead_letters(tmp_path):
    root = tmp_path / "videos"
    write_video(root / "a.mp4")
    line = json.dumps({"annotation_id": "x", "video_id": "a", "query": "q", "windows": [[0.5, 1.5]],
                       "duration_s": 5.0}) + "\n"
    (tmp_path / "ann.jsonl").write_text(line * 2)
    summary = ingest(_cfg(tmp_path, root, tmp_path / "ann.jsonl"))
    assert summary["records"] == 1 and summary["by_reason"] == {"duplicate_annotation_id": 1}


def test_one_id_in_two_folders_of_the_video_root_is_a_dead_letter(tmp_path):
    root = tmp_path / "videos"
    write_video(root / "cam1" / "clip.mp4")
    write_video(root / "cam2" / "clip.mp4", n_frames=80)
    write_video(root / "other.mp4")
    (tmp_path / "ann.jsonl").write_text("".join(json.dumps(
        {"video_id": vid, "query": "q", "windows": [[0.5, 1.5]], "duration_s": 5.0}) + "\n"
        for vid in ("clip", "other")))
    summary = ingest(_cfg(tmp_path, root, tmp_path / "ann.jsonl"))
    assert summary["records"] == 1 and summary["by_reason"] == {"ambiguous_video_id": 1}
    [dead] = read_jsonl(tmp_path / "out/d.jsonl")
    assert "cam1/clip.mp4" in dead["detail"] and "cam2/clip.mp4" in dead["detail"]
