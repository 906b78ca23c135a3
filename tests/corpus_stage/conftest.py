"""A tiny corpus built once per test session (n_videos=12), shared by the corpus and ingest tests.

Built with `CORPUS_MEASURED` (the settings these tests were measured with), not the params.yaml corpus."""

from pathlib import Path

import pytest
from support.measured_settings import CORPUS_MEASURED

from corpus import build_corpus
from vtg.config import CorpusConfig

SMALL = {**CORPUS_MEASURED, "n_videos": 12, "workers": 1, "long_fraction": 0.2, "text_answerable_fraction": 0.3, "duplicate_query_fraction": 0.4}


def small_config(out_dir: Path, **kw) -> CorpusConfig:
    return CorpusConfig(out_dir=str(out_dir), **{**SMALL, **kw})


@pytest.fixture(scope="session")
def corpus_config():
    """`corpus_config(out_dir, **overrides)` -> a small CorpusConfig."""
    return small_config


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> tuple[CorpusConfig, dict]:
    cfg = small_config(tmp_path_factory.mktemp("corpus") / "synthetic")
    return cfg, build_corpus(cfg)
