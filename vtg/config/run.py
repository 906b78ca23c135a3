"""`RunControl`: the run-control fields every training stage has (SFT's `train`, GRPO's `rl`), declared once.

What they mean is the same in both stages and is applied by one module, `training.lifecycle` (checkpoints,
resume, retention, the lock); each stage's section sets its own defaults for the root and the run length.
"""

from pydantic import Field, model_validator

from vtg.config._base import NOT_OUTPUT, RUN_LENGTH, Section


class RunControl(Section):
    seed: int = 42
    """Seeds python, numpy and torch on every rank (RL: also the query order and sampling)."""
    out_dir: str = Field("checkpoints/run", json_schema_extra=NOT_OUTPUT)
    """Checkpoint root: `step-%06d/` and `latest`."""
    max_steps: int = Field(1, ge=1, json_schema_extra=RUN_LENGTH)
    """Optimizer steps (RL: policy updates, one rollout each)."""
    save_every: int = Field(100, ge=1, json_schema_extra=RUN_LENGTH)
    """Checkpoint every N steps (and at the end)."""
    keep_last: int = Field(3, ge=1, json_schema_extra=RUN_LENGTH)
    """Keep the last K step checkpoints (plus the best, those awaiting evaluation and the parents of RL
    checkpoints)."""
    resume: str = Field("auto", json_schema_extra=NOT_OUTPUT)
    """`auto`: continue from `<out_dir>/latest` of the same run (other settings or data: moved aside); `never`:
    start fresh (the old root moved aside); or a checkpoint path (it must verify and match)."""
    log_every: int = Field(10, ge=1, json_schema_extra=NOT_OUTPUT)
    """Metrics are logged every N steps."""
    checkpoint_hooks: list[str] = Field(default_factory=list, json_schema_extra=NOT_OUTPUT)
    """`module:function` paths called as fn(checkpoint_dir, step) on rank 0 after each complete checkpoint."""
    progress: bool = Field(True, json_schema_extra=NOT_OUTPUT)
    """Console progress bar on rank 0."""

    @model_validator(mode="after")
    def _check_hooks(self):
        for hook in self.checkpoint_hooks:
            if ":" not in hook:
                raise ValueError(f"checkpoint hook {hook!r} must look like package.module:function")
        return self
