"""Smoke: `python -m benchmarks.rl` on a 4-step SFT of the tiny model (built locally, as the benchmark does without
--checkpoint) and 2 rounds of 3 GRPO steps completes and writes its ratios (medians over the rounds), the seconds per
phase and the padding shares."""

import pytest
from support.benchkit import assert_promises, run_benchmark


@pytest.mark.slow
def test_rl_benchmark_writes_its_ratios(tmp_path):
    doc = run_benchmark("rl", tmp_path, "--steps", "3", "--repeats", "2", "--sft-steps", "4")
    assert_promises(doc, "rl", ["rollout_tokens_per_s_vs_plain", "rollout_share_of_step", "step_vs_plain_generate"])
    assert 0 < doc["ratios"]["rollout_share_of_step"] < 1
    figures = doc["figures"]
    assert len(figures["rounds"]) == 2 and all(r["rollout_tokens_per_s_vs_plain"] > 0 for r in figures["rounds"])
    assert {"generate_s", "forward_s", "backward_s", "optimizer_s"} <= set(figures["phases_s_per_step"])
    assert 0 <= figures["prefill_padding_frac"] < 1 and 0 <= figures["update_padding_frac"] < 1
