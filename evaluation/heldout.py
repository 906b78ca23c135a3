"""`python -m evaluation.heldout --which {start,latest-rl}`: evaluate on the held-out split, ahead of the evaluate stage, a
checkpoint it will (or most likely will) need there, and store the result (nothing else is written).

The evaluate stage compares RL with its start on test and scores the best checkpoint on test; both go through
`evaluation.api.evaluate_checkpoint`, which finds a stored result under the same content key (checkpoint, split,
settings, data) instead of evaluating again. So the flow runs this in the background on the core the per-checkpoint
evaluator leaves free:

- `start`: RL's start (`<evaluate.select_dir>/start.json`, the select stage's choice), while RL starts up;
- `latest-rl`: the newest RL checkpoint, once RL is done, beside the evaluator's val evaluation of it. It is the
  best on val more often than not (RL's lr is constant); when another one is, this result is simply never read:
  the choice is made on val only, and a test result decides nothing.

It reads the evaluate stage's view of the config (dvc.yaml), so the key is the one that stage computes.

    python -m evaluation.heldout --which start --params params.yaml [-e EXP] [key=value ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from evaluation.api import evaluate_checkpoint
from vtg import checkpoints as ckpt
from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.selection import HELDOUT_SPLIT, start_pointer_path

log = logging.getLogger("evaluation.heldout")
WHICH = ("start", "latest-rl")


def heldout_checkpoint(cfg: PipelineConfig, which: str) -> Path:
    """The checkpoint `which` names: RL's chosen start, or the newest complete RL checkpoint."""
    if which == "start":
        pointer = start_pointer_path(cfg)
        start = ckpt.read_pointer(pointer)
        if not start:
            raise VTGError(f"{pointer}: no RL start chosen yet (run `python -m evaluation.select` first)")
        return Path(start["path"])
    latest = ckpt.latest_checkpoint(cfg.rl.out_dir)
    if latest is None:
        raise VTGError(f"{cfg.rl.out_dir}: no complete RL checkpoint yet (run `python -m training.rl` first)")
    return latest


def heldout(cfg: PipelineConfig, which: str) -> Path:
    """Evaluate `which` on the held-out split (stored, reused by the evaluate stage); returns the stored entry."""
    chosen = heldout_checkpoint(cfg, which)
    res = evaluate_checkpoint(chosen, HELDOUT_SPLIT, cfg, refresh=False)
    log.info("%s %s on %s: %s%s", which, chosen.name, HELDOUT_SPLIT, res.entry_dir,
             " (stored already)" if res.reused else "")
    return res.entry_dir


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m evaluation.heldout"
    parser.add_argument("--which", choices=WHICH, required=True,
                        help="RL's chosen start, or the newest RL checkpoint")
    args: argparse.Namespace = parser.parse_args(argv)
    cfg = resolve_config(args, stage="evaluate")
    print(f"{args.which} on {HELDOUT_SPLIT}: {heldout(cfg, args.which)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
