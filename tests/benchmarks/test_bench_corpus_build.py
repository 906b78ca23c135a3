"""Smoke: `python -m benchmarks.corpus_build` on 1% of the default corpus completes and writes what it promises."""

from support.benchkit import assert_promises, run_benchmark


def test_corpus_build_benchmark_writes_its_ratio(tmp_path):
    doc = run_benchmark("corpus_build", tmp_path, "--scale", "0.01")
    assert_promises(doc, "corpus_build", ["build_speedup"])
    assert doc["figures"]["byte_identical"] is True
    assert doc["figures"]["ingest_records"] > 0
