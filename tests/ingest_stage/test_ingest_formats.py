"""Every format: valid lines become canonical records; every invalid case becomes a dead letter with its reason."""

import json
from pathlib import Path

import pytest

from ingest import ingest
from vtg.records import read_jsonl, read_records


def dead_by_line(cfg) -> dict[int, str]:
    return {d["line"]: d["reason"] for d in read_jsonl(cfg.dead_letter)}


def check_reconciles(summary: dict, cfg) -> None:
    assert summary["reconciled"] and summary["inputs"] == summary["records"] + summary["dead_letters"]
    assert summary["records"] == len(read_records(cfg.out))
    assert summary["dead_letters"] == len(list(read_jsonl(cfg.dead_letter)))
    assert json.loads(Path(cfg.summary).read_text()) == summary


CHARADES = """\
a 0.0 2.5##a person opens a door.
b 1.0 4.9##someone in the sub folder video
a 3.0 5.3##ends 0.3 s after the 5 s video: clipped
a 3.0 9.0##ends far beyond the video
a 2.0 1.0##start after end
a -1.0 2.0##negative start
a nan 2.0##not a number
a 1.0 2.0##   
nosuchvideo 1.0 2.0##missing video
broken 1.0 2.0##zero-byte video cannot be probed
a 1.0##the end time is missing
just some garbage
"""


def test_charades(tmp_path, ingest_config):
    ann = tmp_path / "charades_sta_test.txt"
    ann.write_text(CHARADES)
    cfg = ingest_config(ann)
    summary = ingest(cfg)
    check_reconciles(summary, cfg)
    records = read_records(cfg.out)
    assert [r.query for r in records] == ["a person opens a door.", "someone in the sub folder video",
                                          "ends 0.3 s after the 5 s video: clipped"]
    assert records[0].duration_s == pytest.approx(5.0)  # probed: 40 frames at 8 fps
    assert records[2].windows == [(3.0, 5.0)] and summary["clipped"] == 1
    assert records[0].annotation_id == "a#1" and records[0].source == "test-set" and records[0].licence == "CC0-1.0"
    assert records[0].annotation_file == "charades:charades_sta_test.txt"  # under the declared root: no machine path
    assert records[1].video_path == "videos/sub/b.avi"
    assert dead_by_line(cfg) == {4: "end_beyond_duration", 5: "start_ge_end", 6: "negative_start", 7: "not_finite",
                                 8: "empty_query", 9: "missing_video", 10: "unprobeable_video", 11: "unparsable",
                                 12: "unparsable"}
    assert summary["inputs"] == 12


def qvh(qid, query="q", vid="a", duration=5.0, windows=((1.0, 2.0),)) -> str:
    return json.dumps({"qid": qid, "query": query, "vid": vid, "duration": duration,
                       "relevant_windows": [list(w) for w in windows]})


def test_qvhighlights(tmp_path, ingest_config):
    lines = [
        qvh(1, windows=[(0.0, 2.0), (3.0, 4.0)]),  # several ground-truth windows
        qvh(2, vid="c", duration=30.0, windows=[(2.0, 30.4)]),  # .mkv; not probed; end clipped within tolerance
        qvh(3, windows=[(2.0, 2.0)]),
        qvh(4, windows=[(-0.5, 2.0)]),
        '{"qid": 5, "query": "q", "vid": "a", "duration": 5.0, "relevant_windows": [[NaN, 2.0]]}',
        '{"qid": 6, "query": "q", "vid": "a", "duration": 5.0, "relevant_windows": [[1.0, Infinity]]}',
        qvh(7, windows=[(1.0, 9.0)]),
        qvh(8, query=""),
        qvh(9, vid="zzz"),
        qvh(10, duration=0),
        '{"qid": 11, "query": "q", "vid": "a"',
        '{"qid": 12, "query": "q", "vid": "a", "duration": 5.0}',
        '{"foo": 1}',
        qvh(1),  # duplicate qid
        qvh(13, vid="broken"),  # zero-byte video: exists, so ingest keeps it (preprocess dead-letters it)
        qvh(14, windows="1-2"),
        "",
    ]
    ann = tmp_path / "highlight_val.jsonl"
    ann.write_text("\n".join(lines) + "\n")
    cfg = ingest_config(ann)
    summary = ingest(cfg)
    check_reconciles(summary, cfg)
    records = {r.annotation_id: r for r in read_records(cfg.out)}
    assert set(records) == {"1", "2", "13"}
    assert records["1"].windows == [(0.0, 2.0), (3.0, 4.0)]
    assert records["2"].windows == [(2.0, 30.0)] and records["2"].video_path.endswith("c.mkv")
    assert dead_by_line(cfg) == {3: "start_ge_end", 4: "negative_start", 5: "not_finite", 6: "not_finite",
                                 7: "end_beyond_duration", 8: "empty_query", 9: "missing_video",
                                 10: "bad_duration", 11: "unparsable", 12: "unparsable", 13: "unknown_format",
                                 14: "duplicate_annotation_id", 16: "unparsable"}
    assert summary["inputs"] == 16  # the blank line is not an item


def test_activitynet(tmp_path, ingest_config):
    data = {
        "a": {"duration": 5.0, "timestamps": [[0.0, 1.5], [1.0, 5.2], [4.0, 3.0], [-1.0, 1.0], [1.0, 7.0],
                                              [0.5, 1.0], [1, "x"]],
              "sentences": ["first", "clipped", "reversed", "negative", "too long", " ", "bad"]},
        "zzz": {"duration": 10.0, "timestamps": [[1.0, 2.0]], "sentences": ["no such video"]},
        "b": {"duration": 5.0, "timestamps": [[1.0, 2.0]], "sentences": ["one", "two"]},
        "c": "not an entry",
    }
    ann = tmp_path / "val_1.json"
    ann.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in data.items()) + "\n}\n")
    cfg = ingest_config(ann)
    summary = ingest(cfg)
    check_reconciles(summary, cfg)
    records = read_records(cfg.out)
    assert [(r.annotation_id, r.windows) for r in records] == [("a#0", [(0.0, 1.5)]), ("a#1", [(1.0, 5.0)])]
    dead = {d["annotation_id"]: (d["line"], d["reason"]) for d in read_jsonl(cfg.dead_letter)}
    assert dead == {"a#2": (2, "start_ge_end"), "a#3": (2, "negative_start"), "a#4": (2, "end_beyond_duration"),
                    "a#5": (2, "empty_query"), "a#6": (2, "unparsable"), "zzz#0": (3, "missing_video"),
                    "b": (4, "unparsable"), "c": (5, "unparsable")}
    assert summary["inputs"] == 7 + 1 + 1 + 1


def test_native_jsonl_round_trips_ingest_output(tmp_path, ingest_config):
    lines = [
        {"video_id": "a", "query": "q1", "windows": [[0.5, 1.5]], "duration_s": 5.0, "annotation_id": "n1"},
        {"video_id": "b", "query": "q2", "windows": [[0.5, 1.5]]},  # no duration: probed
        {"video_id": "a", "query": "q3", "windows": [[0.5, 1.5]], "duration_s": "5"},
        {"video_id": "a", "query": "q4", "windows": []},
        {"something": "else"},
    ]
    ann = tmp_path / "records_in.jsonl"
    ann.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    cfg = ingest_config(ann)
    summary = ingest(cfg)
    check_reconciles(summary, cfg)
    records = read_records(cfg.out)
    assert [r.annotation_id for r in records] == ["n1", "records_in:2"]
    assert records[1].duration_s == pytest.approx(5.0)
    assert dead_by_line(cfg) == {3: "unparsable", 4: "unparsable", 5: "unknown_format", 6: "unparsable"}
    # ingest's own output is valid native input and ingests to the same records
    again = ingest_config(Path(cfg.out))
    again = again.model_copy(update={"out": str(tmp_path / "again.jsonl"),
                                     "dead_letter": str(tmp_path / "again_dead.jsonl"),
                                     "summary": str(tmp_path / "again.json")})
    ingest(again)
    assert read_records(again.out) == records


def test_several_files_and_a_directory(tmp_path, ingest_config):
    d = tmp_path / "ann"
    d.mkdir()
    (d / "one.txt").write_text("a 0.0 1.0##hello\n")
    (d / "two.jsonl").write_text(qvh(7) + "\n")
    (d / "README.md").write_text("ignored: not an annotation extension")
    cfg = ingest_config(d)
    summary = ingest(cfg)
    assert [f["format"] for f in summary["files"]] == ["charades", "qvhighlights"]
    assert summary["records"] == 2 and summary["videos"] == 1
