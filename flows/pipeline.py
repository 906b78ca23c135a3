"""The `post-training` flow: corpus -> ingest -> Beam preprocess -> DVC versioning -> training with every
checkpoint evaluated while training continues -> held-out evaluation of the best checkpoint -> report.

Run it embedded with `python -m flows` (Prefect's ephemeral API, no server), or served with `make serve` and
`prefect deployment run 'post-training/default'`. Retrying a failed flow run skips every finished step whose
input content did not change (see `flows.content`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from prefect import flow, runtime
from prefect.tasks import exponential_backoff

from flows import tasks, tracking
from flows.content import StageContent, paths_digest, shard_digest, source_digest, stage_content
from flows.evaluation import evaluate_checkpoint
from flows.stages import ConfigArgs
from vtg import lineage
from vtg.config import PipelineConfig, config_hash, load_config
from vtg.errors import VTGError

logging.getLogger("httpx").setLevel(logging.WARNING)
ENV_FAIL_FLAG = "VTG_FAIL_AFTER_PREPROCESS_FLAG"  # test hook: fail after preprocessing while this file exists


def _run_cached(task_fn, missing_output: str | Path, **kwargs: Any):
    """Call a content-cached task; if its declared output is gone, run it again instead of trusting the cache."""
    refresh = not Path(missing_output).exists()
    return task_fn.with_options(refresh_cache=refresh)(**kwargs) if refresh else task_fn(**kwargs)


def _with_retries(task_fn, cfg: PipelineConfig):
    """The task with `orchestration.task_retries`, delays backing off exponentially from `retry_delay_s`."""
    o = cfg.orchestration
    delays = exponential_backoff(o.retry_delay_s)(o.task_retries) if o.task_retries else 0
    return task_fn.with_options(retries=o.task_retries, retry_delay_seconds=delays)


def _dvc_setup(cfg: PipelineConfig) -> str:
    o = cfg.orchestration
    return f"{o.dvc_version}/{o.dvc_remote}/{Path('.dvc').is_dir() and Path('dvc.yaml').is_file()}"


def _maybe_inject_failure() -> None:
    flag = os.environ.get(ENV_FAIL_FLAG)
    if flag and Path(flag).exists():
        raise RuntimeError(f"injected failure after preprocessing (remove {flag} and retry the flow run)")


def _run_name() -> str:
    return f"post-training-{runtime.flow_run.parameters.get('experiment') or 'default'}"


@flow(name="post-training", flow_run_name=_run_name, log_prints=True, persist_result=True)
def post_training(params: str = "params.yaml", experiment: str | None = None,
                  overrides: list[str] | None = None) -> dict[str, Any]:
    """The whole pipeline for one configuration (params file + experiment + dotted overrides)."""
    t0 = time.perf_counter()
    overrides = list(overrides or [])
    cfg = load_config(params, experiment, overrides)
    args = ConfigArgs(params, experiment, tuple(overrides))
    flow_run_id = str(runtime.flow_run.id)
    summary: dict[str, Any] = {"flow_run_id": flow_run_id, "git_commit": lineage.git_commit(),
                               "config_hash": config_hash(cfg), "stages": {}}
    parent = tracking.pipeline_run(cfg, flow_run_id, {lineage.TAG_GIT_COMMIT: summary["git_commit"],
                                                      lineage.TAG_CONFIG_HASH: summary["config_hash"]})
    summary["mlflow_parent_run_id"] = parent
    try:
        _data_steps(cfg, args, parent, summary)
        _maybe_inject_failure()
        _train_and_evaluate(cfg, args, parent, flow_run_id, summary)
    except BaseException:
        tracking.finish(cfg, parent, "FAILED")
        raise
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    summary["report"] = _with_retries(tasks.write_report, cfg)(cfg, summary)
    tracking.finish(cfg, parent)
    print_where_to_look(cfg, summary)
    return summary


def _data_steps(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, summary: dict[str, Any]) -> None:
    stages = summary["stages"]
    common = {"cfg": cfg, "args": args, "parent": parent}
    if cfg.orchestration.build_corpus:
        stages["corpus"] = _run_cached(tasks.build_corpus, cfg.corpus.out_dir,
                                       content=stage_content(cfg, "corpus", "", cfg.corpus), **common)
    src = source_digest(cfg)
    stages["ingest"] = _run_cached(tasks.ingest, cfg.ingest.out,
                                   content=stage_content(cfg, "ingest", src, cfg.ingest), **common)
    records = paths_digest([cfg.preprocess.records])
    stages["preprocess"] = _run_cached(
        tasks.preprocess, Path(cfg.preprocess.out_dir) / "manifest.json",
        content=stage_content(cfg, "preprocess", f"{records}/{src}", cfg.preprocess), **common)
    shards = shard_digest(cfg)
    dvc = _with_retries(tasks.version_shards, cfg)(content=StageContent("dvc", _dvc_setup(cfg), shards, ""),
                               cfg=cfg, args=args)
    summary.update(source_digest=src, shard_digest=shards, dvc=dvc)
    if parent:
        c = tracking.client(cfg)
        for k, v in {lineage.TAG_SOURCE_DIGEST: src, lineage.TAG_DATA_VERSION: shards,
                     "vtg.dvc_md5": dvc.get("dvc_md5") or "-", "vtg.preprocess_run_id":
                     stages["preprocess"].get("mlflow_run_id") or "-"}.items():
            c.set_tag(parent, k, v)
        tracking.log_shards_input(cfg, [parent], shards, stages["preprocess"].get("manifest", {}))


def _train_and_evaluate(cfg: PipelineConfig, args: ConfigArgs, parent: str | None, flow_run_id: str,
                        summary: dict[str, Any]) -> None:
    queue = Path(cfg.orchestration.state_dir) / f"checkpoint_queue-{flow_run_id}.jsonl"
    queue.parent.mkdir(parents=True, exist_ok=True)
    trained = _run_cached(tasks.train, Path(cfg.train.out_dir) / "latest",
                          content=stage_content(cfg, "train", summary["shard_digest"], cfg.train),
                          cfg=cfg, args=args, parent=parent, flow_run_id=flow_run_id, queue=str(queue))
    summary["stages"]["train"] = trained
    summary.update(train_run_id=trained.get("train_run_id"), eval_mode=trained.get("eval_mode"))
    evals = tasks.wait_for_evaluations(cfg, str(queue)) if trained.get("eval_mode") != "off" else []
    summary["evaluations"] = evals
    best_dir, best_step = tasks.pick_best(cfg, evals, trained)
    if not Path(best_dir).is_dir():
        raise VTGError(f"no checkpoint to evaluate under {cfg.train.out_dir} (training wrote none?)")
    test = evaluate_checkpoint(checkpoint_dir=best_dir, step=best_step, split="test", parent_run_id=parent or "",
                               params=args.params)
    summary.update(best_checkpoint=best_dir, best_step=best_step, test_metrics=test.get("metrics", {}),
                   test_baselines=test.get("baselines", {}), test_report=test.get("report"))


def print_where_to_look(cfg: PipelineConfig, s: dict[str, Any]) -> None:
    api = os.environ.get("PREFECT_API_URL")
    prefect_where = (api.removesuffix("/api") + f"/runs/flow-run/{s['flow_run_id']}" if api else
                     f"flow run {s['flow_run_id']} in {os.environ.get('PREFECT_HOME', '~/.prefect')}/prefect.db "
                     "(see it: `make serve`, then the Prefect UI; or `prefect flow-run inspect <id>`)")
    test = s.get("test_metrics") or {}
    shown = ", ".join(f"{k}={v:.3f}" for k, v in test.items() if k.startswith(("r1", "miou", "mIoU")))
    print("\n".join([
        "", f"=== post-training finished in {s.get('seconds', 0):.0f}s ===",
        f"best checkpoint : {s.get('best_checkpoint')} (held-out test: {shown or test})",
        f"report          : {s.get('report')}",
        f"Prefect         : {prefect_where}",
        (f"MLflow          : parent run {s.get('mlflow_parent_run_id')} in {cfg.tracking.tracking_uri} "
         f"(experiment {cfg.tracking.experiment!r}; `mlflow ui --backend-store-uri {cfg.tracking.tracking_uri}`)"),
        f"lineage         : python -m flows.lineage {s.get('best_checkpoint')}",
    ]))
