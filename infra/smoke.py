"""`infra-smoke`: a flow that proves a worker can reach every service of the non-embedded deployment.

Deploy it to each pool (infra/prefect/prefect.yaml) and run it after `docker compose up`:
    prefect deployment run infra-smoke/cpu --watch
It logs an MLflow run with a metric and an artifact (so the tracking server, its Postgres backend and its S3
artifact store are all exercised), reports the worker's accelerators, and fails with one clear line if any
service is unreachable.
"""

from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path

from prefect import flow, get_run_logger


def accelerators() -> dict[str, object]:
    import torch

    cuda = torch.cuda.is_available()
    return {"cuda": cuda, "gpus": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__}


def mlflow_roundtrip(experiment: str) -> dict[str, str]:
    """Log a run with a metric and an artifact, then read the artifact back through the tracking server."""
    import mlflow

    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith(("http://", "https://")):
        raise RuntimeError(f"MLFLOW_TRACKING_URI={uri!r}: expected the tracking server's http(s) URL")
    from vtg.net import check_tracking_server

    check_tracking_server(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(run_name="infra-smoke") as run:
        mlflow.log_param("host", platform.node())
        mlflow.log_metric("smoke", 1.0)
        note = Path(tmp, "smoke.txt")
        note.write_text(f"written by {platform.node()}\n")
        mlflow.log_artifact(str(note))
        back = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="smoke.txt",
                                                   dst_path=str(Path(tmp, "back")))
        if Path(back).read_text() != note.read_text():
            raise RuntimeError("artifact read back differs from what was written")
    return {"run_id": run.info.run_id, "artifact_uri": run.info.artifact_uri}


@flow(name="infra-smoke", log_prints=True)
def infra_smoke(experiment: str = "vtg-infra-smoke") -> dict[str, object]:
    """Check MLflow (server, database, artifact store) and the accelerators from wherever this runs."""
    log = get_run_logger()
    result: dict[str, object] = {"host": platform.node(), **accelerators(), **mlflow_roundtrip(experiment)}
    log.info("infra smoke ok: %s", result)
    return result
