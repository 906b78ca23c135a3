"""Issue 21 case 12: zero usable records passed ingest and preprocess with rc 0, and the error came two stages
later in training (with a hint to rerun preprocess). Now the stage that ends up with nothing the next stage can use fails there, in one
line that says where every input went, after writing its outputs (nothing is lost)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.declared import declared_arg

from beam_jobs.preprocess import check_trainable
from vtg.errors import VTGError
from vtg.records import read_jsonl

REPO = Path(__file__).resolve().parents[2]


def _cli(module: str, cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "--params", str(REPO / "params.yaml"), *overrides],
                          cwd=cwd, capture_output=True, text=True, timeout=300, check=False,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def test_ingest_with_no_usable_record_fails_in_one_line_and_keeps_the_dead_letters(tmp_path):
    (tmp_path / "videos").mkdir()
    ann = tmp_path / "ann.jsonl"
    ann.write_text("".join(json.dumps({"annotation_id": f"a{i}", "video_id": "v", "video_path": "/nowhere/v.mp4",
                                       "query": "a person opens a door", "windows": [[0.5, 1.5]], "duration_s": 5.0})
                           + "\n" for i in range(3)) + "{not json\n")
    r = _cli("ingest", tmp_path, declared_arg(tmp_path),
             f"ingest.annotations=[{ann}]", f"ingest.video_root={tmp_path / 'videos'}",
             f"ingest.out={tmp_path / 'out/r.jsonl'}", f"ingest.dead_letter={tmp_path / 'out/d.jsonl'}",
             f"ingest.summary={tmp_path / 'out/s.json'}")
    assert r.returncode == 2, r.stderr[-2000:]
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert err[-1].startswith("error: ingest: no usable record out of 4 input line(s)") and "Traceback" not in r.stderr
    # every line kept as a dead letter with its error, beside the stage's outputs, which it does not touch
    # (issue 39 class 2: a failing run truncates nothing)
    (failed,) = (tmp_path / "out").glob("ingest-failed-*")
    assert str(failed / "d.jsonl") in err[-1]
    assert len(list(read_jsonl(failed / "d.jsonl"))) == 4
    assert not (tmp_path / "out/d.jsonl").exists() and not (tmp_path / "out/s.json").exists()


def _manifest(train: int, val: int, test: int) -> dict:
    kept = train + val + test
    return {"samples_per_split": {"train": train, "val": val, "test": test},
            "records": {"inputs": kept + 5, "kept": kept, "filtered": 3, "failed": 2}}


@pytest.mark.parametrize("counts", [(0, 0, 0), (0, 2, 2)])
def test_preprocess_without_train_samples_fails_with_the_counts(counts):
    with pytest.raises(VTGError) as e:
        check_trainable(_manifest(*counts), "data/shards")
    text = str(e.value)
    assert "no train sample" in text and "data/shards/filtered.jsonl" in text and "\n" not in text
    assert f"{sum(counts) + 5} records in" in text


def test_preprocess_with_train_samples_passes_and_warns_for_a_missing_split(caplog):
    check_trainable(_manifest(4, 0, 0), "data/shards")
    assert "no val sample" in caplog.text and "no test sample" in caplog.text
