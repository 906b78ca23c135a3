"""The per-checkpoint evaluation of one flow run: a `CheckpointEvaluator` the flow creates and hands to the
training tasks (SFT, then RL) and to the wait task.

Both training stages report their checkpoints into one queue (`vtg.eval_queue`) that one evaluator follows. The
first training stage that runs opens it (`open`: the mode, the placement, and an evaluator process started once
when it runs beside training); `close` ends the queue after the last training stage (and starts an evaluator
placed after training); `wait` waits for the evaluator and for a result of every queued checkpoint; `stop` ends
the evaluator process on error.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from flows.placement import AFTER_TRAINING, CONCURRENT, Placement, device_ids, place_evaluation
from flows.stages import ConfigArgs, spawn, stop_process
from vtg import eval_queue, lineage
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.gpus import visible_gpu_count
from vtg.net import check_prefect_api

log = logging.getLogger(__name__)
EMBEDDED, EVENTS, OFF = "embedded", "events", "off"


def _logger():
    """The Prefect run logger inside a flow or task run (the lines show in the UI), else this module's."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log


def eval_mode(cfg: PipelineConfig) -> str:
    """`embedded`, `events` or `off` for this run (`auto`: events when a served deployment can be triggered)."""
    o = cfg.orchestration
    if not o.eval_concurrently:
        return OFF
    if o.eval_trigger != "auto":
        return o.eval_trigger
    if not os.environ.get("PREFECT_API_URL"):
        return EMBEDDED
    check_prefect_api()
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment  # noqa: F401  (same client stack)

    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(o.eval_deployment)
        return EVENTS
    except Exception:  # noqa: BLE001 - no such deployment on this server: evaluate locally
        return EMBEDDED


def prefect_api_url() -> str | None:
    """The API this flow talks to: PREFECT_API_URL, or, inside a flow or task run on Prefect's ephemeral API, the
    address of that server (Prefect's client knows it); None outside a run without PREFECT_API_URL."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    from prefect.context import FlowRunContext, TaskRunContext

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return None  # no run here: no server either (asking the client would start one)
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:  # in a run: the run's own client (re-entered, not a new one)
        return str(client.api_url).rstrip("/")


def visible_gpus() -> int:
    """GPUs this node shows the flow (CUDA_VISIBLE_DEVICES respected); 0 without CUDA (`vtg.gpus`)."""
    return visible_gpu_count()


def evaluation_placement(cfg: PipelineConfig, n_gpus: int | None = None) -> Placement:
    """Where and when the embedded evaluator runs beside training (the rule: `flows.placement`)."""
    return place_evaluation(visible_gpus() if n_gpus is None else n_gpus, cfg.train.num_gpus,
                            cfg.train.model.base, cfg.evaluate.device)


def start_evaluator(cfg: PipelineConfig, queue: Path, args: ConfigArgs, parent: str | None,
                    placement: Placement | None = None) -> subprocess.Popen:
    """The embedded evaluator process (`python -m flows.evaluation --queue FILE`); with a placement, it sees only
    its own device (CUDA_VISIBLE_DEVICES: its GPU, or none for the CPU) and evaluates there (`--device`). Its log:
    the queue file with the suffix `.log`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    url = prefect_api_url()
    if url:
        env["PREFECT_API_URL"] = url
    if parent:
        env[lineage.ENV_PARENT_RUN_ID] = parent
    device = []
    if placement is not None:
        gpu = placement.gpu
        env["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else device_ids([gpu], os.environ.get("CUDA_VISIBLE_DEVICES"))[0]
        device = ["--device", "cpu" if gpu is None else "cuda:0"]
    queue = Path(queue)
    with queue.with_suffix(".log").open("a") as log_file:  # own process group, stopped with the flow (flows.stages)
        return spawn([sys.executable, "-m", "flows.evaluation", "--queue", str(queue), "--split", cfg.evaluate.split,
                      "--params", args.params, *device], env=env, stdout=log_file, stderr=subprocess.STDOUT)


class CheckpointEvaluator:
    """How the checkpoints of one flow run's training stages are evaluated: one queue, one mode, one placement,
    one evaluator process for SFT and RL. Created by the flow, opened by the first training stage that runs."""

    def __init__(self, cfg: PipelineConfig, args: ConfigArgs, parent: str | None, flow_run_id: str,
                 queue: str | Path):
        self.cfg, self.args, self.parent, self.flow_run_id = cfg, args, parent, flow_run_id
        self.queue = Path(queue)
        """The flow run's queue (`vtg.eval_queue.queue_path`)."""
        self.mode = OFF
        """`embedded`, `events` or `off` (`eval_mode`), decided by `open`."""
        self.where = OFF
        """One line for the log and the report: where and how the checkpoints are evaluated."""
        self.env = self.lineage_env()
        """For the training stage processes: the queue (the hook appends to it, retention keeps what is listed
        there until evaluated), events on/off, the parent MLflow run, the Prefect flow run."""
        self.placement: Placement | None = None
        self.train_gpus: list[str] | None = None
        """The only GPUs the training stages may use (the evaluator holds another), or None: no restriction."""
        self.process: subprocess.Popen | None = None
        self.is_open = False
        self.is_closed = False

    def __repr__(self) -> str:  # what Prefect shows for the task parameter
        return f"CheckpointEvaluator(queue={str(self.queue)!r}, mode={self.mode!r})"

    @property
    def results(self) -> Path:
        return eval_queue.results_path(self.cfg.orchestration.state_dir)

    @property
    def log_path(self) -> Path:
        return self.queue.with_suffix(".log")

    def lineage_env(self) -> dict[str, str]:
        """The environment of a training stage that reports no checkpoint: the flow run and the MLflow parent."""
        env = {lineage.ENV_PREFECT_FLOW_RUN_ID: self.flow_run_id}
        if self.parent:
            env[lineage.ENV_PARENT_RUN_ID] = self.parent
        return env

    def open(self) -> CheckpointEvaluator:
        """Decide the mode and the placement, and start an evaluator that runs beside training; once per flow run
        (the second training stage gets the same evaluation). The queue stays open until `close`."""
        if self.is_open:
            return self
        self._set_aside_closed()
        self.mode = mode = eval_mode(self.cfg)
        self.where = mode
        env = self.lineage_env()
        if mode != OFF:  # the hook reports each checkpoint here; retention keeps it until its result is recorded
            self.queue.parent.mkdir(parents=True, exist_ok=True)
            env[lineage.ENV_CHECKPOINT_QUEUE] = str(self.queue)
        if mode == EVENTS:
            env[lineage.ENV_CHECKPOINT_EVENTS] = "1"
            self.where = f"events: {self.cfg.orchestration.eval_deployment} on its own work pool"
        elif mode == EMBEDDED:
            self.placement = placement = evaluation_placement(self.cfg)
            self.where = f"embedded: {placement.line()}"
            if placement.train_gpus:
                self.train_gpus = device_ids(placement.train_gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if placement.when == CONCURRENT:
                self._start()
        self.env = env
        self.is_open = True
        _logger().info("per-checkpoint evaluation: %s", self.where)
        return self

    def _start(self) -> None:
        if self.process is None:
            self.process = start_evaluator(self.cfg, self.queue, self.args, self.parent, self.placement)

    def _set_aside_closed(self) -> None:
        """A queue an earlier attempt of this flow run closed (a retried run): renamed, so that the new evaluator
        does not stop at the old closing line and the wait expects this attempt's checkpoints only."""
        if eval_queue.is_closed(self.queue):
            q = self.queue
            q.rename(q.with_name(f"{q.stem}.closed-{time.time_ns()}{q.suffix}"))

    def close(self, start_waiting: bool = True) -> bool:
        """No more checkpoints in this flow run (SFT and RL are done, or one failed): close the queue, so that the
        evaluator following it finishes; with `start_waiting`, an evaluator placed after training starts now.
        False when it was never opened (no training stage ran) or is closed already."""
        if not self.is_open or self.is_closed:
            return False
        eval_queue.close(self.queue)
        self.is_closed = True
        if start_waiting and self.placement is not None and self.placement.when == AFTER_TRAINING:
            self._start()
        return True

    def stop(self) -> None:
        """End the evaluator process (and its process group) now, if it runs."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            stop_process(proc)

    def expected(self) -> list[dict]:
        """The queued checkpoints (the queue's lines, the closing line left out)."""
        return eval_queue.queued(self.queue)

    def records(self) -> list[dict]:
        """The results of the queued checkpoints (matched by `vtg.eval_queue.match_key`), by step."""
        return eval_queue.evaluated(self.queue, self.results)

    def wait(self, timeout_s: float | None = None, poll_s: float = 1.0) -> list[dict]:
        """Wait for the evaluator process, then until every queued checkpoint has a result or `timeout_s`
        (default `orchestration.eval_wait_s`) has passed; the results. An evaluator still running at the timeout
        is stopped; one that failed raises, with the end of its log."""
        timeout_s = self.cfg.orchestration.eval_wait_s if timeout_s is None else timeout_s
        deadline = time.time() + timeout_s
        proc = self.process
        if proc is not None:
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.stop()
                raise VTGError(f"embedded evaluator did not finish within {timeout_s}s (log: {self.log_path})"
                               ) from None
            self.process = None
            if rc != 0:
                tail = self.log_path.read_text().splitlines()[-5:] if self.log_path.is_file() else []
                raise VTGError(f"embedded evaluator failed (exit {rc}):\n  " + "\n  ".join(tail))
        expected = {eval_queue.match_key(item) for item in self.expected()}
        while True:
            done = self.records()
            if len(done) >= len(expected) or time.time() > deadline:
                break
            time.sleep(poll_s)
        missing = len(expected) - len(done)
        if missing:
            _logger().warning("%d of %d checkpoint evaluations did not finish in time", missing, len(expected))
        return done
