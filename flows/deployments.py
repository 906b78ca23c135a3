"""`python -m flows.deployments [--params P] [-e E] [--rl | --no-rl] [key=value ...]`: serve the two deployments.

- `post-training/<orchestration.deployment_name>`: the whole pipeline; its default parameters are the
  params file, experiment, overrides and `rl` given here (`prefect deployment run` may override them with `-p`,
  e.g. `-p rl=false` for SFT only; `rl` unset: `orchestration.rl` decides).
- `evaluate-checkpoint/on-checkpoint-saved`: triggered by every `checkpoint.saved` event (emitted by training's
  checkpoint hook), with `checkpoint_dir`, `step`, `parent_run_id` and `saved_at` taken from the event.
Needs PREFECT_API_URL pointing at a Prefect server (`python -m flows.serve` sets everything up).
"""

from __future__ import annotations

import argparse
import os
import sys

from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.errors import VTGError
from vtg.lineage import CHECKPOINT_EVENT
from vtg.net import check_prefect_api

EVENT_PARAMETERS = {
    "checkpoint_dir": "{{ event.payload.checkpoint_dir }}",
    "step": "{{ event.payload.step }}",  # renders as int: the flow parameter is typed `step: int`
    "parent_run_id": "{{ event.payload.parent_run_id }}",
    "saved_at": "{{ event.payload.saved_at }}",
}


def build_deployments(params: str, experiment: str | None, overrides: list[str], rl: bool | None = None):
    from prefect.events import DeploymentEventTrigger
    from prefect.types.entrypoint import EntrypointType

    from flows.evaluation import evaluate_checkpoint
    from flows.pipeline import post_training, rl_override

    cfg = resolve_config_quiet(params, experiment, overrides + rl_override(rl))
    o = cfg.orchestration
    pipeline = post_training.to_deployment(
        name=o.deployment_name, entrypoint_type=EntrypointType.MODULE_PATH,
        parameters={"params": params, "experiment": experiment, "overrides": overrides, "rl": rl},
        description="corpus -> ingest -> annotate -> Beam preprocess -> DVC shards -> DeepSpeed SFT -> GRPO (rl), "
                    "every checkpoint evaluated -> held-out evaluation -> report", tags=["vtg"])
    flow_name, _, dep_name = o.eval_deployment.partition("/")
    if flow_name != evaluate_checkpoint.name:
        raise VTGError(f"orchestration.eval_deployment must start with '{evaluate_checkpoint.name}/', got "
                       f"{o.eval_deployment!r}")
    evaluator = evaluate_checkpoint.to_deployment(
        name=dep_name, entrypoint_type=EntrypointType.MODULE_PATH, tags=["vtg"],
        parameters={"params": params},
        triggers=[DeploymentEventTrigger(name="on-checkpoint-saved", expect={CHECKPOINT_EVENT},
                                         match={"prefect.resource.id": "vtg.checkpoint.*"},
                                         parameters=EVENT_PARAMETERS)],
        description="Evaluate one checkpoint; runs on every checkpoint.saved event")
    return [pipeline, evaluator]


def add_rl_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rl", action=argparse.BooleanOptionalAction, default=None,
                        help="the pipeline deployment's default for its `rl` parameter: GRPO after SFT (--rl) or "
                             "not (--no-rl); unset: orchestration.rl decides")


def resolve_config_quiet(params: str, experiment: str | None, overrides: list[str]):
    from vtg.config import load_config

    return load_config(params, experiment, overrides)


def _main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser("Serve the post-training and evaluate-checkpoint deployments on the Prefect server "
                               "named by PREFECT_API_URL (the config given becomes the pipeline's defaults).")
    add_rl_flag(parser)
    args = parser.parse_args(argv)
    resolve_config(args)
    if not os.environ.get("PREFECT_API_URL"):
        raise VTGError("PREFECT_API_URL is not set: start a Prefect server first (`make serve` does both)")
    check_prefect_api()
    from prefect import serve

    serve(*build_deployments(args.params, args.experiment, list(args.overrides), args.rl), pause_on_shutdown=False)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(_main))
