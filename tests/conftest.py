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


@pytest.fixture(scope="session", autouse=True)
def _suite_frames_cache(tmp_path_factory) -> None:
    """Decoded general-task suites (`vtg.general_tasks.CACHE_ENV`) go to this test run's temp folder (shared by the
    workers), not `vtg/.cache`: tests decode suites of throwaway videos, whose entries would pile up there."""
    from vtg.general_tasks import CACHE_ENV

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    os.environ.setdefault(CACHE_ENV, str(shared / "suite_frames"))


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen2.5-VL (seed 0), built once and cached (tests/training, tests/vtg/model)."""
    from vtg.model.tiny import build_tiny_model

    return build_tiny_model(seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def flow_door_run(tmp_path_factory) -> tuple[Path, str]:
    """`make run`'s door on the REAL stages at the tiny scale, once per test run: a fresh git + DVC project (a user's
    clone, `tests/support/flowkit.real_project`) on which `python -m flows` ran to the end. Returns (project, log).

    Shared by the tests that only read what an uninterrupted flow leaves: the front-door test (dvc status clean,
    `dvc repro` runs nothing, the same outputs as the DVC door, lineage) and the kill -9 test of the flow (the
    reference its killed-and-rerun flow must equal). Read it, never write into it. On two workers (pytest-xdist)
    the first worker that needs it builds it in the run's shared temp folder, under a lock; the other reuses it."""
    import fcntl
    import json
    import os
    import subprocess

    from support.flowkit import PY, project_env, real_project

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # one folder per test run, above the workers' own
    root, done = shared / "flow_door", shared / "flow_door.json"
    with open(shared / "flow_door.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            found = json.loads(done.read_text())
            return Path(found["project"]), found["log"]
        project = real_project(root / "flow", fresh_prefect=True)  # a first run
        r = subprocess.run([PY, "-m", "flows"], cwd=project, env=project_env(project, PYTHONPATH=""),
                           capture_output=True, text=True, timeout=900, check=False)
        log = r.stdout + r.stderr
        assert r.returncode == 0, log[-5000:]
        done.write_text(json.dumps({"project": str(project), "log": log}))
    return project, log


# ---- running the suite on two workers (`make test` runs `pytest -n 2 --dist loadfile`, docs/testing.md) --------

FIRST = (
    "tests/training/test_train_recipes.py",  # shape-true 3B/7B recipes: the longest file, and the memory peak
    "tests/training/test_train_gpu_defaults.py",  # DeepSpeedCPUAdam's first JIT build (one core) beside them
    "tests/training/test_family_recipes.py",  # the Qwen3-VL/3.5 recipes (two ranks) after the JIT build
)
"""Started first: the recipes run beside the short one-core tests, not beside another two-rank file (the 7B
ranks slowed 2.5-4x when they met the flow tests)."""
LAST = (  # longest first, so that no long file is left to run alone at the end
    "tests/flows/test_front_doors.py",  # with the shared `flow_door_run`
    "tests/faults/test_kill9.py",  # reads `flow_door_run` too
    "tests/flows/test_embedded_flow.py",
    "tests/training/test_fsdp_ws2.py",  # three two-rank launches: ~2-4.5 min
    "tests/benchmarks/test_bench_orchestration.py",  # two flows on stand-in stages: ~2 min
    "tests/infra/test_infra_native_stack.py",
    "tests/training/test_rl_loop.py",
    "tests/training/test_family_lifecycle.py",
    "tests/flows/test_dvc_pipeline.py",
    "tests/training/test_train_gpu_check.py",
    "tests/training/test_train_multiprocess.py",
    "tests/training/test_zero3_offload.py",  # one two-rank launch: ~1 min
    "tests/flows/test_served.py",
)
"""After the short tests: the multi-process files, from the longest."""


def pytest_collection_modifyitems(config, items):
    """The order files start in (`--dist loadfile` keeps a file's tests on one worker, so a module fixture is
    built once, and with `--no-loadscope-reorder` hands files out in this order): FIRST, then the short files in
    collection order, then LAST."""

    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        if path in FIRST:
            return FIRST.index(path)
        return len(FIRST) + 1 + LAST.index(path) if path in LAST else len(FIRST)

    items.sort(key=rank)  # stable: collection order within a rank
