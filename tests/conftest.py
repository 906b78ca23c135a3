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


@pytest.fixture(scope="session")
def flow_door_run(tmp_path_factory) -> tuple[Path, str]:
    """`make run`'s door on the REAL stages at the tiny scale, once per session: a fresh git + DVC project (a user's
    clone, `tests/flows/flowkit.real_project`) on which `python -m flows` ran to the end. Returns (project, log).

    Shared by the tests that only read what an uninterrupted flow leaves: the front-door test (dvc status clean,
    `dvc repro` runs nothing, the same outputs as the DVC door, lineage) and the kill -9 test of the flow (the
    reference its killed-and-rerun flow must equal). Read it, never write into it."""
    import subprocess
    import sys

    sys.path.insert(0, str(REPO_ROOT / "tests" / "flows"))
    from flowkit import PY, project_env, real_project

    project = real_project(tmp_path_factory.mktemp("flow_door") / "flow", fresh_prefect=True)  # a first run
    r = subprocess.run([PY, "-m", "flows"], cwd=project, env=project_env(project, PYTHONPATH=""), capture_output=True,
                       text=True, timeout=900, check=False)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-5000:]
    return project, log
