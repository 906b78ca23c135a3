"""Tiny stand-in stages that honour the stage contracts (file layout, CLI, checkpoint hook, evaluation API).

They let the orchestration tests exercise the real Prefect / DVC / MLflow wiring in seconds. Each stage appends
its name to `$STANDIN_CALLS` (when set) so tests can count how often a stage really ran.
"""

import json
import os
import sys
import time
from pathlib import Path

from vtg.cli_common import config_arg_parser, resolve_config


def record_call(stage: str) -> None:
    path = os.environ.get("STANDIN_CALLS")
    if path:
        with open(path, "a") as f:
            f.write(f"{stage} {time.time()}\n")


def parse(stage: str, argv=None, extra=None):
    parser = config_arg_parser(f"stand-in {stage} stage")
    for a in extra or []:
        parser.add_argument(a, default=None)
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    record_call(stage)
    return args, resolve_config(args)


def write_json(path, obj) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, sort_keys=True, indent=1))
