"""dvc.yaml as shipped, in a temp git repo, with the stage modules replaced by the tiny stand-ins."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flowkit import BIN, REPO, git, stage_calls, project_env

STAGE_MODULES = {  # module name in dvc.yaml -> stand-in it runs here
    "vtg/corpus/__main__.py": "standin_stages.corpus",
    "vtg/ingest/__main__.py": "standin_stages.ingest",
    "beam_jobs/__main__.py": None,
    "beam_jobs/preprocess.py": "standin_stages.preprocess",
    "training/__main__.py": "standin_stages.train",
    "evaluation/__main__.py": "standin_stages.evaluate_cli",
}


def shadow_stages(workdir: Path) -> None:
    """Packages with the real stage names in the repo dir (first on sys.path for `python -m`)."""
    import shutil

    shutil.copytree(REPO / "vtg", workdir / "vtg", ignore=shutil.ignore_patterns("__pycache__", "corpus", "ingest"))
    for rel, target in STAGE_MODULES.items():
        path = workdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        if target:
            path.write_text(f"import runpy\nrunpy.run_module({target!r}, run_name='__main__')\n")
    (workdir / "vtg" / "records.py").touch()
    (workdir / "vtg" / "shards.py").touch()
    (workdir / "vtg" / "answer.py").touch()


def dvc(workdir: Path, *args: str) -> str:
    r = subprocess.run([str(BIN / "dvc"), *args], cwd=workdir, env=project_env(workdir), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


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


@pytest.mark.slow
def test_repro_noop_then_selective_rerun_and_exp_run(project: Path):
    shadow_stages(project)
    set_params(project, **{"corpus.n_videos": 6, "train.max_steps": 4, "train.save_every": 2,
                           "orchestration.stages.evaluate_api": "standin_stages.evaluation:evaluate_checkpoint"})
    git(project, "add", "-A")
    git(project, "commit", "-qm", "pipeline")

    dvc(project, "repro")
    assert stage_calls(project) == ["corpus", "ingest", "preprocess", "train", "evaluate-cli"]
    assert (project / "dvc.lock").is_file() and (project / "reports/eval/metrics.json").is_file()

    out = dvc(project, "repro")  # nothing changed: nothing runs
    assert stage_calls(project) == ["corpus", "ingest", "preprocess", "train", "evaluate-cli"]
    assert "up to date" in out.lower()

    set_params(project, **{"train.lr": 0.001})  # a train param: train + evaluate only
    dvc(project, "repro")
    assert stage_calls(project)[5:] == ["train", "evaluate-cli"]
    git(project, "add", "-A")
    git(project, "commit", "-qm", "lr 0.001")

    dvc(project, "exp", "run", "-S", "train.lr=0.0005")
    assert stage_calls(project)[7:] == ["train", "evaluate-cli"]
    assert "0.0005" in dvc(project, "exp", "show", "--no-pager", "--csv")

    dvc(project, "push")  # the local remote of .dvc/config (a folder beside the repo's data)
    assert any((project / "dvc_remote").rglob("*")), "nothing pushed to the local remote"
