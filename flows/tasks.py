"""Thin Prefect tasks: each resolves its inputs, makes one call into a stage entry point, and records the result.

Whether a stage must run is not decided here: `vtg.stages.status` compares dvc.lock (deps, outs, and the
output-changing config fields) with the workspace, exactly as `dvc repro` does; a stage that is up to date
finishes as `Cached` without running, and a stage that ran is recorded in dvc.lock (`vtg.stages.record`). So a
retried flow run (`prefect flow-run retry`, the UI's Retry), a second `make run` and `dvc repro` all skip the
same finished steps.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed
from prefect.tasks import exponential_backoff

from flows import report, tracking
from flows.evaluator import CheckpointEvaluator
from flows.stages import ConfigArgs, module_cmd, rl_cmd, run_stage, train_cmd, yield_nice
from vtg import checkpoints, lineage, stages
from vtg.config import PipelineConfig
from vtg.io import resolve_ref
from vtg.rl_outputs import SUMMARY_JSON as RL_SUMMARY
from vtg.selection import CANDIDATES, start_pointer_path
from vtg.shards import MANIFEST, data_version
from vtg.util import flatten

HOOK = "flows.events:on_checkpoint_saved"
DVC_SECONDS: dict[str, float] = {}  # stage -> seconds spent asking and updating dvc.lock (the report shows them)


def _stream(name: str):
    logger = get_run_logger()
    return lambda line: logger.info("[%s] %s", name, line)


def _read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else {}


def _numbers(d: dict[str, Any]) -> dict[str, float]:
    """The numeric leaves of `d` as MLflow metrics: dotted keys, `@` spelled `_at_` (MLflow refuses it)."""
    return {k.replace("@", "_at_"): float(v) for k, v in flatten(d).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


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
    r = run_stage("corpus", module_cmd(stages.stage_module("corpus", cfg), args.argv()), on_line=_stream("corpus"))
    _record("corpus", cfg)
    run_id = tracking.stage_run(cfg, parent, "corpus", params={"corpus": cfg.corpus.model_dump(mode="json")},
                                metrics={"seconds": r.seconds})
    return {"out_dir": cfg.corpus.out_dir, "seconds": r.seconds, "mlflow_run_id": run_id}


@_stage_task("ingest-annotations")
def ingest(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, source: str) -> dict:
    summary_path = stages.stage_outputs("ingest", cfg).summary  # where the CLI writes it
    if cached := _up_to_date("ingest", cfg, {"summary": _read_json(summary_path)}, parent):
        return cached
    r = run_stage("ingest", module_cmd(stages.stage_module("ingest", cfg), args.argv()), on_line=_stream("ingest"),
                  nice=yield_nice())
    _record("ingest", cfg)
    summary = _read_json(summary_path)
    run_id = tracking.stage_run(cfg, parent, "ingest", params={"ingest": cfg.ingest.model_dump(mode="json")},
                                metrics={**_numbers(summary), "seconds": r.seconds},
                                tags={lineage.TAG_SOURCE_DIGEST: source}, artifacts=[summary_path])
    return {"summary": summary, "seconds": r.seconds, "mlflow_run_id": run_id}


@_stage_task("annotate")
def annotate(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, source: str) -> dict:
    """Automatic annotation (a pass-through when `annotate.enabled` is false)."""
    summary_path = stages.stage_outputs("annotate", cfg).summary  # where the CLI writes it
    if cached := _up_to_date("annotate", cfg, {"summary": _read_json(summary_path)}, parent):
        return cached
    r = run_stage("annotate", module_cmd(stages.stage_module("annotate", cfg), args.argv()), on_line=_stream("annotate"),
                  nice=yield_nice())
    _record("annotate", cfg)
    summary = _read_json(summary_path)
    run_id = tracking.stage_run(cfg, parent, "annotate", params={"annotate": cfg.annotate.model_dump(mode="json")},
                                metrics={**_numbers(summary), "seconds": r.seconds},
                                tags={lineage.TAG_SOURCE_DIGEST: source}, artifacts=[summary_path])
    return {"summary": summary, "seconds": r.seconds, "mlflow_run_id": run_id}


@_stage_task("beam-preprocess")
def preprocess(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, source: str) -> dict:
    out = Path(cfg.preprocess.out_dir)
    if cached := _up_to_date("preprocess", cfg, {"out_dir": str(out), "manifest": _read_json(out / MANIFEST)},
                             parent):
        return cached
    r = run_stage("preprocess", module_cmd(stages.stage_module("preprocess", cfg), args.argv()),
                  on_line=_stream("preprocess"), nice=yield_nice())
    _record("preprocess", cfg)
    manifest = _read_json(out / MANIFEST)
    version = data_version(out)
    run_id = tracking.stage_run(
        cfg, parent, "preprocess", params={"preprocess": cfg.preprocess.model_dump(mode="json")},
        metrics={**_numbers(manifest), "seconds": r.seconds},
        tags={lineage.TAG_SOURCE_DIGEST: source, lineage.TAG_DATA_VERSION: version}, artifacts=[out / MANIFEST])
    tracking.log_shards_input(cfg, [run_id], version, manifest)
    create_markdown_artifact(key="shard-manifest", markdown=report.manifest_markdown(cfg, manifest, version),
                             description="Shards written by the Beam preprocessing job")
    return {"out_dir": str(out), "manifest": manifest, "seconds": r.seconds, "mlflow_run_id": run_id}


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


def _trained(cfg: PipelineConfig) -> dict:
    latest = checkpoints.latest_checkpoint(cfg.train.out_dir)
    meta = checkpoints.read_checkpoint_meta(latest) if latest else {}
    return {"out_dir": cfg.train.out_dir, "latest_checkpoint": str(latest) if latest else None, "meta": meta,
            "train_run_id": meta.get("mlflow_run_id")}


@_stage_task("train-deepspeed")
def train(cfg: PipelineConfig, args: ConfigArgs, evaluator: CheckpointEvaluator) -> dict:
    """Launch training; every checkpoint it saves is evaluated concurrently (embedded process or events).

    Training itself decides whether to resume (`latest` of the same trajectory) or to start fresh (then it moves
    the old checkpoints aside); the flow never deletes checkpoints. The queue stays open for RL after it."""
    if cached := _up_to_date("train", cfg, {**_trained(cfg), "eval_mode": "off"}, log_run=False):
        return cached
    ev = evaluator.open()
    hooks = list(cfg.train.checkpoint_hooks)
    extra = [f"train.checkpoint_hooks={json.dumps(hooks + [HOOK])}"] if HOOK not in hooks else []
    cmd, launch_env = train_cmd(cfg, args.argv(extra), gpus=ev.train_gpus)
    r = run_stage("train", cmd, env={**launch_env, **ev.env}, on_line=_stream("train"))
    _record("train", cfg)
    return {**_trained(cfg), "eval_mode": ev.mode, "eval_placement": ev.where, "seconds": r.seconds}


def _selected(cfg: PipelineConfig) -> dict:
    """What the select stage left: the SFT checkpoint RL starts from with `rl.init: best`, and the candidates."""
    pointer = checkpoints.read_pointer(start_pointer_path(cfg)) if start_pointer_path(cfg).is_file() else None
    return {"start_checkpoint": str(pointer["path"]) if pointer else None,
            "candidates": _read_json(start_pointer_path(cfg).with_name(CANDIDATES))}


@_stage_task("select-rl-start")
def select(cfg: PipelineConfig, args: ConfigArgs) -> dict:
    """The select stage (`python -m evaluation.select`): the SFT checkpoint best on val, which RL starts from
    (results the evaluator stored while training ran are reused); the same command `dvc repro` runs."""
    if cached := _up_to_date("select", cfg, _selected(cfg), log_run=False):
        return cached
    r = run_stage("select", module_cmd(stages.stage_module("select", cfg), args.argv()), on_line=_stream("select"))
    _record("select", cfg)
    return {**_selected(cfg), "seconds": r.seconds}


def _tuned(cfg: PipelineConfig) -> dict:
    """What the rl stage left: its newest checkpoint (meta: the RL run, the SFT checkpoint it started from) and
    its summary."""
    report_dir = stages.stage_outputs("rl", cfg).report_dir  # where the CLI writes it
    summary = _read_json(Path(report_dir) / RL_SUMMARY)
    latest = checkpoints.latest_checkpoint(cfg.rl.out_dir) if Path(cfg.rl.out_dir).is_dir() else None
    meta = checkpoints.read_checkpoint_meta(latest) if latest else {}
    parent = checkpoints.parent_checkpoint(latest, meta) if meta.get("parent_checkpoint") else None
    if parent is None and summary.get("parent_checkpoint"):
        parent = resolve_ref(summary["parent_checkpoint"], report_dir)
    return {"enabled": bool(summary.get("enabled", cfg.orchestration.rl)), "out_dir": cfg.rl.out_dir,
            "latest_checkpoint": str(latest) if latest else None, "rl_run_id": meta.get("mlflow_run_id"),
            "start_checkpoint": str(parent) if parent else None,
            "start_step": meta.get("parent_step", summary.get("parent_step")),
            "steps": meta.get("step", summary.get("step")), "summary": summary}


@_stage_task("rl-grpo")
def rl(cfg: PipelineConfig, args: ConfigArgs, evaluator: CheckpointEvaluator) -> dict:
    """The rl stage (`python -m training.rl`): GRPO from an SFT checkpoint; its checkpoints go to the same queue
    and evaluator as training's. With `orchestration.rl` false the stage still runs (an empty RL root, a summary
    saying RL is off), so dvc.lock records what ran."""
    if cached := _up_to_date("rl", cfg, {**_tuned(cfg), "eval_mode": "off"}, log_run=False):
        return cached
    ev = evaluator.open() if cfg.orchestration.rl else None
    hooks = list(cfg.rl.checkpoint_hooks)
    extra = [f"rl.checkpoint_hooks={json.dumps(hooks + [HOOK])}"] if HOOK not in hooks else []
    cmd, launch_env = rl_cmd(cfg, args.argv(extra), gpus=ev.train_gpus if ev else None)
    env = ev.env if ev else evaluator.lineage_env()
    r = run_stage("rl", cmd, env={**launch_env, **env}, on_line=_stream("rl"))
    _record("rl", cfg)
    return {**_tuned(cfg), "eval_mode": ev.mode if ev else "off", "eval_placement": ev.where if ev else None,
            "seconds": r.seconds}


@task(name="wait-checkpoint-evals", cache_policy=NO_CACHE)
def wait_for_evaluations(evaluator: CheckpointEvaluator) -> list[dict]:
    """Wait until every checkpoint reported in the queue has an evaluation record (or the timeout passes)."""
    return evaluator.wait()


@_stage_task("evaluate-stage")
def evaluate(cfg: PipelineConfig, args: ConfigArgs, parent: str | None) -> dict:
    """The evaluate stage CLI (`python -m evaluation`): every checkpoint on val (results stored while training
    ran are reused), the best on test; the same command `dvc repro` runs."""
    out = Path(cfg.evaluate.out_dir)
    if cached := _up_to_date("evaluate", cfg, evaluate_outputs(cfg), log_run=False):
        return cached
    env = {lineage.ENV_PARENT_RUN_ID: parent} if parent else {}
    r = run_stage("evaluate", module_cmd(stages.stage_module("evaluate", cfg), args.argv()), env=env,
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
    """The report (`flows.report`) to `orchestration.report_path`, and as Prefect artifacts."""
    path = Path(cfg.orchestration.report_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    md = report.report_markdown(summary)
    path.write_text(md)
    create_markdown_artifact(key="run-summary", markdown=md, description="post-training run summary")
    if evals := summary.get("evaluations", []):
        create_table_artifact(key="eval-metrics", table=report.eval_table(evals),
                              description="Metrics of every evaluated checkpoint")
    return str(path.resolve())
