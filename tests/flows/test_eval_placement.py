"""The orchestrator applies the evaluation placement (vtg/placement.py): the evaluator process of the training
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
    """`run_train(n_gpus, *overrides, visible=None, rl=False, train_cached=False)`: the train task (then the rl
    task with `rl`), then the queue closed as the flow does, with `n_gpus` visible -> (Started, result of the last
    task that ran). `train_cached`: dvc.lock says SFT is done (only RL runs)."""
    monkeypatch.setattr(tasks, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(tasks, "_record", lambda *a, **k: None)
    monkeypatch.setattr(stages, "DEEPSPEED_HOSTFILE", str(tmp_path / "no-hostfile"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    tasks._evaluators.clear()
    tasks._open.clear()

    def run(n_gpus: int, *overrides: str, visible: str | None = None, rl: bool = False, train_cached: bool = False):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        started = Started()
        monkeypatch.setattr(tasks, "run_stage", started.run_stage)
        monkeypatch.setattr(tasks.subprocess, "Popen", started.popen)
        monkeypatch.setattr(tasks, "visible_gpus", lambda: n_gpus)
        monkeypatch.setattr(tasks, "_up_to_date", lambda stage, cfg, result, *a, **k: Completed(data=result) if (
            train_cached and stage == "train") else None)
        cfg = load_config(REPO / "params.yaml", None, [f"train.out_dir={tmp_path / 'ck'}",
                                                       f"rl.out_dir={tmp_path / 'rl'}",
                                                       f"rl.report_dir={tmp_path / 'reports-rl'}",
                                                       f"orchestration.state_dir={tmp_path / 'state'}",
                                                       "orchestration.eval_trigger=embedded", *overrides])
        queue = tmp_path / "queue.jsonl"
        queue.unlink(missing_ok=True)
        result = tasks.train.fn(cfg, ConfigArgs(), None, "flow-1", str(queue))
        if rl:
            result = tasks.rl.fn(cfg, ConfigArgs(), None, "flow-1", str(queue))
        assert not queue.exists() or '"done"' not in queue.read_text()  # open until the last training stage
        tasks.close_checkpoint_queue(cfg, str(queue), ConfigArgs(), None)
        return started, result

    yield run
    tasks._evaluators.clear()
    tasks._open.clear()


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


def test_rl_reports_into_the_same_queue_and_evaluator_as_training(run_train, tmp_path):
    started, result = run_train(0, rl=True)  # CPU: one evaluator beside SFT, still there for RL
    assert started.order == ["evaluator", "train", "rl"]
    (_, train_env), (rl_argv, rl_env) = started.one("train"), started.one("rl")
    for key in (lineage.ENV_CHECKPOINT_QUEUE, lineage.ENV_PREFECT_FLOW_RUN_ID):
        assert rl_env[key] == train_env[key]
    assert rl_argv[rl_argv.index("-m") + 1] == "training.rl"
    assert f"rl.checkpoint_hooks=[\"{tasks.HOOK}\"]" in rl_argv and rl_argv[rl_argv.index("--params") + 1]
    assert result["eval_mode"] == "embedded" and "evaluation on cpu, concurrent" in result["eval_placement"]
    assert tasks.follow_all(tmp_path / "queue.jsonl") == [] and '"done"' in (tmp_path / "queue.jsonl").read_text()


def test_evaluation_after_training_waits_for_rl_too_and_rl_stays_off_the_evaluation_gpu(run_train):
    started, _ = run_train(8, QWEN, "train.num_gpus=8", "orchestration.train_launcher=deepspeed", rl=True)
    assert started.order == ["train", "rl", "evaluator"]  # the evaluator takes a training GPU: after both
    started, _ = run_train(8, QWEN, "train.num_gpus=7", "orchestration.train_launcher=deepspeed", rl=True)
    assert started.order == ["evaluator", "train", "rl"]
    rl_argv, _ = started.one("rl")  # the same launcher, rl.num_gpus=1: the first training GPU, not the evaluator's 7
    assert "--include=localhost:0" in rl_argv and rl_argv[rl_argv.index("--module") + 1] == "training.rl"


def test_rl_starts_the_evaluator_when_training_was_up_to_date(run_train):
    started, result = run_train(0, rl=True, train_cached=True)
    assert started.order == ["evaluator", "rl"] and result["eval_mode"] == "embedded"
    assert started.one("rl")[1][lineage.ENV_CHECKPOINT_QUEUE]


def test_rl_off_still_runs_the_stage_without_an_evaluator(run_train):
    started, result = run_train(0, "orchestration.rl=false", rl=True, train_cached=True)
    assert started.order == ["rl"] and result["eval_mode"] == "off" and result["enabled"] is False
    assert lineage.ENV_CHECKPOINT_QUEUE not in started.one("rl")[1]
