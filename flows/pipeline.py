"""The `post-training` flow: corpus -> ingest -> annotate -> Beam preprocess -> DVC push -> SFT training -> select
(RL's start, chosen on val) -> GRPO (rl), with every checkpoint of both evaluated while they run -> the evaluate
stage (best of SFT and RL on val, then held-out test) -> report.

Run it embedded with `python -m flows` (Prefect's ephemeral API, no server), or served with `make serve` and
`prefect deployment run 'post-training/default'`. The stages are the ones `dvc.yaml` declares; a stage that
dvc.lock records as done for this config finishes as `Cached` without running (see `vtg.stages`), so a retried
flow run, a second `make run` and `dvc repro` skip the same finished steps.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from prefect import flow, runtime
from prefect.tasks import exponential_backoff

from flows import report, tasks, tracking
from flows.evaluator import CheckpointEvaluator
from flows.stages import BackgroundStage, ConfigArgs, module_cmd
from vtg import eval_queue, lineage
from vtg.config import PipelineConfig, config_hash, load_config
from vtg.errors import VTGError
from vtg.selection import start_pointer_path
from vtg.shards import data_version
from vtg.stages import stage_module

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)
ENV_FAIL_FLAG = "VTG_FAIL_AFTER_PREPROCESS_FLAG"  # test hook: fail after preprocessing while this file exists


def _call(task_fn, **kwargs: Any) -> dict[str, Any]:
    """Run a task and return its result (also when it finished as `Cached`, i.e. up to date in dvc.lock)."""
    return task_fn(**kwargs, return_state=True).result()


def _with_retries(task_fn, cfg: PipelineConfig):
    """The task with `orchestration.task_retries`, delays backing off exponentially from `retry_delay_s`."""
    o = cfg.orchestration
    delays = exponential_backoff(o.retry_delay_s)(o.task_retries) if o.task_retries else 0
    return task_fn.with_options(retries=o.task_retries, retry_delay_seconds=delays)


def _maybe_inject_failure() -> None:
    flag = os.environ.get(ENV_FAIL_FLAG)
    if flag and Path(flag).exists():
        raise RuntimeError(f"injected failure after preprocessing (remove {flag} and retry the flow run)")


def _run_name() -> str:
    return f"post-training-{runtime.flow_run.parameters.get('experiment') or 'default'}"


@flow(name="post-training", flow_run_name=_run_name, log_prints=True, persist_result=True)
def post_training(params: str = "params.yaml", experiment: str | None = None,
                  overrides: list[str] | None = None, rl: bool | None = None) -> dict[str, Any]:
    """The whole pipeline for one configuration (params file + experiment + dotted overrides).

    `rl`: when set, runs GRPO after SFT (true) or not (false) whatever `orchestration.rl` says; it becomes the
    override `orchestration.rl=true|false`, so every stage sees it and dvc.lock records what ran."""
    t0 = time.perf_counter()
    overrides = list(overrides or []) + rl_override(rl)
    cfg = load_config(params, experiment, overrides)
    args = ConfigArgs(params, experiment, tuple(overrides))
    flow_run_id = str(runtime.flow_run.id)
    summary: dict[str, Any] = {"flow_run_id": flow_run_id, "git_commit": lineage.git_commit(),
                               "config_hash": config_hash(cfg), "stages": {}}
    parent = tracking.pipeline_run(cfg, flow_run_id, {lineage.TAG_GIT_COMMIT: summary["git_commit"],
                                                      lineage.TAG_CONFIG_HASH: summary["config_hash"]})
    summary["mlflow_parent_run_id"] = parent
    early: list[BackgroundStage] = []  # the base's preparation, started once the corpus exists
    try:
        _data_steps(cfg, args, parent, summary, early)
        _maybe_inject_failure()
        # the train stage starts now (imports, pre-flight) and, if the base is still being taught, waits for it
        # where it needs it (`vtg.model.tiny.build_once`: one builder at a time, the second finds the first's build)
        _train_and_evaluate(cfg, args, parent, flow_run_id, summary, early)
    except BaseException:
        for prep in early:
            prep.stop()
        tracking.finish(cfg, parent, "FAILED")
        raise
    for name, step in summary["stages"].items():
        step["dvc_s"] = round(tasks.DVC_SECONDS.get(name, 0.0), 2)
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    summary["report"] = _with_retries(tasks.write_report, cfg)(cfg, summary)
    tracking.finish(cfg, parent)
    print_where_to_look(cfg, summary)
    return summary


def rl_override(rl: bool | None) -> list[str]:
    """The flow's `rl` parameter as a config override (none when unset: `orchestration.rl` decides)."""
    return [] if rl is None else [f"orchestration.rl={'true' if rl else 'false'}"]


def _start_base(cfg: PipelineConfig, args: ConfigArgs) -> BackgroundStage | None:
    """`python -m training.prepare_base` in the background when the train stage's base is a tiny one to teach:
    the teaching (and the suite's decoding) then runs beside ingest, annotate and preprocess instead of at the
    start of the train stage, which finds both in their caches (the same keys: the same base, bit for bit)."""
    from vtg.config.train import taught_suite

    if taught_suite(cfg.train.teach, cfg.train.model.base) is None:
        return None
    log_path = Path(cfg.orchestration.state_dir) / "prepare_base.log"
    return BackgroundStage("prepare-base", module_cmd("training.prepare_base", args.argv()), log_path, critical=True)


def _wait_for_base(prep: BackgroundStage) -> None:
    """Join the base's preparation (the train stage has run, or was up to date); a failure is only logged: the
    train stage prepared the base itself, and reported what went wrong as its own error."""
    _join_background(prep, "the train stage prepared it itself")


def _start_heldout(cfg: PipelineConfig, args: ConfigArgs, which: str) -> BackgroundStage:
    """`python -m evaluation.heldout --which <which>` in the background: a checkpoint the evaluate stage will score on test
    (RL's start while RL starts up; the newest RL checkpoint beside its val evaluation once RL is done), evaluated on
    the core the per-checkpoint evaluator leaves free; the evaluate stage finds it stored under the same key."""
    log_path = Path(cfg.orchestration.state_dir) / f"heldout_{which.replace('-', '_')}.log"
    return BackgroundStage(f"heldout-{which}", module_cmd("evaluation.heldout", [*args.argv(), "--which", which]), log_path)


HELDOUT_FOR = "evaluation"
"""The evaluate stage module whose work `evaluation.heldout` does ahead (`python -m evaluation`, dvc.yaml): it finds
what `evaluation.api` stored under its key. Another implementation of the stage (`orchestration.stages.evaluate`)
never reads those results, so the flow does not start them for it."""


def _heldout_ahead(cfg: PipelineConfig) -> bool:
    module = stage_module("evaluate", cfg)
    if module != HELDOUT_FOR:
        log.info("held-out evaluations ahead: off (the evaluate stage is `python -m %s`, which would not read them)",
                 module)
    return module == HELDOUT_FOR


def _join_background(stage: BackgroundStage, fallback: str) -> None:
    """Wait for a step started in the background; a failure is only logged (`fallback` says who does the work
    instead and reports what went wrong as its own error)."""
    t0 = time.perf_counter()
    rc = stage.wait()
    if time.perf_counter() - t0 > 1:
        log.info("waited %.0f s for [%s]", time.perf_counter() - t0, stage.name)
    if rc != 0:
        log.warning("[%s] failed (exit %d, log: %s): %s", stage.name, rc, stage.log_path, fallback)


def _data_steps(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, summary: dict[str, Any],
                early: list[BackgroundStage]) -> None:
    stages = summary["stages"]
    common = {"cfg": cfg, "args": args, "parent": parent}
    if cfg.orchestration.build_corpus:
        stages["corpus"] = _call(tasks.build_corpus, **common)
    prep = _start_base(cfg, args)  # needs the corpus (the general suite), nothing after it
    if prep is not None:
        early.append(prep)
    src = lineage.source_digest([*cfg.ingest.annotations, cfg.ingest.video_root])
    stages["ingest"] = _call(tasks.ingest, source=src, **common)
    stages["annotate"] = _call(tasks.annotate, source=src, **common)
    stages["preprocess"] = _call(tasks.preprocess, source=src, **common)
    version = data_version(cfg.preprocess.out_dir)
    dvc = _call(_with_retries(tasks.push_shards, cfg), cfg=cfg)
    summary.update(source_digest=src, data_version=version, dvc=dvc)
    if parent:
        c = tracking.client(cfg)
        for k, v in {lineage.TAG_SOURCE_DIGEST: src, lineage.TAG_DATA_VERSION: version,
                     "vtg.dvc_md5": dvc.get("dvc_md5") or "-", "vtg.preprocess_run_id":
                     stages["preprocess"].get("mlflow_run_id") or "-"}.items():
            c.set_tag(parent, k, v)
        tracking.log_shards_input(cfg, [parent], version, stages["preprocess"].get("manifest", {}))


def _train_and_evaluate(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, flow_run_id: str,
                        summary: dict[str, Any], early: list[BackgroundStage]) -> None:
    """SFT, then RL, both reporting their checkpoints into one queue that one evaluator follows (started with the
    first of them that runs, or after both when it must wait for the training device); the queue is closed once
    both are done (or one failed); then every evaluation is awaited, then the evaluate stage picks the best."""
    queue = eval_queue.queue_path(cfg.orchestration.state_dir, flow_run_id)
    evaluator = CheckpointEvaluator(cfg, args, parent, flow_run_id, queue)
    common = {"cfg": cfg, "args": args, "evaluator": evaluator}
    heldout: list[BackgroundStage] = []  # checkpoints the evaluate stage will score on test, evaluated ahead
    try:
        trained = _call(tasks.train, **common)
        summary["stages"]["train"] = trained
        for prep in early:
            _wait_for_base(prep)
        summary["stages"]["select"] = _call(tasks.select, cfg=cfg, args=args)
        ahead = cfg.orchestration.rl and start_pointer_path(cfg).is_file() and _heldout_ahead(cfg)
        if ahead:
            heldout.append(_start_heldout(cfg, args, "start"))
        tuned = _call(tasks.rl, **common)
        summary["stages"]["rl"] = tuned
        if ahead and tuned.get("status") != "up to date":
            heldout.append(_start_heldout(cfg, args, "latest-rl"))
    except BaseException:
        for job in heldout:
            job.stop()
        evaluator.close(start_waiting=False)
        evaluator.stop()  # the flow fails: nobody waits for these evaluations
        raise
    evaluator.close()
    modes = [m for m in (trained.get("eval_mode"), tuned.get("eval_mode")) if m not in (None, "off")]
    summary.update(train_run_id=trained.get("train_run_id"), rl_run_id=tuned.get("rl_run_id"),
                   rl_start_checkpoint=tuned.get("start_checkpoint"), rl_steps=tuned.get("steps"),
                   eval_mode=modes[0] if modes else trained.get("eval_mode"))
    try:
        if modes:
            summary["evaluations"] = tasks.wait_for_evaluations(evaluator)
    finally:
        evaluator.stop()  # finished already, or failed or interrupted while waiting
        for job in heldout:
            _join_background(job, "the evaluate stage evaluates what it needs itself")
    evaluated = _call(_with_retries(tasks.evaluate, cfg), cfg=cfg, args=args, parent=parent)
    summary["stages"]["evaluate"] = evaluated
    if not evaluated.get("best_checkpoint"):
        raise VTGError(f"the evaluate stage chose no best checkpoint under {cfg.train.out_dir} or {cfg.rl.out_dir} "
                       f"(see {cfg.evaluate.out_dir})")
    test = evaluated.get("test") or {}
    summary.update(best_checkpoint=evaluated["best_checkpoint"], best_step=evaluated.get("best_step"),
                   test_metrics=test.get("model", {}), test_baselines=test.get("baselines", {}),
                   evaluation_markdown=evaluated.get("summary_markdown", ""))


def print_where_to_look(cfg: PipelineConfig, s: dict[str, Any]) -> None:
    api = os.environ.get("PREFECT_API_URL")
    prefect_where = (api.removesuffix("/api") + f"/runs/flow-run/{s['flow_run_id']}" if api else
                     f"flow run {s['flow_run_id']} in {os.environ.get('PREFECT_HOME', '~/.prefect')}/prefect.db "
                     "(see it: `make serve`, then the Prefect UI; or `prefect flow-run inspect <id>`)")
    test = s.get("test_metrics") or {}
    shown = ", ".join(f"{k}={v:.3f}" for k, v in test.items() if k.startswith(("r1", "miou", "mIoU")))
    times = ", ".join(f"{name} {step.get('seconds', 0):.0f} s" + (" (up to date)" if step.get("status") == "up to date" else "")
                      for name, step in (s.get("stages") or {}).items())
    print("\n".join([
        "", f"=== post-training finished in {s.get('seconds', 0):.0f}s ===",
        f"stage times     : {times}",
        f"best checkpoint : {s.get('best_checkpoint')} (held-out test: {shown or test})",
        f"rl              : {report.rl_line((s.get('stages') or {}).get('rl')).replace('`', '')}",
        f"report          : {s.get('report')}",
        f"Prefect         : {prefect_where}",
        (f"MLflow          : parent run {s.get('mlflow_parent_run_id')} in {cfg.tracking.tracking_uri} "
         f"(experiment {cfg.tracking.experiment!r}; `mlflow ui --backend-store-uri {cfg.tracking.tracking_uri}`)"),
        f"lineage         : python -m flows.lineage {s.get('best_checkpoint')}",
    ]))
