"""The orchestrator applies the evaluation placement (flows/placement.py): the evaluator process of the training
stages (its CUDA_VISIBLE_DEVICES, `--device`, started before SFT or after SFT and RL) and the SFT and RL commands
(never on the evaluation GPU); RL reports into the same queue and evaluator as SFT. The task bodies run for real;
the processes they would start are recorded instead."""

from __future__ import annotations

import logging
import subprocess
import types
from pathlib import Path

import pytest
from prefect.states import Completed

from flows import evaluator, report, stages, tasks
from flows.evaluator import CheckpointEvaluator
from flows.stages import ConfigArgs, train_cmd
from vtg import eval_queue, lineage
from vtg.config import load_config

REPO = Path(__file__).resolve().parents[2]
QWEN = "train.model.base=Qwen/Qwen2.5-VL-7B-Instruct"
REAL_POPEN = subprocess.Popen


class Started:
    """Stands in for the evaluator's Popen and the training's run_stage, in the order they happen."""

    def __init__(self):
        self.events: list[tuple[str, list[str], dict[str, str]]] = []

    def popen(self, argv, *args, env=None, **kwargs):
        if "flows.evaluation" not in argv:  # anything else (git, ...) runs for real
            return REAL_POPEN(argv, *args, env=env, **kwargs)
        self.events.append(("evaluator", list(argv), dict(env or {})))
        return types.SimpleNamespace(pid=2**30, returncode=0, poll=lambda: 0)  # no such process: nothing to stop

    def run_stage(self, name, argv, env=None, **_):
        self.events.append((name, list(argv), dict(env or {})))
        return stages.StageResult(name, argv, 0, 0.1)

    def one(self, kind: str) -> tuple[list[str], dict[str, str]]:
        (hit,) = [(argv, env) for k, argv, env in self.events if k == kind]
        return hit

    @property
    def order(self) -> list[str]:
        return [k for k, _, _ in self.events]


@pytest.fixture
def run_train(tmp_path, monkeypatch):
    """`run_train(n_gpus, *overrides, visible=None, rl=False, train_cached=False)`: the train task (then the rl
    task with `rl`), then the queue closed as the flow does, with `n_gpus` visible -> (Started, result of the last
    task that ran, the CheckpointEvaluator). `train_cached`: dvc.lock says SFT is done (only RL runs)."""
    monkeypatch.setattr(tasks, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(tasks, "_record", lambda *a, **k: None)
    monkeypatch.setattr(stages, "DEEPSPEED_HOSTFILE", str(tmp_path / "no-hostfile"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)

    def run(n_gpus: int, *overrides: str, visible: str | None = None, rl: bool = False, train_cached: bool = False):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        started = Started()
        monkeypatch.setattr(tasks, "run_stage", started.run_stage)
        monkeypatch.setattr(subprocess, "Popen", started.popen)
        monkeypatch.setattr(evaluator, "visible_gpus", lambda: n_gpus)
        monkeypatch.setattr(tasks, "_up_to_date", lambda stage, cfg, result, *a, **k: Completed(data=result) if (
            train_cached and stage == "train") else None)
        cfg = load_config(REPO / "params.yaml", None, [f"train.out_dir={tmp_path / 'ck'}",
                                                       f"rl.out_dir={tmp_path / 'rl'}",
                                                       f"rl.report_dir={tmp_path / 'reports-rl'}",
                                                       f"orchestration.state_dir={tmp_path / 'state'}",
                                                       "orchestration.eval_trigger=embedded", *overrides])
        queue = tmp_path / "queue.jsonl"
        queue.unlink(missing_ok=True)
        ev = CheckpointEvaluator(cfg, ConfigArgs(), None, "flow-1", queue)
        result = tasks.train.fn(cfg, ConfigArgs(), ev)
        if rl:
            result = tasks.rl.fn(cfg, ConfigArgs(), ev)
        assert not eval_queue.is_closed(queue)  # open until the last training stage
        ev.close()
        return started, result, ev

    yield run


def test_free_gpu_evaluates_concurrently_and_deepspeed_trains_on_the_others(run_train):
    started, result, _ = run_train(8, QWEN, "train.num_gpus=7", "orchestration.train_launcher=deepspeed")
    assert started.order == ["evaluator", "train"]  # concurrent: the evaluator follows training's checkpoints
    argv, env = started.one("evaluator")
    assert env["CUDA_VISIBLE_DEVICES"] == "7" and argv[argv.index("--device") + 1] == "cuda:0"
    cmd, train_env = started.one("train")
    assert "--include=localhost:0,1,2,3,4,5,6" in cmd and not any(a.startswith("--num_gpus") for a in cmd)
    assert "CUDA_VISIBLE_DEVICES" not in train_env or train_env["CUDA_VISIBLE_DEVICES"] != "7"
    assert train_env[lineage.ENV_CHECKPOINT_QUEUE]  # reported checkpoints are kept until evaluated
    assert result["eval_placement"].startswith("embedded: evaluation on cuda:7, concurrent; training on cuda:0-6")


def test_all_gpus_training_means_evaluation_after_training(run_train):
    started, result, ev = run_train(8, QWEN, "train.num_gpus=8", "orchestration.train_launcher=deepspeed")
    assert started.order == ["train", "evaluator"]  # never concurrently on a training GPU
    cmd, _ = started.one("train")
    assert "--num_gpus=8" in cmd
    argv, env = started.one("evaluator")
    assert env["CUDA_VISIBLE_DEVICES"] == "7" and argv[argv.index("--device") + 1] == "cuda:0"
    assert "after training" in result["eval_placement"]
    assert ev.process is not None  # wait_for_evaluations waits for it like for a concurrent one


def test_one_gpu_one_rank_evaluates_after_training(run_train):
    started, _, _ = run_train(1, QWEN)
    assert started.order == ["train", "evaluator"]
    _, train_env = started.one("train")
    assert "CUDA_VISIBLE_DEVICES" not in train_env
    assert started.one("evaluator")[1]["CUDA_VISIBLE_DEVICES"] == "0"


def test_torchrun_and_single_process_training_see_only_their_gpus(run_train):
    started, _, _ = run_train(4, QWEN, "train.num_gpus=3", "orchestration.train_launcher=torchrun", visible="4,5,6,7")
    cmd, train_env = started.one("train")
    assert train_env["CUDA_VISIBLE_DEVICES"] == "4,5,6" and "--nproc_per_node=3" in cmd
    assert started.one("evaluator")[1]["CUDA_VISIBLE_DEVICES"] == "7"

    started, _, _ = run_train(2, QWEN, "evaluate.device=cuda:0")  # explicit device wins; training takes the other
    assert started.order == ["evaluator", "train"]
    assert started.one("train")[1]["CUDA_VISIBLE_DEVICES"] == "1"
    argv, env = started.one("evaluator")
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and argv[argv.index("--device") + 1] == "cuda:0"


def test_cpu_machine_and_tiny_rung_evaluate_on_the_cpu_beside_training(run_train):
    for n_gpus, overrides in ((0, [QWEN]), (8, [])):  # no GPU; the tiny rung (params.yaml's default base)
        started, result, _ = run_train(n_gpus, *overrides)
        assert started.order == ["evaluator", "train"]
        argv, env = started.one("evaluator")
        assert env["CUDA_VISIBLE_DEVICES"] == "" and argv[argv.index("--device") + 1] == "cpu"
        assert "CUDA_VISIBLE_DEVICES" not in started.one("train")[1]
        assert "evaluation on cpu, concurrent" in result["eval_placement"]


def test_without_per_checkpoint_evaluation_nothing_is_held_back(run_train):
    started, result, _ = run_train(8, QWEN, "orchestration.eval_concurrently=false")
    assert started.order == ["train"] and result["eval_mode"] == "off"
    assert lineage.ENV_CHECKPOINT_QUEUE not in started.one("train")[1]  # retention: keep_last and the best only


def test_events_mode_leaves_placement_to_the_served_pool(run_train):
    started, result, _ = run_train(8, QWEN, "orchestration.eval_trigger=events")
    assert started.order == ["train"]
    _, env = started.one("train")
    assert env[lineage.ENV_CHECKPOINT_EVENTS] == "1" and env[lineage.ENV_CHECKPOINT_QUEUE]
    assert "CUDA_VISIBLE_DEVICES" not in env and "own work pool" in result["eval_placement"]


def test_report_shows_the_placement_next_to_the_eval_mode():
    md = report.report_markdown({"eval_mode": "embedded", "stages": {"train": {
        "eval_placement": "embedded: evaluation on cuda:7, concurrent; training on cuda:0-6 (...)"}}})
    lines = md.splitlines()
    i = lines.index("| eval_mode | `embedded` |")
    assert lines[i + 1] == "| eval_placement | embedded: evaluation on cuda:7, concurrent; training on cuda:0-6 (...) |"


def test_train_cmd_rejects_a_gpu_list_that_does_not_match_the_ranks():
    cfg = load_config(REPO / "params.yaml", None, ["train.num_gpus=2"])
    with pytest.raises(Exception, match=r"2 rank\(s\)"):
        train_cmd(cfg, ConfigArgs().argv(), gpus=["0"])


def test_rl_reports_into_the_same_queue_and_evaluator_as_training(run_train, tmp_path):
    started, result, _ = run_train(0, rl=True)  # CPU: one evaluator beside SFT, still there for RL
    assert started.order == ["evaluator", "train", "rl"]
    (_, train_env), (rl_argv, rl_env) = started.one("train"), started.one("rl")
    for key in (lineage.ENV_CHECKPOINT_QUEUE, lineage.ENV_PREFECT_FLOW_RUN_ID):
        assert rl_env[key] == train_env[key]
    assert rl_argv[rl_argv.index("-m") + 1] == "training.rl"
    assert f"rl.checkpoint_hooks=[\"{tasks.HOOK}\"]" in rl_argv and rl_argv[rl_argv.index("--params") + 1]
    assert result["eval_mode"] == "embedded" and "evaluation on cpu, concurrent" in result["eval_placement"]
    assert eval_queue.queued(tmp_path / "queue.jsonl") == [] and eval_queue.is_closed(tmp_path / "queue.jsonl")


def test_evaluation_after_training_waits_for_rl_too_and_rl_stays_off_the_evaluation_gpu(run_train):
    started, _, _ = run_train(8, QWEN, "train.num_gpus=8", "orchestration.train_launcher=deepspeed", rl=True)
    assert started.order == ["train", "rl", "evaluator"]  # the evaluator takes a training GPU: after both
    started, _, _ = run_train(8, QWEN, "train.num_gpus=7", "orchestration.train_launcher=deepspeed", rl=True)
    assert started.order == ["evaluator", "train", "rl"]
    rl_argv, _ = started.one("rl")  # the same launcher, rl.num_gpus=1: the first training GPU, not the evaluator's 7
    assert "--include=localhost:0" in rl_argv and rl_argv[rl_argv.index("--module") + 1] == "training.rl"


def test_rl_starts_the_evaluator_when_training_was_up_to_date(run_train):
    started, result, _ = run_train(0, rl=True, train_cached=True)
    assert started.order == ["evaluator", "rl"] and result["eval_mode"] == "embedded"
    assert started.one("rl")[1][lineage.ENV_CHECKPOINT_QUEUE]


def test_rl_off_still_runs_the_stage_without_an_evaluator(run_train):
    started, result, _ = run_train(0, "orchestration.rl=false", rl=True, train_cached=True)
    assert started.order == ["rl"] and result["eval_mode"] == "off" and result["enabled"] is False
    assert lineage.ENV_CHECKPOINT_QUEUE not in started.one("rl")[1]


def test_the_evaluator_sets_aside_a_closed_queue_and_waits_for_the_results_of_this_attempt(tmp_path):
    cfg = load_config(REPO / "params.yaml", None, [f"orchestration.state_dir={tmp_path / 'state'}",
                                                   "orchestration.eval_concurrently=false"])
    queue = eval_queue.queue_path(cfg.orchestration.state_dir, "flow-1")
    eval_queue.append(queue, {"checkpoint_dir": str(tmp_path / "old"), "step": 1, "saved_at": 1.0})
    eval_queue.close(queue)  # an earlier attempt of this flow run
    ev = CheckpointEvaluator(cfg, ConfigArgs(), "parent-1", "flow-1", queue)
    assert not ev.close()  # never opened: nothing to close
    assert ev.open() is ev and ev.open() is ev and ev.mode == "off" and ev.process is None
    assert not queue.exists() and len(list(queue.parent.glob("checkpoint_queue-flow-1.closed-*.jsonl"))) == 1
    assert ev.env == {lineage.ENV_PREFECT_FLOW_RUN_ID: "flow-1", lineage.ENV_PARENT_RUN_ID: "parent-1"}
    for step, at in ((2, 2.0), (4, 4.0)):
        eval_queue.append(queue, {"checkpoint_dir": str(tmp_path / f"s{step}"), "step": step, "saved_at": at})
    assert ev.close() and not ev.close() and eval_queue.is_closed(queue)
    results = eval_queue.results_path(cfg.orchestration.state_dir)
    eval_queue.append(results, {"checkpoint_dir": str(tmp_path / "s4"), "step": 4, "saved_at": 4.0})
    eval_queue.append(results, {"checkpoint_dir": str(tmp_path / "old"), "step": 1, "saved_at": 1.0})
    assert [r["step"] for r in ev.wait(timeout_s=0.2, poll_s=0.05)] == [4]  # s2 missing: a warning, no error
    eval_queue.append(results, {"checkpoint_dir": str(tmp_path / "s2"), "step": 2, "saved_at": 2.0})
    assert [r["step"] for r in ev.wait(timeout_s=5)] == [2, 4]


def test_the_evaluator_process_that_fails_or_hangs_fails_the_wait(tmp_path):
    import sys

    from vtg.errors import VTGError

    cfg = load_config(REPO / "params.yaml", None, [f"orchestration.state_dir={tmp_path}"])
    ev = CheckpointEvaluator(cfg, ConfigArgs(), None, "flow-1", tmp_path / "q.jsonl")
    ev.log_path.write_text("starting\nerror: no such checkpoint\n")
    ev.process = stages.spawn([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(VTGError, match=r"(?s)exit 3.*no such checkpoint"):
        ev.wait(timeout_s=60)
    ev.process = proc = stages.spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(VTGError, match="did not finish within 0.5s"):
        ev.wait(timeout_s=0.5)
    assert proc.returncode is not None and ev.process is None  # stopped
