"""Helpers for the orchestration tests: a throwaway project directory wired to the tiny stand-in stages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "flows" / "standins"
PY = sys.executable
BIN = Path(PY).parent

STANDIN_OVERRIDES = [
    "orchestration.stages.corpus=standin_stages.corpus",
    "orchestration.stages.ingest=standin_stages.ingest",
    "orchestration.stages.preprocess=standin_stages.preprocess",
    "orchestration.stages.train=standin_stages.train",
    "orchestration.stages.select=standin_stages.select",
    "orchestration.stages.rl=standin_stages.rl",
    "orchestration.stages.evaluate_api=standin_stages.evaluation:evaluate_checkpoint",
    "orchestration.stages.evaluate=standin_stages.evaluate_cli",
    "corpus.n_videos=10",
    "train.max_steps=6",
    "train.save_every=2",
    "train.keep_last=10",
    "rl.max_steps=2",
    "rl.save_every=1",
    "orchestration.task_retries=0",
]


def project_env(workdir: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(STANDINS), "PREFECT_HOME": str(workdir / ".prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "STANDIN_CALLS": str(workdir / "calls.txt"),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180", "PATH": f"{BIN}:{os.environ['PATH']}",
           "VTG_GIT_COMMIT": "", "PYTHONUNBUFFERED": "1"}
    env.pop("PREFECT_API_URL", None)
    env.pop("VTG_GIT_COMMIT")
    env.update(extra)
    return env


def git(workdir: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=workdir, check=True, capture_output=True, text=True).stdout


def migrated_prefect_db() -> Path:
    """An empty Prefect database with every migration applied, built once per Prefect version (19 s) under
    .cache/. A fresh PREFECT_HOME makes the ephemeral server migrate first: 31 s to the first flow run instead of
    20 s, paid by every flow run of the suite. The front-door fixture keeps a fresh home: the suite's one first flow run
    that migrates the database itself (`python -m flows` without `make setup`, which migrates it beforehand)."""
    import prefect

    db = REPO / ".cache" / f"prefect-db-{prefect.__version__}" / "prefect.db"
    if not db.exists():
        tmp = db.parent.with_name(f"{db.parent.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)  # Prefect opens <home>/prefect.db without making a missing .cache/ first
        env = {**os.environ, "PREFECT_HOME": str(tmp), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop("PREFECT_API_URL", None)
        subprocess.run([str(BIN / "prefect"), "server", "database", "upgrade", "-y"], env=env, check=True,
                       capture_output=True, timeout=300)
        db.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / "prefect.db", db)
        shutil.rmtree(tmp, ignore_errors=True)
    return db


def make_project(workdir: Path, with_dvc: bool = True, fresh_prefect: bool = False) -> Path:
    """params.yaml + experiments + dvc.yaml + a DVC repo in git, with a local remote beside it. Its PREFECT_HOME
    starts from a migrated database unless `fresh_prefect` (then the first flow run migrates, as a user's does)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if not fresh_prefect:
        (workdir / ".prefect").mkdir(exist_ok=True)
        shutil.copy(migrated_prefect_db(), workdir / ".prefect" / "prefect.db")
    shutil.copy(REPO / "params.yaml", workdir / "params.yaml")
    shutil.copytree(REPO / "experiments", workdir / "experiments")
    (workdir / ".gitignore").write_text("/.prefect/\n/calls.txt\n/mlflow.db\n/mlruns/\n/.serve/\n/reports/orchestration/\n"
                                       "/reports/eval_runs/\n/dvc_remote/\n/reports/pipeline_report.md\n")
    if with_dvc:
        git(workdir, "init", "-q")
        subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=workdir, check=True)
        shutil.copy(REPO / ".dvc" / "config", workdir / ".dvc" / "config")
        shutil.copy(REPO / "dvc.yaml", workdir / "dvc.yaml")
        shutil.copy(REPO / ".dvcignore", workdir / ".dvcignore")  # a clone has it: bytecode is not a code dep
    return workdir


STAGE_MODULES = {  # module name in dvc.yaml -> stand-in it runs here
    "corpus/__main__.py": "standin_stages.corpus",
    "ingest/__main__.py": "standin_stages.ingest",
    "annotate/__main__.py": "standin_stages.annotate",
    "beam_jobs/__main__.py": None,
    "beam_jobs/preprocess.py": "standin_stages.preprocess",
    "training/__main__.py": "standin_stages.train",
    "training/rl/__main__.py": "standin_stages.rl",
    "evaluation/select.py": "standin_stages.select",
    "evaluation/__main__.py": "standin_stages.evaluate_cli",
}


def shadow_stages(workdir: Path) -> None:
    """Packages with the real stage names in the repo dir (first on sys.path for `python -m`)."""
    shutil.copytree(REPO / "vtg", workdir / "vtg", ignore=shutil.ignore_patterns("__pycache__", ".cache", "corpus", "ingest"))
    for rel, target in STAGE_MODULES.items():
        path = workdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        if target:
            path.write_text(f"import runpy\nrunpy.run_module({target!r}, run_name='__main__')\n")
    (workdir / "vtg" / "records.py").touch()
    (workdir / "vtg" / "shards.py").touch()
    (workdir / "vtg" / "answer.py").touch()


def set_params(workdir: Path, **dotted: object) -> None:
    import yaml

    data = yaml.safe_load((workdir / "params.yaml").read_text())
    for key, value in dotted.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    (workdir / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def calls(workdir: Path) -> list[str]:
    path = workdir / "calls.txt"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def stage_calls(workdir: Path) -> list[str]:
    """Stage processes that really ran (evaluation API calls, `evaluate:<ckpt>:<split>`, left out)."""
    return [c for c in calls(workdir) if not c.startswith("evaluate:")]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []




CODE = ("vtg", "corpus", "ingest", "annotate", "beam_jobs", "training", "evaluation", "flows")
TINY_REAL = {  # the real stages at a tiny scale: ~1-2 min for the whole pipeline on 2 cores
    "corpus.n_videos": 40, "corpus.workers": 1, "preprocess.direct_num_workers": 1,
    "train.max_steps": 4, "train.save_every": 2, "train.micro_batch_size": 4, "train.data.num_workers": 0,
    "train.data.sanity_examples": 4, "train.progress": False, "evaluate.max_examples": 6,
    "evaluate.baselines": ["prior"], "orchestration.task_retries": 0,
    "rl.max_steps": 2, "rl.queries_per_step": 2, "rl.group_size": 2, "rl.save_every": 1, "rl.max_queries": 8,
    "rl.micro_batch_size": 4, "rl.kl_every": 1, "rl.progress": False,
    "train.teach.steps": 20, "evaluate.forgetting.max_items": 6,
    # the annotate stage on: a quarter of the train videos' labels withheld, a tiny annotator taught 20 steps
    "annotate.enabled": True, "annotate.hide_fraction": 0.25, "annotate.teach.steps": 20, "annotate.samples": 1,
    "annotate.max_new_tokens": 16, "annotate.progress": False,
}


def real_project(workdir: Path, fresh_prefect: bool = False) -> Path:
    """A fresh git + DVC project holding a copy of the real code (the code deps dvc.yaml hashes) and
    params.yaml at the tiny scale, committed, as a user's clone would be."""
    make_project(workdir, fresh_prefect=fresh_prefect)
    for pkg in CODE:
        shutil.copytree(REPO / pkg, workdir / pkg, ignore=shutil.ignore_patterns("__pycache__", ".cache"))
    set_params(workdir, **TINY_REAL)
    git(workdir, "add", "-A")
    git(workdir, "commit", "-qm", "project")
    return workdir


def outputs_with_symlinks(workdir: Path, roots: tuple[str, ...] = ("data", "checkpoints", "reports/eval", "reports/rl"),
                          ) -> list[str]:
    return [str(p.relative_to(workdir)) for r in roots if (workdir / r).exists()
            for p in (workdir / r).rglob("*") if p.is_symlink()]
