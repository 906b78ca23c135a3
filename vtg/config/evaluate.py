"""`evaluate`: per-checkpoint evaluation (mIoU, R@1 at IoU 0.3/0.5/0.7, blind baselines, report)."""

from typing import Literal

from pydantic import Field

from vtg.config._base import Section


class EvaluateConfig(Section):
    split: Literal["val", "test"] = "val"
    """Split evaluated per checkpoint."""
    out_dir: str = "reports/eval"
    """metrics.json, predictions.jsonl and report.html."""
    batch_size: int = Field(16, ge=1)
    """Generation batch size."""
    max_new_tokens: int = Field(16, ge=1)
    """Generated tokens per answer."""
    select_metric: str = "r1@0.7"
    """Metric that picks the best checkpoint."""
