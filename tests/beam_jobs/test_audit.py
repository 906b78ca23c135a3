"""The annotation audit on a synthetic corpus with planted ambiguous and imprecise queries, through the real
preprocess graph: precision and recall of its flags against the ground truth, manifest counts that reconcile
with audit.jsonl, the optional filter, and shards the audit leaves alone when it does not filter.

What the corpus can check (beam_jobs/audit.py): `ambiguous` (planted repeats: the same object doing the same
action twice, annotated with the same words), `no_change_at_boundary` and `far_from_scene_change` against planted
imprecise windows (1-2.5 s off the true event), `touches_video_end` against the annotated windows. Its events sit
inside scenes, so `far_from_scene_change` flags precise and imprecise queries alike here (measured and printed,
not asserted as a detector); `too_long` has no planted truth.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.corpus_metrics import read_outputs, read_shards
from support.declared import declared, declared_arg
from support.measured_settings import CORPUS_MEASURED

from beam_jobs.audit import AUDIT_LOG, FLAGS, iou
from beam_jobs.preprocess import run
from corpus import build_corpus, load_ground_truth
from ingest import ingest
from vtg.config import CorpusConfig, IngestConfig, load_config

REPO = Path(__file__).resolve().parents[2]
PLANT = {"ambiguous_query_fraction": 0.5, "imprecise_fraction": 1.0}
"""Half the clean videos repeat an event, nearly every one has an imprecise window (about 30% of the queries, as
TimeLens measured on Charades-STA: precision depends on this prevalence, so the false-positive rate is printed too)."""
CORPUS = {**CORPUS_MEASURED, "n_videos": 60, "workers": 1, "defect_fraction": 0.1, "duplicate_query_fraction": 0.2,
          **PLANT}
IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
FILTER = ["ambiguous", "no_change_at_boundary"]


def preprocess(root: Path, out: str, *overrides: str) -> dict:
    cfg = load_config(REPO / "params.yaml", None, [f"preprocess.records={root / 'records.jsonl'}",
                                                   f"preprocess.out_dir={root / out}", "preprocess.progress=false",
                                                   declared_arg(root / "corpus"), *overrides])
    return run(cfg, IN_PROCESS, show=False)


def build_and_ingest(root: Path, corpus_cfg: CorpusConfig) -> None:
    build_corpus(corpus_cfg)
    corpus = Path(corpus_cfg.out_dir)
    ingest(IngestConfig(sources=declared(corpus),
                        annotations=[str(corpus / "annotations")], video_root=str(corpus / "videos"),
                        out=str(root / "records.jsonl"), dead_letter=str(root / "ingest_dead.jsonl"),
                        summary=str(root / "ingest_summary.json")))


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """The busy corpus (textured scenes, small objects, up to 3 events and a distractor) with planted faults."""
    root = tmp_path_factory.mktemp("audit")
    build_and_ingest(root, CorpusConfig(out_dir=str(root / "corpus"), **CORPUS))
    return root, preprocess(root, "shards")


def audit_rows(out: Path) -> dict[str, dict]:
    return {r["annotation_id"]: r for r in map(json.loads, (out / AUDIT_LOG).read_text().splitlines())}


def truth(root: Path) -> tuple[dict[str, dict], set[str], set[str]]:
    """Every event by annotation id (with its annotated window), the truly ambiguous ids (another event of the
    video shows the same object doing the same action at another moment) and the planted imprecise ids."""
    events, ambiguous = {}, set()
    for v in load_ground_truth(root / "corpus")["videos"]:
        evs = [e for e in v["events"] if "action" in e]
        for e in v["events"]:
            e["annotated"] = (e.get("annotated_start_s", e["start_s"]), min(e.get("annotated_end_s", e["end_s"]),
                                                                             v["duration_s"]))
            events[e["annotation_id"]] = {**e, "duration_s": v["duration_s"]}
        for a in evs:
            if any(b is not a and (a["color"], a["shape"], a["action"]) == (b["color"], b["shape"], b["action"])
                   and iou((a["start_s"], a["end_s"]), (b["start_s"], b["end_s"])) < 0.5 for b in evs):
                ambiguous.add(a["annotation_id"])
    imprecise = {a for a, e in events.items() if "imprecise" in e}
    return events, ambiguous, imprecise


def precision_recall(flagged: set[str], true: set[str]) -> tuple[float, float]:
    hit = len(flagged & true)
    return hit / max(1, len(flagged)), hit / max(1, len(true))


def measure(root: Path, out: Path) -> dict:
    """Precision, recall and false-positive rate of the flags against the planted truth, over the kept queries."""
    population = {q["annotation_id"] for ms in read_shards(out).values() for m in ms for q in m["queries"]}
    rows = audit_rows(out)
    assert set(rows) <= population
    events, ambiguous, imprecise = truth(root)
    ambiguous, imprecise = ambiguous & population, imprecise & population
    flagged = {f: {a for a, r in rows.items() if f in r["flags"]} for f in FLAGS}
    m = {"queries": len(population), "n_ambiguous": len(ambiguous), "n_imprecise": len(imprecise)}
    for flag, true in (("ambiguous", ambiguous), ("no_change_at_boundary", imprecise),
                       ("far_from_scene_change", imprecise)):
        hit = len(flagged[flag] & true)
        m[flag] = (hit / max(1, len(flagged[flag])), hit / max(1, len(true)),
                   len(flagged[flag] - true) / max(1, len(population - true)))
    margin = 0.1
    m["touching"] = {a for a in population if events[a]["annotated"][0] <= margin or
                     events[a]["annotated"][1] >= events[a]["duration_s"] - margin}
    m["touches_video_end"] = flagged["touches_video_end"]
    print(f"\naudit of {out.parent.name}: {len(population)} kept queries, {len(ambiguous)} ambiguous and "
          f"{len(imprecise)} imprecise planted: " + ", ".join(
              f"{f} P {m[f][0]:.2f} R {m[f][1]:.2f} FPR {m[f][2]:.3f}"
              for f in ("ambiguous", "no_change_at_boundary", "far_from_scene_change")))
    return m


@pytest.mark.slow
def test_audit_finds_the_planted_ambiguous_and_imprecise_queries(audited):
    root, _ = audited
    m = measure(root, root / "shards")
    assert m["n_ambiguous"] >= 15 and m["n_imprecise"] >= 25, m
    assert min(m["ambiguous"][:2]) >= 0.9, m
    precision, recall, _ = m["no_change_at_boundary"]
    assert precision >= 0.75 and recall >= 0.85, m
    # events sit inside scenes: far-from-a-cut says nothing about precision here (its precision ~ the base rate)
    assert m["far_from_scene_change"][0] < precision, m
    assert m["touches_video_end"] == m["touching"]


@pytest.mark.slow
def test_audit_on_the_default_corpus_settings(tmp_path):
    """params.yaml's corpus (plain scenes, large objects, one event, 8-16 s) with the same planted faults."""
    params = load_config(REPO / "params.yaml", None, [f"corpus.out_dir={tmp_path / 'corpus'}", "corpus.n_videos=40",
                                                      "corpus.workers=1", "corpus.defect_fraction=0",
                                                      *(f"corpus.{k}={v}" for k, v in PLANT.items())])
    build_and_ingest(tmp_path, params.corpus)
    preprocess(tmp_path, "shards")
    m = measure(tmp_path, tmp_path / "shards")
    assert m["n_ambiguous"] >= 10 and m["n_imprecise"] >= 15, m
    assert min(m["ambiguous"][:2]) >= 0.9 and min(m["no_change_at_boundary"][:2]) >= 0.9, m
    assert m["touches_video_end"] == m["touching"]


@pytest.mark.slow
def test_manifest_counts_reconcile_with_the_list(audited):
    root, manifest = audited
    a, rows = manifest["audit"], audit_rows(root / "shards")
    assert a["list"] == AUDIT_LOG and a["filter"] == []
    assert a["queries"] == manifest["kept_per_split"]  # nothing filtered: every kept query was audited
    assert sum(a["unaudited"].values()) == 0
    for split, n in a["flagged"].items():
        assert n == sum(r["split"] == split for r in rows.values())
        for f in FLAGS:
            assert a["per_flag"][split][f] == sum(r["split"] == split and f in r["flags"] for r in rows.values())
    assert all(r["flags"] and r["filtered"] is None and set(r["detail"]) == set(r["flags"]) for r in rows.values())
    assert not any(r.startswith("audit_") for r in manifest["dropped_per_reason"])


@pytest.mark.slow
def test_other_thresholds_change_only_the_audit(audited):
    """The audit decides nothing while `filter` is empty: other thresholds flag other queries, and every shard,
    filtered and dead-letter line and the data version stay byte for byte the same."""
    root, manifest = audited
    other = preprocess(root, "shards_other", "preprocess.audit.ambiguous_jaccard=0.3",
                       "preprocess.audit.max_fraction=0.3", "preprocess.audit.boundary_tolerance_s=0.1")
    assert other["audit"]["flagged"] != manifest["audit"]["flagged"]
    assert other["audit"]["rules"]["max_fraction"] == 0.3
    for key in ("records", "kept_per_split", "dropped_per_reason", "failed_per_reason", "samples_per_split",
                "shards", "data_version", "params_hash"):
        assert other[key] == manifest[key], key
    a, b = root / "shards", root / "shards_other"
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file() and p.name != "manifest.json"
                   and p.name != AUDIT_LOG)
    assert len(files) > 5 and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


@pytest.mark.slow
def test_filter_drops_flagged_queries_with_their_reason(audited):
    root, manifest = audited
    filtered_run = preprocess(root, "shards_filtered", f"preprocess.audit.filter=[{','.join(FILTER)}]")
    rows = audit_rows(root / "shards")
    _, filtered, _ = read_outputs(root / "shards_filtered")
    expect = {a: f"audit_{next(f for f in FILTER if f in r['flags'])}" for a, r in rows.items()
              if set(FILTER) & set(r["flags"])}
    got = {a: r["reason"] for a, r in filtered.items() if r["reason"].startswith("audit_")}
    assert got == expect and len(got) >= 10
    rec, before = filtered_run["records"], manifest["records"]
    assert rec["inputs"] == before["inputs"] == rec["kept"] + rec["filtered"] + rec["failed"]
    assert rec["kept"] == before["kept"] - len(got) and rec["failed"] == before["failed"]
    for reason in {*expect.values()}:
        assert filtered_run["dropped_per_reason"][reason] == sum(v == reason for v in expect.values())
    a = filtered_run["audit"]
    assert a["filter"] == FILTER and a["queries"] == manifest["audit"]["queries"]  # the same queries audited
    assert sum(a["flagged"].values()) == len(audit_rows(root / "shards_filtered")) == len(rows)
    assert {r["annotation_id"] for r in audit_rows(root / "shards_filtered").values() if r["filtered"]} == set(got)
    kept = {q["annotation_id"] for ms in read_shards(root / "shards_filtered").values() for m in ms
            for q in m["queries"]}
    assert not kept & set(got)
    detail = json.loads(filtered[next(iter(got))]["detail"])
    assert set(detail) == set(rows[next(iter(got))]["flags"])


def test_planting_leaves_the_default_corpus_alone(tmp_path):
    """The new corpus options at 0 plan exactly the videos and annotations they planned before (their own
    random stream); planted, the clean videos keep their other events and get repeats and shifted windows."""
    from corpus.annotations import valid_items
    from corpus.plan import plan_corpus

    base = CorpusConfig(out_dir=str(tmp_path), **{**CORPUS_MEASURED, "n_videos": 40})
    planted = base.model_copy(update={"ambiguous_query_fraction": 1.0, "imprecise_fraction": 1.0})
    a, b = plan_corpus(base), plan_corpus(planted)
    kinds = [e["kind"] for v in b for e in v["events"]]
    assert kinds.count("ambiguous_query") >= 30 and sum("annotated_s" in e for v in b for e in v["events"]) >= 20
    for va, vb in zip(a, b):
        assert va["scenes"] == vb["scenes"] and va["distractors"] == vb["distractors"]
        assert not any(e["kind"] == "ambiguous_query" or "annotated_s" in e for e in va["events"])
        if va["defect"]["kind"] == "none":  # the same events, then the repeat
            same = [{k: x for k, x in e.items() if k not in ("annotated_s", "imprecise")} for e in vb["events"]]
            assert same[:len(va["events"])] == va["events"]
        elif va["defect"]["kind"] != "near_duplicate":
            assert va == vb
    items = {(it["video_id"], it["eid"]): it for it in valid_items(b)}
    for v in b:
        for e in v["events"]:
            it = items[(v["video_id"], e["eid"])]
            if "annotated_s" in e:
                s, t = e["start_frame"] / v["fps"], e["end_frame"] / v["fps"]
                assert (it["start"], it["end"]) == tuple(e["annotated_s"])
                assert max(abs(it["start"] - s), abs(it["end"] - t)) >= 1.0
            if e["kind"] == "ambiguous_query":
                src = next(x for x in v["events"] if x["eid"] == e["of_eid"])
                assert e["query"].lower().rstrip(".").split() == src["query"].split()
                assert e["end_frame"] <= src["start_frame"] or e["start_frame"] >= src["end_frame"]
