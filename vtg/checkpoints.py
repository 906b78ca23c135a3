"""Checkpoint directory contract (docs/architecture.md): self-describing, atomic, resumable. The one home of its layout.

Layout under a checkpoint root (`train.out_dir`, default `checkpoints/sft/`; RL's `rl.out_dir`, default
`checkpoints/rl/`, is the same, its meta.json adding `stage: rl`, `parent_checkpoint`, `parent_step`)::

    checkpoints/sft/
      step-000200/
        hf/            save_pretrained export + tokenizer + preprocessor_config.json (the base's processor facts,
                       `vtg.model.processing.VisionParams.from_model`): full weights (safetensors), or the adapter
                       only for LoRA (`adapter_config.json` names the base). This is what evaluation/serving load, via
                       `vtg.model.modeling.load_model_and_tokenizer(export_dir(<ckpt>))`.
        engine/        training state for exact resume: the DeepSpeed engine checkpoint (optimizer, scheduler,
                       step; tag `state`) or, for `strategy: fsdp`, a torch.distributed.checkpoint directory,
                       plus per rank `rank-<r>.json` (run state, data position, stability-guard state, python and
                       numpy RNG: plain JSON) and `rank-<r>.pt` (torch/CUDA RNG tensors only, read with
                       `torch.load(weights_only=True)`). Nothing of ours is ever unpickled.
        config.json    the resolved PipelineConfig (all sections) used for the run.
        meta.json      written LAST: {step, data_version, git_commit, mlflow_run_id, config_hash, finetune, base,
                       world_size, samples_seen, created_at, metrics, files}. `files` lists every other file of the
                       checkpoint ({path (relative, POSIX), size, sha256}).
      latest           a pointer file (JSON: {"checkpoint": "step-000200", "step": 200}), replaced atomically
                       after each complete checkpoint

Pointers are plain JSON files, never symlinks: DVC's cache, object stores and copies keep them. A pointer names
its target relative to the pointer's own folder, so the best-checkpoint pointer that evaluation keeps in its
own outputs (`<evaluate.out_dir>/best.json`, written with `write_pointer`) survives a clone or a `dvc checkout`.

Writes are atomic: everything goes to `.tmp-step-000200/` first and is renamed into place once complete, then
`latest` moves. Only the last `keep_last` step directories are kept (plus any `protect`ed one, e.g. the best).
A root whose checkpoints belong to another trajectory is moved aside (`move_aside`), never deleted.
`read_checkpoint_meta` refuses a half-written or corrupt directory with a clear `VTGError`.

Complete = meta.json is there and every file it lists is there with its size (the cheap check, used by listing,
retention and evaluation); `verify=True` also compares each sha256 (the full check, run before resuming: DeepSpeed
unpickles its own state files with `weights_only=False`, so a file that is not byte-for-byte what was saved must be
refused before it is opened). A checkpoint written before file lists existed (no `files` in meta.json) is accepted
as unverified with a warning. `latest_checkpoint` skips a newer checkpoint that does not pass, with a warning that
names it and says why, and falls back to the newest one that does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vtg.errors import VTGError
from vtg.io import file_digest, relative_ref, resolve_ref, write_json_atomic  # also `ckpt.write_json_atomic`

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
FILES_KEY = "files"
"""meta.json key of the checkpoint's file list: [{path, size, sha256}] of every file written before meta.json."""


def step_dir_name(step: int) -> str:
    return STEP_FORMAT % step


def export_dir(checkpoint: str | Path) -> Path:
    """The Hugging Face export of a checkpoint (what evaluation, serving and the registry load)."""
    return Path(checkpoint) / HF_DIR


def engine_dir(checkpoint: str | Path) -> Path:
    return Path(checkpoint) / ENGINE_DIR


def rank_state_file(checkpoint: str | Path, rank: int) -> Path:
    """Per-rank run state (data position, guard, python/numpy RNG) as plain JSON, next to the engine state."""
    return engine_dir(checkpoint) / f"rank-{rank}.json"


def rank_rng_file(checkpoint: str | Path, rank: int) -> Path:
    """Per-rank torch/CUDA RNG state: tensors only, loaded with `torch.load(weights_only=True)`."""
    return engine_dir(checkpoint) / f"rank-{rank}.pt"


def temp_dir_for(root: str | Path, step: int) -> Path:
    """Deterministic temp path (every rank must agree on it)."""
    return Path(root) / f".tmp-{step_dir_name(step)}"


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
    rel = relative_ref(checkpoint, pointer.parent)
    if pointer.is_symlink():  # an older layout's symlink pointer: replace the link, not its target
        pointer.unlink()
    write_json_atomic(pointer, {"checkpoint": rel, **extra})


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
    return {**data, "path": resolve_ref(data["checkpoint"], p.parent)}


def parent_ref(step_dir: str | Path, parent: str | Path) -> str:
    """meta.json's `parent_checkpoint` of the checkpoint that will live at `step_dir` (its final name, not the
    temp one): relative to that folder, so a moved or copied project keeps its lineage (`vtg.io.relative_ref`)."""
    return relative_ref(parent, step_dir)


def parent_checkpoint(checkpoint: str | Path, meta: dict | None = None) -> Path | None:
    """The checkpoint an RL checkpoint started from (meta.json `parent_checkpoint`, relative to the checkpoint's
    folder, or absolute as older metas wrote it), or None when it names none."""
    checkpoint = resolve_checkpoint(checkpoint)
    meta = read_checkpoint_meta(checkpoint) if meta is None else meta
    ref = meta.get("parent_checkpoint")
    return resolve_ref(ref, checkpoint) if ref else None


def resolve_pointer(root: str | Path, name: str) -> Path | None:
    info = read_pointer(Path(root) / name)
    return info["path"] if info else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir from a step dir, a pointer file (`latest`, `best.json`), or a root (-> its latest)."""
    p = Path(path)
    root = p if p.is_dir() and not p.is_symlink() and not (p / META_FILE).exists() else \
        p.parent if p.name == LATEST else None
    if root is not None and (root / LATEST).exists():
        # a root, or its `latest` pointer: the newest complete checkpoint, as training resumes it (a pointer that
        # is corrupt or names a missing step falls back on the older ones, with a warning; a root without the
        # pointer stays an error that names its checkpoints, `read_checkpoint_meta`)
        found = latest_checkpoint(root)
        if found is not None:
            return found
        if p == root:
            p = p / LATEST
    info = read_pointer(p) if (p.is_file() or p.is_symlink()) else None
    return info["path"] if info else p.resolve()


def file_list(checkpoint: str | Path) -> list[dict]:
    """{path, size, sha256} of every file under `checkpoint` except meta.json (and its temp file), sorted."""
    checkpoint = Path(checkpoint)
    out = []
    for p in sorted(checkpoint.rglob("*")):
        rel = p.relative_to(checkpoint).as_posix()
        if p.is_dir() or rel in (META_FILE, f".{META_FILE}.tmp"):
            continue
        out.append({"path": rel, "size": p.stat().st_size, "sha256": file_digest(p)})
    return out


def _check_files(ckpt: Path, files: Any, verify: bool) -> None:
    """VTGError naming the first listed file that is missing, or differs in size (or, with `verify`, in sha256)."""
    if not isinstance(files, list):
        raise VTGError(f"{ckpt}: corrupt checkpoint metadata ({FILES_KEY!r} is not a list)")
    for item in files:
        try:
            rel, size, digest = item["path"], int(item["size"]), item["sha256"]
        except (TypeError, KeyError, ValueError):
            raise VTGError(f"{ckpt}: corrupt checkpoint metadata (bad {FILES_KEY!r} entry {item!r})") from None
        p = ckpt / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise VTGError(f"{ckpt}: corrupt checkpoint metadata (file {rel!r} outside the checkpoint)")
        if not p.is_file():
            raise VTGError(f"{ckpt}: corrupt checkpoint (missing file {rel})")
        if (actual := p.stat().st_size) != size:
            raise VTGError(f"{ckpt}: corrupt checkpoint ({rel} has {actual} bytes, {size} were saved: truncated "
                           "or rewritten)")
        if verify and file_digest(p) != digest:
            raise VTGError(f"{ckpt}: corrupt checkpoint ({rel}: sha256 differs from the one saved)")


def _why_no_meta(folder: Path) -> str:
    """What a folder without meta.json is, and what to pass instead: only a step folder is an interrupted save."""
    if folder.name == HF_DIR and (folder.parent / META_FILE).is_file():
        return (f"this is the Hugging Face export inside the checkpoint {folder.parent}: pass that checkpoint "
                "folder instead")
    if re.fullmatch(r"(\.tmp-)?step-\d+", folder.name):
        return (f"incomplete checkpoint (no {META_FILE}: the save was interrupted); move it aside or point at "
                "another step")
    steps = sorted(p.name for p in folder.glob("step-*") if (p / META_FILE).is_file())
    if steps:
        return (f"a checkpoint root without a `{LATEST}` pointer: pass one of its step folders (newest: "
                f"{folder / steps[-1]})")
    return (f"not a checkpoint (no {META_FILE}): pass a step folder (`checkpoints/sft/step-000500`), a pointer "
            f"file (`checkpoints/sft/{LATEST}`, `reports/eval/{BEST_POINTER}`) or a checkpoint root")


def read_checkpoint_meta(path: str | Path, verify: bool = False) -> dict:
    """meta.json of a complete checkpoint; a missing, half-written or corrupt one is a clear VTGError.

    Every file in meta.json's file list must be there with its size; `verify=True` (before resuming) also checks
    each sha256. A checkpoint without a file list (older layout) passes unverified, with a warning under `verify`."""
    ckpt = resolve_checkpoint(path)
    if not ckpt.is_dir():
        raise VTGError(f"{path}: no checkpoint directory there")
    meta_path = ckpt / META_FILE
    if not meta_path.is_file():
        raise VTGError(f"{ckpt}: {_why_no_meta(ckpt)}")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VTGError(f"{meta_path}: corrupt checkpoint metadata ({e})") from None
    if not isinstance(meta, dict) or (missing := [k for k in REQUIRED_META if k not in meta]):
        raise VTGError(f"{meta_path}: checkpoint metadata lacks {missing if isinstance(meta, dict) else 'all keys'}")
    hf = export_dir(ckpt)
    if not hf.is_dir() or not any(hf.iterdir()):
        raise VTGError(f"{ckpt}: checkpoint has no {HF_DIR}/ export (corrupt or half-written)")
    if FILES_KEY in meta:
        _check_files(ckpt, meta[FILES_KEY], verify)
    elif verify:
        log.warning("%s: no file list in %s (saved before checkpoints were verified): using it unverified",
                    ckpt, META_FILE)
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
    meta[FILES_KEY] = file_list(tmp)  # every rank has written its part (the caller's barrier); meta.json last
    write_json_atomic(tmp / META_FILE, meta)
    final = root / step_dir_name(step)
    if final.exists():  # a re-run of the same step of the same trajectory (after resuming from an earlier one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_pointer(root / LATEST, final, step=step)
    prune(root, keep_last, protect)
    return final


def _step_dirs(root: Path) -> list[Path]:
    return sorted((p for p in root.glob("step-*") if not p.is_symlink() and p.is_dir()), key=lambda p: p.name)


def list_checkpoints(root: str | Path, verify: bool = False) -> list[Path]:
    """Complete step directories (all listed files there with their sizes; `verify`: and digests), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return [p for p in _step_dirs(root) if is_complete(p, verify)]


def checkpoint_problem(path: str | Path, verify: bool = False) -> str | None:
    """Why `path` is not a complete checkpoint (the VTGError's message), or None when it is."""
    try:
        read_checkpoint_meta(path, verify)
    except VTGError as e:
        return str(e)
    return None


def is_complete(path: str | Path, verify: bool = False) -> bool:
    return checkpoint_problem(path, verify) is None


def prune(root: str | Path, keep_last: int, protect: Iterable[Path] = ()) -> list[Path]:
    """Delete all but the newest `keep_last` complete step dirs (never a `protect`ed one: the best, one whose
    evaluation is pending; the trainer computes that set); return deleted."""
    root = Path(root)
    protected = {Path(p).resolve() for p in protect}
    complete = list_checkpoints(root)
    doomed = [p for p in complete[:-keep_last] if p.resolve() not in protected]
    kept = [p.name for p in complete[:-keep_last] if p.resolve() in protected]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
        log.info("retention: removed %s (keep_last=%d%s)", p, keep_last,
                 f"; kept {', '.join(kept)}: best, evaluation pending or an RL parent" if kept else "")
    for stale in root.glob(".tmp-step-*"):  # leftovers of a crashed save
        shutil.rmtree(stale, ignore_errors=True)
    return doomed


def latest_checkpoint(root: str | Path, verify: bool = False) -> Path | None:
    """The newest complete checkpoint under `root` (by the `latest` pointer, else by name), or None.

    `verify=True` (before resuming) checks every file's digest. A checkpoint that does not pass (no meta.json, a
    missing, truncated or altered file) is skipped with a warning naming it and why; the next older one is tried."""
    root = Path(root)
    try:
        target = resolve_pointer(root, LATEST) if root.is_dir() else None
    except VTGError as e:
        log.warning("%s; looking for the newest complete checkpoint by name", e)
        target = None
    candidates = ([target] if target is not None else []) + [
        p for p in reversed(_step_dirs(root) if root.is_dir() else []) if target is None or p.resolve() != target]
    for i, p in enumerate(candidates):
        if i == 0 and target is not None and not p.exists():
            log.warning("%s: the %r pointer names %s, which is not there; looking for an older checkpoint",
                        root, LATEST, p.name)
            continue
        why = checkpoint_problem(p, verify)
        if why is None:
            return p
        log.warning("skipping checkpoint %s: %s", p.name, why)
    return None


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
