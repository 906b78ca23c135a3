"""Fast checks of the orchestration pieces: the checkpoint hook, stage runner errors, launchers,
the event trigger's parameters, the lineage CLI's errors, the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flows.events import on_checkpoint_saved
from flows.stages import ConfigArgs, StageFailed, run_stage, train_cmd
from flows.tasks import report_markdown
from vtg import lineage
from vtg.config import load_config

REPO = Path(__file__).resolve().parents[2]


def test_checkpoint_hook_appends_one_line_per_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    queue = tmp_path / "queue.jsonl"
    on_checkpoint_saved(str(tmp_path / "step-000002"), 2)  # not orchestrated: does nothing
    assert not queue.exists()
    monkeypatch.setenv(lineage.ENV_CHECKPOINT_QUEUE, str(queue))
    monkeypatch.setenv(lineage.ENV_PARENT_RUN_ID, "abc")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    on_checkpoint_saved(str(tmp_path / "step-000002"), 2)
    on_checkpoint_saved(str(tmp_path / "step-000004"), 4)
    items = [json.loads(x) for x in queue.read_text().splitlines()]
    assert [i["step"] for i in items] == [2, 4] and items[0]["parent_run_id"] == "abc"
    assert items[1]["checkpoint_dir"] == str((tmp_path / "step-000004").resolve())


def test_stage_failure_names_the_stage_and_its_last_words(tmp_path: Path):
    ok = run_stage("echo", [sys.executable, "-c", "print('hello')"], on_line=lambda _: None)
    assert ok.returncode == 0 and ok.tail == ["hello"]
    with pytest.raises(StageFailed, match=r"stage 'boom' exited with code 3 .*: error: disk full"):
        run_stage("boom", [sys.executable, "-c", ("import sys; print('working'); print('error: disk full'); "
                                                 "sys.exit(3)")], on_line=lambda _: None)


def test_train_launcher_by_rank_count():
    cfg = load_config(REPO / "params.yaml")
    cmd, env = train_cmd(cfg, ConfigArgs().argv())
    assert cmd[1:3] == ["-m", "training"] and env["WORLD_SIZE"] == "1"
    two = load_config(REPO / "params.yaml", None, ["train.num_gpus=2"])
    cmd, env = train_cmd(two, ConfigArgs("p.yaml", "tiny", ("train.lr=0.1",)).argv())
    assert "torch.distributed.run" in cmd and "--nproc_per_node=2" in cmd and not env
    assert cmd[-5:] == ["--params", "p.yaml", "--experiment", "tiny", "train.lr=0.1"]


def test_event_trigger_maps_the_event_payload_onto_typed_parameters():
    import inspect

    from flows.deployments import EVENT_PARAMETERS, build_deployments
    from flows.evaluation import evaluate_checkpoint

    pipeline, evaluator = build_deployments(str(REPO / "params.yaml"), None, ["train.max_steps=5"])
    assert pipeline.name == "default" and pipeline.parameters["overrides"] == ["train.max_steps=5"]
    (trigger,) = evaluator.triggers
    assert trigger.expect == {lineage.CHECKPOINT_EVENT} and trigger.parameters == EVENT_PARAMETERS
    sig = inspect.signature(evaluate_checkpoint.fn)
    assert set(EVENT_PARAMETERS) <= set(sig.parameters) and sig.parameters["step"].annotation in (int, "int")


def test_lineage_cli_rejects_an_unknown_target_in_one_line(tmp_path: Path):
    r = subprocess.run([sys.executable, "-m", "flows.lineage", "not-a-thing", "--params", str(REPO / "params.yaml"),
                        "--tracking-uri", f"sqlite:///{tmp_path}/m.db"], capture_output=True, text=True,
                       cwd=tmp_path, check=False)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: 'not-a-thing' is neither a checkpoint directory")


def test_report_has_lineage_the_evaluation_part_and_every_step():
    md = report_markdown({"flow_run_id": "f1", "data_version": "dv1",
                          "evaluation_markdown": "## Held-out test metrics\n| r1@0.5 | 0.9000 | 0.3000 |\n",
                          "stages": {"train": {"seconds": 12.0, "mlflow_run_id": "r"},
                                     "ingest": {"status": "up to date", "mlflow_run_id": None}}})
    assert "| data_version | `dv1` |" in md and "| r1@0.5 | 0.9000 | 0.3000 |" in md
    assert "| train | ran | 12.0 | 0.0 | r |" in md and "| ingest | up to date | 0.0 | 0.0 | - |" in md
