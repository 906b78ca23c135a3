"""`python -m flows [--params P] [-e EXPERIMENT] [key=value ...]`: the whole pipeline on the embedded default.

This is what `make run` calls. It runs the `post-training` flow on Prefect's ephemeral API (no server needed;
set PREFECT_API_URL to run against a server instead), then prints where to look.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.errors import VTGError

# The ephemeral API migrates a fresh database on first use; on 2 busy cores that can exceed Prefect's 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def _main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(
        "Run the post-training pipeline: corpus -> ingest -> Beam preprocess -> DVC-versioned shards -> "
        "DeepSpeed training with every checkpoint evaluated concurrently -> held-out evaluation -> report.")
    args = parser.parse_args(argv)
    resolve_config(args)  # validate (and --dry-run) before Prefect starts
    from flows.pipeline import post_training

    state = post_training(params=args.params, experiment=args.experiment, overrides=list(args.overrides),
                          return_state=True)
    if not state.is_completed():
        run_id = state.state_details.flow_run_id
        entry = f"{Path(__file__).with_name('pipeline.py')}:post_training"
        first = (state.message or state.name).splitlines()[0]
        raise VTGError(f"post-training flow run {run_id} {state.name.lower()}: {first}\n"
                       f"  finished steps are kept; after fixing, retry it: prefect flow-run retry {run_id} "
                       f"--entrypoint {entry}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(_main))
