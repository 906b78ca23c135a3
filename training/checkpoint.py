"""Checkpoint directory contract (DESIGN.md §3): self-describing, atomic, resumable.

Layout under the checkpoint root (`train.out_dir`, default `checkpoints/`)::

    checkpoints/
      step-000200/
        hf/            save_pretrained export + tokenizer: full weights (safetensors), or the adapter only for
                       LoRA (`adapter_config.json` names the base). This is what evaluation/serving load, via
                       `training.modeling.load_model_and_tokenizer(<ckpt>/hf)`.
        engine/        training state for exact resume: the DeepSpeed engine checkpoint (optimizer, scheduler,
                       step; tag `state`) or, for `strategy: fsdp`, a torch.distributed.checkpoint directory,
                       plus `rank-<r>.pt` per rank (python/numpy/torch RNG, data position, stability-guard state).
        config.json    the resolved PipelineConfig (all sections) used for the run.
        meta.json      written LAST: {step, data_version, git_commit, mlflow_run_id, config_hash, finetune, base,
                       world_size, samples_seen, created_at, metrics}. Its presence marks a complete checkpoint.
      latest -> step-000200   relative symlink, moved atomically after each complete checkpoint
      best   -> step-000150   relative symlink set by `update_best` when evaluation reports a metric
      best.json               {step, metric, value, mode} of the current best

Writes are atomic: everything goes to `.tmp-step-000200/` first and is renamed into place once complete, then
`latest` moves. Only the last `keep_last` step directories are kept (the `best` target is never pruned).
`read_checkpoint_meta` refuses a half-written or corrupt directory with a clear `VTGError`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from vtg.errors import VTGError

STEP_FORMAT = "step-%06d"
META_FILE = "meta.json"
CONFIG_FILE = "config.json"
HF_DIR = "hf"
ENGINE_DIR = "engine"
REQUIRED_META = ("step", "data_version", "git_commit", "config_hash", "finetune", "base")


def step_dir_name(step: int) -> str:
    return STEP_FORMAT % step


def temp_dir_for(root: str | Path, step: int) -> Path:
    """Deterministic temp path (every rank must agree on it)."""
    return Path(root) / f".tmp-{step_dir_name(step)}"


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def point(root: str | Path, name: str, target: str) -> None:
    """Atomically make `root/name` a relative symlink to `target` (a step dir name)."""
    root = Path(root)
    tmp = root / f".{name}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, root / name)


def finalize(root: str | Path, step: int, meta: dict, config: dict, keep_last: int) -> Path:
    """Rank 0, after every rank has written its part into the temp dir: meta last, rename, move `latest`, prune."""
    root = Path(root)
    tmp = temp_dir_for(root, step)
    write_json_atomic(tmp / CONFIG_FILE, config)
    meta = {**meta, "step": step, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"checkpoint meta lacks {missing}")
    write_json_atomic(tmp / META_FILE, meta)
    final = root / step_dir_name(step)
    if final.exists():  # a re-run of the same step (e.g. after resuming from an earlier one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    point(root, "latest", final.name)
    prune(root, keep_last)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete step directories, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.glob("step-*") if not p.is_symlink() and is_complete(p)), key=lambda p: p.name)


def is_complete(path: str | Path) -> bool:
    try:
        read_checkpoint_meta(path)
    except VTGError:
        return False
    return True


def prune(root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete step dirs, never the `best` target; return deleted."""
    root = Path(root)
    protected = {resolve_pointer(root, "best")} - {None}
    doomed = [p for p in list_checkpoints(root)[:-keep_last] if p.resolve() not in protected]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):  # leftovers of a crashed save
        shutil.rmtree(stale, ignore_errors=True)
    return doomed


def resolve_pointer(root: str | Path, name: str) -> Path | None:
    p = Path(root) / name
    if not p.exists():
        return None
    if p.is_file():  # a text pointer (e.g. synced through an object store without symlinks)
        p = Path(root) / p.read_text().strip()
    return p.resolve()


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir from a step dir, a `latest`/`best` pointer, or a checkpoint root (-> its latest)."""
    p = Path(path)
    if p.is_dir() and not (p / META_FILE).exists() and (p / "latest").exists():
        p = p / "latest"
    if p.is_file() and not p.is_dir():
        p = p.parent / p.read_text().strip()
    return p.resolve()


def read_checkpoint_meta(path: str | Path) -> dict:
    """meta.json of a complete checkpoint; a missing, half-written or corrupt one is a clear VTGError."""
    ckpt = resolve_checkpoint(path)
    if not ckpt.is_dir():
        raise VTGError(f"{path}: no checkpoint directory there")
    meta_path = ckpt / META_FILE
    if not meta_path.is_file():
        raise VTGError(f"{ckpt}: incomplete checkpoint (no {META_FILE}: the save was interrupted); "
                       "delete it or point at another step")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VTGError(f"{meta_path}: corrupt checkpoint metadata ({e})") from None
    if not isinstance(meta, dict) or (missing := [k for k in REQUIRED_META if k not in meta]):
        raise VTGError(f"{meta_path}: checkpoint metadata lacks {missing if isinstance(meta, dict) else 'all keys'}")
    if not (ckpt / HF_DIR).is_dir() or not any((ckpt / HF_DIR).iterdir()):
        raise VTGError(f"{ckpt}: checkpoint has no {HF_DIR}/ export (corrupt or half-written)")
    return meta


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root` (by the `latest` pointer, else by name), or None."""
    target = resolve_pointer(root, "latest")
    if target is not None and is_complete(target):
        return target
    complete = list_checkpoints(root)
    return complete[-1] if complete else None


def update_best(root: str | Path, checkpoint: str | Path, metric: str, value: float,
                mode: str = "max", force: bool = False) -> bool:
    """Move `best` to `checkpoint` if `value` beats the current best (`mode` max or min). Returns True if moved.

    Called by whoever evaluates a checkpoint (the evaluation stage or the orchestrator), not by the loop.
    `force` moves it regardless: for a caller that already ranked every checkpoint (with tie-breaks).
    """
    root = Path(root)
    ckpt = resolve_checkpoint(checkpoint)
    read_checkpoint_meta(ckpt)
    best_file = root / "best.json"
    current = json.loads(best_file.read_text()) if best_file.is_file() else None
    if not force and current is not None and current.get("metric") == metric:
        better = value > current["value"] if mode == "max" else value < current["value"]
        if not better:
            return False
    point(root, "best", ckpt.name)
    write_json_atomic(best_file, {"step": int(ckpt.name.split("-")[-1]), "checkpoint": ckpt.name,
                                  "metric": metric, "value": value, "mode": mode})
    return True
