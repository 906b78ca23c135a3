"""Fixtures for evaluation tests (the helpers they use live in `support.eval_fixtures`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.eval_fixtures import write_fixture_shards


@pytest.fixture(scope="session")
def shards_dir(tmp_path_factory) -> Path:
    return write_fixture_shards(tmp_path_factory.mktemp("shards"))
