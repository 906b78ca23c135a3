"""The annotate stage on real videos with a real taught annotator (issue 24 item 2): off it is a byte-for-byte
pass-through; on, every input record is passed or withheld, every proposal is accepted or rejected with its reason,
the accepted ones are records of the annotator's `auto:<weights digest>` source that keep their video's source and
licence, an unlabelled video under a declared root is annotated and one under none is refused, and a rerun gives
the same bytes without teaching again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.declared import declared

from annotate.model import weights_digest
from annotate.run import hidden, run
from corpus import build_corpus
from ingest import ingest
from vtg.config import CorpusConfig, IngestConfig, load_config
from vtg.errors import VTGError
from vtg.model.tiny import default_cache_dir
from vtg.records import read_jsonl, read_records
from vtg.splits import split_of

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("annotate")
    corpus = root / "corpus"
    build_corpus(CorpusConfig(out_dir=str(corpus), n_videos=40, workers=1, defect_fraction=0.0, long_fraction=0.0))
    ingest(IngestConfig(sources=declared(corpus, licence="CC-BY-4.0"), annotations=[str(corpus / "annotations")],
                        video_root=str(corpus / "videos"), out=str(root / "records.jsonl"),
                        dead_letter=str(root / "dead.jsonl"), summary=str(root / "ingest.json")))
    return root


def _cfg(root: Path, out: str, *overrides: str):
    o = root / out
    return load_config(REPO / "params.yaml", None, [
        "ingest.sources=" + json.dumps(declared(root / "corpus", licence="CC-BY-4.0")),
        f"annotate.records={root / 'records.jsonl'}", f"annotate.out={o}/records.jsonl",
        f"annotate.proposals={o}/proposals.jsonl", f"annotate.withheld={o}/withheld.jsonl",
        f"annotate.summary={o}/summary.json", "annotate.progress=false", *overrides])


def test_off_the_stage_passes_the_records_through_byte_for_byte(project: Path):
    summary = run(_cfg(project, "off", "annotate.hide_fraction=0.5"))
    assert (project / "off/records.jsonl").read_bytes() == (project / "records.jsonl").read_bytes()
    n = len(read_records(project / "records.jsonl"))
    assert summary["enabled"] is False and summary["records_in"] == summary["records_out"] == n
    assert summary["withheld"] == summary["proposals"] == 0  # hide_fraction is ignored while off (a warning says so)


# teaching the annotator 80 steps on ~12 clips and annotating ~12 videos: ~18 s alone on 2 cores (300 steps took 62 s
# and gave 6 proposals, 1 accepted; 80 give 12, 5 accepted and both reasons to reject), then a cached rerun
@pytest.mark.slow
def test_on_every_record_and_proposal_is_accounted_for_and_auto_records_keep_their_video_s_source(project: Path):
    extra = project / "corpus" / "unlabelled"  # an unlabelled video under the declared root
    extra.mkdir(exist_ok=True)
    shutil.copy(project / "corpus/videos/v000003.mp4", extra / "new_clip.mp4")
    on = ["annotate.enabled=true", "annotate.hide_fraction=0.6", "annotate.teach.steps=80", "annotate.samples=2",
          f"annotate.videos=[{extra}]"]
    cfg = _cfg(project, "on", *on)
    summary = run(cfg)

    records = read_records(project / "records.jsonl")
    withheld = read_records(project / "on/withheld.jsonl")
    out = read_records(project / "on/records.jsonl")
    fractions = cfg.preprocess.split_fractions
    assert withheld and {r.video_id for r in withheld} == {r.video_id for r in records if hidden(r.video_id, cfg)}
    assert all(split_of(r.video_id, fractions) == "train" for r in withheld)  # only train videos lose labels
    labelled = [r for r in out if r.source == "test-set"]
    assert sorted(labelled + withheld, key=lambda r: r.annotation_id) == sorted(records, key=lambda r: r.annotation_id)
    assert summary["records_in"] == summary["passed"] + summary["withheld"] == len(records)

    auto = [r for r in out if r.source != "test-set"]
    rows = list(read_jsonl(project / "on/proposals.jsonl"))
    proposals = [r for r in rows if "query" in r]
    assert summary["proposals"] == len(proposals) > 0, rows[:5]
    assert summary["accepted"] == len(auto) == sum(r["verdict"] == "accepted" for r in proposals)
    assert summary["rejected"] == sum(r["verdict"] in ("verifier_disagrees", "low_confidence") for r in proposals)
    assert summary["accepted"] > 0 and summary["rejected"] > 0, rows  # both outcomes are checked below
    assert {r["video_id"] for r in proposals} <= {r.video_id for r in withheld} | {"new_clip"}
    for r in auto:  # what an accepted proposal is, whichever proposals the model made
        assert r.source == summary["annotator"]["source"] and r.source.startswith("auto:")
        assert (r.video_source, r.licence) == ("test-set", "CC-BY-4.0")
        assert r.verdict["iou"] >= cfg.annotate.verify_iou and r.confidence >= cfg.annotate.min_confidence
        assert (project / "corpus" / r.video_path).is_file()
    for row in proposals:  # and a rejected one is rejected for the reason it names
        if row["verdict"] == "verifier_disagrees":
            assert row["verifier"]["iou"] < cfg.annotate.verify_iou
        elif row["verdict"] == "low_confidence":
            assert row["confidence"] < cfg.annotate.min_confidence <= 1
    assert summary["precision"]["withheld_records"] == len(withheld)

    # the source id is the taught annotator's weights digest; a rerun is the same bytes and does not teach again
    taught = default_cache_dir().parent / "annotators" / summary["annotator"]["proposer"]
    assert summary["annotator"]["source"] == f"auto:{weights_digest(taught)}"
    before = {p.name: p.read_bytes() for p in (project / "on").glob("*.jsonl")}
    again = run(cfg)
    assert {p.name: p.read_bytes() for p in (project / "on").glob("*.jsonl")} == before
    assert again["seconds"] < summary["seconds"]

    # a video under no declared root is refused, naming it, with nothing written over the outputs
    stray = project / "stray"
    stray.mkdir(exist_ok=True)
    shutil.copy(project / "corpus/videos/v000003.mp4", stray / "stray.mp4")
    with pytest.raises(VTGError, match=r"annotate.videos: .*stray.mp4: belongs to no declared data source"):
        run(_cfg(project, "on", *on[:-1], f"annotate.videos=[{stray}]"))
    assert {p.name: p.read_bytes() for p in (project / "on").glob("*.jsonl")} == before
