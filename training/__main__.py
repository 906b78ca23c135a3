"""`python -m training`: train per params.yaml (+ experiment + overrides); resumes from `latest` by default.

Runs as a single process, or under a launcher (one process per rank):
    deepspeed --num_gpus 2 -m training -e tiny          # GPUs
    torchrun --nproc_per_node 2 -m training             # also on CPU (gloo)
"""

from __future__ import annotations

import json
import sys

from vtg.cli_common import config_arg_parser, resolve_config, run_cli


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.add_argument("--stop-after", type=int, default=None, metavar="N",
                        help="checkpoint and exit after optimizer step N (a later run resumes exactly)")
    parser.add_argument("--summary", default=None, metavar="PATH",
                        help="write a JSON summary (steps, losses, skips, wall time) here on rank 0")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse_hidden())
    args = parser.parse_args(argv)
    cfg = resolve_config(args)
    from training.loop import train

    summary = train(cfg, stop_after=args.stop_after)
    import torch.distributed as dist

    if args.summary and (not dist.is_initialized() or dist.get_rank() == 0):
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS  # the deepspeed launcher passes --local_rank


if __name__ == "__main__":
    sys.exit(run_cli(main))
