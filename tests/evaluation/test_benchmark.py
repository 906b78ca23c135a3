"""The benchmark protocol end to end: a small Charades-STA-format set (real videos, `<vid> <s> <e>##<query>` lines)
ingested by `python -m ingest`'s code, scored on whole videos under the `full_video` profile and lmms-eval's
Charades-STA profile; the two harness cards differ and ranking across them is refused (lmms-eval's answer reading
is pinned to lmms-eval's own in test_lmms_parity.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.declared import declared
from support.eval_fixtures import make_checkpoint
from support.measured_settings import CORPUS_MEASURED

from corpus import build_corpus
from evaluation.benchmark import Profile, frame_indices, load_profile, main, run_benchmark
from ingest.run import ingest
from vtg.cli_common import run_cli
from vtg.config import CorpusConfig, IngestConfig, PipelineConfig
from vtg.errors import VTGError
from vtg.harness import HarnessMismatch, differences
from vtg.records import read_records
from vtg.selection import pick_best

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bench(tmp_path_factory, shards_dir):
    tmp = tmp_path_factory.mktemp("bench")
    corpus = CorpusConfig(out_dir=str(tmp / "charades"), **{**CORPUS_MEASURED, "n_videos": 4, "workers": 1,
                          "annotation_format": "charades", "defect_fraction": 0.0, "invalid_per_100": 0.0,
                          "long_fraction": 0.0, "text_answerable_fraction": 0.0, "duplicate_query_fraction": 0.0})
    truth = build_corpus(corpus)
    annotations = Path(corpus.out_dir) / truth["annotation_file"]
    assert annotations.suffix == ".txt" and "##" in annotations.read_text().splitlines()[0]
    records = tmp / "records.jsonl"
    summary = ingest(IngestConfig(sources=declared(corpus.out_dir), annotations=[str(annotations)], format="charades",
                                  video_root=str(Path(corpus.out_dir) / "videos"), out=str(records),
                                  dead_letter=str(tmp / "dead.jsonl"), summary=str(tmp / "summary.json")))
    n = len(read_records(records))
    assert n == summary["records"] >= 4
    ckpt = make_checkpoint(tmp / "checkpoints" / "sft", 0, shards_dir, 0)
    base = {"ingest": {"sources": declared(corpus.out_dir)},
            "benchmark": {"records": str(records), "out_dir": str(tmp / "bench"), "device": "cpu",
                          "batch_size": 4}, "tracking": {"enabled": False}, "evaluate": {"bootstrap_resamples": 200}}
    cfgs = {p: PipelineConfig.model_validate({**base, "benchmark": {**base["benchmark"], "profile": p}})
            for p in ("full_video", "lmms_eval_charades")}
    return {"truth": truth, "records": records, "n": n, "ckpt": ckpt, "cfgs": cfgs, "tmp": tmp}


def test_full_video_and_lmms_eval_profiles_score_whole_videos_with_different_cards(bench):
    durations = {v["video_id"]: v["duration_s"] for v in bench["truth"]["videos"]}
    results = {}
    for profile, cfg in bench["cfgs"].items():
        r = results[profile] = run_benchmark(bench["ckpt"], cfg)
        s = r["summary"]
        assert s["counts"] == {"records": bench["n"], "scored": bench["n"], "video_errors": 0}
        assert set(s["model"]) >= {"miou", "r1@0.3", "r1@0.5", "r1@0.7", "n"} and s["model"]["n"] == bench["n"]
        for m, (lo, hi) in s["intervals"]["model"].items():
            assert lo <= s["model"][m] <= hi
        card = s["harness"]
        assert card["protocol"] == "full_video" and card["profile"]["name"] == profile
        preds = [json.loads(line) for line in (Path(r["out_dir"]) / "predictions.jsonl").read_text().splitlines()]
        assert len(preds) == bench["n"]
        for p in preds:  # the whole video: frames from its first to its last second
            assert p["first_s"] == 0.0 and p["last_s"] >= durations[p["video_id"]] - 0.5
        stored = json.loads((Path(r["out_dir"]) / "metrics.json").read_text())
        assert stored["summary"]["harness"] == card
        assert "| protocol | full_video |" in (Path(r["out_dir"]) / "summary.md").read_text()
    full, lmms = (results[p]["summary"]["harness"] for p in ("full_video", "lmms_eval_charades"))
    assert lmms["frames"]["per_query"] == {"min": 32, "median": 32, "max": 32}
    assert lmms["decoding"]["max_new_tokens"] == 50 and full["decoding"]["max_new_tokens"] == 32
    assert "seonds" in lmms["profile"]["query_template"]  # lmms-eval's prompt, held as data, typo included
    assert lmms["parser"]["version"].startswith("lmms-eval 0.7.3 ")  # its reader, pinned by test_lmms_parity
    assert lmms["profile"]["lmms_eval_version"] == "0.7.3" and full["profile"]["lmms_eval_version"] is None
    as_reported = results["lmms_eval_charades"]["as_reported"]
    assert set(as_reported) == {"IOU 0.3", "IOU 0.5", "IOU 0.7", "mIOU"}
    assert as_reported["mIOU"] == pytest.approx(100 * results["lmms_eval_charades"]["summary"]["model"]["miou"],
                                                abs=0.01)
    diff = "\n".join(differences(full, lmms))
    assert full["frames"]["fps"]["median"] == pytest.approx(2.0, abs=0.15)
    assert "frames.per_query" in diff and "decoding.max_new_tokens" in diff and "parser.version" in diff
    assert "profile.lmms_eval_version" in diff
    with pytest.raises(HarnessMismatch, match="different harness cards"):
        pick_best([results["full_video"], results["lmms_eval_charades"]], "r1@0.5")


def test_the_cli_prints_the_card_and_a_missing_records_file_says_how_to_make_it(bench, capsys, tmp_path):
    cfg = bench["cfgs"]["full_video"]
    args = ["--checkpoint", str(bench["ckpt"]), f"benchmark.records={cfg.benchmark.records}",
            f"benchmark.out_dir={tmp_path}", "benchmark.device=cpu", "benchmark.max_examples=2",
            "benchmark.max_frames=8", "ingest.sources=" + json.dumps([d.model_dump() for d in cfg.ingest.sources]),
            "tracking.enabled=false"]
    assert run_cli(main, args) == 0
    out = capsys.readouterr().out
    assert "Benchmark `full_video`" in out and "| frames per query (min / median / max) | 8 / 8.0 / 8 |" in out
    assert run_cli(main, [*args[:-3], "benchmark.records=/nonexistent/records.jsonl"]) != 0
    assert "python -m ingest" in capsys.readouterr().err


def test_frame_indices_spread_over_the_whole_video():
    policy, uniform = Profile("full_video", "policy"), load_profile("lmms_eval_charades")
    assert frame_indices(100, 32, uniform).tolist() == np.linspace(0, 99, 32).astype(int).tolist()
    assert frame_indices(100, 5, policy).tolist() == [0, 25, 50, 74, 99]
    assert frame_indices(10, 32, uniform).tolist() == list(range(10))  # never a repeated frame
    with pytest.raises(VTGError, match="no such profile"):
        load_profile("nope")
