"""The served path (`python -m flows.serve`, what `make serve` runs) on a free loopback port: `prefect deployment
run` completes, and the `checkpoint.saved` events of SFT and then RL trigger evaluate-checkpoint runs that
complete."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.flowkit import BIN, PY, STANDIN_OVERRIDES, project_env, read_jsonl

from vtg.net import free_port


def api_call(api: str, fn):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        return fn(client)


def flow_runs(api: str, flow_name: str) -> list:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    return api_call(api, lambda c: c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name]))))


def deployment_names(api: str) -> set[str]:
    try:
        deps = api_call(api, lambda c: c.read_deployments())
    except Exception:  # noqa: BLE001 - server not up yet
        return set()
    return {d.name for d in deps}


@pytest.mark.slow
def test_deployment_run_and_checkpoint_triggered_evaluations(tmp_path: Path):
    from support.flowkit import make_project

    project = make_project(tmp_path / "proj", with_dvc=False)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = project_env(project, STANDIN_STEP_S="0.3")
    serve = subprocess.Popen([PY, "-m", "flows.serve", "--prefect-port", str(port), "--no-mlflow",
                              *STANDIN_OVERRIDES, "tracking.enabled=false"], cwd=project, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        cli_env = {**env, "PREFECT_API_URL": api}
        deadline = time.time() + 240
        while time.time() < deadline:  # deployments are registered once `serve` is up
            if {"default", "on-checkpoint-saved"} <= deployment_names(api):
                break
            assert serve.poll() is None, serve.stdout.read()
            time.sleep(2)
        else:
            pytest.fail("deployments never appeared")
        run = subprocess.run([str(BIN / "prefect"), "deployment", "run", "post-training/default", "--watch",
                              "--watch-timeout", "300"], env=cli_env, capture_output=True, text=True, timeout=330,
                             check=False, cwd=project)
        assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]

        report = (project / "reports/pipeline_report.md").read_text()
        assert "eval_mode | `events`" in report
        evals = [e for e in read_jsonl(project / "reports/orchestration/checkpoint_evals.jsonl")
                 if e["split"] == "val"]
        by_root = {root: sorted(e["step"] for e in evals if Path(e["checkpoint_dir"]).parent.name == root)
                   for root in ("sft", "rl")}
        assert by_root == {"sft": [2, 4, 6], "rl": [1, 2]}  # every SFT and RL checkpoint, each from its event
        triggered = [r for r in flow_runs(api, "evaluate-checkpoint") if r.deployment_id is not None]
        assert len(triggered) == 5 and all(r.state.is_completed() for r in triggered)
        assert sorted(r.parameters["step"] for r in triggered) == [1, 2, 2, 4, 6]  # typed int from the event
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)
