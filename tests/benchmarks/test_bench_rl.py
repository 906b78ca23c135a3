"""Smoke: `python -m benchmarks.rl` on a 4-step SFT of the tiny model (built locally, as the benchmark does without
--checkpoint) and 3 GRPO steps completes and writes its ratios."""

import pytest
from benchkit import assert_promises, run_benchmark


@pytest.mark.slow
def test_rl_benchmark_writes_its_ratios(tmp_path):
    doc = run_benchmark("rl", tmp_path, "--steps", "3", "--sft-steps", "4")
    assert_promises(doc, "rl", ["rollout_tokens_per_s_vs_plain", "rollout_share_of_step", "step_vs_plain_generate"])
    assert 0 < doc["ratios"]["rollout_share_of_step"] < 1
