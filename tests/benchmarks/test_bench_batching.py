"""Smoke: `python -m benchmarks.batching` on a handful of windows and 2 timed steps completes and writes its ratios,
the padding share of each run among its figures."""

import pytest
from support.benchkit import assert_promises, finite, run_benchmark


@pytest.mark.slow
def test_batching_benchmark_writes_its_ratios(tmp_path):
    doc = run_benchmark("batching", tmp_path, "--windows", "24", "--steps", "2", "--warm", "1", "--repeats", "1")
    assert_promises(doc, "batching", ["tokens_per_s_grouped_vs_fixed", "tokens_per_s_packed_vs_fixed",
                                      "tokens_per_s_packed_wide_vs_fixed"])
    med = doc["figures"]["median"]
    assert set(med) == {"fixed", "grouped", "packed", "packed_wide"}
    assert all(finite(m["padding_frac"]) and 0 <= m["padding_frac"] < 1 for m in med.values())
    stream = doc["figures"]["stream_padding_frac"]
    assert stream["grouped"] < stream["fixed"] and stream["packed_wide"] < stream["fixed"]
