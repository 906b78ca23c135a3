"""`python -m vtg.config [--experiment NAME] [key=value ...]`: print the resolved config and its hash."""

from __future__ import annotations

import sys

from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.config import config_hash, dump_yaml


def _main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser("Print the resolved pipeline configuration (params.yaml + experiment + overrides).")
    args = parser.parse_args(argv)
    cfg = resolve_config(args)
    print(dump_yaml(cfg), end="")
    print(f"# config hash: {config_hash(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(_main))
