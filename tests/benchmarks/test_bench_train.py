"""Smoke: `python -m benchmarks.train` with 3 timed steps and a handful of videos completes and writes its ratios."""

import pytest
from support.benchkit import assert_promises, run_benchmark


@pytest.mark.slow
def test_train_benchmark_writes_its_ratios(tmp_path):
    doc = run_benchmark("train", tmp_path, "--steps", "3", "--videos", "4", "--examples", "16")
    assert_promises(doc, "train", ["step_time_vs_plain", "loader_corpus_vs_decode", "loader_camera_vs_decode"])
