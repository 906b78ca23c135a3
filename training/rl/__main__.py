"""`python -m training.rl`: GRPO after SFT, per params.yaml's `rl` section (+ experiment + overrides).

Starts from `rl.init` (default: the SFT checkpoint best on val), samples `rl.group_size` answers per train query,
rewards each with the temporal IoU of its span, and updates the policy on group-normalised advantages; writes
checkpoints to `rl.out_dir` (same contract as SFT; evaluation picks the best of SFT and RL on val) and per-step
metrics to `<rl.report_dir>/steps.csv`. Resumes from `<rl.out_dir>/latest` by default, exactly.

Runs as a single process or under a launcher (one process per rank), like `python -m training`:
    torchrun --nproc_per_node 2 -m training.rl rl.num_gpus=2 rl.resume=never     # CPU, gloo
    deepspeed --num_gpus 4 --module training.rl -e qwen2.5-vl-7b rl.num_gpus=4   # GPUs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.stages import stage_outputs


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m training.rl"
    parser.add_argument("--stop-after", type=int, default=None, metavar="N",
                        help="checkpoint and exit after RL step N (a later run resumes exactly)")
    parser.add_argument("--summary", default=None, metavar="PATH",
                        help="on rank 0, also write the run summary and the per-step metrics (\"history\") as JSON here")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher
    args = parser.parse_args(argv)
    cfg = resolve_config(args, stage="rl")
    cfg = cfg.model_copy(update={"rl": stage_outputs("rl", cfg)})  # a side run's reports go beside its checkpoints
    from training.rl.loop import run_rl

    summary = run_rl(cfg, stop_after=args.stop_after)
    import torch.distributed as dist

    if args.summary and (not dist.is_initialized() or dist.get_rank() == 0):
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
