"""`python -m training`: train per params.yaml (+ experiment + overrides); resumes from `latest` by default.

Runs as a single process, or under a launcher (one process per rank):
    deepspeed --num_gpus 2 --module training -e tiny    # GPUs
    torchrun --nproc_per_node 2 -m training             # also on CPU (gloo)

--summary PATH writes scalar metrics (final loss, steps/s, tokens/s, data wait, skips, wall time; TFLOP/s, MFU, GPU
utilisation and memory when measured) as JSON and the per-step losses as CSV beside it (<name>_loss.csv), e.g. for
DVC.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vtg.cli_common import run_cli


def main(argv: list[str] | None = None) -> int:
    from training.sft import train
    from training.trainer import stage_main

    return stage_main(__doc__, "python -m training", "train", train, write_summary, argv)


def write_summary(summary: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    losses = summary.pop("losses", [])
    path.write_text(json.dumps(summary, indent=1) + "\n")
    first = summary["step"] - len(losses) + 1
    rows = "".join(f"{first + i},{loss!r}\n" for i, loss in enumerate(losses))
    path.with_name(f"{path.stem}_loss.csv").write_text("step,loss\n" + rows)


if __name__ == "__main__":
    sys.exit(run_cli(main))
