"""Shared fixtures. Environment defaults that every test process (and its children) needs."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")  # no analytics daemon per dvc call
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GIT_AUTHOR_NAME", "test")
os.environ.setdefault("GIT_AUTHOR_EMAIL", "test@localhost")
os.environ.setdefault("GIT_COMMITTER_NAME", "test")
os.environ.setdefault("GIT_COMMITTER_EMAIL", "test@localhost")

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
