"""The checkpoint-evaluation queue: the one home of its file names, line format, match key and "pending" rule.

While a flow run evaluates checkpoints as they are saved, two append-only JSON-lines files live in
`<orchestration.state_dir>/`:

- the queue, `checkpoint_queue-<flow run id>.jsonl`: the training checkpoint hook (`flows.events`) appends one
  line per complete checkpoint, `{"checkpoint_dir", "step", "saved_at", "parent_run_id", "flow_run_id"}`; the
  orchestrator appends `{"done": true}` once no training stage will add more (the evaluator stops there). The
  training stages learn its path from the environment (`vtg.lineage.ENV_CHECKPOINT_QUEUE`).
- the results index, `checkpoint_evals.jsonl`: one line per finished evaluation (`flows.evaluation`), holding at
  least `checkpoint_dir` and `saved_at` of the queue line it answers.

A queue line and a result line match when their `match_key`s are equal (resolved directory, save time to the
millisecond: a checkpoint directory rewritten by a resumed run is a new checkpoint). A checkpoint is *pending*
while it is in the queue without a matching result; retention keeps pending checkpoints.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vtg import lineage

RESULTS_FILE = "checkpoint_evals.jsonl"
QUEUE_PREFIX = "checkpoint_queue-"
DONE = "done"
"""Key of the closing line (`{"done": true}`)."""


def queue_path(state_dir: str | Path, flow_run_id: str) -> Path:
    """The queue file of one flow run."""
    return Path(state_dir) / f"{QUEUE_PREFIX}{flow_run_id}.jsonl"


def results_path(state_dir: str | Path) -> Path:
    """The results index every per-checkpoint evaluation appends to."""
    return Path(state_dir) / RESULTS_FILE


def append(path: str | Path, item: dict[str, Any]) -> None:
    """One line per write, flushed and fsync'd, so a follower never sees half a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(item) + "\n")
        f.flush()
        os.fsync(f.fileno())


def close(path: str | Path) -> None:
    """No more checkpoints will be queued: the evaluator that follows `path` finishes."""
    append(path, {DONE: True})


def is_done(item: dict[str, Any]) -> bool:
    return bool(item.get(DONE))


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every complete JSON object line of `path` (a line being appended right now is left out); [] if absent."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def queued(path: str | Path) -> list[dict[str, Any]]:
    """The checkpoint lines of a queue (the closing line left out)."""
    return [item for item in read(path) if not is_done(item) and item.get("checkpoint_dir")]


def is_closed(path: str | Path) -> bool:
    return any(is_done(item) for item in read(path))


def match_key(item: dict[str, Any]) -> tuple[str, float]:
    """What ties a result line to the queue line it answers: resolved directory and save time (ms)."""
    return str(Path(item["checkpoint_dir"]).resolve()), round(float(item.get("saved_at") or 0), 3)


def evaluated(queue: str | Path, results: str | Path) -> list[dict[str, Any]]:
    """The result lines that answer a checkpoint of `queue` (the newest line per checkpoint), by step."""
    want = {match_key(item) for item in queued(queue)}
    seen: dict[tuple[str, float], dict[str, Any]] = {}
    for r in read(results):
        if r.get("checkpoint_dir") and match_key(r) in want:
            seen[match_key(r)] = r
    return sorted(seen.values(), key=lambda r: int(r.get("step") or 0))


def pending(queue: str | Path, results: str | Path) -> list[Path]:
    """Checkpoint directories in `queue` with no matching line in `results` yet (sorted, unique)."""
    done = {match_key(r) for r in read(results) if r.get("checkpoint_dir")}
    return sorted({Path(match_key(item)[0]) for item in queued(queue) if match_key(item) not in done})


def pending_from_env(state_dir: str | Path) -> list[Path]:
    """For a training stage: the pending checkpoints of the queue its orchestrator names in the environment
    (`vtg.lineage.ENV_CHECKPOINT_QUEUE`); [] outside an orchestrated run."""
    queue = os.environ.get(lineage.ENV_CHECKPOINT_QUEUE)
    return pending(queue, results_path(state_dir)) if queue else []


def follow(queue: str | Path, poll_s: float = 0.5, alive=None) -> Iterator[dict[str, Any]]:
    """Yield the checkpoint lines of a growing queue until its closing line, or until `alive()` says False (the
    process that would close it is gone)."""
    import time

    queue, pos = Path(queue), 0
    while alive is None or alive():
        if queue.exists():
            with queue.open() as f:
                f.seek(pos)
                while line := f.readline():
                    if not line.endswith("\n"):
                        break
                    pos = f.tell()
                    item = json.loads(line)
                    if is_done(item):
                        return
                    yield item
        time.sleep(poll_s)
