"""`python -m training`: train per params.yaml (+ experiment + overrides); resumes from `latest` by default.

Runs as a single process, or under a launcher (one process per rank):
    deepspeed --num_gpus 2 --module training -e tiny    # GPUs
    torchrun --nproc_per_node 2 -m training             # also on CPU (gloo)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vtg.cli_common import config_arg_parser, resolve_config, run_cli


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m training"
    parser.add_argument("--stop-after", type=int, default=None, metavar="N",
                        help="checkpoint and exit after optimizer step N (a later run resumes exactly)")
    parser.add_argument("--summary", default=None, metavar="PATH",
                        help="on rank 0, write scalar metrics (final loss, steps/s, tokens/s, data wait, skips, wall "
                             "time; TFLOP/s, MFU, GPU utilisation and memory when measured) as JSON here and the "
                             "per-step losses as CSV beside it (<name>_loss.csv), e.g. for DVC")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher
    args = parser.parse_args(argv)
    cfg = resolve_config(args, stage="train")
    from training.loop import train

    summary = train(cfg, stop_after=args.stop_after)
    import torch.distributed as dist

    if args.summary and (not dist.is_initialized() or dist.get_rank() == 0):
        write_summary(summary, Path(args.summary))
    return 0


def write_summary(summary: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    losses = summary.pop("losses", [])
    path.write_text(json.dumps(summary, indent=1) + "\n")
    first = summary["step"] - len(losses) + 1
    rows = "".join(f"{first + i},{loss!r}\n" for i, loss in enumerate(losses))
    path.with_name(f"{path.stem}_loss.csv").write_text("step,loss\n" + rows)


if __name__ == "__main__":
    sys.exit(run_cli(main))
