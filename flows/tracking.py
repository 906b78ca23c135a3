"""MLflow lineage from the orchestrator: one parent run per pipeline run, one child run per stage.

Stage processes (training, evaluation) open their own runs as children of the parent through the
`VTG_MLFLOW_PARENT_RUN_ID` environment variable; the steps that run in the flow process log through here.
Uses `MlflowClient` with explicit run ids (Prefect tasks run in threads; the fluent API's active run is
thread-local).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from vtg import lineage, util
from vtg.config import PipelineConfig
from vtg.net import check_tracking_server

log = logging.getLogger(__name__)
PARENT_TAG = "mlflow.parentRunId"


def client(cfg: PipelineConfig):
    import mlflow
    from mlflow import MlflowClient

    check_tracking_server(cfg.tracking.tracking_uri)
    mlflow.set_tracking_uri(cfg.tracking.tracking_uri)
    return MlflowClient(cfg.tracking.tracking_uri, registry_uri=cfg.tracking.tracking_uri)


def experiment_id(cfg: PipelineConfig) -> str:
    c = client(cfg)
    exp = c.get_experiment_by_name(cfg.tracking.experiment)
    return exp.experiment_id if exp else c.create_experiment(cfg.tracking.experiment)


def flatten(d: dict[str, Any]) -> dict[str, str]:
    """`d` as MLflow params: dotted keys (`vtg.util.flatten`), lists as JSON, every other leaf as `str`."""
    return {k: json.dumps(v) if isinstance(v, list | tuple) else str(v) for k, v in util.flatten(d).items()}


def pipeline_run(cfg: PipelineConfig, flow_run_id: str, tags: dict[str, str]) -> str | None:
    """The parent run of this pipeline run; a retried flow run (same flow-run id) gets the same parent back."""
    if not cfg.tracking.enabled:
        return None
    c, exp = client(cfg), experiment_id(cfg)
    found = c.search_runs([exp], filter_string=f"tags.`{lineage.TAG_PREFECT_FLOW_RUN}` = '{flow_run_id}' and "
                                               f"tags.`{lineage.TAG_STAGE}` = 'pipeline'", max_results=1)
    if found:
        run_id = found[0].info.run_id
        c.update_run(run_id, status="RUNNING")
    else:
        run = c.create_run(exp, run_name=f"pipeline-{flow_run_id[:8]}",
                           tags={lineage.TAG_STAGE: "pipeline", lineage.TAG_PREFECT_FLOW_RUN: flow_run_id})
        run_id = run.info.run_id
        for k, v in flatten(cfg.model_dump(mode="json")).items():
            c.log_param(run_id, k, v[:6000])
    for k, v in tags.items():
        c.set_tag(run_id, k, v)
    return run_id


def stage_run(cfg: PipelineConfig, parent: str | None, stage: str, params: dict[str, Any] | None = None,
              metrics: dict[str, float] | None = None, tags: dict[str, str] | None = None,
              artifacts: list[str | Path] = ()) -> str | None:
    """Log one finished stage as a child run of the pipeline run."""
    if not cfg.tracking.enabled or parent is None:
        return None
    c = client(cfg)
    run = c.create_run(experiment_id(cfg), run_name=stage,
                       tags={PARENT_TAG: parent, lineage.TAG_STAGE: stage, **(tags or {})})
    run_id = run.info.run_id
    for k, v in flatten(params or {}).items():
        c.log_param(run_id, k, v[:6000])
    for k, v in (metrics or {}).items():
        c.log_metric(run_id, k, float(v))
    for a in artifacts:
        if Path(a).is_file():
            c.log_artifact(run_id, str(a))
    c.set_terminated(run_id, "FINISHED")
    return run_id


def log_shards_input(cfg: PipelineConfig, run_ids: list[str | None], digest: str, manifest: dict[str, Any]) -> None:
    """`log_input` of the shard set (name, DVC/tree digest, source path) on the given runs."""
    if not cfg.tracking.enabled:
        return
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(str(Path(cfg.preprocess.out_dir).resolve()))
    dataset = MetaDataset(source=source, name=f"shards@{digest[:12]}", digest=digest[:36])
    entity = dataset._to_mlflow_entity()
    c = client(cfg)
    for run_id in filter(None, run_ids):
        c.log_inputs(run_id, datasets=[DatasetInput(entity, tags=[InputTag("mlflow.data.context", "train")])])


def finish(cfg: PipelineConfig, run_id: str | None, status: str = "FINISHED") -> None:
    if cfg.tracking.enabled and run_id:
        client(cfg).set_terminated(run_id, status)


def run_url(cfg: PipelineConfig, run_id: str | None) -> str:
    """A link to the run in the MLflow UI when the tracking URI is a server, else the run id."""
    if not run_id:
        return "-"
    uri = cfg.tracking.tracking_uri
    if uri.startswith("http"):
        return f"{uri.rstrip('/')}/#/experiments/{experiment_id(cfg)}/runs/{run_id}"
    return run_id
