"""`orchestration`: Prefect flows and deployments, per-checkpoint evaluation, DVC versioning of the shards."""

from typing import Literal

from pydantic import Field

from vtg.config._base import NOT_OUTPUT, Section
from vtg.net import NETWORK_TIMEOUT_S


class StageEntryPoints(Section):
    """Which module runs each stage. Empty (the default): the module of the stage's `cmd` in dvc.yaml, the one
    declaration of a stage (`vtg.stages.stage_module`); set one to plug in another implementation."""

    corpus: str = ""
    """The synthetic corpus (dvc.yaml: `python -m corpus`)."""
    ingest: str = ""
    """Annotations into canonical records (dvc.yaml: `python -m ingest`)."""
    annotate: str = ""
    """Automatic annotation, a pass-through when `annotate.enabled` is false (dvc.yaml: `python -m annotate`)."""
    preprocess: str = ""
    """The Beam preprocessing job (dvc.yaml: `python -m beam_jobs.preprocess`)."""
    train: str = ""
    """SFT, launched by `train_launcher` (dvc.yaml: `python -m training`)."""
    select: str = ""
    """The SFT checkpoint best on val, which RL starts from (dvc.yaml: `python -m evaluation.select`)."""
    rl: str = ""
    """GRPO after SFT, launched like training (dvc.yaml: `python -m training.rl`)."""
    evaluate: str = ""
    """The evaluate stage (dvc.yaml: `python -m evaluation`)."""
    evaluate_api: str = "evaluation.api:evaluate_checkpoint"
    """`module:function` called as `fn(checkpoint_dir, split, cfg)` by the per-checkpoint evaluator."""


class OrchestrationConfig(Section):
    flow_name: str = "post-training"
    """Prefect flow name (deployments are `post-training/<name>`)."""
    deployment_name: str = "default"
    """Name of the served post-training deployment (`prefect deployment run 'post-training/default'`)."""
    stages: StageEntryPoints = StageEntryPoints()
    """Entry points of the stages; swap a module to plug in another implementation."""
    rl: bool = True
    """Run GRPO (`python -m training.rl`) after SFT; its checkpoints join the evaluation and best-of selection.
    false: the rl stage writes no checkpoints and selection sees SFT only."""
    build_corpus: bool = True
    """Build the synthetic corpus first; false when `ingest.annotations` point at real data."""
    train_launcher: Literal["auto", "python", "deepspeed", "torchrun"] = "auto"
    """How training is started: `auto` = one process for one rank, the deepspeed launcher with GPUs, torchrun on CPU."""
    task_retries: int = Field(2, ge=0)
    """Retries of the steps where a retry can help (DVC push, evaluation, report)."""
    retry_delay_s: float = Field(5.0, ge=0)
    """First retry delay; later retries back off exponentially."""
    network_timeout_s: float = Field(NETWORK_TIMEOUT_S, gt=0, json_schema_extra=NOT_OUTPUT)
    """Connect and read timeout of every network call (the MLflow tracking server, the Prefect API, the object
    store): a server that accepts and never answers ends the command in one line naming it (vtg/net.py)."""
    dvc_version: bool = True
    """Record the shards in dvc.lock (`dvc commit`) and push them to `dvc_remote` after preprocessing."""
    dvc_remote: str = "local"
    """DVC remote the shards are pushed to (`.dvc/config`; S3/GCS in production, see docs/scaling.md)."""
    eval_concurrently: bool = True
    """Evaluate every checkpoint while training continues (separate process, or event-triggered runs when served)."""
    eval_trigger: Literal["auto", "embedded", "events"] = "auto"
    """`embedded`: a local evaluator process; `events`: `checkpoint.saved` events trigger the served deployment;
    `auto`: events when a Prefect server is configured (PREFECT_API_URL) and the deployment exists."""
    eval_deployment: str = "evaluate-checkpoint/on-checkpoint-saved"
    """Deployment triggered by `checkpoint.saved` events."""
    eval_wait_s: float = Field(1800.0, gt=0)
    """How long the flow waits for outstanding checkpoint evaluations after training ends."""
    state_dir: str = Field("reports/orchestration", json_schema_extra=NOT_OUTPUT)
    """Checkpoint queues, embedded-evaluator logs and the per-checkpoint evaluation index of flow runs."""
    report_path: str = Field("reports/pipeline_report.md", json_schema_extra=NOT_OUTPUT)
    """Final run report (markdown): lineage, shard manifest, metrics per checkpoint, links."""
    prefect_port: int = Field(4200, ge=1, le=65535)
    """Port of the Prefect server that `make serve` starts on 127.0.0.1."""
    serve_poll_s: float = Field(2.0, gt=0)
    """How often served deployments poll for scheduled runs (Prefect's default is 10 s)."""
