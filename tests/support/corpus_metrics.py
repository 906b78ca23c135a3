"""The issue's "Done means" measured from a preprocess run's outputs against the corpus ground truth."""

from __future__ import annotations

import json
from pathlib import Path

from support.corpus_truth import load_truth

QUALITY = {"blurred": "blurry", "dark": "too_dark", "low_res": "low_resolution"}


def read_outputs(out: Path) -> tuple[dict, dict[str, dict], list[dict]]:
    manifest = json.loads((out / "manifest.json").read_text())
    filtered = {r["annotation_id"]: r for r in map(json.loads, (out / "filtered.jsonl").read_text().splitlines())}
    dead = [json.loads(x) for x in (out / "dead_letter.jsonl").read_text().splitlines()]
    return manifest, filtered, dead


def measure(corpus: Path, out: Path, bias_threshold: float = 0.5) -> dict:
    truth = load_truth(corpus)
    _, filtered, dead = read_outputs(out)
    dead_ids = {d.get("annotation_id") for d in dead}
    m: dict = {}
    videos = truth["videos"]
    # Quality: every record of a blurred/dark/low-res video dropped with the right reason.
    q_total = q_right = 0
    for v in videos:
        want = QUALITY.get(v["defect"]["kind"])
        for e in v["events"] if want else []:
            q_total += 1
            q_right += filtered.get(e["annotation_id"], {}).get("reason") == want
    m["quality_right"] = (q_right, q_total)
    clean = [e for v in videos if v["defect"]["kind"] == "none" for e in v["events"]]
    m["clean_quality_dropped"] = (sum(filtered.get(e["annotation_id"], {}).get("reason") in
                                      ("blurry", "too_dark", "low_resolution", "washed_out") for e in clean),
                                  len(clean))
    # Unreadable videos: every record in the dead letters.
    unreadable = [e for v in videos if not v["readable"] for e in v["events"]]
    m["unreadable_dead"] = (sum(e["annotation_id"] in dead_ids for e in unreadable), len(unreadable))
    # Near-duplicate videos clustered with their original; no other video filtered as a duplicate.
    pairs = {frozenset((v["video_id"], v["defect"]["of"])) for v in videos if v["defect"]["kind"] == "near_duplicate"}
    dup_hits = {frozenset((r["video_id"], r["detail"].split()[1])) for r in filtered.values()
                if r["reason"] == "near_duplicate_video"}
    m["video_dup_recall"] = (len(pairs & dup_hits), len(pairs))
    m["video_dup_false"] = len(dup_hits - pairs)
    # Duplicate queries clustered with their original; no other query merged.
    qpairs = {frozenset((e["annotation_id"], e["of"])) for v in videos if v["defect"]["kind"] == "none"
              for e in v["events"] if e["kind"] == "duplicate_query"}
    qhits = {frozenset((r["annotation_id"], r["detail"].split()[1].rstrip(";"))) for r in filtered.values()
             if r["reason"] == "duplicate_query"}
    m["query_dup_recall"] = (len(qpairs & qhits), len(qpairs))
    m["query_dup_false"] = len(qhits - qpairs)
    # Text bias on clean videos.
    ta = [e for e in clean if e["kind"] == "text_answerable"]
    normal = [e for e in clean if e["kind"] == "normal"]
    flagged = {a for a, r in filtered.items() if r["reason"] == "text_answerable" or
               ("blind_iou" in r["detail"] and float(r["detail"].split("blind_iou ")[1]) >= bias_threshold)}
    m["text_bias_flagged"] = (sum(e["annotation_id"] in flagged for e in ta), len(ta))
    m["text_answerable_dropped"] = sum(e["annotation_id"] in filtered for e in ta)
    m["normal_flagged"] = (sum(e["annotation_id"] in flagged for e in normal), len(normal))
    return m


def read_shards(out: Path) -> dict[str, list[dict]]:
    """Every sample's json per split, read back with the plain `webdataset` library."""
    import webdataset as wds

    metas: dict[str, list[dict]] = {}
    for split_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        urls = sorted(str(p) for p in split_dir.glob("shard-*.tar"))
        for sample in wds.WebDataset(urls, shardshuffle=False):
            meta = json.loads(sample["json"])
            frames = sorted(k for k in sample if k.endswith(".jpg"))
            assert len(frames) == meta["num_frames"] and meta["key"] == sample["__key__"]
            metas.setdefault(split_dir.name, []).append(meta)
    return metas
