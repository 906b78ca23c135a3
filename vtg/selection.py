"""The best-checkpoint rule: which split selects, and how results rank. The one home of `pick_best`.

The evaluate stage (`evaluation.registry.select_best`: pointer and registry alias) and RL (picking its start
checkpoint among the SFT ones) both rank with it. A result is evaluation's result dict (or the same shape):
{"checkpoint", "step", "stage", "summary": {"model": {<metrics>}}}.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

SELECTION_SPLIT = "val"
HELDOUT_SPLIT = "test"
STAGES = ("sft", "rl")
"""Training stages in the order they run: checkpoints of a later stage come after all of an earlier one's."""
DEFAULT_STAGE = "sft"
"""The stage of a checkpoint whose meta.json names none (SFT checkpoints; every one written before RL existed)."""


def checkpoint_stage(result: dict) -> str:
    """`sft` or `rl` (meta.json's `stage`), for a result or a checkpoint meta; results stored before stages
    existed are SFT."""
    return str(result.get("stage") or DEFAULT_STAGE)


def checkpoint_label(result: dict) -> str:
    """`sft/step-000100` or `rl/step-000100`: tells apart checkpoints of two stages with the same step."""
    return f"{checkpoint_stage(result)}/{Path(result['checkpoint']).name}"


def order_key(result: dict) -> tuple[int, int]:
    """(stage rank, step): an RL step number is never compared with an SFT one as if they were one sequence."""
    stage = checkpoint_stage(result)
    return (STAGES.index(stage) if stage in STAGES else len(STAGES), int(result["step"]))


def rank_key(result: dict, select: str) -> tuple[float, float, tuple[int, int]]:
    m = result["summary"]["model"]
    return (m[select], m["miou"], order_key(result))


def pick_best(results: Sequence[dict], select: str) -> dict | None:
    return max(results, key=lambda r: rank_key(r, select)) if results else None
