"""Single-stage flows for placement on a pool: the stage CLI, run where the deployment's pool puts it.

`preprocess` on the `cpu` pool runs the Beam job there (the DirectRunner on that node, or a submission to
Dataflow/Flink/Spark when `preprocess.runner` says so) and, with `push=True`, pushes the shards to the DVC remote
so the GPU node trains on exactly that data version (`dvc pull`).

`train-node` / `train-multinode` are the one-worker-per-node path of multi-node training: one GPU worker per
node polls its own queue (`gpu`/`node-<rank>`), each runs `deepspeed --no_ssh --node_rank=<rank>` from the same
hostfile, and they meet at node 0 (infra/multinode.py).
"""

from __future__ import annotations

import time

from prefect import flow

from flows.stages import ConfigArgs, module_cmd, run_stage
from infra.multinode import DEFAULT_PORT, launch_cmd, read_hostfile
from vtg import stages
from vtg.config import load_config


@flow(name="preprocess", log_prints=True)
def preprocess(params: str = "params.yaml", experiment: str | None = None, overrides: list[str] | None = None,
               push: bool = True, remote: str | None = None) -> dict[str, object]:
    """Run the preprocessing stage CLI, then `dvc push` its outputs to the configured remote."""
    args = ConfigArgs(params, experiment, tuple(overrides or ()))
    cfg = load_config(params, experiment, overrides or ())
    result = run_stage("preprocess", module_cmd(stages.stage_module("preprocess", cfg), args.argv()))
    if push:
        run_stage("dvc-push", ["dvc", "push", "-r", remote or cfg.orchestration.dvc_remote, cfg.preprocess.out_dir])
    return {"seconds": result.seconds, "out_dir": cfg.preprocess.out_dir, "pushed": push}


@flow(name="train-node", flow_run_name="train-node-{node_rank}", log_prints=True)
def train_node(node_rank: int, hostfile: str = "/job/hostfile", master_addr: str | None = None,
               master_port: int = DEFAULT_PORT, params: str = "params.yaml", experiment: str | None = None,
               overrides: list[str] | None = None) -> dict[str, object]:
    """This node's share of a multi-node DeepSpeed run (no ssh): its local ranks, joined at master_addr."""
    args = ConfigArgs(params, experiment, tuple(overrides or ()))
    cfg = load_config(params, experiment, overrides or ())
    cmd = launch_cmd(hostfile, args.argv(), stages.stage_module("train", cfg), node_rank, master_addr, master_port)
    result = run_stage(f"train-node-{node_rank}", cmd)
    return {"node_rank": node_rank, "seconds": result.seconds}


@flow(name="train-multinode", log_prints=True)
def train_multinode(hostfile: str = "/job/hostfile", master_addr: str | None = None, master_port: int = DEFAULT_PORT,
                    params: str = "params.yaml", experiment: str | None = None, overrides: list[str] | None = None,
                    deployment_prefix: str = "train-node/node-") -> list[str]:
    """Start `train-node` on every node of the hostfile at once (deployment `<prefix><rank>` is pinned to that
    node's work queue), then wait for all of them; any node failing fails the run."""
    from prefect.deployments import run_deployment

    hosts = read_hostfile(hostfile)
    common = {"hostfile": hostfile, "master_addr": master_addr or hosts[0].name, "master_port": master_port,
              "params": params, "experiment": experiment, "overrides": overrides or []}
    runs = [run_deployment(f"{deployment_prefix}{rank}", parameters={"node_rank": rank, **common}, timeout=0)
            for rank in range(len(hosts))]
    finished = [_wait_final(r.id) for r in runs]
    failed = [f"{r.name}: {r.state.type.value}" for r in finished if not r.state.is_completed()]
    if failed:
        raise RuntimeError(f"multi-node training failed on {len(failed)} node(s): {'; '.join(failed)}")
    return [str(r.id) for r in finished]


def _wait_final(flow_run_id, poll_s: float = 5.0):
    from prefect.client.orchestration import get_client

    from vtg.net import check_prefect_api

    check_prefect_api()
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final():
                return run
            time.sleep(poll_s)
