"""SFT and RL checkpoints in one evaluate stage: ordering, best across both roots, the SFT-vs-RL comparison on
test by query type (distractor or not), and the RL curves in the report."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
from support.eval_fixtures import make_checkpoint, make_sample

from evaluation.compare import compare
from evaluation.query_types import GROUND_TRUTH_FILE, classify_samples
from evaluation.registry import checkpoint_label, order_key, pick_best
from evaluation.report import PLOTS, RL_PLOT, read_rl_steps, write_report
from evaluation.store import history, step_rows
from vtg.io import write_json_atomic
from vtg.shards import write_shard

ANNOTATIONS = "annotations/qvhighlights.jsonl"


def _result(stage: str | None, step: int, r07: float = 0.5, miou: float = 0.4) -> dict:
    r = {"checkpoint": f"/ck/{stage or 'old'}/step-{step:06d}", "step": step, "split": "val",
         "summary": {"model": {"miou": miou, "r1@0.7": r07}, "baselines": {}}}
    if stage:
        r["stage"] = stage
    return r


# ---- ordering and selection ----------------------------------------------------------------------------------
def test_rl_checkpoints_order_after_every_sft_checkpoint_whatever_their_steps():
    sft_late, rl_early = _result("sft", 500), _result("rl", 1)
    assert order_key(rl_early) > order_key(sft_late)
    assert pick_best([sft_late, rl_early], "r1@0.7") is rl_early  # a tie goes to the later stage
    assert pick_best([rl_early, sft_late], "r1@0.7") is rl_early
    old = _result(None, 900)  # stored before stages existed: SFT
    assert checkpoint_label(old) == "sft/step-000900" and pick_best([old, rl_early], "r1@0.7") is rl_early
    assert pick_best([_result("sft", 100), _result("sft", 50)], "r1@0.7")["step"] == 100
    better_sft = _result("sft", 10, r07=0.6)
    assert pick_best([better_sft, _result("rl", 300)], "r1@0.7") is better_sft  # metrics first
    assert pick_best([_result("sft", 10, miou=0.5), rl_early], "r1@0.7")["stage"] == "sft"  # then mIoU


def test_history_and_steps_rows_keep_both_stages_apart(tmp_path):
    results = [_result("sft", 50), _result("sft", 100), _result("rl", 50), _result("rl", 100)]
    for r in results:
        r.update(lineage="run-1", settings_hash="h", checkpoint_name=checkpoint_label(r))
        entry = tmp_path / "val" / f"{r['checkpoint_name'].replace('/', '-')}-x"
        entry.mkdir(parents=True)
        write_json_atomic(entry / "metrics.json", r)
    got = history(tmp_path, "val", "run-1", "h")
    assert [(r["stage"], r["step"]) for r in got] == [("sft", 50), ("sft", 100), ("rl", 50), ("rl", 100)]
    rows = step_rows(list(reversed(got)), ["miou", "r1@0.7"], "r1@0.7")
    assert [(r["checkpoint"], r["stage"], r["step"], r["curve_step"]) for r in rows] == [
        ("sft/step-000050", "sft", 50, 50), ("sft/step-000100", "sft", 100, 100),
        ("rl/step-000050", "rl", 50, 150), ("rl/step-000100", "rl", 100, 200)]


# ---- query types and the comparison --------------------------------------------------------------------------
def _truth(corpus: Path) -> dict:
    """A corpus ground truth: A has a distractor inside its window, B one outside (after the window), C none."""
    return {"annotation_file": ANNOTATIONS, "videos": [
        {"video_id": "A", "events": [{"annotation_id": "A-0"}, {"annotation_id": "A-1"}],
         "distractors": [{"start_s": 2.0, "end_s": 5.0}]},
        {"video_id": "B", "events": [{"annotation_id": "B-0"}], "distractors": [{"start_s": 40.0, "end_s": 44.0}]},
        {"video_id": "C", "events": [{"annotation_id": "C-0"}], "distractors": []},
        {"video_id": "D", "events": [{"annotation_id": "D-9"}], "distractors": []}]}


def _samples(corpus: Path, split: str) -> list:
    src = f"qvhighlights:{corpus / ANNOTATIONS}"
    return [make_sample("A", 0, 12.0, [[(1.0, 4.0)], [(6.0, 9.0)]], split, src),  # 2 queries, distractor
            make_sample("B", 0, 14.0, [[(3.0, 6.0)]], split, src),                  # distractor outside window
            make_sample("C", 0, 11.0, [[(2.0, 5.0)]], split, src),                  # no distractor
            make_sample("D", 0, 13.0, [[(4.0, 7.0)]], split, src),                  # annotation id not in truth
            make_sample("E", 0, 15.0, [[(5.0, 8.0)]], split, "charades:other.txt")]  # another annotation file


def test_query_types_join_the_corpus_ground_truth(tmp_path):
    metas = [m for m, _ in _samples(tmp_path, "test")]
    types, unknown = classify_samples(metas, _truth(tmp_path), tmp_path)
    assert types == {"A.0#0": "distractor", "A.0#1": "distractor", "B.0#0": "no_distractor",
                     "C.0#0": "no_distractor", "D.0#0": "unknown", "E.0#0": "unknown"}
    assert unknown == {"unknown_annotation": 1, "other_source": 1}
    types, unknown = classify_samples(metas, None, tmp_path)  # real data: no corpus ground truth
    assert set(types.values()) == {"unknown"} and unknown == {"no_ground_truth": 6}


def test_ground_truth_file_name_is_the_corpus_stage_s():
    from corpus import GROUND_TRUTH

    assert GROUND_TRUTH_FILE == GROUND_TRUTH


def _pred(key: str, iou: float, parsed: bool = True) -> dict:
    return {"key": key, "iou": iou, "raw": "x", "pred": [0, 1] if parsed else None}


def test_comparison_deltas_and_counts_reconcile():
    types = {"a#0": "distractor", "b#0": "no_distractor", "c#0": "no_distractor"}  # d#0: no type -> unknown
    sft = [_pred("a#0", 0.2), _pred("b#0", 0.6), _pred("c#0", 0.0, parsed=False), _pred("d#0", 0.8)]
    rl = [_pred("a#0", 0.75), _pred("b#0", 0.6), _pred("c#0", 0.4), _pred("d#0", 0.8)]
    c = compare(sft, rl, types, [0.3, 0.5, 0.7])
    assert c["query_type_counts"] == {"distractor": 1, "no_distractor": 2, "unknown": 1, "total": 4}
    assert sum(g["n"] for g in c["by_query_type"].values()) == c["overall"]["n"] == 4
    d = c["by_query_type"]["distractor"]
    assert d["sft"]["r1@0.7"] == 0 and d["rl"]["r1@0.7"] == 1 and d["delta"]["miou"] == pytest.approx(0.55)
    nd = c["by_query_type"]["no_distractor"]
    assert nd["delta"]["parse_failure_rate"] == -0.5 and nd["delta"]["r1@0.3"] == 0.5
    assert c["overall"]["delta"]["miou"] == pytest.approx((0.55 + 0.4) / 4)
    only_rl = compare(None, rl, {}, [0.5])
    assert "sft" not in only_rl["overall"] and only_rl["query_type_counts"]["unknown"] == 4
    with pytest.raises(ValueError):
        compare(sft[:3], rl, types, [0.5])


# ---- report ----------------------------------------------------------------------------------------------------
def _rl_steps_csv(path: Path, n: int = 6) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "reward_mean", "reward_std", "iou_mean", "parse_failure_rate", "kl", "entropy",
                    "clip_frac", "zero_advantage_groups", "rollout_s", "update_s"])
        for s in range(1, n + 1):
            w.writerow([s, 0.3 + 0.05 * s, 0.1, 0.3 + 0.05 * s, 0.0, 0.01 * s if s % 3 == 0 else "", 1.5 - 0.1 * s,
                        0.0, 1, 0.5, 0.4])
    return path


def test_report_with_rl_curves_and_comparison(tmp_path):
    rows = read_rl_steps(_rl_steps_csv(tmp_path / "rl" / "steps.csv"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and math.isnan(rows[0]["kl"]) and rows[2]["kl"] == 0.03
    assert read_rl_steps(tmp_path / "missing.csv") == []
    model = {"miou": 0.4, "r1@0.5": 0.5, "n": 2, "parse_failure_rate": 0.0, "eval_loss": 1.2}
    result = {"checkpoint": "/x/rl/step-000006", "checkpoint_name": "rl/step-000006", "step": 6, "split": "test",
              "select_metric": "r1@0.5", "summary": {
                  "model": model, "baselines": {}, "visual_gain": {}, "by_length": {}, "by_source": {},
                  "counts": {"samples": 2, "queries": 2, "scored": 2, "skipped": {}}}}
    preds = [{"key": "v#0", "query": "q", "gt": [[1.0, 3.0]], "raw": "1 - 3", "pred": [1.0, 3.0], "iou": 1.0,
              "duration_s": 10.0}, {"key": "w#0", "query": "q", "gt": [[1.0, 3.0]], "raw": "?", "pred": None,
                                    "iou": 0.0, "duration_s": 10.0}]
    comparison = {"split": "test", "selected_on": "val", "select_metric": "r1@0.5",
                  "sft": {"checkpoint": "sft/step-000100"}, "rl": {"checkpoint": "rl/step-000006", "overall_best": True},
                  **compare([{**p, "iou": 0.0} for p in preds], preds, {"v#0": "distractor"}, [0.5]),
                  "query_types": {"rule": "r"}}
    steps = [{"step": 100, "stage": "sft", "curve_step": 100, "miou": 0.1, "r1@0.5": 0.0},
             {"step": 6, "stage": "rl", "curve_step": 106, "miou": 0.4, "r1@0.5": 0.5}]
    html = write_report(tmp_path / "r", result, preds, steps, [0.5], 2, comparison=comparison, rl_steps=rows,
                        rl_warn=(0.5, 0.05)).read_text()
    images = re.findall(r'<img src="([^"]+)"', html)
    assert images == [*PLOTS, RL_PLOT]
    assert all((tmp_path / "r" / i).read_bytes()[:4] == b"\x89PNG" for i in images)
    assert "SFT vs RL on test" in html and "sft/step-000100" in html and "<td>no_distractor</td>" not in html
    assert "<td>distractor</td><td>1</td>" in html and "<td>unknown</td><td>1</td>" in html


# ---- the evaluate stage over both roots ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rl_stage")
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / GROUND_TRUTH_FILE).write_text(json.dumps(_truth(corpus)))
    shards = root / "shards"
    for split in ("train", "val", "test"):
        write_shard(shards / split / "shard-000000.tar", _samples(corpus, split))
    return {"root": root, "corpus": corpus, "shards": shards}


def _cfg(data: dict, name: str):
    from vtg.config import PipelineConfig

    w = data["root"] / name
    return PipelineConfig.model_validate({
        "train": {"out_dir": str(w / "checkpoints/sft")}, "rl": {"out_dir": str(w / "checkpoints/rl"),
                                                                "report_dir": str(w / "reports/rl")},
        "corpus": {"out_dir": str(data["corpus"])},
        "evaluate": {"shards_dir": str(data["shards"]), "out_dir": str(w / "reports/eval"),
                     "store_dir": str(w / "reports/eval_runs"), "batch_size": 6, "max_new_tokens": 12,
                     "device": "cpu", "report_samples": 3, "baselines": ["prior"]},
        "tracking": {"enabled": False}})


def _rl(cfg, step: int, parent: Path, shards: Path, train_steps: int = 0) -> Path:
    return make_checkpoint(Path(cfg.rl.out_dir), step, shards, train_steps,
                           extra_meta={"stage": "rl", "parent_checkpoint": str(parent), "parent_step": 100})


@pytest.mark.slow
def test_stage_selects_across_sft_and_rl_and_compares_on_test(data):
    from evaluation.stage import run_stage

    cfg = _cfg(data, "tie")
    sft_root = Path(cfg.train.out_dir)
    sft = [make_checkpoint(sft_root, 50, data["shards"], 0), make_checkpoint(sft_root, 100, data["shards"], 0)]
    for step in (1, 2):  # the same untrained weights everywhere: every metric ties
        _rl(cfg, step, sft[1], data["shards"])
    _rl_steps_csv(Path(cfg.rl.report_dir) / "steps.csv")

    out = run_stage(cfg)
    # A tie on every metric goes to the later checkpoint: RL after SFT (a raw step order would pick sft 100).
    assert out["best_checkpoint_name"] == "rl/step-000002" and out["best_stage"] == "rl" and out["best_step"] == 2
    labels = [v["checkpoint_name"] for v in out["val"]]
    assert labels == ["sft/step-000050", "sft/step-000100", "rl/step-000001", "rl/step-000002"]
    ev = Path(cfg.evaluate.out_dir)
    assert json.loads((ev / "best.json").read_text())["stage"] == "rl"

    metrics = json.loads((ev / "metrics.json").read_text())
    assert metrics["checkpoint"] == "rl/step-000002" and metrics["stage"] == "rl"
    c = metrics["comparison"]
    assert c["sft"]["checkpoint"] == "sft/step-000100" and c["rl"] == {
        "checkpoint": "rl/step-000002", "step": 2, "overall_best": True, "parent_step": 100}
    n_test = metrics["counts"]["scored"]
    assert n_test == 6 and c["query_type_counts"] == {"distractor": 2, "no_distractor": 2, "unknown": 2,
                                                      "total": n_test}
    assert sum(g["n"] for g in c["by_query_type"].values()) == c["overall"]["n"] == n_test
    assert all(v == 0 for g in [c["overall"], *c["by_query_type"].values()] for v in g["delta"].values())
    assert c["query_types"]["unknown_reasons"] == {"other_source": 1, "unknown_annotation": 1}

    rows = list(csv.DictReader((ev / "steps.csv").open()))
    assert [(r["checkpoint"], r["stage"], r["curve_step"]) for r in rows] == [
        ("sft/step-000050", "sft", "50"), ("sft/step-000100", "sft", "100"), ("rl/step-000001", "rl", "101"),
        ("rl/step-000002", "rl", "102")]
    html = (ev / "report.html").read_text()
    assert f'<img src="{RL_PLOT}"' in html and (ev / RL_PLOT).stat().st_size > 1000 and "SFT vs RL on test" in html
    summary = (ev / "summary.md").read_text()
    assert "## SFT vs RL on test" in summary and "| distractor | 2 |" in summary
    assert "| rl/step-000001 | rl | 1 |" in summary and "| sft/step-000100 | sft | 100 |" in summary
    assert len(list((Path(cfg.evaluate.store_dir) / "test").iterdir())) == 2  # sft parent + the best, once each

    # RL off: the stage sees SFT only (the RL checkpoints stay, unjudged).
    cfg.orchestration.rl = False
    off = run_stage(cfg)
    assert off["best_checkpoint_name"] == "sft/step-000100" and off["comparison"] is None
    assert "comparison" not in json.loads((ev / "metrics.json").read_text()) and not (ev / RL_PLOT).exists()


@pytest.mark.slow
def test_best_rl_is_compared_even_when_sft_is_the_overall_best(data):
    from evaluation.stage import run_stage

    cfg = _cfg(data, "sft_wins")
    parent = make_checkpoint(Path(cfg.train.out_dir), 100, data["shards"], 30)  # trained: beats untrained RL
    _rl(cfg, 1, parent, data["shards"])
    out = run_stage(cfg)
    assert out["best_checkpoint_name"] == "sft/step-000100"
    c = out["comparison"]
    assert c["rl"]["checkpoint"] == "rl/step-000001" and not c["rl"]["overall_best"]
    assert c["sft"]["checkpoint"] == "sft/step-000100" and c["overall"]["delta"]["miou"] < 0
    metrics = json.loads((Path(cfg.evaluate.out_dir) / "metrics.json").read_text())
    assert metrics["checkpoint"] == "sft/step-000100"
    _check_paired_interval(cfg, metrics["comparison"], (Path(cfg.evaluate.out_dir) / "summary.md").read_text())


def _check_paired_interval(cfg, c: dict, summary: str) -> None:
    """The SFT -> RL interval the report promises, recomputed from the two stored test predictions: the queries
    paired by key, the per-query differences resampled with the interval module's seed, the percentile bounds."""
    import numpy as np

    from evaluation import intervals, store
    from evaluation.intervals import format_delta

    ev = cfg.evaluate
    entries = {json.loads((e / "metrics.json").read_text())["checkpoint_name"]: e
               for e in (Path(ev.store_dir) / "test").iterdir()}
    sft = {p["key"]: p["iou"] for p in store.load_predictions(entries[c["sft"]["checkpoint"]])}
    rl = {p["key"]: p["iou"] for p in store.load_predictions(entries[c["rl"]["checkpoint"]])}
    keys = sorted(sft)
    assert sorted(rl) == keys and any(sft[k] != rl[k] for k in keys)  # the same queries, answered differently
    a, b = np.array([sft[k] for k in keys]), np.array([rl[k] for k in keys])
    index = np.random.default_rng(intervals.SEED).integers(0, len(keys), size=(ev.bootstrap_resamples, len(keys)))
    low, high = (1 - ev.confidence) / 2, (1 + ev.confidence) / 2
    for metric, t in [("miou", None), *((f"r1@{t}", t) for t in ev.iou_thresholds)]:
        diff = b - a if t is None else (b >= t).astype(float) - (a >= t).astype(float)
        lo, hi = np.quantile(diff[index].mean(axis=1), [low, high])
        got = c["overall"]["delta_ci"][metric]
        assert got["delta"] == pytest.approx(diff.mean()) == pytest.approx(c["overall"]["delta"][metric])
        assert got["ci"] == pytest.approx([lo, hi]) and got["excludes_zero"] == bool(lo > 0 or hi < 0), metric
        assert format_delta(got) in summary, metric  # the interval the report prints is this one
    assert c["overall"]["delta_ci"]["miou"]["ci"] != [0.0, 0.0]  # a real interval, not a tie's
    for group in c["by_query_type"].values():  # every type's interval brackets its own difference
        for m, entry in group["delta_ci"].items():
            assert entry["ci"][0] <= entry["delta"] <= entry["ci"][1], m


def test_an_rl_checkpoint_belongs_to_the_run_of_its_parent(tmp_path):
    from evaluation.api import _lineage, checkpoint_identity
    from vtg.checkpoints import HF_DIR, finalize, temp_dir_for

    def fake(root: Path, step: int, **meta) -> Path:  # the contract without a model: one file in hf/
        (temp_dir_for(root, step) / HF_DIR).mkdir(parents=True)
        (temp_dir_for(root, step) / HF_DIR / "config.json").write_text("{}")
        return finalize(root, step, {"data_version": "d", "git_commit": "g", "config_hash": "c", "finetune": "full",
                                     "base": "tiny", **meta}, {}, keep_last=5)

    sft = fake(tmp_path / "sft", 100, mlflow_run_id="sft-run")
    rl = fake(tmp_path / "rl", 100, stage="rl", parent_checkpoint=str(sft), parent_step=100, mlflow_run_id="rl-run")
    meta = json.loads((rl / "meta.json").read_text())
    assert _lineage(rl, meta) == "sft-run" and _lineage(sft, json.loads((sft / "meta.json").read_text())) == "sft-run"
    assert checkpoint_identity(rl, meta) == {"stage": "rl", "checkpoint_name": "rl/step-000100",
                                             "parent_checkpoint": str(sft), "parent_step": 100}
    untracked = fake(tmp_path / "sft2", 5)
    assert _lineage(untracked, json.loads((untracked / "meta.json").read_text())) == str(untracked.parent)
    gone = {**meta, "parent_checkpoint": str(tmp_path / "nowhere" / "step-000007")}
    assert _lineage(rl, gone) == str(tmp_path / "nowhere")  # the parent's root, as its own results would say
