"""Both front doors on the REAL stages at a tiny scale, each in a fresh git + DVC project (a user's clone):

- `dvc repro` twice (the second runs nothing), `dvc checkout`, `dvc repro` again: nothing runs, nothing breaks,
  no stage writes into another's outputs and no pointer inside a DVC output is a symlink; then `make run`'s flow
  skips every stage;
- `python -m flows` (what `make run` runs) in another clone: `dvc status` is clean afterwards and `dvc repro` runs
  nothing; both clones hold the same `reports/eval/metrics.json` content and one data version;
- raising `train.max_steps` resumes in the DVC door; a trajectory change moves the old checkpoints aside.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from flowkit import BIN, PY, outputs_with_symlinks, project_env, real_project, set_params

STAGES = ["corpus", "ingest", "preprocess", "train", "evaluate"]


def sh(cmd: list[str], cwd: Path, timeout: float = 900) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=project_env(cwd, PYTHONPATH=""), capture_output=True, text=True,
                       timeout=timeout, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    return r.stdout + r.stderr


def dvc(cwd: Path, *args: str) -> str:
    return sh([str(BIN / "dvc"), *args], cwd)


def ran(out: str) -> list[str]:
    return [s for s in STAGES if f"Running stage '{s}'" in out]


def lock_outs(cwd: Path) -> dict[str, str]:
    lock = yaml.safe_load((cwd / "dvc.lock").read_text())["stages"]
    return {o["path"]: o["md5"] for s in lock.values() for o in s.get("outs", [])}


@pytest.mark.slow
def test_both_doors_agree_on_what_is_done_and_write_the_same_outputs(tmp_path: Path):
    # Door 1, `dvc repro`: twice (the second runs nothing), `dvc checkout`, again: nothing runs, nothing breaks.
    p = real_project(tmp_path / "repro")
    first = dvc(p, "repro")
    assert ran(first) == STAGES
    assert outputs_with_symlinks(p) == []
    pointer = json.loads((p / "checkpoints" / "latest").read_text())
    best = json.loads((p / "reports" / "eval" / "best.json").read_text())
    assert pointer == {"checkpoint": "step-000004", "step": 4} and best["checkpoint"].startswith("../../checkpoints/")
    # evaluate wrote nothing into train's output: the lock's checkpoints md5 is what training left
    outs = lock_outs(p)
    assert sorted(x.name for x in (p / "checkpoints").iterdir()) == ["latest", "step-000002", "step-000004"]
    second = dvc(p, "repro")
    assert ran(second) == [] and "Data and pipelines are up to date" in second
    dvc(p, "checkout")
    third = dvc(p, "repro")
    assert ran(third) == [] and lock_outs(p) == outs
    assert json.loads((p / "checkpoints" / "latest").read_text()) == pointer
    assert dvc(p, "status").strip().endswith("Data and pipelines are up to date.")
    # ... then `make run`'s flow skips every stage.
    flow = sh([PY, "-m", "flows"], p)
    assert flow.count("Cached('up to date (dvc.lock)'") == len(STAGES), flow[-3000:]
    assert not any(f"[{s}] $ " in flow for s in STAGES)
    assert "Data and pipelines are up to date" in dvc(p, "status")

    # Door 2, `make run` in a fresh clone: `dvc status` clean after it, `dvc repro` runs nothing, and the outputs
    # are the ones door 1 wrote.
    q = real_project(tmp_path / "flow")
    flow = sh([PY, "-m", "flows"], q)
    assert "=== post-training finished" in flow
    assert "Data and pipelines are up to date" in dvc(q, "status")
    assert ran(dvc(q, "repro")) == [] and outputs_with_symlinks(q) == []
    flow_metrics = json.loads((q / "reports/eval/metrics.json").read_text())
    assert flow_metrics == json.loads((p / "reports/eval/metrics.json").read_text()) and flow_metrics["split"] == "test"
    assert (q / "reports/eval/best.json").read_text() == (p / "reports/eval/best.json").read_text()
    # one data version: the manifest's, in every checkpoint's meta and on the MLflow runs
    version = json.loads((q / "data/shards/manifest.json").read_text())["data_version"]
    metas = [json.loads((c / "meta.json").read_text()) for c in sorted((q / "checkpoints").glob("step-*"))]
    assert version and {m["data_version"] for m in metas} == {version}
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{q / 'mlflow.db'}")
    train_run = client.get_run(metas[-1]["mlflow_run_id"])
    assert train_run.data.tags["vtg.data_version"] == version
    pipeline = client.get_run(train_run.data.tags["mlflow.parentRunId"])
    assert pipeline.data.tags["vtg.data_version"] == version

    # Extending the run in the DVC door resumes it: the old checkpoints stay, training continues from step 4.
    set_params(p, **{"train.max_steps": 6})
    extended = dvc(p, "repro")
    assert ran(extended) == ["train", "evaluate"] and "resumed from" in extended and "step 4" in extended
    assert sorted(x.name for x in (p / "checkpoints").glob("step-*")) == ["step-000002", "step-000004", "step-000006"]
    assert not list(p.glob("checkpoints-superseded-*"))
    # A trajectory change starts fresh and moves the old checkpoints aside (never deletes them).
    set_params(p, **{"train.lr": 0.001})
    fresh = dvc(p, "repro")
    assert ran(fresh) == ["train", "evaluate"] and "moved the checkpoints" in fresh
    [aside] = p.glob("checkpoints-superseded-*")
    assert sorted(x.name for x in aside.glob("step-*")) == ["step-000002", "step-000004", "step-000006"]
