"""Smoke: `python -m benchmarks.vision` at a handful of videos and steps completes and writes its ratios, with each
variant's step times among its figures."""

import pytest
from support.benchkit import assert_promises, run_benchmark


@pytest.mark.slow
def test_vision_benchmark_writes_its_ratios(tmp_path):
    doc = run_benchmark("vision", tmp_path, "--videos", "6", "--steps", "2", "--repeats", "1")
    assert_promises(doc, "vision", ["step_speedup_fast_vision_vs_transformers", "step_speedup_patch_embed_vs_transformers",
                                    "step_speedup_both_vs_transformers", "suite_read_speedup_cached_vs_per_clip",
                                    "suite_read_speedup_first_vs_per_clip"])
    suite = doc["figures"]["suite"]
    assert suite["items"] > suite["clips"] > 0 and suite["cached_s"] < suite["per_clip_s"]
    assert set(doc["figures"]["median_step_s"]) == {"transformers", "fast_vision", "patch_embed", "both"}
