"""Fixtures that tests, benchmarks and the GPU check share: importable outside tests/ (`vtg.testing.shards`)."""
