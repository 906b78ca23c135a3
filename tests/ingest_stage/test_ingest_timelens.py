"""TimeLens-Bench's annotation files (`charades-timelens.json` etc.: `{vid: {duration, spans, queries}}`) through
the real ingest: detected beside ActivityNet's `.json`, one record per (span, query) with TimeLens's own query
cleaning, and every malformed entry a dead letter with its line."""

import json

from test_ingest_formats import check_reconciles

from ingest import ingest
from ingest.detect import detect_format
from vtg.records import read_jsonl, read_records

DATA = {
    "a": {"duration": 5.0, "spans": [[0.0, 1.5], [1.0, 5.2], [4.0, 3.0]],
          "queries": ["A person  opens the door.", "  clipped at the end. ", "reversed"]},
    "zzz": {"duration": 10.0, "spans": [[1.0, 2.0]], "queries": ["no such video"]},
    "b": {"duration": 5.0, "spans": [[1.0, 2.0]], "queries": ["one", "two"]},
    "c": {"duration": 5.0, "timestamps": [[1.0, 2.0]], "sentences": ["ActivityNet's keys"]},
}


def test_timelens_bench_json(tmp_path, ingest_config):
    ann = tmp_path / "charades-timelens.json"
    ann.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in DATA.items()) + "\n}\n")
    assert detect_format(ann, ann.read_text()) == "timelens"
    cfg = ingest_config(ann)
    summary = ingest(cfg)
    check_reconciles(summary, cfg)
    assert summary["files"][0]["format"] == "timelens"
    records = read_records(cfg.out)
    # TimeLens's parse_query: whitespace runs become one space, the ends and a trailing period go
    assert [(r.annotation_id, r.query, r.windows, r.duration_s) for r in records] == [
        ("a#0", "A person opens the door", [(0.0, 1.5)], 5.0), ("a#1", "clipped at the end", [(1.0, 5.0)], 5.0)]
    dead = {d["annotation_id"]: (d["line"], d["reason"]) for d in read_jsonl(cfg.dead_letter)}
    assert dead == {"a#2": (2, "start_ge_end"), "zzz#0": (3, "missing_video"), "b": (4, "unparsable"),
                    "c": (5, "unparsable")}


def test_activitynet_json_is_still_activitynet(tmp_path):
    ann = tmp_path / "val_1.json"
    ann.write_text(json.dumps({"v": {"duration": 5.0, "timestamps": [[0, 1]], "sentences": ["s"]}}))
    assert detect_format(ann, ann.read_text()) == "activitynet"
    ann.write_text("{not json")  # left to the ActivityNet reader, which dead-letters it
    assert detect_format(ann, ann.read_text()) == "activitynet"
