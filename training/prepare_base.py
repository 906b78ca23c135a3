"""`python -m training.prepare_base`: build what the train stage's base needs before the train stage runs.

A tiny base (`train.model.base: tiny`) is taught its general suite first (`vtg.model.teach`: ~2 min on two CPU
cores for the embedded default) and the suite's clips are decoded (`vtg.general_tasks.suite_frames`); both land in
caches the train stage then finds (`vtg/.cache/`). The flow starts this in the background as soon as the corpus
exists, so the teaching runs while ingest, annotate and preprocess do (one core of two is idle in them), not
after them. It reads the train stage's view of the config (dvc.yaml), builds exactly what the train stage would
build (the same keys), and does nothing for a base that needs no teaching. `dvc repro` does not run it: its train
stage teaches, as it always did.

    python -m training.prepare_base --params params.yaml [-e EXP] [key=value ...]
"""

from __future__ import annotations

import logging
import sys
import time

from vtg.cli_common import config_arg_parser, resolve_config, run_cli

log = logging.getLogger("training.prepare_base")


def prepare_base(cfg) -> str:
    """The train stage's base, resolved and (a tiny base) taught; returns its path."""
    from vtg.model.modeling import resolve_base
    from vtg.model.teach import teach_if_tiny

    name = cfg.train.model.base
    return teach_if_tiny(cfg, name, resolve_base(name, seed=0))


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__).parse_args(argv)
    cfg = resolve_config(args, stage="train")
    t0 = time.perf_counter()
    path = prepare_base(cfg)
    log.info("base ready in %.0f s: %s", time.perf_counter() - t0, path)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
