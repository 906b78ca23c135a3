"""The TimeLens-Bench protocols as profiles, on a real-format benchmark set made here.

Fast: the peers' frame and pixel rules (`evaluation.budgets`) on worked examples of the files they copy
(qwen-vl-utils 0.0.14's `vision_process.py`, VLMEvalKit's TimeLens sampling); a model whose own bounds shrink a
budget's frames is recorded as such; TimeLens2's answer reading equals lmms-eval's on the parity battery.
Slow: a few dozen queries written in TimeLens-Bench's own format (`charades-timelens.json`, videos under
`videos/charades/`) and in Charades-STA's (`<vid> <start> <end>##<sentence>`) over videos rendered here, ingested
by the real ingest, and a tiny checkpoint scored under every profile in one call: one table, five cards that
differ pairwise and refuse to be ranked against each other."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.eval_fixtures import make_checkpoint
from support.measured_settings import CORPUS_MEASURED

from evaluation import budgets
from evaluation.bench_table import TABLE_JSON, TABLE_MD
from evaluation.benchmark import budget_used, budget_words, load_profile, main, profile_entry, run_benchmarks
from vtg.config import PipelineConfig
from vtg.frames import video_facts
from vtg.harness import HarnessMismatch, require_comparable
from vtg.model.processing import VisionParams

PROFILES = ["full_video", "lmms_eval_charades", "lmms_eval_timelens", "timelens", "timelens2"]


# ---- the peers' rules, on worked examples ----------------------------------------------------------------------
def test_qwen_vl_utils_frame_count_and_indices():
    # total_frames / video_fps * fps within [4, min(768, total)], floored to even
    assert budgets.qwen_vl_utils_nframes(900, 30.0, 2.0) == 60       # a 30 s Charades video: 2 fps exactly
    assert budgets.qwen_vl_utils_nframes(147, 30.0, 2.0) == 8        # 4.9 s -> 9.8 frames, floored to 8 (not 10)
    assert budgets.qwen_vl_utils_nframes(45, 30.0, 2.0) == 4         # 1.5 s: the 4-frame floor
    assert budgets.qwen_vl_utils_nframes(5, 30.0, 2.0) == 4          # ... within the video's 5 frames, even
    assert budgets.qwen_vl_utils_nframes(30 * 600, 30.0, 2.0) == 768  # 10 min: the 768-frame cap
    with pytest.raises(ValueError, match="nframes"):
        budgets.qwen_vl_utils_nframes(1, 30.0, 2.0)  # qwen-vl-utils refuses it too
    assert budgets.qwen_vl_utils_indices(900, 60).tolist() == [round(i * 899 / 59) for i in range(60)]
    assert budgets.qwen_vl_utils_indices(7, 4).tolist() == [0, 2, 4, 6]


def test_qwen_vl_utils_pixel_budget():
    assert budgets.smart_resize(360, 480, 28, 50176, 602112) == (364, 476)  # rounded to multiples of 28
    assert budgets.smart_resize(112, 112, 28, 50176, 602112) == (224, 224)  # up to min_pixels, ceil
    assert budgets.smart_resize(1080, 1920, 28, 3136, 602112) == (560, 1008)  # down to max_pixels, floor
    timelens = load_profile("timelens").budget
    assert (timelens.min_pixels, timelens.total_pixels) == (64 * 28 * 28, 14336 * 28 * 28)

    def tokens(n, h, w):
        return n // 2 * (h // 28) * (w // 28)  # Qwen2.5-VL: a token per 28 x 28 px of each 2-frame patch

    for n in (4, 60, 200, 400):  # the video budget: at most 14,336 merged 28x28 cells over the whole video
        assert tokens(n, *timelens.frame_size(n, 720, 1280, 28)) <= 14336
    # past ~430 frames the per-frame floor, int(min_pixels x 1.05), wins: qwen-vl-utils' rule, kept as it is
    assert timelens.frame_size(768, 720, 1280, 28) == (168, 280) and tokens(768, 168, 280) == 23040
    assert timelens.frame_size(60, 720, 1280, 32) == (448, 800)  # Qwen3-VL: factor 32
    tl2 = load_profile("timelens2").budget
    assert (tl2.min_pixels, tl2.max_pixels, tl2.total_pixels) == (32 * 32, 640 * 640, 128000 * 32 * 32)
    assert tl2.frame_size(120, 360, 480, 32) == (352, 480)  # within 640 x 640: kept, multiples of 32
    assert tl2.frame_size(120, 1080, 1920, 32) == (480, 832)  # each frame to 640 x 640 px first (fetch_image)
    assert tl2.frame_size(2048, 1080, 1920, 32) == (256, 448)  # then total_pixels / 2048 x 2 px a frame
    assert tl2.frame_size(1001, 1080, 1920, 32) == (384, 672)  # resized twice: (352, 672) if only once
    assert tl2.frame_size(709, 1080, 1920, 32) == (448, 768)  # 709 frames padded to 710: (448, 800) if not


def test_vlmevalkit_timelens_sampling():
    assert budgets.vlmevalkit_indices(900, 30.0, 4.0, 2048).tolist() == [int(i * 7.5) for i in range(120)]
    long = budgets.vlmevalkit_indices(30 * 600, 30.0, 4.0, 2048)  # 10 min at 4 fps: 2,400 > 2,048
    assert long.tolist() == [int(i * 18000 / 2049) for i in range(1, 2049)]
    assert budgets.vlmevalkit_indices(10, 2.0, 4.0, 2048).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7,
                                                                        7, 8, 8, 9, 9]  # 4 fps of a 2 fps file


def test_a_model_that_shrinks_the_budget_is_recorded_as_such():
    profile, cfg = load_profile("timelens"), PipelineConfig()
    clips = [(60, 364, 476, 30.0)]  # the size qwen-vl-utils asks for, 60 frames
    published = VisionParams()  # Qwen2.5-VL's bounds keep it
    assert budget_used(profile, published, clips) == {
        "factor": 28, "requested_pixels_per_frame": {"min": 173264, "median": 173264, "max": 173264},
        "kept_by_model": True}
    small = VisionParams(max_pixels=64 * 28 * 28)  # a model whose own bounds are smaller than the budget's frames
    assert budget_used(profile, small, clips)["kept_by_model"] is False
    words = budget_words(profile, small, cfg, budget_used(profile, small, clips))
    assert "14,336 cells of 28x28" in words and "not the peer's budget" in words
    entry = profile_entry(profile, cfg)
    assert entry["budget"]["pixels"]["total_pixels"] == 14336 * 28 * 28 and entry["windows"] == "first"
    assert entry["source"]["repository"] == "https://github.com/TencentARC/TimeLens"
    assert "compute_metrics.py" in entry["source"]["parser_source"] and entry["lmms_eval_version"] is None


def _battery() -> list[str]:
    path = Path(__file__).with_name("test_lmms_parity.py")
    spec = importlib.util.spec_from_file_location("lmms_parity_battery", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BATTERY


def test_timelens2_reads_the_battery_as_lmms_evals_timelens_task():
    """TimeLens2's `_extract_time` is lmms-eval's timelens reader with another last-resort number regex; the
    profile reads with lmms-eval's, so the two regexes must give the same numbers on every answer."""
    battery = _battery()
    assert len(battery) >= 40
    for answer in battery:
        text = answer.lower()
        lmms = [float(n) for n in re.findall(r"\b\d+\.?\d*\b", text)]
        timelens2 = [float(n) for n in re.findall(r"\b(\d+\.\d+|\d+)\b", text)]
        assert lmms == timelens2, answer


# ---- a real-format set made here, ingested and scored under every profile ---------------------------------------
@pytest.fixture(scope="module")
def sets(tmp_path_factory, shards_dir):
    from corpus import build_corpus
    from ingest.run import ingest
    from vtg.config import CorpusConfig, IngestConfig

    tmp = tmp_path_factory.mktemp("realsets")
    corpus = CorpusConfig(out_dir=str(tmp / "corpus"), **{
        **CORPUS_MEASURED, "n_videos": 12, "workers": 1, "min_duration_s": 8.0, "max_duration_s": 14.0,
        "width": 120, "height": 96,  # not square, not a multiple of 28: every budget resizes
        "max_event_s": 6.0, "annotation_format": "charades", "defect_fraction": 0.0, "invalid_per_100": 0.0,
        "long_fraction": 0.0, "text_answerable_fraction": 0.0, "duplicate_query_fraction": 0.0})
    truth = build_corpus(corpus)
    bench = tmp / "TimeLens-Bench"  # its own layout: <subset>-timelens.json, videos/<subset>/<id>.mp4
    charades = tmp / "Charades-STA"  # charades_sta_test.txt, Charades_v1_480/<id>.mp4
    entries = {}
    for v in truth["videos"]:
        for folder in (bench / "videos" / "charades", charades / "Charades_v1_480"):
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(corpus.out_dir) / v["path"], folder / f"{v['video_id']}.mp4")
        entries[v["video_id"]] = {"duration": round(v["duration_s"], 2),
                                  "spans": [[round(e["start_s"], 2), round(e["end_s"], 2)] for e in v["events"]],
                                  "queries": [f"{e['query'].capitalize()}." for e in v["events"]]}
    (bench / "charades-timelens.json").write_text(json.dumps(entries, indent=1))
    shutil.copy(Path(corpus.out_dir) / truth["annotation_file"], charades / "charades_sta_test.txt")
    sources = [{"id": "timelens-bench", "licence": "LicenseRef-TimeLens-Bench", "origin": "made by this test",
                "roots": [str(bench)]},
               {"id": "charades-sta", "licence": "LicenseRef-Charades-NonCommercial", "origin": "made by this test",
                "roots": [str(charades)]}]
    out = {}
    for name, ann, videos in (("timelens", bench / "charades-timelens.json", bench / "videos"),
                              ("charades", charades / "charades_sta_test.txt", charades / "Charades_v1_480")):
        records = tmp / f"{name}.jsonl"
        summary = ingest(IngestConfig(sources=sources, annotations=[str(ann)], video_root=str(videos),
                                      out=str(records), dead_letter=str(tmp / f"{name}.dead.jsonl"),
                                      summary=str(tmp / f"{name}.summary.json")))
        out[name] = (records, summary)
    ckpt = make_checkpoint(tmp / "checkpoints" / "sft", 0, shards_dir, 30)  # taught the answer format: it stops
    return {"tmp": tmp, "truth": truth, "entries": entries, "out": out, "ckpt": ckpt, "sources": sources,
            "bench": bench}


def _cfg(sets, name: str, **bench) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "ingest": {"sources": sets["sources"]}, "tracking": {"enabled": False},
        "evaluate": {"bootstrap_resamples": 200},
        "benchmark": {"records": str(sets["out"][name][0]), "out_dir": str(sets["tmp"] / "bench"), "device": "cpu",
                      "batch_size": 8, **bench}})


@pytest.mark.slow
def test_both_formats_ingest_to_the_same_queries(sets):
    n = sum(len(v["events"]) for v in sets["truth"]["videos"])
    assert n >= 20  # a few dozen
    (tl, tl_summary), (ch, ch_summary) = sets["out"]["timelens"], sets["out"]["charades"]
    assert tl_summary["files"][0]["format"] == "timelens" and ch_summary["files"][0]["format"] == "charades"
    assert tl_summary["records"] == ch_summary["records"] == n and tl_summary["dead_letters"] == 0
    assert tl_summary["sources"]["timelens-bench"] == {"licence": "LicenseRef-TimeLens-Bench",
                                                       "origin": "made by this test", "terms": "", "records": n}
    from vtg.records import read_records
    by_query = {(r.video_id, r.query): r for r in read_records(ch)}
    for r in read_records(tl):
        assert not r.query.endswith(".") and r.query[0].isupper()  # TimeLens's cleaning of "<Query>."
        twin = by_query[r.video_id, r.query.lower()]
        assert abs(r.windows[0][0] - twin.windows[0][0]) < 0.01 and abs(r.duration_s - twin.duration_s) < 0.01
        assert r.video_path == f"videos/charades/{r.video_id}.mp4" and r.licence == "LicenseRef-TimeLens-Bench"


@pytest.mark.slow
def test_every_profile_in_one_call_one_table_five_cards(sets, capsys):
    cfg = _cfg(sets, "timelens")
    results = run_benchmarks(sets["ckpt"], cfg, PROFILES)
    n = sets["out"]["timelens"][1]["records"]
    assert [r["profile"] for r in results] == PROFILES
    videos = {v: str(sets["bench"] / "videos" / "charades" / f"{v}.mp4") for v in sets["entries"]}
    for r in results:
        s, card = r["summary"], r["summary"]["harness"]
        assert s["counts"] == {"records": n, "scored": n, "video_errors": 0} and card["profile"]["name"] == r["profile"]
        for m, (lo, hi) in s["intervals"]["model"].items():
            assert lo <= s["model"][m] <= hi
        preds = [json.loads(x) for x in (Path(r["out_dir"]) / "predictions.jsonl").read_text().splitlines()]
        for p in preds:  # each profile's own frame rule, on the decoder's count and rate
            total, fps, _, _ = video_facts(videos[p["video_id"]])
            want = {"lmms_eval_charades": 32, "lmms_eval_timelens": 32,
                    "timelens": budgets.qwen_vl_utils_nframes(total, fps, 2.0),
                    "timelens2": len(budgets.vlmevalkit_indices(total, fps, 4.0, 2048))}.get(r["profile"])
            assert want is None or p["frames"] == min(want, total), (r["profile"], p)
        assert s["model"]["parse_failure_rate"] == sum(p["pred"] is None for p in preds) / n
    cards = {r["profile"]: r["summary"]["harness"] for r in results}
    tl, tl2 = cards["timelens"], cards["timelens2"]
    assert tl["profile"]["budget"]["pixels"]["total_pixels"] == 14336 * 28 * 28
    # 96 x 120 px: up to 64 x 28 x 28 px, multiples of 28 (ceil): 224 x 252 (kept by the model's bounds)
    assert tl["profile"]["used"]["kept_by_model"] and tl["frames"]["model_pixels_per_frame"]["min"] == 224 * 252
    assert tl["frames"]["fps"]["median"] == pytest.approx(2.0, abs=0.2) and tl["decoding"]["max_new_tokens"] == 512
    assert tl2["profile"]["budget"]["frames"]["frames_limit"] == 2048 and tl2["profile"]["used"]["factor"] == 28
    assert tl2["frames"]["fps"]["median"] == pytest.approx(4.0, abs=0.3)
    assert tl2["frames"]["model_pixels_per_frame"]["max"] == 84 * 112  # within 640 x 640: rounded to 28s
    assert [cards[p]["profile"]["lmms_eval_version"] for p in PROFILES] == [None, "0.7.3", "0.7.3", None, None]
    assert cards["lmms_eval_timelens"]["profile"]["source"]["sha256"]["lmms_eval/tasks/timelens/utils.py"]
    for i, a in enumerate(PROFILES):  # five cards, pairwise different: no two rows may be ranked together
        for b in PROFILES[i + 1:]:
            with pytest.raises(HarnessMismatch):
                require_comparable([(a, cards[a]), (b, cards[b])])
    table = Path(results[0]["table_dir"])
    assert all(r["table_dir"] == str(table) for r in results) and table.parent == Path(cfg.benchmark.out_dir)
    rows = json.loads((table / TABLE_JSON).read_text())["rows"]
    assert [(row["profile"], row["card_digest"], row["out_dir"]) for row in rows] == [
        (r["profile"], r["harness_digest"], r["out_dir"]) for r in results]
    assert all(row["metrics"]["miou"] == r["summary"]["model"]["miou"] for row, r in zip(rows, results))
    md = (table / TABLE_MD).read_text()
    assert "14,336 cells of 28x28" in md and "at most 2,048 frames" in md and "never with another row" in md
    assert "(lmms-eval 0.7.3)" in md and "TencentARC/TimeLens" in md and md.count("; kept by the model") == 2
    assert cards["timelens"]["scoring"]["several_windows"].startswith("the first window")
    assert "Caveats" in (Path(results[3]["out_dir"]) / "summary.md").read_text()
    # the CLI: the same call from the command line, on the Charades-STA records
    ch = _cfg(sets, "charades")
    args = ["--checkpoint", str(sets["ckpt"]), "--profiles", ",".join(PROFILES),
            f"benchmark.records={ch.benchmark.records}", f"benchmark.out_dir={ch.benchmark.out_dir}",
            "benchmark.device=cpu", "benchmark.max_examples=4", "benchmark.batch_size=4",
            "ingest.sources=" + json.dumps(sets["sources"]), "tracking.enabled=false"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("| `") == len(PROFILES) and "table: " in out
    assert math.isfinite(rows[0]["metrics"]["miou"]) and np.isfinite(rows[-1]["parse_failure_rate"])
