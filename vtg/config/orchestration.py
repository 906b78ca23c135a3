"""`orchestration`: Prefect flows, deployments and DVC remote."""

from vtg.config._base import Section


class OrchestrationConfig(Section):
    flow_name: str = "post-training"
    """Prefect flow name (deployments are `post-training/<name>`)."""
    dvc_remote: str = "local"
    """DVC remote the shards are pushed to."""
    eval_concurrently: bool = True
    """Evaluate every checkpoint while training continues (separate process)."""
