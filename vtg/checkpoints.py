"""Checkpoint directory contract (DESIGN.md §3): self-describing, atomic, resumable. The one home of its layout.

Layout under the checkpoint root (`train.out_dir`, default `checkpoints/`)::

    checkpoints/
      step-000200/
        hf/            save_pretrained export + tokenizer: full weights (safetensors), or the adapter only for
                       LoRA (`adapter_config.json` names the base). This is what evaluation/serving load, via
                       `vtg.model.modeling.load_model_and_tokenizer(export_dir(<ckpt>))`.
        engine/        training state for exact resume: the DeepSpeed engine checkpoint (optimizer, scheduler,
                       step; tag `state`) or, for `strategy: fsdp`, a torch.distributed.checkpoint directory,
                       plus `rank-<r>.pt` per rank (python/numpy/torch RNG, data position, stability-guard state).
        config.json    the resolved PipelineConfig (all sections) used for the run.
        meta.json      written LAST: {step, data_version, git_commit, mlflow_run_id, config_hash, finetune, base,
                       world_size, samples_seen, created_at, metrics}. Its presence marks a complete checkpoint.
      latest           a pointer file (JSON: {"checkpoint": "step-000200", "step": 200}), replaced atomically
                       after each complete checkpoint

Pointers are plain JSON files, never symlinks: DVC's cache, object stores and copies keep them. A pointer names
its target relative to the pointer's own folder, so the best-checkpoint pointer that evaluation keeps in its
own outputs (`<evaluate.out_dir>/best.json`, written with `write_pointer`) survives a clone or a `dvc checkout`.

Writes are atomic: everything goes to `.tmp-step-000200/` first and is renamed into place once complete, then
`latest` moves. Only the last `keep_last` step directories are kept (plus any `protect`ed one, e.g. the best).
A root whose checkpoints belong to another trajectory is moved aside (`move_aside`), never deleted.
`read_checkpoint_meta` refuses a half-written or corrupt directory with a clear `VTGError`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vtg.errors import VTGError

log = logging.getLogger(__name__)

STEP_FORMAT = "step-%06d"
META_FILE = "meta.json"
CONFIG_FILE = "config.json"
HF_DIR = "hf"
ENGINE_DIR = "engine"
LATEST = "latest"
BEST_POINTER = "best.json"
"""File name of the best-checkpoint pointer that evaluation writes into its own output folder."""
SUPERSEDED = "superseded"
REQUIRED_META = ("step", "data_version", "git_commit", "config_hash", "finetune", "base")


def step_dir_name(step: int) -> str:
    return STEP_FORMAT % step


def export_dir(checkpoint: str | Path) -> Path:
    """The Hugging Face export of a checkpoint (what evaluation, serving and the registry load)."""
    return Path(checkpoint) / HF_DIR


def engine_dir(checkpoint: str | Path) -> Path:
    return Path(checkpoint) / ENGINE_DIR


def rank_state_file(checkpoint: str | Path, rank: int) -> Path:
    """Per-rank run state (RNG, data position, guard) next to the engine state."""
    return engine_dir(checkpoint) / f"rank-{rank}.pt"


def temp_dir_for(root: str | Path, step: int) -> Path:
    """Deterministic temp path (every rank must agree on it)."""
    return Path(root) / f".tmp-{step_dir_name(step)}"


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_config(checkpoint: str | Path) -> dict | None:
    """The resolved config a checkpoint was trained with (its config.json), or None when absent/unreadable."""
    path = Path(checkpoint) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


# ---- pointers ------------------------------------------------------------------------------------------------
def write_pointer(pointer: str | Path, checkpoint: str | Path, **extra: Any) -> None:
    """Atomically make `pointer` a JSON file naming `checkpoint` (relative to the pointer's folder) + `extra`."""
    pointer, checkpoint = Path(pointer), Path(checkpoint)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(checkpoint.resolve(), pointer.parent.resolve())
    if pointer.is_symlink():  # an older layout's symlink pointer: replace the link, not its target
        pointer.unlink()
    write_json_atomic(pointer, {"checkpoint": Path(rel).as_posix(), **extra})


def read_pointer(pointer: str | Path) -> dict | None:
    """The pointer's JSON (with `path`, the resolved target) or None if there is no pointer there.

    Also reads the older forms: a symlink, or a text file holding a step dir name."""
    p = Path(pointer)
    if p.is_symlink():
        return {"checkpoint": os.readlink(p), "path": p.resolve()}
    if not p.is_file():
        return None
    text = p.read_text().strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = {"checkpoint": text}
    if not isinstance(data, dict) or not data.get("checkpoint"):
        raise VTGError(f"{p}: not a checkpoint pointer (expected JSON with a 'checkpoint' key)")
    return {**data, "path": (p.parent / data["checkpoint"]).resolve()}


def resolve_pointer(root: str | Path, name: str) -> Path | None:
    info = read_pointer(Path(root) / name)
    return info["path"] if info else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir from a step dir, a pointer file (`latest`, `best.json`), or a root (-> its latest)."""
    p = Path(path)
    if p.is_dir() and not p.is_symlink() and not (p / META_FILE).exists() and (p / LATEST).exists():
        p = p / LATEST
    info = read_pointer(p) if (p.is_file() or p.is_symlink()) else None
    return info["path"] if info else p.resolve()


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
    hf = export_dir(ckpt)
    if not hf.is_dir() or not any(hf.iterdir()):
        raise VTGError(f"{ckpt}: checkpoint has no {HF_DIR}/ export (corrupt or half-written)")
    return meta


# ---- writing and retention -----------------------------------------------------------------------------------
def finalize(root: str | Path, step: int, meta: dict, config: dict, keep_last: int,
             protect: Iterable[Path] = ()) -> Path:
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
    if final.exists():  # a re-run of the same step of the same trajectory (after resuming from an earlier one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_pointer(root / LATEST, final, step=step)
    prune(root, keep_last, protect)
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


def prune(root: str | Path, keep_last: int, protect: Iterable[Path] = ()) -> list[Path]:
    """Delete all but the newest `keep_last` complete step dirs (never a `protect`ed one: the best, one whose
    evaluation is pending; the trainer computes that set); return deleted."""
    root = Path(root)
    protected = {Path(p).resolve() for p in protect}
    doomed = [p for p in list_checkpoints(root)[:-keep_last] if p.resolve() not in protected]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):  # leftovers of a crashed save
        shutil.rmtree(stale, ignore_errors=True)
    return doomed


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root` (by the `latest` pointer, else by name), or None."""
    target = resolve_pointer(root, LATEST)
    if target is not None and is_complete(target):
        return target
    complete = list_checkpoints(root)
    return complete[-1] if complete else None


def has_checkpoints(root: str | Path) -> bool:
    root = Path(root)
    return root.is_dir() and any(root.glob("step-*"))


def move_aside(root: str | Path, reason: str) -> Path:
    """Rename a checkpoint root that must not be resumed to `<root>-superseded-<UTC time>` (nothing is deleted)."""
    root = Path(root)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = root.with_name(f"{root.name}-{SUPERSEDED}-{stamp}")
    n = 1
    while dest.exists():
        dest = root.with_name(f"{root.name}-{SUPERSEDED}-{stamp}-{n}")
        n += 1
    os.replace(root, dest)
    log.warning("moved the checkpoints in %s aside to %s: %s (nothing deleted; remove it yourself when done)",
                root, dest, reason)
    return dest
