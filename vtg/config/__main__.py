"""`python -m vtg.config [--experiment NAME] [key=value ...]`: print the resolved config and its hash.

`python -m vtg.config --write-params [PATH]` writes params.yaml (default: `params.yaml`) from the config classes:
their defaults are the values and their docstrings the comments (see `vtg.config.render`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.config import config_hash, dump_yaml
from vtg.config.render import render_params
from vtg.errors import VTGError


def _main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser("Print the resolved pipeline configuration (params.yaml + experiment + overrides).")
    parser.add_argument("--write-params", nargs="?", const="params.yaml", default=None, metavar="PATH",
                        help="write params.yaml (or PATH) from the config classes' defaults and docstrings, "
                        "then exit (no other arguments)")
    args = parser.parse_args(argv)
    if args.write_params is not None:
        if args.experiment or args.overrides or args.dry_run:
            raise VTGError("--write-params renders the class defaults; it takes no experiment, overrides or "
                           "--dry-run (put a changed default in vtg/config/*.py)")
        path = Path(args.write_params)
        try:
            path.write_text(render_params())
        except OSError as e:
            raise VTGError(f"cannot write {path}: {e.strerror or e}") from None
        print(f"wrote {path}")
        return 0
    cfg = resolve_config(args)
    print(dump_yaml(cfg), end="")
    print(f"# config hash: {config_hash(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(_main))
