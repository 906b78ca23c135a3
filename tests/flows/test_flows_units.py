"""Fast checks of the orchestration pieces: the checkpoint hook, stage runner errors, launchers,
the event trigger's parameters, the lineage CLI's errors, the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flows.events import on_checkpoint_saved
from flows.report import report_markdown
from flows.stages import ConfigArgs, StageFailed, run_stage, train_cmd
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


def test_report_says_where_rl_started_and_how_far_it_went():
    rl = {"enabled": True, "rl_run_id": "r9", "start_checkpoint": "checkpoints/sft/step-000004", "start_step": 4,
          "steps": 2, "latest_checkpoint": "checkpoints/rl/step-000002", "seconds": 3.0}
    md = report_markdown({"stages": {"rl": rl}})
    assert ("| rl | run `r9` from `checkpoints/sft/step-000004` (step 4), 2 steps -> `checkpoints/rl/step-000002` |"
            in md) and "| rl | ran | 3.0 |" in md
    assert "| rl | off (`orchestration.rl` false)" in report_markdown({"stages": {"rl": {"enabled": False}}})
    assert "| rl | not run |" in report_markdown({})


def test_the_rl_parameter_of_the_flow_and_the_deployment_is_an_override_dvc_lock_records():
    import inspect

    from flows.deployments import build_deployments
    from flows.pipeline import post_training, rl_override

    assert rl_override(None) == [] and rl_override(True) == ["orchestration.rl=true"]
    assert load_config(REPO / "params.yaml", None, rl_override(False)).orchestration.rl is False
    assert inspect.signature(post_training.fn).parameters["rl"].default is None
    pipeline, _ = build_deployments(str(REPO / "params.yaml"), None, [], rl=False)
    assert pipeline.parameters["rl"] is False  # `prefect deployment run ... -p rl=true` overrides it


def test_lineage_follows_an_rl_checkpoint_to_its_sft_parent_and_without_it_to_the_pipeline_run(tmp_path: Path):
    import mlflow

    from flows.lineage import build_chain, render
    from vtg import checkpoints as ck

    uri = f"sqlite:///{tmp_path}/m.db"
    c = mlflow.MlflowClient(uri)
    exp = c.create_experiment("lineage")
    pipeline = c.create_run(exp, tags={lineage.TAG_STAGE: "pipeline", lineage.TAG_SOURCE_DIGEST: "src1",
                                       lineage.TAG_DATA_VERSION: "dv1", lineage.TAG_PREFECT_FLOW_RUN: "flow1"}).info
    child = {"mlflow.parentRunId": pipeline.run_id}
    train = c.create_run(exp, tags={lineage.TAG_STAGE: "train", lineage.TAG_DATA_VERSION: "dv1", **child}).info
    c.log_param(train.run_id, "train.lr", "0.003")

    def save(root: Path, step: int, **meta) -> Path:
        ck.export_dir(ck.temp_dir_for(root, step)).mkdir(parents=True)
        (ck.export_dir(ck.temp_dir_for(root, step)) / "model.safetensors").write_bytes(b"w")
        base = {"data_version": "dv1", "git_commit": "g", "config_hash": "h", "finetune": "full", "base": "tiny"}
        return ck.finalize(root, step, {**base, **meta}, {}, keep_last=5)

    sft = save(tmp_path / "checkpoints/sft", 4, mlflow_run_id=train.run_id)
    rl = c.create_run(exp, tags={lineage.TAG_STAGE: "rl", lineage.TAG_PARENT_CHECKPOINT: str(sft), **child}).info
    c.log_param(rl.run_id, "rl.group_size", "8")
    rl_ckpt = save(tmp_path / "checkpoints/rl", 2, stage="rl", parent_checkpoint=str(sft), parent_step=4,
                   mlflow_run_id=rl.run_id)
    ev = c.create_run(exp, tags={lineage.TAG_STAGE: "evaluate", lineage.TAG_TRAIN_RUN: rl.run_id, "vtg.split": "val",
                                 lineage.TAG_STEP: "2", lineage.TAG_CHECKPOINT: str(rl_ckpt)}).info
    c.log_metric(ev.run_id, "eval/val/r1_at_0.5", 0.75)

    for target in (str(rl_ckpt), ev.run_id, rl.run_id):  # the checkpoint, its eval run, the RL run
        ch = build_chain(c, exp, target)
        assert (ch.stage, ch.rl_run, ch.parent_checkpoint, ch.parent_step) == ("rl", rl.run_id, str(sft), 4), target
        assert (ch.train_run, ch.train_params, ch.source_digest, ch.shard_digest, ch.flow_run) == (
            train.run_id, {"train.lr": "0.003"}, "src1", "dv1", "flow1"), target
        assert ch.rl_params == {"rl.group_size": "8"} and ch.evals[0]["metrics"] == {"r1_at_0.5": 0.75}
    assert f"-> SFT checkpoint {sft}  step 4\n" in render(ch) and "-> RL checkpoint" in render(ch)
    # the SFT parent was pruned since: the RL run's own tags and pipeline run still reach the raw data
    ck.move_aside(sft.parent, "test")
    ch = build_chain(c, exp, str(rl_ckpt))
    assert (ch.parent_checkpoint, ch.source_digest, ch.shard_digest, ch.pipeline_run) == (
        str(sft), "src1", "dv1", pipeline.run_id) and ch.train_run is None
    # ... and the chain says the parent is gone (issue 21 case 3: it printed the pruned parent as if present)
    assert ch.parent_present is False and "not on disk any more" in render(ch)


def test_metrics_and_params_flatten_nested_dicts_as_before():
    from flows.tasks import _numbers
    from flows.tracking import flatten

    d = {"a": {"r1@0.5": 1, "ok": True, "name": "x", "b": {"c": 2.5}, "empty": {}}, "n": 3, "xs": [1, 2]}
    assert _numbers(d) == {"a.r1_at_0.5": 1.0, "a.b.c": 2.5, "n": 3.0}
    assert flatten(d) == {"a.r1@0.5": "1", "a.ok": "True", "a.name": "x", "a.b.c": "2.5", "n": "3", "xs": "[1, 2]"}


TINY_FLOW = """
import json, sys, urllib.request
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from flows.evaluator import CheckpointEvaluator, prefect_api_url
from flows.stages import ConfigArgs
from vtg.config import load_config

@task(cache_policy=NO_CACHE)
def where(evaluator: CheckpointEvaluator) -> dict:
    url = prefect_api_url()
    with urllib.request.urlopen(url + "/health", timeout=30) as r:  # the server this flow run reports to
        return {"url": url, "health": r.status, "queue": str(evaluator.queue)}

@flow(persist_result=True)
def tiny() -> dict:
    ev = CheckpointEvaluator(load_config(sys.argv[1]), ConfigArgs(), None, "f", sys.argv[2])
    ev.process = open(sys.argv[2] + ".log", "w")  # stands in for the Popen: neither picklable nor hashable
    return where(evaluator=ev, return_state=True).result()

assert prefect_api_url() is None  # outside a run: none (and no server started to answer)
print(json.dumps(tiny()))
"""


@pytest.mark.slow  # an ephemeral Prefect server: 10-50 s
def test_a_task_gets_the_evaluator_and_the_ephemeral_api_url_from_prefects_client(tmp_path: Path):
    """The embedded evaluator reports to the flow's API: on the ephemeral server that is the address Prefect's
    own client uses (no private server registry), and the evaluator object passes through a NO_CACHE task."""
    from support.flowkit import project_env

    script = tmp_path / "tiny_flow.py"
    script.write_text(TINY_FLOW)
    env = {**project_env(tmp_path), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, str(script), str(REPO / "params.yaml"), str(tmp_path / "q.jsonl")],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["url"].startswith("http://127.0.0.1:") and got["url"].endswith("/api") and got["health"] == 200
    assert got["queue"] == str(tmp_path / "q.jsonl")


def test_a_checkpoint_config_from_before_the_engine_section_still_reads(tmp_path: Path, caplog):
    """A checkpoint saved with `train.precision` etc. (before `engine`) evaluates under its own config, upgraded,
    not under params.yaml with a warning."""
    from flows.evaluation import checkpoint_config

    REPO = Path(__file__).resolve().parents[2]
    data = load_config(REPO / "params.yaml", None, ["engine.deterministic=true", "train.lr=0.001"]).model_dump(
        mode="json")
    data["train"].update(data.pop("engine"))  # the old layout
    (tmp_path / "config.json").write_text(json.dumps(data))
    with caplog.at_level("WARNING"):
        cfg = checkpoint_config(tmp_path, str(REPO / "params.yaml"))
    assert cfg.engine.deterministic is True and cfg.train.lr == 0.001 and not caplog.records


def test_data_stages_started_beside_a_critical_background_step_yield_to_it(tmp_path):
    """The base's teaching (`BackgroundStage(critical=True)`) is what the train stage waits for: a stage the flow
    runs meanwhile starts at `YIELD_NICE` (its children too), one started after it ends at the flow's own priority."""
    from flows.stages import YIELD_NICE, BackgroundStage, yield_nice

    show = [sys.executable, "-c", "import os, subprocess, sys; print(os.nice(0)); "
            "print(subprocess.run([sys.executable, '-c', 'import os; print(os.nice(0))'], capture_output=True, "
            "text=True).stdout.strip())"]
    own = __import__("os").nice(0)
    assert yield_nice() == 0
    prep = BackgroundStage("teach", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "bg.log",
                           critical=True)
    try:
        assert yield_nice() == YIELD_NICE
        lines: list[str] = []
        run_stage("beside", show, on_line=lines.append, nice=yield_nice())
        assert [int(x) for x in lines] == [own + YIELD_NICE] * 2  # the stage and its child (Beam's workers)
    finally:
        prep.stop()
    assert yield_nice() == 0
    lines = []
    run_stage("after", show, on_line=lines.append, nice=yield_nice())
    assert [int(x) for x in lines] == [own] * 2
