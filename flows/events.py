"""The checkpoint hook training calls after each complete checkpoint: `flows.events:on_checkpoint_saved`.

It reports the checkpoint two ways, chosen by the orchestrator through the environment of the training process:
- `VTG_CHECKPOINT_QUEUE=<file>`: append one line to that queue (`vtg.eval_queue`); the embedded evaluator process
  follows it, and retention keeps every checkpoint listed there until its evaluation is recorded
  (`vtg.eval_queue.pending`).
  The orchestrator sets it only while per-checkpoint evaluation runs (embedded or events).
- `VTG_CHECKPOINT_EVENTS=1` (with `PREFECT_API_URL` set): emit a Prefect `checkpoint.saved` event, whose
  deployment trigger starts an `evaluate-checkpoint` run with `checkpoint_dir` and `step` from the event.
Training itself never imports Prefect; outside an orchestrated run the hook does nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from vtg import eval_queue, lineage


def checkpoint_payload(checkpoint_dir: str, step: int) -> dict[str, Any]:
    return {
        "checkpoint_dir": str(Path(checkpoint_dir).resolve()),
        "step": int(step),
        "saved_at": time.time(),
        "parent_run_id": os.environ.get(lineage.ENV_PARENT_RUN_ID, ""),
        "flow_run_id": os.environ.get(lineage.ENV_PREFECT_FLOW_RUN_ID, ""),
    }


def emit_checkpoint_event(payload: dict[str, Any]) -> None:
    from prefect.events import emit_event

    emit_event(
        event=lineage.CHECKPOINT_EVENT,
        resource={"prefect.resource.id": f"vtg.checkpoint.{payload['checkpoint_dir']}",
                  "prefect.resource.name": Path(payload["checkpoint_dir"]).name},
        payload=payload,
    )


def on_checkpoint_saved(checkpoint_dir: str, step: int) -> None:
    """Training's checkpoint hook (rank 0, after the checkpoint directory is complete)."""
    payload = checkpoint_payload(checkpoint_dir, step)
    queue = os.environ.get(lineage.ENV_CHECKPOINT_QUEUE)
    if queue:
        eval_queue.append(queue, payload)
    if os.environ.get(lineage.ENV_CHECKPOINT_EVENTS) == "1" and os.environ.get("PREFECT_API_URL"):
        emit_checkpoint_event(payload)
