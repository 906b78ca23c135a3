"""Smoke: `python -m benchmarks.orchestration` on the stand-in stages with 2 training steps completes and writes its
ratios and the checkpoint-to-evaluation delay."""

import pytest
from support.benchkit import assert_promises, finite, run_benchmark


@pytest.mark.slow
def test_orchestration_benchmark_writes_its_ratios(tmp_path):
    doc = run_benchmark("orchestration", tmp_path, "--steps", "2")
    assert_promises(doc, "orchestration", ["flow_vs_direct", "rerun_vs_first"])
    delay = doc["figures"]["ckpt_to_eval_start_s"]
    assert delay["n"] > 0 and finite(delay["mean"]), delay
