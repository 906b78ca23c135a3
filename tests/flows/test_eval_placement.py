"""The orchestrator applies the evaluation placement (vtg/placement.py): the train task's evaluator process
(its CUDA_VISIBLE_DEVICES, `--device`, started before or after training) and the training command (never on the
evaluation GPU). The task body runs for real; the processes it would start are recorded instead."""

from __future__ import annotations

import logging
import subprocess
import types
from pathlib import Path

import pytest

from flows import stages, tasks
from flows.stages import ConfigArgs, train_cmd
from vtg import lineage
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
    """`run_train(n_gpus, *overrides, visible=None)`: the train task with `n_gpus` visible -> (Started, result)."""
    monkeypatch.setattr(tasks, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(tasks, "_up_to_date", lambda *a, **k: None)
    monkeypatch.setattr(tasks, "_record", lambda *a, **k: None)
    monkeypatch.setattr(stages, "DEEPSPEED_HOSTFILE", str(tmp_path / "no-hostfile"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    tasks._evaluators.clear()

    def run(n_gpus: int, *overrides: str, visible: str | None = None):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        started = Started()
        monkeypatch.setattr(tasks, "run_stage", started.run_stage)
        monkeypatch.setattr(tasks.subprocess, "Popen", started.popen)
        monkeypatch.setattr(tasks, "visible_gpus", lambda: n_gpus)
        cfg = load_config(REPO / "params.yaml", None, [f"train.out_dir={tmp_path / 'ck'}",
                                                       f"orchestration.state_dir={tmp_path / 'state'}",
                                                       "orchestration.eval_trigger=embedded", *overrides])
        queue = tmp_path / "queue.jsonl"
        result = tasks.train.fn(cfg, ConfigArgs(), None, "flow-1", str(queue))
        return started, result

    yield run
    tasks._evaluators.clear()


def test_free_gpu_evaluates_concurrently_and_deepspeed_trains_on_the_others(run_train):
    started, result = run_train(8, QWEN, "train.num_gpus=7", "orchestration.train_launcher=deepspeed")
    assert started.order == ["evaluator", "train"]  # concurrent: the evaluator follows training's checkpoints
    argv, env = started.one("evaluator")
    assert env["CUDA_VISIBLE_DEVICES"] == "7" and argv[argv.index("--device") + 1] == "cuda:0"
    cmd, train_env = started.one("train")
    assert "--include=localhost:0,1,2,3,4,5,6" in cmd and not any(a.startswith("--num_gpus") for a in cmd)
    assert "CUDA_VISIBLE_DEVICES" not in train_env or train_env["CUDA_VISIBLE_DEVICES"] != "7"
    assert train_env[lineage.ENV_CHECKPOINT_QUEUE]  # reported checkpoints are kept until evaluated
    assert result["eval_placement"].startswith("embedded: evaluation on cuda:7, concurrent; training on cuda:0-6")


def test_all_gpus_training_means_evaluation_after_training(run_train):
    started, result = run_train(8, QWEN, "train.num_gpus=8", "orchestration.train_launcher=deepspeed")
    assert started.order == ["train", "evaluator"]  # never concurrently on a training GPU
    cmd, _ = started.one("train")
    assert "--num_gpus=8" in cmd
    argv, env = started.one("evaluator")
    assert env["CUDA_VISIBLE_DEVICES"] == "7" and argv[argv.index("--device") + 1] == "cuda:0"
    assert "after training" in result["eval_placement"]
    assert tasks._evaluators  # wait_for_evaluations waits for it like for a concurrent one


def test_one_gpu_one_rank_evaluates_after_training(run_train):
    started, _ = run_train(1, QWEN)
    assert started.order == ["train", "evaluator"]
    _, train_env = started.one("train")
    assert "CUDA_VISIBLE_DEVICES" not in train_env
    assert started.one("evaluator")[1]["CUDA_VISIBLE_DEVICES"] == "0"


def test_torchrun_and_single_process_training_see_only_their_gpus(run_train):
    started, _ = run_train(4, QWEN, "train.num_gpus=3", "orchestration.train_launcher=torchrun", visible="4,5,6,7")
    cmd, train_env = started.one("train")
    assert train_env["CUDA_VISIBLE_DEVICES"] == "4,5,6" and "--nproc_per_node=3" in cmd
    assert started.one("evaluator")[1]["CUDA_VISIBLE_DEVICES"] == "7"

    started, _ = run_train(2, QWEN, "evaluate.device=cuda:0")  # explicit device wins; training takes the other
    assert started.order == ["evaluator", "train"]
    assert started.one("train")[1]["CUDA_VISIBLE_DEVICES"] == "1"
    argv, env = started.one("evaluator")
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and argv[argv.index("--device") + 1] == "cuda:0"


def test_cpu_machine_and_tiny_rung_evaluate_on_the_cpu_beside_training(run_train):
    for n_gpus, overrides in ((0, [QWEN]), (8, [])):  # no GPU; the tiny rung (params.yaml's default base)
        started, result = run_train(n_gpus, *overrides)
        assert started.order == ["evaluator", "train"]
        argv, env = started.one("evaluator")
        assert env["CUDA_VISIBLE_DEVICES"] == "" and argv[argv.index("--device") + 1] == "cpu"
        assert "CUDA_VISIBLE_DEVICES" not in started.one("train")[1]
        assert "evaluation on cpu, concurrent" in result["eval_placement"]


def test_without_per_checkpoint_evaluation_nothing_is_held_back(run_train):
    started, result = run_train(8, QWEN, "orchestration.eval_concurrently=false")
    assert started.order == ["train"] and result["eval_mode"] == "off"
    assert lineage.ENV_CHECKPOINT_QUEUE not in started.one("train")[1]  # retention: keep_last and the best only


def test_events_mode_leaves_placement_to_the_served_pool(run_train):
    started, result = run_train(8, QWEN, "orchestration.eval_trigger=events")
    assert started.order == ["train"]
    _, env = started.one("train")
    assert env[lineage.ENV_CHECKPOINT_EVENTS] == "1" and env[lineage.ENV_CHECKPOINT_QUEUE]
    assert "CUDA_VISIBLE_DEVICES" not in env and "own work pool" in result["eval_placement"]


def test_report_shows_the_placement_next_to_the_eval_mode():
    md = tasks.report_markdown({"eval_mode": "embedded", "stages": {"train": {
        "eval_placement": "embedded: evaluation on cuda:7, concurrent; training on cuda:0-6 (...)"}}})
    lines = md.splitlines()
    i = lines.index("| eval_mode | `embedded` |")
    assert lines[i + 1] == "| eval_placement | embedded: evaluation on cuda:7, concurrent; training on cuda:0-6 (...) |"


def test_train_cmd_rejects_a_gpu_list_that_does_not_match_the_ranks():
    cfg = load_config(REPO / "params.yaml", None, ["train.num_gpus=2"])
    with pytest.raises(Exception, match=r"2 rank\(s\)"):
        train_cmd(cfg, ConfigArgs().argv(), gpus=["0"])
