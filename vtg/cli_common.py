"""Arguments every stage CLI shares: `--params`, `--experiment`, `--dry-run`, and `key=value` overrides.

Stage CLIs (`python -m beam_jobs.preprocess`, `python -m training`, ...) build their parser with
`config_arg_parser`, call `resolve_config`, and wrap `main` with `run_cli` so a user error prints one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from vtg.config import PipelineConfig, config_hash, dump_yaml, load_config
from vtg.errors import VTGError, describe_os_error
from vtg.net import TIMEOUT_SETTING


def config_arg_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description,
        epilog="Overrides are dotted keys, e.g. train.lr=5e-5 train.model.finetune=lora; they win over the "
        "experiment, which wins over params.yaml. `python -m vtg.config` prints every key.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--params", default="params.yaml", help="base params file (default: %(default)s)")
    parser.add_argument("--experiment", "-e", default=None,
                        help="experiment name in experiments/ (overrides only; may `extends:` another)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    return parser


def resolve_config(args: argparse.Namespace, stage: str | None = None) -> PipelineConfig:
    """The resolved config; for a stage's CLI (`stage`: its name in dvc.yaml) the view of it that stage may read
    (`vtg.stages.stage_view`: a field its record does not declare is an error naming dvc.yaml)."""
    cfg = load_config(args.params, args.experiment, args.overrides)
    declared = None
    if stage is not None:
        from vtg.stages import stage_view

        cfg, declared = stage_view(stage, cfg)
    if getattr(args, "dry_run", False):
        print(dump_yaml(cfg), end="")
        print(f"# config hash: {config_hash(cfg)}")
        if declared is not None:
            print(f"# the {stage} stage reads only: {', '.join(declared)} (dvc.yaml), the NOT_OUTPUT fields and "
                  "the tracking section")
        raise SystemExit(0)
    return cfg


def _object_store_error(e: Exception) -> int:
    """The object store did not answer, refused or denied: one line, exit 2."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    print(f"error: object store: {first} (check AWS_ENDPOINT_URL_S3 and the credentials; waits are bounded by "
          f"{TIMEOUT_SETTING})", file=sys.stderr)
    return 2


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a CLI main: every failure the user can act on is one line on stderr, no traceback (docs/faults.md).

    - a `VTGError` (a user error: the message says what to do): exit 2;
    - an `OSError` (disk full, permission denied, a read-only or vanished folder): what failed where, exit 2;
    - an MLflow error (an unreachable tracking server, ...): its first line and the key to check, exit 2;
    - stdout closed by its reader (`| head`): nothing more is written, exit 141 like `cat` or `git`;
    - Ctrl-C: `interrupted`, exit 130.
    Anything else is a bug, and keeps its traceback."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        rc = int(main(argv) or 0)
        sys.stdout.flush()  # inside the try: a reader that closed the pipe is seen here, not at interpreter exit
        return rc
    except VTGError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # Python would flush into the closed pipe again at exit
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as e:
        if type(e).__module__.startswith("botocore"):  # its timeouts are OSErrors too
            return _object_store_error(e)
        print(f"error: {describe_os_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if type(e).__module__.startswith("botocore"):
            return _object_store_error(e)
        if type(e).__name__ != "MlflowException":
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        print(f"error: MLflow: {first} (is the tracking server at tracking.tracking_uri running and reachable? "
              "tracking.enabled=false runs without it)", file=sys.stderr)
        return 2
