"""The Beam wiring: composite transforms under TestPipeline, the CLI, runner profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs import preprocess
from beam_jobs.options import option_args, pipeline_options
from beam_jobs.transforms import DEAD, OUTCOME, NearDuplicates, ReadRecords, TextBias, query_dedup_items
from vtg.config import load_config
from vtg.config.preprocess import DedupConfig, TextBiasConfig
from vtg.errors import VTGError
from vtg.records import CanonicalRecord

REPO_PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def rec(aid: str, vid: str, query: str, window=(1.0, 3.0), duration=20.0) -> CanonicalRecord:
    return CanonicalRecord(video_id=vid, video_path=f"/v/{vid}.mp4", duration_s=duration, query=query,
                           windows=[window], source="test", annotation_id=aid)


def test_read_records_routes_bad_lines_and_duplicate_ids(tmp_path):
    good = rec("a1", "v", "x").model_dump_json()
    path = tmp_path / "r.jsonl"
    lines = [good, good, '{"video_id": 1}', "not json", ""]
    path.write_text("".join(line + "\n" for line in lines))
    with test_pipeline.TestPipeline() as p:
        out = p | ReadRecords(str(path))
        assert_that(out["records"] | beam.Map(lambda r: r.annotation_id), equal_to(["a1"]), label="records")
        assert_that(out[DEAD] | beam.Map(lambda d: d["stage"]), equal_to(["parse"] * 3), label="dead")
        assert_that(out[OUTCOME] | beam.Map(lambda o: o.reason),
                    equal_to(["duplicate_annotation_id", "invalid_record", "invalid_record"]), label="outcomes")
        assert_that(out["lines"] | beam.combiners.Count.Globally(), equal_to([4]), label="lines")


def test_query_dedup_groups_band_keys_per_video():
    rows = [rec("q1", "v1", "The red circle moves left."), rec("q2", "v1", "the red circle moves left"),
            rec("q3", "v1", "a blue square appears"), rec("q4", "v2", "the red circle moves left"),
            rec("q5", "v1", "the red circle moves left", window=(10.0, 12.0))]
    cfg = DedupConfig()
    with test_pipeline.TestPipeline() as p:
        out = (p | beam.Create(rows) | beam.Map(query_dedup_items, cfg.query_ngram)
               | NearDuplicates(cfg, cfg.query_jaccard, span_iou=0.5))
        # q4 is on another video, q5 at another moment: neither is a duplicate.
        assert_that(out, equal_to([("q1", "q1"), ("q2", "q1")]))


def test_text_bias_flags_position_giveaways():
    rows = [rec(f"t{i}", f"v{i}", "the opening title card is shown", (0.0, 2.0), 10.0 + i) for i in range(20)]
    rows += [rec(f"n{i}", f"v{i}", "the red circle moves left", (i % 7 + 0.5, i % 7 + 3.0), 20.0)
             for i in range(20)]
    with test_pipeline.TestPipeline() as p:
        out = p | beam.Create(rows) | TextBias(TextBiasConfig())
        flagged = out | beam.Filter(lambda kv: kv[1] >= 0.5) | beam.Map(lambda kv: kv[0][0])
        assert_that(flagged | beam.combiners.Count.PerElement(), equal_to([("t", 20)]))


def test_cli_end_to_end_on_fixture_videos(small_dataset, tmp_path, capsys):
    out = tmp_path / "shards"
    argv = ["--params", str(REPO_PARAMS), f"preprocess.records={small_dataset}", f"preprocess.out_dir={out}",
            "preprocess.progress=false", "preprocess.max_window_s=6", "preprocess.frame_mode=adaptive",
            "preprocess.samples_per_shard=1", *IN_PROCESS]
    assert preprocess.main(argv) == 0
    m = json.loads((out / "manifest.json").read_text())
    rec_ = m["records"]
    assert rec_ == {"inputs": 14, "kept": rec_["kept"], "filtered": rec_["filtered"], "failed": 5}
    assert m["failed_per_reason"] == {"invalid_record": 1, "unreadable_video": 4}  # 2 bad files x 2 queries
    assert m["dropped_per_reason"]["near_duplicate_video"] == 2 and m["dropped_per_reason"]["duplicate_query"] == 1
    dead = [json.loads(x) for x in (out / "dead_letter.jsonl").read_text().splitlines()]
    assert {d["error"] for d in dead if d["stage"] == "decode"} == {"zero-byte file",
                                                                    "not a decodable video (OpenCV could not open it)"}
    assert "moment_crosses_window" in m["dropped_per_reason"] or m["windows_dropped_per_reason"]
    n = sum(m["samples_per_split"].values())
    assert n >= 3 and len(m["shards"]) == n and all(s["samples"] == 1 for s in m["shards"])
    import webdataset as wds

    sample = next(iter(wds.WebDataset(str(out / m["shards"][0]["path"]), shardshuffle=False)))
    meta = json.loads(sample["json"])
    assert meta["frame_mode"] == "adaptive" and meta["num_frames"] == 16 and meta["window_end_s"] <= 6 + 1e-6
    assert meta["preprocess_version"] == f"{m['code_version']}+{m['params_hash']}"
    err = capsys.readouterr().err
    assert "preprocess summary" in err and "near_duplicate_video" in err


def test_cli_user_errors_are_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "beam_jobs.preprocess", "--params", str(REPO_PARAMS),
                        f"preprocess.records={tmp_path / 'nope.jsonl'}"], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "python -m ingest" in r.stderr
    with pytest.raises(VTGError, match="key=value"):
        preprocess.main(["--params", str(REPO_PARAMS), "stray"])


@pytest.mark.parametrize("runner", ["direct", "dataflow", "flink", "spark"])
def test_every_runner_profile_builds_pipeline_options(runner):
    cfg = load_config(REPO_PARAMS, None, [f"preprocess.runner={runner}"])
    opts = pipeline_options(cfg, ["--job_name=vtg-preprocess"]).get_all_options(drop_default=True)
    assert opts["runner"].lower().startswith(runner) and opts["job_name"] == "vtg-preprocess"
    # The command line wins over the profile.
    assert pipeline_options(cfg, ["--runner=DirectRunner"]).get_all_options()["runner"] == "DirectRunner"
    if runner == "direct":
        assert "--direct_num_workers=2" in option_args(cfg) and opts["direct_running_mode"] == "multi_processing"
