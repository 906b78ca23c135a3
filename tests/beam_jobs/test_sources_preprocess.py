"""Issue 24 item 1 through the real preprocess job: every kept query (and its sample) names its source and licence,
`preprocess.allowed_licences` filters the others with the reason in filtered.jsonl, the manifest counts records
per source and licence, and no machine path reaches a shard or the stage's outputs."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from support.declared import declared

from beam_jobs.preprocess import run
from corpus import build_corpus
from ingest import ingest
from vtg.config import CorpusConfig, IngestConfig, load_config
from vtg.records import read_records
from vtg.shards import SHARD_CONTRACT

REPO = Path(__file__).resolve().parents[2]
IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def preprocess(tmp_path: Path, records: str, sources: list[dict], *overrides: str) -> tuple[dict, list[dict]]:
    """The real job in process on `tmp_path/records` -> (manifest, filtered.jsonl rows)."""
    cfg = load_config(REPO / "params.yaml", None, [
        f"preprocess.records={tmp_path / records}", f"preprocess.out_dir={tmp_path / 'shards'}",
        "preprocess.progress=false", "ingest.sources=" + json.dumps(sources), *overrides])
    manifest = run(cfg, IN_PROCESS, show=False)
    return manifest, [json.loads(x) for x in (tmp_path / "shards" / "filtered.jsonl").read_text().splitlines()]


def sample_metas(shards: Path):
    """Every sample's JSON in the shards under `shards`."""
    for tar in sorted(shards.glob("*/shard-*.tar")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                if m.name.endswith(".json"):
                    yield json.loads(t.extractfile(m).read())


# a 16-video corpus and one in-process preprocess run: ~6 s
def test_sources_and_licences_reach_every_sample_and_the_filter_drops_with_its_reason(tmp_path: Path):
    corpus = tmp_path / "corpus"
    build_corpus(CorpusConfig(out_dir=str(corpus), n_videos=16, workers=1, defect_fraction=0.0))
    lines = (corpus / "annotations" / "qvhighlights.jsonl").read_text().splitlines(keepends=True)
    for name, part in (("open", lines[0::2]), ("nc", lines[1::2])):  # two sets annotating the same videos
        (corpus / name).mkdir()
        (corpus / name / f"{name}.jsonl").write_text("".join(part))
    sources = [*declared(corpus / "open", corpus / "videos", id="open-set", licence="CC-BY-4.0"),
               *declared(corpus / "nc", corpus / "videos", id="nc-set", licence="CC-BY-NC-4.0")]
    ingest(IngestConfig(sources=sources, annotations=[str(corpus / "open"), str(corpus / "nc")],
                        video_root=str(corpus / "videos"), out=str(tmp_path / "records.jsonl"),
                        dead_letter=str(tmp_path / "dead.jsonl"), summary=str(tmp_path / "summary.json")))
    records = read_records(tmp_path / "records.jsonl")
    nc = {r.annotation_id for r in records if r.source == "nc-set"}
    assert nc and len(nc) < len(records)

    manifest, filtered = preprocess(tmp_path, "records.jsonl", sources, "preprocess.allowed_licences=[CC-BY-4.0]")
    by_licence = {f["annotation_id"]: f for f in filtered if f["reason"] == "licence_not_allowed"}
    assert set(by_licence) == nc  # every non-commercial record, each with why
    assert all("source nc-set is CC-BY-NC-4.0; allowed: CC-BY-4.0" == f["detail"] for f in by_licence.values())
    assert manifest["dropped_per_reason"]["licence_not_allowed"] == len(nc)

    queries = 0
    for meta in sample_metas(tmp_path / "shards"):
        assert (meta["source"], meta["licence"], meta["contract"]) == ("open-set", "CC-BY-4.0", SHARD_CONTRACT)
        for q in meta["queries"]:
            assert (q["source"], q["licence"]) == ("open-set", "CC-BY-4.0")
            assert q["annotation_file"] == "jsonl:open.jsonl" or q["annotation_file"].startswith("qvhighlights:")
            queries += 1
    rows = {r["source"]: r for r in manifest["sources"]}
    assert rows["nc-set"]["records"] == len(nc) and rows["nc-set"]["kept"] == {}
    assert rows["open-set"]["records"] == len(records) - len(nc)
    assert sum(rows["open-set"]["kept"].values()) == manifest["records"]["kept"] == queries > 0

    # no machine path anywhere in what the stage wrote (shard bytes included) or in the records
    root = str(tmp_path).encode()
    for p in [*(tmp_path / "shards").rglob("*"), tmp_path / "records.jsonl"]:
        if p.is_file():
            assert root not in p.read_bytes(), p


def test_a_declared_source_s_relative_paths_are_read_from_its_root(tmp_path: Path):
    """Records hold video paths relative to their source's root; preprocess (which reads the same `ingest.sources`
    as ingest) finds the file under the first root that has it. An absolute path is itself; a relative path of an
    undeclared source is an error that says what to pass."""
    from vtg.sources import Sources, UndeclaredFile

    for root in ("a", "b"):
        (tmp_path / root).mkdir()
    (tmp_path / "b" / "v.mp4").write_bytes(b"x")
    src = Sources.of(declared(tmp_path / "a", tmp_path / "b"))
    assert Path(src.resolve("test-set", "v.mp4")).samefile(tmp_path / "b" / "v.mp4")
    assert src.resolve("test-set", "w.mp4") == str(tmp_path / "a" / "w.mp4")  # missing: named under the first root
    assert src.resolve("test-set", "/x/v.mp4") == "/x/v.mp4"
    with pytest.raises(UndeclaredFile, match="source 'unknown' is not declared in ingest.sources .* run with the "
                                             "ingest.sources that ingest ran with"):
        src.resolve("unknown", "v.mp4")


# a 24-video corpus and one in-process preprocess run: ~8 s
def test_auto_labels_reach_train_only_and_keep_their_video_s_source(tmp_path: Path):
    """Issue 24 item 2: an `auto:<digest>` record (the annotate stage's) is read from its video's declared source
    (`video_source`), keeps that source's licence, reaches a train shard, and on a val or test video is filtered
    `auto_label_not_train` with the reason; the labelled records are untouched."""
    from vtg.splits import split_of

    corpus = tmp_path / "corpus"
    build_corpus(CorpusConfig(out_dir=str(corpus), n_videos=24, workers=1, defect_fraction=0.0,
                              text_answerable_fraction=0.0, duplicate_query_fraction=0.0))
    sources = declared(corpus, id="open-set", licence="CC-BY-4.0")
    ingest(IngestConfig(sources=sources, annotations=[str(corpus / "annotations")], video_root=str(corpus / "videos"),
                        out=str(tmp_path / "records.jsonl"), dead_letter=str(tmp_path / "dead.jsonl"),
                        summary=str(tmp_path / "summary.json")))
    records = read_records(tmp_path / "records.jsonl")
    auto = [r.model_copy(update={"source": "auto:0123456789ab", "annotation_id": f"auto:0123456789ab:{r.annotation_id}",
                                 "video_source": r.source, "confidence": 1.0, "annotation_file": "auto:test",
                                 "verdict": {"iou": 1.0}, "query": f"in this clip {r.query}"})
            for r in records]
    from vtg.records import write_jsonl

    write_jsonl(tmp_path / "all.jsonl", [*records, *auto])
    fractions = {"test": 0.2, "train": 0.6, "val": 0.2}
    off_train = {r.annotation_id for r in auto if split_of(r.video_id, fractions) != "train"}
    assert off_train and len(off_train) < len(auto)

    manifest, filtered = preprocess(tmp_path, "all.jsonl", sources, "preprocess.text_bias.enabled=false")
    not_train = {f["annotation_id"]: f for f in filtered if f["reason"] == "auto_label_not_train"}
    assert set(not_train) == off_train
    assert all(f["detail"].startswith("auto:0123456789ab label of a ") for f in not_train.values())
    seen: dict[str, set[str]] = {}
    for meta in sample_metas(tmp_path / "shards"):
        for q in meta["queries"]:
            seen.setdefault(q["source"], set()).add(meta["split"])
            assert q["licence"] == "CC-BY-4.0"  # the video's source's licence
    assert seen["auto:0123456789ab"] == {"train"} and seen["open-set"] == {"train", "val", "test"}
    rows = {r["source"]: r for r in manifest["sources"]}
    assert set(rows["auto:0123456789ab"]["kept"]) == {"train"}
    assert rows["auto:0123456789ab"]["records"] == len(auto)
