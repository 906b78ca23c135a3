"""Fixtures for the orchestration tests."""

from pathlib import Path

import pytest
from support.flowkit import make_project


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")
