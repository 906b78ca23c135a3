"""Issue 15 item 5: a record's video must lie inside `ingest.video_root` (or `ingest.extra_video_roots`), symlinks
and `..` resolved; anything else is a `path_outside_root` dead letter that names the path, never a record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.declared import declared

from ingest import ingest
from vtg.config import IngestConfig
from vtg.records import read_jsonl, read_records
from vtg.sources import Sources


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """root/{a.mp4, sub/b.mp4, link_in.mp4 -> a.mp4, link_out.mp4 -> outside/secret.mp4}, outside/secret.mp4.
    Durations come with the records, so nothing is probed: the files only need to exist."""
    root, outside = tmp_path / "videos", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    for p in (root / "a.mp4", root / "sub" / "b.mp4", outside / "secret.mp4"):
        p.write_bytes(b"stand-in")
    (root / "link_in.mp4").symlink_to(root / "a.mp4")
    (root / "link_out.mp4").symlink_to(outside / "secret.mp4")
    return {"root": root, "outside": outside, "tmp": tmp_path}


def run_native(tree: dict[str, Path], rows: list[dict], **kw) -> tuple[dict, dict, dict]:
    tmp = tree["tmp"]
    ann = tmp / "ann.jsonl"
    ann.write_text("".join(json.dumps({"query": "a person opens a door", "windows": [[0.5, 1.5]],
                                       "duration_s": 5.0, **r}) + "\n" for r in rows))
    cfg = IngestConfig(sources=declared(tmp),
                       annotations=[str(ann)], video_root=str(tree["root"]), out=str(tmp / "out" / "r.jsonl"),
                       dead_letter=str(tmp / "out" / "d.jsonl"), summary=str(tmp / "out" / "s.json"), **kw)
    summary = ingest(cfg)
    assert summary["reconciled"] and summary["inputs"] == len(rows)
    sources = Sources.of(cfg.sources)  # records hold paths under their source's root: back to the file
    records = {r.annotation_id: r.model_copy(update={"video_path": sources.resolve(r.source, r.video_path)})
               for r in read_records(cfg.out)}
    assert all(not os.path.isabs(r.video_path) for r in read_records(cfg.out))
    dead = {d["annotation_id"]: d for d in read_jsonl(cfg.dead_letter)}
    assert len(records) + len(dead) == len(rows)
    return summary, records, dead


def test_absolute_path_outside_the_root_is_a_dead_letter(tree):
    secret = str(tree["outside"] / "secret.mp4")
    _, records, dead = run_native(tree, [
        {"annotation_id": "out", "video_id": "secret", "video_path": secret},
        # the id exists under the root, but the record names a file outside it: rejected, not silently swapped
        {"annotation_id": "out-a", "video_id": "a", "video_path": secret},
        {"annotation_id": "in", "video_id": "a", "video_path": str(tree["root"] / "a.mp4")}])
    assert set(records) == {"in"}
    for aid in ("out", "out-a"):
        assert dead[aid]["reason"] == "path_outside_root" and dead[aid]["video_path"] == secret
        assert secret in dead[aid]["detail"]


def test_dotdot_escaping_the_root_is_a_dead_letter(tree):
    escaping = f"{tree['root']}/sub/../../outside/secret.mp4"
    inside = f"{tree['root']}/sub/../a.mp4"  # `..` that stays inside is fine
    _, records, dead = run_native(tree, [{"annotation_id": "esc", "video_id": "secret", "video_path": escaping},
                                        {"annotation_id": "ok", "video_id": "a", "video_path": inside}])
    assert set(records) == {"ok"} and os.path.samefile(records["ok"].video_path, inside)
    assert dead["esc"]["reason"] == "path_outside_root" and dead["esc"]["video_path"] == escaping
    assert str(tree["outside"] / "secret.mp4") in dead["esc"]["detail"]  # the resolved target is named


def test_relative_dotdot_path_is_resolved_against_the_working_dir(tree, monkeypatch):
    monkeypatch.chdir(tree["root"])
    _, records, dead = run_native(tree, [{"annotation_id": "rel", "video_id": "s",
                                          "video_path": "../outside/secret.mp4"}])
    assert not records and dead["rel"]["reason"] == "path_outside_root"


def test_symlink_inside_the_root_pointing_outside_is_a_dead_letter(tree):
    link_out, link_in = str(tree["root"] / "link_out.mp4"), str(tree["root"] / "link_in.mp4")
    summary, records, dead = run_native(tree, [
        {"annotation_id": "by-path", "video_id": "x", "video_path": link_out},
        {"annotation_id": "by-id", "video_id": "link_out"},  # found by the index walk: same check
        {"annotation_id": "inner", "video_id": "link_in"},  # a link that stays inside the root is fine
        {"annotation_id": "inner-path", "video_id": "y", "video_path": link_in}])
    assert set(records) == {"inner", "inner-path"} and records["inner-path"].video_path == link_in
    assert dead["by-path"]["reason"] == dead["by-id"]["reason"] == "path_outside_root"
    assert dead["by-id"]["video_path"] == link_out
    assert summary["by_reason"] == {"path_outside_root": 2}


def test_extra_video_roots_allow_list(tree):
    secret = str(tree["outside"] / "secret.mp4")
    rows = [{"annotation_id": "abs", "video_id": "secret", "video_path": secret},
            {"annotation_id": "link", "video_id": "link_out"}]
    _, records, dead = run_native(tree, rows, extra_video_roots=[str(tree["outside"])])
    assert set(records) == {"abs", "link"} and not dead
    assert records["abs"].video_path == secret


def test_video_root_given_through_a_symlink(tree):
    alias = tree["tmp"] / "alias"
    alias.symlink_to(tree["root"], target_is_directory=True)
    rows = [{"annotation_id": "a", "video_id": "a", "video_path": str(tree["root"] / "a.mp4")},
            {"annotation_id": "b", "video_id": "b"}]
    _, records, dead = run_native({**tree, "root": alias}, rows)
    assert set(records) == {"a", "b"} and not dead
    assert os.path.realpath(records["b"].video_path) == str((tree["root"] / "sub" / "b.mp4").resolve())
