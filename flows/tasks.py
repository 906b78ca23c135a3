"""Thin Prefect tasks: each resolves its inputs, makes one call into a stage entry point, and records the result.

Whether a stage must run is not decided here: `vtg.stages.status` compares dvc.lock (deps, outs, and the
output-changing config fields) with the workspace, exactly as `dvc repro` does; a stage that is up to date
finishes as `Cached` without running, and a stage that ran is recorded in dvc.lock (`vtg.stages.record`). So a
retried flow run (`prefect flow-run retry`, the UI's Retry), a second `make run` and `dvc repro` all skip the
same finished steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed
from prefect.tasks import exponential_backoff

from flows import tracking
from flows.evaluation import results_path
from flows.events import append_jsonl
from flows.stages import ConfigArgs, module_cmd, rl_cmd, run_stage, spawn, stop_process, train_cmd
from vtg import checkpoints, lineage, stages
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.placement import AFTER_TRAINING, CONCURRENT, Placement, device_ids, place_evaluation
from vtg.rl_outputs import SUMMARY_JSON as RL_SUMMARY
from vtg.shards import MANIFEST, data_version

HOOK = "flows.events:on_checkpoint_saved"
DVC_SECONDS: dict[str, float] = {}  # stage -> seconds spent asking and updating dvc.lock (the report shows them)
_evaluators: dict[str, subprocess.Popen] = {}  # queue path -> embedded evaluator process (same flow process)


def _stream(name: str):
    logger = get_run_logger()
    return lambda line: logger.info("[%s] %s", name, line)


def _read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else {}


def _numbers(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[f"{prefix}{k}".replace("@", "_at_")] = float(v)
    return out


def _stage_task(name: str):
    """A stage step. No Prefect cache: whether it is done is dvc.lock's call (`_up_to_date`), for every door."""
    return task(name=name, log_prints=True, cache_policy=NO_CACHE)


def _up_to_date(stage: str, cfg: PipelineConfig, result: dict[str, Any], parent: str | None = None,
                log_run: bool = True):
    """If dvc.lock says `stage` is done for this config, a `Cached` state carrying `result`; else None.

    A skipped stage still gets its child run under this pipeline run (params, `vtg.status`), so the lineage of
    every pipeline run is complete whichever door built the outputs."""
    t0 = time.perf_counter()
    st = stages.status(stage, cfg)
    DVC_SECONDS[stage] = DVC_SECONDS.get(stage, 0.0) + time.perf_counter() - t0
    logger = get_run_logger()
    if not st.up_to_date:
        logger.info("%s must run: %s", stage, st)
        return None
    stages.sync_params(stage, cfg)  # only fields that do not change the output may differ: record params.yaml's
    logger.info("%s is up to date in %s: not run", stage, stages.LOCK_FILE)
    if log_run:
        result = {**result, "mlflow_run_id": tracking.stage_run(
            cfg, parent, stage, params={stage: getattr(cfg, stage).model_dump(mode="json")},
            tags={"vtg.status": str(st)})}
    return Completed(name="Cached", data={**result, "status": "up to date"}, message=str(st))


def _record(stage: str, cfg: PipelineConfig) -> None:
    t0 = time.perf_counter()
    stages.record(stage, cfg)
    DVC_SECONDS[stage] = DVC_SECONDS.get(stage, 0.0) + time.perf_counter() - t0


@_stage_task("build-corpus")
def build_corpus(cfg: PipelineConfig, args: ConfigArgs, parent: str | None) -> dict:
    if cached := _up_to_date("corpus", cfg, {"out_dir": cfg.corpus.out_dir}, parent):
        return cached
    r = run_stage("corpus", module_cmd(cfg.orchestration.stages.corpus, args.argv()), on_line=_stream("corpus"))
    _record("corpus", cfg)
    run_id = tracking.stage_run(cfg, parent, "corpus", params={"corpus": cfg.corpus.model_dump(mode="json")},
                                metrics={"seconds": r.seconds})
    return {"out_dir": cfg.corpus.out_dir, "seconds": r.seconds, "mlflow_run_id": run_id}


@_stage_task("ingest-annotations")
def ingest(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, source: str) -> dict:
    if cached := _up_to_date("ingest", cfg, {"summary": _read_json(cfg.ingest.summary)}, parent):
        return cached
    r = run_stage("ingest", module_cmd(cfg.orchestration.stages.ingest, args.argv()), on_line=_stream("ingest"))
    _record("ingest", cfg)
    summary = _read_json(cfg.ingest.summary)
    run_id = tracking.stage_run(cfg, parent, "ingest", params={"ingest": cfg.ingest.model_dump(mode="json")},
                                metrics={**_numbers(summary), "seconds": r.seconds},
                                tags={lineage.TAG_SOURCE_DIGEST: source}, artifacts=[cfg.ingest.summary])
    return {"summary": summary, "seconds": r.seconds, "mlflow_run_id": run_id}


@_stage_task("beam-preprocess")
def preprocess(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, source: str) -> dict:
    out = Path(cfg.preprocess.out_dir)
    if cached := _up_to_date("preprocess", cfg, {"out_dir": str(out), "manifest": _read_json(out / MANIFEST)},
                             parent):
        return cached
    r = run_stage("preprocess", module_cmd(cfg.orchestration.stages.preprocess, args.argv()),
                  on_line=_stream("preprocess"))
    _record("preprocess", cfg)
    manifest = _read_json(out / MANIFEST)
    version = data_version(out)
    run_id = tracking.stage_run(
        cfg, parent, "preprocess", params={"preprocess": cfg.preprocess.model_dump(mode="json")},
        metrics={**_numbers(manifest), "seconds": r.seconds},
        tags={lineage.TAG_SOURCE_DIGEST: source, lineage.TAG_DATA_VERSION: version}, artifacts=[out / MANIFEST])
    tracking.log_shards_input(cfg, [run_id], version, manifest)
    create_markdown_artifact(key="shard-manifest", markdown=manifest_markdown(cfg, manifest, version),
                             description="Shards written by the Beam preprocessing job")
    return {"out_dir": str(out), "manifest": manifest, "seconds": r.seconds, "mlflow_run_id": run_id}


def manifest_markdown(cfg: PipelineConfig, manifest: dict, version: str) -> str:
    rows = [f"| {k} | {json.dumps(v) if isinstance(v, dict | list) else v} |" for k, v in manifest.items()
            if not isinstance(v, list) or len(v) < 20]
    return "\n".join([f"# Shards `{cfg.preprocess.out_dir}`", f"data version: `{version}`", "",
                      "| field | value |", "| --- | --- |", *rows])


@task(name="dvc-push-shards", retries=2, retry_delay_seconds=exponential_backoff(5), cache_policy=NO_CACHE)
def push_shards(cfg: PipelineConfig) -> dict:
    """`dvc push` the shards (recorded in dvc.lock by the preprocess step) to `orchestration.dvc_remote`."""
    if not cfg.orchestration.dvc_version:
        return {"status": "disabled"}
    if not stages.is_dvc_repo():
        return {"status": "skipped: not a DVC repository here"}
    dvc = str(Path(sys.executable).with_name("dvc"))
    pushed = run_stage("dvc-push", [dvc, "push", "--remote", cfg.orchestration.dvc_remote, "preprocess"],
                       on_line=_stream("dvc"))
    return {"status": "pushed", "remote": cfg.orchestration.dvc_remote, "dvc_md5": dvc_out_md5(cfg),
            "seconds": pushed.seconds}


def dvc_out_md5(cfg: PipelineConfig, stage: str = "preprocess") -> str | None:
    import yaml

    lock = Path(stages.LOCK_FILE)
    if not lock.is_file():
        return None
    outs = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).get(stage, {}).get("outs", [])
    target = Path(cfg.preprocess.out_dir).as_posix()
    return next((o.get("md5") for o in outs if Path(o.get("path", "")).as_posix() == target), None)


def eval_mode(cfg: PipelineConfig) -> str:
    """`embedded`, `events` or `off` for this run (`auto`: events when a served deployment can be triggered)."""
    o = cfg.orchestration
    if not o.eval_concurrently:
        return "off"
    if o.eval_trigger != "auto":
        return o.eval_trigger
    if not os.environ.get("PREFECT_API_URL"):
        return "embedded"
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment  # noqa: F401  (same client stack)

    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(o.eval_deployment)
        return "events"
    except Exception:  # noqa: BLE001 - no such deployment on this server: evaluate locally
        return "embedded"


def prefect_api_url() -> str | None:
    """The API this flow talks to: PREFECT_API_URL, or the ephemeral server this process started."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    from prefect.server.api.server import SubprocessASGIServer

    inst = SubprocessASGIServer._instances.get(None)
    return inst.api_url if inst is not None and inst.running else None


def visible_gpus() -> int:
    """GPUs this node shows the flow (CUDA_VISIBLE_DEVICES respected); 0 without CUDA."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def evaluation_placement(cfg: PipelineConfig, n_gpus: int | None = None) -> Placement:
    """Where and when the embedded evaluator runs beside training (the rule: `vtg.placement`)."""
    return place_evaluation(visible_gpus() if n_gpus is None else n_gpus, cfg.train.num_gpus,
                            cfg.train.model.base, cfg.evaluate.device)


def start_evaluator(cfg: PipelineConfig, queue: Path, args: ConfigArgs, parent: str | None,
                    placement: Placement | None = None) -> subprocess.Popen:
    """The embedded evaluator process; with a placement, it sees only its own device (CUDA_VISIBLE_DEVICES: its
    GPU, or none for the CPU) and evaluates there (`--device`)."""
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
    log_path = queue.with_suffix(".log")
    with log_path.open("a") as log_file:  # own process group, stopped with the flow, dies with it (flows.stages)
        return spawn([sys.executable, "-m", "flows.evaluation", "--queue", str(queue), "--split", cfg.evaluate.split,
                      "--params", args.params, *device], env=env, stdout=log_file, stderr=subprocess.STDOUT)


@dataclass
class CheckpointEvaluation:
    """How the checkpoints of this flow run's training stages (SFT, then RL) are evaluated: one queue file, one
    mode, one placement, one evaluator for both stages."""

    mode: str
    """`embedded`, `events` or `off` (`eval_mode`)."""
    where: str
    """One line for the log and the report (`eval_placement`)."""
    env: dict[str, str]
    """For the training stage processes: the queue (the hook appends to it, retention keeps what is listed there
    until evaluated), events on/off, the parent MLflow run, the Prefect flow run."""
    placement: Placement | None = None
    train_gpus: list[str] | None = None
    """The only GPUs the training stages may use (the evaluator holds another), or None: no restriction."""


_open: dict[str, CheckpointEvaluation] = {}  # queue path -> the evaluation the training stages report into


def open_checkpoint_evaluation(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, flow_run_id: str,
                               queue: str) -> CheckpointEvaluation:
    """The per-checkpoint evaluation of this flow run, set up by the first training stage that runs (SFT, or RL
    when SFT was up to date): the mode, the placement, and a concurrent evaluator started once. The queue stays
    open until `close_checkpoint_queue`, after the last training stage."""
    if queue in _open:
        return _open[queue]
    _set_aside_closed(Path(queue))
    mode = eval_mode(cfg)
    env = {lineage.ENV_PREFECT_FLOW_RUN_ID: flow_run_id}
    if mode != "off":  # the hook reports each checkpoint here; retention keeps it until its evaluation is recorded
        env[lineage.ENV_CHECKPOINT_QUEUE] = queue
    if parent:
        env[lineage.ENV_PARENT_RUN_ID] = parent
    ev = CheckpointEvaluation(mode, mode, env)
    if mode == "events":
        env[lineage.ENV_CHECKPOINT_EVENTS] = "1"
        ev.where = f"events: {cfg.orchestration.eval_deployment} on its own work pool"
    elif mode == "embedded":
        ev.placement = placement = evaluation_placement(cfg)
        ev.where = f"embedded: {placement.line()}"
        if placement.train_gpus:
            ev.train_gpus = device_ids(placement.train_gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if placement.when == CONCURRENT:
            _evaluators[queue] = start_evaluator(cfg, Path(queue), args, parent, placement)
    get_run_logger().info("per-checkpoint evaluation: %s", ev.where)
    _open[queue] = ev
    return ev


def _set_aside_closed(queue: Path) -> None:
    """A queue an earlier attempt of this flow run closed (a retried run): renamed, so that the new evaluator
    does not stop at the old `done` line and the wait expects this attempt's checkpoints only."""
    if queue.is_file() and any(json.loads(line).get("done") for line in queue.read_text().splitlines() if line.strip()):
        queue.rename(queue.with_name(f"{queue.stem}.closed-{time.time_ns()}{queue.suffix}"))


def close_checkpoint_queue(cfg: PipelineConfig, queue: str, args: ConfigArgs, parent: str | None,
                           start_waiting: bool = True) -> CheckpointEvaluation | None:
    """No more checkpoints in this flow run (SFT and RL are done, or one failed): append `{"done": true}`, so a
    following evaluator finishes; with `start_waiting`, an evaluator placed after training starts now. None when
    no training stage ran."""
    ev = _open.pop(queue, None)
    if ev is None:
        return None
    append_jsonl(queue, {"done": True})
    if start_waiting and ev.placement is not None and ev.placement.when == AFTER_TRAINING:
        _evaluators[queue] = start_evaluator(cfg, Path(queue), args, parent, ev.placement)
    return ev


def _trained(cfg: PipelineConfig) -> dict:
    latest = checkpoints.latest_checkpoint(cfg.train.out_dir)
    meta = checkpoints.read_checkpoint_meta(latest) if latest else {}
    return {"out_dir": cfg.train.out_dir, "latest_checkpoint": str(latest) if latest else None, "meta": meta,
            "train_run_id": meta.get("mlflow_run_id")}


@_stage_task("train-deepspeed")
def train(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, flow_run_id: str, queue: str) -> dict:
    """Launch training; every checkpoint it saves is evaluated concurrently (embedded process or events).

    Training itself decides whether to resume (`latest` of the same trajectory) or to start fresh (then it moves
    the old checkpoints aside); the flow never deletes checkpoints. The queue stays open for RL after it."""
    if cached := _up_to_date("train", cfg, {**_trained(cfg), "eval_mode": "off"}, log_run=False):
        return cached
    ev = open_checkpoint_evaluation(cfg, args, parent, flow_run_id, queue)
    hooks = list(cfg.train.checkpoint_hooks)
    extra = [f"train.checkpoint_hooks={json.dumps(hooks + [HOOK])}"] if HOOK not in hooks else []
    cmd, launch_env = train_cmd(cfg, args.argv(extra), gpus=ev.train_gpus)
    r = run_stage("train", cmd, env={**launch_env, **ev.env}, on_line=_stream("train"))
    _record("train", cfg)
    return {**_trained(cfg), "eval_mode": ev.mode, "eval_placement": ev.where, "seconds": r.seconds}


def _tuned(cfg: PipelineConfig) -> dict:
    """What the rl stage left: its newest checkpoint (meta: the RL run, the SFT checkpoint it started from) and
    its summary."""
    summary = _read_json(Path(cfg.rl.report_dir) / RL_SUMMARY)
    latest = checkpoints.latest_checkpoint(cfg.rl.out_dir) if Path(cfg.rl.out_dir).is_dir() else None
    meta = checkpoints.read_checkpoint_meta(latest) if latest else {}
    return {"enabled": bool(summary.get("enabled", cfg.orchestration.rl)), "out_dir": cfg.rl.out_dir,
            "latest_checkpoint": str(latest) if latest else None, "rl_run_id": meta.get("mlflow_run_id"),
            "start_checkpoint": meta.get("parent_checkpoint") or summary.get("parent_checkpoint"),
            "start_step": meta.get("parent_step", summary.get("parent_step")),
            "steps": meta.get("step", summary.get("step")), "summary": summary}


@_stage_task("rl-grpo")
def rl(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, flow_run_id: str, queue: str) -> dict:
    """The rl stage (`python -m training.rl`): GRPO from an SFT checkpoint; its checkpoints go to the same queue
    and evaluator as training's. With `orchestration.rl` false the stage still runs (an empty RL root, a summary
    saying RL is off), so dvc.lock records what ran."""
    if cached := _up_to_date("rl", cfg, {**_tuned(cfg), "eval_mode": "off"}, log_run=False):
        return cached
    env, gpus, ev = {lineage.ENV_PREFECT_FLOW_RUN_ID: flow_run_id}, None, None
    if parent:
        env[lineage.ENV_PARENT_RUN_ID] = parent
    if cfg.orchestration.rl:
        ev = open_checkpoint_evaluation(cfg, args, parent, flow_run_id, queue)
        env, gpus = ev.env, ev.train_gpus
    hooks = list(cfg.rl.checkpoint_hooks)
    extra = [f"rl.checkpoint_hooks={json.dumps(hooks + [HOOK])}"] if HOOK not in hooks else []
    cmd, launch_env = rl_cmd(cfg, args.argv(extra), gpus=gpus)
    r = run_stage("rl", cmd, env={**launch_env, **env}, on_line=_stream("rl"))
    _record("rl", cfg)
    return {**_tuned(cfg), "eval_mode": ev.mode if ev else "off", "eval_placement": ev.where if ev else None,
            "seconds": r.seconds}


@task(name="wait-checkpoint-evals")
def wait_for_evaluations(cfg: PipelineConfig, queue: str) -> list[dict]:
    """Wait until every checkpoint reported in `queue` has an evaluation record (or the timeout passes)."""
    logger = get_run_logger()
    proc = _evaluators.pop(queue, None)
    deadline = time.time() + cfg.orchestration.eval_wait_s
    if proc is not None:
        try:
            rc = proc.wait(timeout=cfg.orchestration.eval_wait_s)
        except subprocess.TimeoutExpired:
            stop_process(proc)
            raise VTGError(f"embedded evaluator did not finish within {cfg.orchestration.eval_wait_s}s "
                           f"(log: {Path(queue).with_suffix('.log')})") from None
        if rc != 0:
            tail = Path(queue).with_suffix(".log").read_text().splitlines()[-5:]
            raise VTGError(f"embedded evaluator failed (exit {rc}):\n  " + "\n  ".join(tail))
    expected = list(follow_all(Path(queue)))
    while True:
        done = evaluation_records(cfg, expected)
        if len(done) >= len(expected) or time.time() > deadline:
            break
        time.sleep(1.0)
    missing = len(expected) - len(done)
    if missing:
        logger.warning("%d of %d checkpoint evaluations did not finish in time", missing, len(expected))
    return done


def follow_all(queue: Path) -> list[dict]:
    if not queue.exists():
        return []
    return [json.loads(line) for line in queue.read_text().splitlines() if line.strip()
            and not json.loads(line).get("done")]


def evaluation_records(cfg: PipelineConfig, expected: list[dict]) -> list[dict]:
    """Evaluation records of the expected checkpoints (matched by directory and save time)."""
    path = results_path(cfg)
    if not path.is_file():
        return []
    want = {(e["checkpoint_dir"], round(float(e.get("saved_at", 0)), 3)) for e in expected}
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    seen: dict[tuple, dict] = {}
    for r in recs:
        k = (r.get("checkpoint_dir"), round(float(r.get("saved_at", 0)), 3))
        if k in want:
            seen[k] = r
    return sorted(seen.values(), key=lambda r: r["step"])


@_stage_task("evaluate-stage")
def evaluate(cfg: PipelineConfig, args: ConfigArgs, parent: str | None) -> dict:
    """The evaluate stage CLI (`python -m evaluation`): every checkpoint on val (results stored while training
    ran are reused), the best on test; the same command `dvc repro` runs."""
    out = Path(cfg.evaluate.out_dir)
    if cached := _up_to_date("evaluate", cfg, evaluate_outputs(cfg), log_run=False):
        return cached
    env = {lineage.ENV_PARENT_RUN_ID: parent} if parent else {}
    r = run_stage("evaluate", module_cmd(cfg.orchestration.stages.evaluate, args.argv()), env=env,
                  on_line=_stream("evaluate"))
    _record("evaluate", cfg)
    return {**evaluate_outputs(cfg), "seconds": r.seconds, "out_dir": str(out)}


def evaluate_outputs(cfg: PipelineConfig) -> dict:
    """What the evaluate stage wrote: the best pointer, the held-out metrics, its summary markdown."""
    out = Path(cfg.evaluate.out_dir)
    best = checkpoints.read_pointer(out / checkpoints.BEST_POINTER) or {}
    summary = out / "summary.md"
    return {"best_checkpoint": str(best["path"]) if best else None, "best_step": best.get("step"),
            "test": _read_json(out / "metrics.json"), "summary_markdown": summary.read_text() if summary.is_file()
            else ""}


@task(name="write-report", retries=1, retry_delay_seconds=2)
def write_report(cfg: PipelineConfig, summary: dict[str, Any]) -> str:
    path = Path(cfg.orchestration.report_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    md = report_markdown(summary)
    path.write_text(md)
    create_markdown_artifact(key="run-summary", markdown=md, description="post-training run summary")
    evals = summary.get("evaluations", [])
    if evals:
        create_table_artifact(key="eval-metrics", table=[{"step": e["step"], **{k: round(v, 4) for k, v in
                              e.get("metrics", {}).items()}} for e in evals],
                              description="Metrics of every evaluated checkpoint")
    return str(path.resolve())


def rl_line(step: dict[str, Any] | None) -> str:
    """The report's RL row: the RL run, the SFT checkpoint it started from and how many steps, or why none."""
    if not step:
        return "not run"
    if not step.get("enabled", True):
        return "off (`orchestration.rl` false): no RL checkpoints"
    if not step.get("latest_checkpoint"):
        return "no RL checkpoint"
    start = step.get("start_checkpoint")
    at = f" (step {step['start_step']})" if step.get("start_step") is not None else ""
    return (f"run `{step.get('rl_run_id')}` from `{start}`{at}, {step.get('steps')} steps -> "
            f"`{step.get('latest_checkpoint')}`")


def report_markdown(s: dict[str, Any]) -> str:
    """The pipeline report: lineage and steps from the flow, the evaluation part as the evaluate stage wrote it."""
    lines = ["# Post-training run report", "", "| | |", "| --- | --- |"]
    steps = s.get("stages") or {}
    placement = s.get("eval_placement") or next(
        (steps.get(k, {}).get("eval_placement") for k in ("train", "rl") if steps.get(k, {}).get("eval_placement")),
        None)
    for k in ("flow_run_id", "mlflow_parent_run_id", "git_commit", "config_hash", "source_digest",
              "data_version", "dvc", "train_run_id", "rl", "best_checkpoint", "eval_mode", "seconds"):
        lines.append(f"| rl | {rl_line(steps.get('rl'))} |" if k == "rl" else f"| {k} | `{s.get(k)}` |")
        if k == "eval_mode" and placement:
            lines.append(f"| eval_placement | {placement} |")
    if s.get("evaluation_markdown"):
        lines += ["", s["evaluation_markdown"].rstrip()]
    stages_ = s.get("stages", {})
    if stages_:
        lines += ["", "## Steps", "", "| step | status | stage process s | dvc.lock s | MLflow run |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {k} | {v.get('status', 'ran')} | {v.get('seconds', 0):.1f} | {v.get('dvc_s', 0):.1f} | "
                  f"{v.get('mlflow_run_id') or '-'} |" for k, v in stages_.items()]
    return "\n".join(lines) + "\n"
