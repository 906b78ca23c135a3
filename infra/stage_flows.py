"""Single-stage flows for placement on a pool: the stage CLI, run where the deployment's pool puts it.

`preprocess` on the `cpu` pool runs the Beam job there (the DirectRunner on that node, or a submission to
Dataflow/Flink/Spark when `preprocess.runner` says so) and, with `push=True`, pushes the shards to the DVC remote
so the GPU node trains on exactly that data version (`dvc pull`).
"""

from __future__ import annotations

from prefect import flow

from flows.stages import ConfigArgs, module_cmd, run_stage
from vtg.config import load_config


@flow(name="preprocess", log_prints=True)
def preprocess(params: str = "params.yaml", experiment: str | None = None, overrides: list[str] | None = None,
               push: bool = True, remote: str | None = None) -> dict[str, object]:
    """Run the preprocessing stage CLI, then `dvc push` its outputs to the configured remote."""
    args = ConfigArgs(params, experiment, tuple(overrides or ()))
    cfg = load_config(params, experiment, overrides or ())
    result = run_stage("preprocess", module_cmd(cfg.orchestration.stages.preprocess, args.argv()))
    if push:
        run_stage("dvc-push", ["dvc", "push", "-r", remote or cfg.orchestration.dvc_remote, cfg.preprocess.out_dir])
    return {"seconds": result.seconds, "out_dir": cfg.preprocess.out_dir, "pushed": push}
