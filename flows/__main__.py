"""`python -m flows [--params P] [-e EXPERIMENT] [key=value ...]`: the whole pipeline on the embedded default.

This is what `make run` calls. It runs the `post-training` flow on Prefect's ephemeral API (no server needed;
set PREFECT_API_URL to run against a server instead), then prints where to look.
"""

from __future__ import annotations

import os
import sys

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

    try:
        post_training(params=args.params, experiment=args.experiment, overrides=list(args.overrides))
    except VTGError:
        raise
    except Exception as e:  # the Prefect log above has the traceback; the user gets one line
        raise VTGError(f"post-training flow failed: {type(e).__name__}: {e} (details in the log above; fix and "
                       "rerun, or retry the flow run: see README 'Rerun failed steps')") from None
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(_main))
