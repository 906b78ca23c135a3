"""The select stage (`python -m evaluation.select`): which SFT checkpoint RL starts from, chosen on the evaluation
side and handed to RL as a file.

Every complete SFT checkpoint under `train.out_dir` is evaluated on val as the evaluate stage evaluates it
(`evaluation.api.evaluate_checkpoint`: results stored while training ran are reused, and the evaluate stage
reuses these), ranked by `evaluate.select_metric` among those that keep `evaluate.forgetting.min_for_selection`
of the base's general-task accuracy (`vtg.selection.pick_best`), and the winner is written to
`<evaluate.select_dir>/start.json` (`vtg.selection.START_POINTER`: only the choice) with every candidate's score in
`candidates.json`. dvc.yaml declares the evaluation settings as this stage's params and `start.json` as a dep of
the rl stage, so changing the selection metric reruns this stage, and RL reruns only when the choice changes.
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
from vtg.io import relative_ref, write_json_atomic
from vtg.selection import (
    CANDIDATES,
    SELECTION_SPLIT,
    checkpoint_identity,
    checkpoint_label,
    min_retention_of,
    pick_best,
    start_pointer_path,
)

log = logging.getLogger("evaluation.select")


def select_start(cfg: PipelineConfig) -> dict:
    """Evaluate every SFT checkpoint on val, pick the best, write the pointer; returns the candidates file."""
    root = Path(cfg.train.out_dir)
    found = ckpt.list_checkpoints(root)
    if not found:
        raise VTGError(f"{root}: no complete SFT checkpoint to choose RL's start from (run `python -m training` "
                       "first)")
    ev, select = cfg.evaluate, cfg.evaluate.select_metric
    rows, results = [], []
    for c in found:
        res = evaluate_checkpoint(c, SELECTION_SPLIT, cfg, refresh=False)
        results.append(res.result)
        rows.append({"checkpoint": relative_ref(c, ev.select_dir), "step": res.result["step"],
                     select: res.metrics.get(select), "miou": res.metrics.get("miou"),
                     "min_retention": min_retention_of(res.result), "stored": res.reused})
        log.info("RL start candidate %s: %s on %s %.4f, mIoU %.4f%s", c.name, select, SELECTION_SPLIT,
                 res.metrics.get(select, float("nan")), res.metrics["miou"], " (stored)" if res.reused else "")
    best = pick_best(results, select, ev.forgetting.min_for_selection)
    chosen = Path(best["checkpoint"])
    pointer = start_pointer_path(cfg)
    ckpt.write_pointer(pointer, chosen, step=int(best["step"]), identity=checkpoint_identity(chosen))
    out = {"split": SELECTION_SPLIT, "select_metric": select, "min_for_selection": ev.forgetting.min_for_selection,
           "chosen": checkpoint_label(best), "candidates": rows}
    write_json_atomic(pointer.with_name(CANDIDATES), out)
    log.info("RL starts from %s (best of %d SFT checkpoints on %s by %s: %.4f) -> %s", checkpoint_label(best),
             len(found), SELECTION_SPLIT, select, best["summary"]["model"][select], pointer)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m evaluation.select"
    args: argparse.Namespace = parser.parse_args(argv)
    cfg = resolve_config(args, stage="select")
    out = select_start(cfg)
    print(f"RL starts from {out['chosen']} ({start_pointer_path(cfg)})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
