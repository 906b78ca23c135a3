"""Ingest of the synthetic corpus, in every annotation format, matches its ground truth exactly."""


import pytest
from support.declared import declared
from support.measured_settings import CORPUS_MEASURED

from corpus import build_corpus
from vtg.config import CorpusConfig, IngestConfig
from vtg.records import read_jsonl, read_records


@pytest.mark.parametrize("fmt", ["qvhighlights", "charades", "activitynet", "jsonl"])
def test_ingest_matches_ground_truth(tmp_path, fmt):
    root = tmp_path / "corpus"
    gt = build_corpus(CorpusConfig(**{**CORPUS_MEASURED, "n_videos": 5}, out_dir=str(root), workers=1,
                                   annotation_format=fmt, duplicate_query_fraction=0.5,
                                   text_answerable_fraction=0.3))
    cfg = IngestConfig(sources=declared(root), annotations=[str(root / "annotations")], video_root=str(root / "videos"),
                       out=str(tmp_path / "r.jsonl"), dead_letter=str(tmp_path / "d.jsonl"),
                       summary=str(tmp_path / "s.json"))
    from ingest import ingest

    summary = ingest(cfg)
    assert summary["inputs"] == (gt["annotation_lines"] if fmt != "activitynet"
                                 else sum(len(v["events"]) for v in gt["videos"]) + len(gt["invalid_annotations"]))
    assert summary["reconciled"] and summary["files"][0]["format"] == fmt
    dead = sorted((d["line"], d["reason"]) for d in read_jsonl(cfg.dead_letter))
    assert dead == sorted((x["line"], x["reason"]) for x in gt["invalid_annotations"])
    rejected = {x["annotation_id"] for x in gt["invalid_annotations"]}
    events = {e["annotation_id"]: (v, e) for v in gt["videos"] for e in v["events"]
              if e["annotation_id"] not in rejected}
    records = read_records(cfg.out)
    assert {r.annotation_id for r in records} == set(events)
    for r in records:
        v, e = events[r.annotation_id]
        assert r.video_id == v["video_id"] and r.query == e["query"].strip()
        assert r.video_path == v["path"]  # under the declared root (the corpus folder): no machine path
        assert r.duration_s == pytest.approx(v["duration_s"])
        assert r.windows == [pytest.approx((e["start_s"], e["end_s"]), abs=1e-3)]
    assert summary["clipped"] == len(gt["clipped_annotations"])
