"""dvc.yaml as shipped, in a temp git repo, with the stage modules replaced by the tiny stand-ins."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.flowkit import BIN, git, project_env, set_params, shadow_stages, stage_calls


def dvc(workdir: Path, *args: str) -> str:
    r = subprocess.run([str(BIN / "dvc"), *args], cwd=workdir, env=project_env(workdir), capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.slow
def test_repro_noop_then_selective_rerun_and_exp_run(project: Path):
    shadow_stages(project)
    set_params(project, **{"corpus.n_videos": 6, "train.max_steps": 4, "train.save_every": 2, "rl.max_steps": 2,
                           "orchestration.stages.evaluate_api": "standin_stages.evaluation:evaluate_checkpoint"})
    git(project, "add", "-A")
    git(project, "commit", "-qm", "pipeline")

    dvc(project, "repro")
    assert stage_calls(project) == ["corpus", "ingest", "annotate", "preprocess", "train", "select", "rl", "evaluate-cli"]
    assert (project / "dvc.lock").is_file() and (project / "reports/eval/metrics.json").is_file()

    out = dvc(project, "repro")  # nothing changed: nothing runs
    assert stage_calls(project) == ["corpus", "ingest", "annotate", "preprocess", "train", "select", "rl", "evaluate-cli"]
    assert "up to date" in out.lower()

    dvc(project, "exp", "run", "-S", "train.lr=0.0005")  # a train param: train, select, rl, evaluate rerun
    assert stage_calls(project)[8:] == ["train", "select", "rl", "evaluate-cli"]
    dvc(project, "exp", "run", "-S", "orchestration.rl=false")  # SFT only: rl (an empty root) and evaluate rerun
    assert stage_calls(project)[12:] == ["rl", "evaluate-cli"]
    # the selection metric: the select stage reruns; its choice is the same checkpoint, so RL does not (issue 36)
    dvc(project, "exp", "run", "-S", "evaluate.select_metric=miou")
    assert stage_calls(project)[14:] == ["select", "evaluate-cli"]
    assert "0.0005" in dvc(project, "exp", "show", "--no-pager", "--csv")

    dvc(project, "push")  # the local remote of .dvc/config (a folder beside the repo's data)
    assert any((project / "dvc_remote").rglob("*")), "nothing pushed to the local remote"
