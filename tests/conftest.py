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


# ---- running the suite on two workers (`make test` runs `pytest -n 2 --dist loadgroup`, docs/testing.md) -------

FIRST = (
    "tests/training/test_train_recipes.py",  # shape-true 3B/7B recipes: the longest group, and the memory peak
    "tests/training/test_train_gpu_defaults.py",  # DeepSpeedCPUAdam's first JIT build (one core) beside them
)
"""Started first: the recipes run beside the short one-core tests, not beside another two-rank group (the 7B
ranks slowed 2.5-4x when they met the flow tests)."""
LAST = (  # longest first, so that no long group is left to run alone at the end
    "flow_door_run",  # the shared `python -m flows` run + the front doors + the flow's kill -9 test
    "tests/flows/test_embedded_flow.py",
    "tests/faults/test_kill9.py",
    "tests/infra/test_infra_native_stack.py",
    "tests/training/test_rl_loop.py",
    "tests/flows/test_dvc_pipeline.py",
    "tests/training/test_train_gpu_check.py",
    "tests/training/test_train_multiprocess.py",
    "tests/flows/test_served.py",
)
"""After the short tests: the multi-process groups, from the longest."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Every test in a group: the tests of one file run in one worker (module fixtures are built once), and the
    tests that read the shared `flow_door_run` run in one worker (a session fixture is built once per worker).
    Order: FIRST, then the short tests in collection order, then LAST."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = "flow_door_run" if "flow_door_run" in item.fixturenames else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))

    def rank(item) -> int:
        group = item.get_closest_marker("xdist_group").args[0]
        if group in FIRST:
            return FIRST.index(group)
        return len(FIRST) + 1 + LAST.index(group) if group in LAST else len(FIRST)

    items.sort(key=rank)  # stable: collection order within a rank
