"""`python -m training.rl`: GRPO after SFT, per params.yaml's `rl` section (+ experiment + overrides).

Starts from `rl.init` (default: the SFT checkpoint best on val), samples `rl.group_size` answers per train query,
rewards each with the temporal IoU of its span, and updates the policy on group-normalised advantages; writes
checkpoints to `rl.out_dir` (same contract as SFT; evaluation picks the best of SFT and RL on val) and per-step
metrics to `<rl.report_dir>/steps.csv`. Resumes from `<rl.out_dir>/latest` by default, exactly.

Runs as a single process or under a launcher (one process per rank), like `python -m training`:
    torchrun --nproc_per_node 2 -m training.rl rl.num_gpus=2 rl.resume=never     # CPU, gloo
    deepspeed --num_gpus 4 --module training.rl -e qwen2.5-vl-7b rl.num_gpus=4   # GPUs

--summary PATH writes the run summary and the per-step metrics ("history") as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vtg.cli_common import run_cli
from vtg.config import PipelineConfig
from vtg.stages import stage_outputs


def main(argv: list[str] | None = None) -> int:
    from training.rl.grpo import run_rl
    from training.trainer import stage_main

    return stage_main(__doc__, "python -m training.rl", "rl", run_rl, write_summary, argv, prepare=side_outputs)


def side_outputs(cfg: PipelineConfig) -> PipelineConfig:
    """A side run's reports go beside its checkpoints (`vtg.stages.stage_outputs`)."""
    return cfg.model_copy(update={"rl": stage_outputs("rl", cfg)})


def write_summary(summary: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(run_cli(main))
