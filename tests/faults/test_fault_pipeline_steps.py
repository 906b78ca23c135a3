"""Issue 15 item 2 beyond ProcessVideoFn: an exception in any later per-element step (record parsing, query and
video near-duplicate detection, text bias, assembly) dead-letters only the records concerned (`processing_error`
with the exception type, message and stage; `invalid_record` for a line) and the job goes on; the manifest
reconciles. Two of the faults are real input, no patch: a record line nested 100k deep (RecursionError in
`json.loads`, which took the whole job down) and a record with a finite but huge duration (OverflowError in the
text-bias statistics, which took the whole job down too). The others are injected by patching our own step
functions (the in-memory runner runs them in this process)."""

from __future__ import annotations

import json
from pathlib import Path

from test_fault_preprocess import IN_PROCESS, REPO, kept_videos, rec, write_video

from beam_jobs import dedup, preprocess, sink, transforms
from vtg.config import load_config


def test_a_failure_in_a_later_step_dead_letters_only_its_records(tmp_path: Path, monkeypatch):
    real_split, real_band_keys = sink.split_of, transforms._band_keys
    real_shingles, real_predict = dedup.query_shingles, transforms.blind_predict

    def split_of(canon, fractions):
        if canon == "v_assemble":
            raise RuntimeError("injected fault in assembly")
        return real_split(canon, fractions)

    def band_keys(item, *a):
        if item[0] == "v_vdedup":
            raise ValueError("injected fault in video dedup")
        return real_band_keys(item, *a)

    def query_shingles(text, n):
        if "qdedup" in text:
            raise KeyError("injected fault in query dedup")
        return real_shingles(text, n)

    def blind_predict(text, *a):
        if "tbias" in text:
            raise ZeroDivisionError("injected fault in text bias")
        return real_predict(text, *a)

    monkeypatch.setattr(sink, "split_of", split_of)
    monkeypatch.setattr(transforms, "_band_keys", band_keys)
    monkeypatch.setattr(dedup, "query_shingles", query_shingles)
    monkeypatch.setattr(transforms, "blind_predict", blind_predict)

    vdir = tmp_path / "videos"
    vdir.mkdir()
    rows = []
    for k, vid in enumerate(("good", "v_assemble", "v_vdedup", "v_huge_duration")):
        write_video(vdir / f"{vid}.mp4", 40, 8.0, seed=k + 1)
        rows += [rec(vid, vdir / f"{vid}.mp4", 5.0, (0.0, 2.0), f"{vid}-q1"),
                 rec(vid, vdir / f"{vid}.mp4", 5.0, (2.5, 4.5), f"{vid}-q2")]
    rows[1]["query"] = "the square moves (qdedup)"
    rows.append({**rows[0], "query": "the square moves (tbias)", "annotation_id": "good-q3"})
    huge = [r for r in rows if r["video_id"] == "v_huge_duration"]
    for r in huge:  # finite and valid for CanonicalRecord, but x 1e6 overflows the text-bias statistics
        r.update(duration_s=1e303, windows=[[0.0, 1e302]])
    lines = [json.dumps(r) for r in rows] + ["[" * 100_000 + "]" * 100_000]
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(lines) + "\n")
    out = tmp_path / "shards"
    cfg = load_config(REPO / "params.yaml", None, [f"preprocess.records={records}", f"preprocess.out_dir={out}",
                                                    "preprocess.progress=false"])
    manifest = preprocess.run(cfg, IN_PROCESS, show=False)

    dead = [json.loads(x) for x in (out / "dead_letter.jsonl").read_text().splitlines()]
    rec_ = manifest["records"]
    assert rec_["inputs"] == len(lines) == rec_["kept"] + rec_["filtered"] + rec_["failed"]
    assert rec_["failed"] == len(dead) == 9 and rec_["kept"] == 1 and rec_["filtered"] == 0
    [line] = [d for d in dead if d["stage"] == "parse"]
    assert line["reason"] == "invalid_record" and "RecursionError" in line["error"]
    by_aid = {d["annotation_id"]: d for d in dead if "annotation_id" in d}
    assert len(by_aid) == len(dead) - 1  # one dead letter per record
    expect = {"good-q2": ("query_dedup", "KeyError", "injected fault in query dedup"),
              "good-q3": ("text_bias", "ZeroDivisionError", "injected fault in text bias"),
              "v_assemble-q1": ("assemble", "RuntimeError", "injected fault in assembly"),
              "v_assemble-q2": ("assemble", "RuntimeError", "injected fault in assembly"),
              "v_vdedup-q1": ("video_dedup", "ValueError", "injected fault in video dedup"),
              "v_vdedup-q2": ("video_dedup", "ValueError", "injected fault in video dedup")}
    for aid, (stage, etype, msg) in expect.items():
        d = by_aid[aid]
        assert (d["reason"], d["stage"], d["error_type"]) == ("processing_error", stage, etype), d
        assert msg in d["error"] and d["video_path"].endswith(f"{d['video_id']}.mp4"), d
    for aid in ("v_huge_duration-q1", "v_huge_duration-q2"):  # its decode says why, once
        assert by_aid[aid]["reason"] == "unreadable_video" and "truncated" in by_aid[aid]["error"]
    assert manifest["failed_per_reason"] == {"invalid_record": 1, "processing_error": 6, "unreadable_video": 2}
    assert kept_videos(manifest, out) == {"good"}  # good-q1 (and its sample) survive its siblings' faults
