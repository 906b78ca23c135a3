"""The run lifecycle every trainer shares (SFT's `training.sft`, GRPO's `training.rl.grpo`): what happens around
the steps, decided once.

`RunLifecycle` owns, for one checkpoint root (`train.out_dir` or `rl.out_dir`):
- the lock: rank 0 takes `<root>/.lock` first, before anything reads or moves the root, and holds it to the end;
- resume (`resume_source`): `auto` takes the newest checkpoint that verifies (digests) and falls back past ones that
  do not; a checkpoint of another trajectory (the stage's run key: `train_hash` / `rl_hash`) or of other data (the
  shards' data version) is a superseded run: the root is moved aside, never deleted, and the run starts fresh;
  `never` moves an existing root aside; an explicit path must verify and carry the same run key (else a one-line
  error), other data only warns. Resuming needs the same world size (a one-line error on every rank);
- rank state: per rank, the stage's run state, its guard state and the RNG state as JSON, the torch/CUDA RNG
  tensors apart (read back with `weights_only=True`: nothing of ours is unpickled);
- save (`save`): engine state on every rank, the HF export on rank 0, then `vtg.checkpoints.finalize` (file list
  with sha256, meta.json last, atomic rename, `latest`, retention);
- retention's protected set (`protected`): the best checkpoint (evaluation's pointer), every checkpoint whose
  evaluation is pending (`vtg.eval_queue`) and every checkpoint an RL checkpoint started from (its lineage parent).

The rules and their reasons: docs/architecture.md ("Run lifecycle").
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from pathlib import Path

import torch

from training.dist import DistInfo, barrier, broadcast, rng_state, set_rng_state
from vtg import checkpoints as ckpt
from vtg import eval_queue
from vtg.checkpoint_lock import lock_checkpoint_root
from vtg.config import PipelineConfig, output_roots_overlap
from vtg.config.view import unguarded
from vtg.errors import VTGError, out_of_space
from vtg.io import write_json_atomic
from vtg.model import quant
from vtg.model.processing import save_processor_config

log = logging.getLogger("training")

RESUME_AUTO, RESUME_NEVER = "auto", "never"


# ---- rank state --------------------------------------------------------------------------------------------
def write_rank_state(checkpoint: Path, rank: int, state: dict) -> None:
    """`state` (run, guard, num_workers, rng) as JSON; the torch/CUDA RNG tensors apart (loadable weights_only)."""
    rng = dict(state["rng"])
    tensors = {"torch": rng.pop("torch"), "cuda": rng.pop("cuda")}
    write_json_atomic(ckpt.rank_state_file(checkpoint, rank), {**state, "rng": rng})
    torch.save(tensors, ckpt.rank_rng_file(checkpoint, rank))


def read_rank_state(checkpoint: Path, rank: int) -> dict:
    """What `write_rank_state` wrote; nothing is unpickled (JSON, and tensors under `weights_only=True`).

    An older checkpoint's single pickled `rank-<r>.pt` is read with `weights_only=True` too (numpy arrays allowed)."""
    import numpy as np

    state_file, rng_file = ckpt.rank_state_file(checkpoint, rank), ckpt.rank_rng_file(checkpoint, rank)
    try:
        if state_file.is_file():
            state = json.loads(state_file.read_text())
            tensors = torch.load(rng_file, weights_only=True, map_location="cpu")
            state["rng"] = {**state["rng"], "torch": tensors["torch"], "cuda": tensors["cuda"]}
        elif rng_file.is_file():  # the layout before the run state moved to JSON
            with torch.serialization.safe_globals([np._core.multiarray._reconstruct, np.ndarray, np.dtype,
                                                   type(np.dtype(np.uint32))]):
                state = torch.load(rng_file, weights_only=True, map_location="cpu")
        else:
            raise VTGError(f"{checkpoint}: no run state for rank {rank} ({state_file.name} is missing); "
                           "exact resume needs every rank's state")
        state["run"], state["guard"], state["rng"], state["num_workers"]  # all there (KeyError otherwise)
    except VTGError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, pickle.UnpicklingError) as e:
        raise VTGError(f"{checkpoint}: unreadable run state for rank {rank} "
                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return state


# ---- retention -----------------------------------------------------------------------------------------------
def lineage_parents(cfg: PipelineConfig) -> list[Path]:
    """The checkpoints that RL checkpoints started from (meta.json `parent_checkpoint`), resolved."""
    parents = set()
    for c in ckpt.list_checkpoints(cfg.rl.out_dir):
        parent = ckpt.parent_checkpoint(c)
        if parent:
            parents.add(parent)
    return sorted(parents)


LOWEST_EVAL_LOSS = "lowest_eval_loss.json"
"""`<train.out_dir>/lowest_eval_loss.json`: with `train.early_stop`, the pointer to the run's checkpoint with the
lowest val eval loss so far (what the early-stop decision names as the one to keep)."""


def namers(cfg: PipelineConfig) -> list[tuple[Path, str]]:
    """Every checkpoint something names, with what names it: the one protection set (docs/faults.md). Retention
    never removes one of them (`vtg.checkpoints.prune`), and a move-aside never takes one that the run about to
    start uses (`in_use`):
    - the best one, as evaluation's pointer names it (`<evaluate.out_dir>/best.json`; the registry alias the
      evaluate stage sets points at the same checkpoint);
    - every checkpoint reported into this flow run's evaluation queue without an evaluation yet
      (`vtg.eval_queue.pending_from_env`); a later save prunes it once it is evaluated;
    - every checkpoint an RL checkpoint started from, so that a lineage never loses its parent;
    - with `train.early_stop`, the lowest-eval-loss checkpoint the early-stop decision names (`LOWEST_EVAL_LOSS`);
    - `rl.init` when it names a checkpoint, and `train.resume` / `rl.resume` when they do.
    Training only reads these files; evaluation never writes into a checkpoint root. It reads every stage's names
    whatever the stage declares (`vtg.config.view.unguarded`): what is kept, not what the stage computes."""
    cfg = unguarded(cfg)
    out: list[tuple[Path, str]] = []
    best = ckpt.read_pointer(Path(cfg.evaluate.out_dir) / ckpt.BEST_POINTER)
    if best:
        out.append((best["path"], f"{Path(cfg.evaluate.out_dir) / ckpt.BEST_POINTER} (the best on val)"))
    pending = eval_queue.pending_from_env(cfg.orchestration.state_dir)
    if pending:
        log.info("retention keeps %s: evaluation pending", ", ".join(p.name for p in pending))
    out += [(p, "a pending evaluation") for p in pending]
    out += [(p, "an RL checkpoint's parent") for p in lineage_parents(cfg)]
    try:
        lowest = ckpt.read_pointer(Path(cfg.train.out_dir) / LOWEST_EVAL_LOSS) if cfg.train.early_stop else None
    except VTGError:
        lowest = None
    if lowest:
        out.append((lowest["path"], "train.early_stop (the lowest val eval loss so far)"))
    for key, ref in (("rl.init", cfg.rl.init), ("train.resume", cfg.train.resume), ("rl.resume", cfg.rl.resume)):
        if ref not in ("best", ckpt.LATEST, RESUME_AUTO, RESUME_NEVER):
            try:
                out.append((ckpt.resolve_checkpoint(ref), key))
            except VTGError:
                out.append((Path(ref).resolve(), key))
    return out


def protected(cfg: PipelineConfig) -> list[Path]:
    """The checkpoints retention must keep (`namers`)."""
    return [p for p, _ in namers(cfg)]


def in_use(cfg: PipelineConfig) -> list[tuple[Path, str]]:
    """The named checkpoints the run about to start reads or reports: a move-aside of their root would take them
    from under it (`rl.init` inside `rl.out_dir`, a pending evaluation). A superseded run's own best checkpoint
    and RL parents go aside with it, its pointers stale until the evaluate stage selects again."""
    keep = ("rl.init", "train.resume", "rl.resume", "a pending evaluation")
    return [(p, who) for p, who in namers(cfg) if who in keep]


def move_aside(cfg: PipelineConfig, root: Path, reason: str) -> Path:
    """`vtg.checkpoints.move_aside`, refusing (one line, nothing moved) when `root` holds a checkpoint in use."""
    for path, who in in_use(cfg):
        p, r = Path(path).resolve(), root.resolve()
        if p == r or r in p.parents:
            raise VTGError(f"{root} is to be moved aside ({reason}), but it holds {path}, which {who} names: "
                           f"nothing moved. Copy that checkpoint out of {root} and name the copy, or give this run "
                           "another out_dir")
    return ckpt.move_aside(root, reason)


# ---- resume --------------------------------------------------------------------------------------------------
def resume_source(cfg: PipelineConfig, section: str, key_name: str, key: str, data_version: str) -> Path | None:
    """Rank 0's decision: the checkpoint to resume from, or None for a fresh run (after moving a superseded root
    aside). `section` is the stage's config section (`train`, `rl`): its `out_dir` and `resume` apply."""
    run = getattr(cfg, section)
    root, setting = Path(run.out_dir), f"{section}.resume"
    if run.resume not in (RESUME_AUTO, RESUME_NEVER):
        # the full check (digests) before anything of it is opened: DeepSpeed unpickles its state files
        try:
            meta = ckpt.read_checkpoint_meta(run.resume, verify=True)
        except VTGError as e:
            raise VTGError(f"{setting}={run.resume}: cannot resume from it: {e}") from None
        if meta.get(key_name) != key:
            raise VTGError(f"{setting}={run.resume}: it was trained with other {section} settings ({key_name} "
                           f"{meta.get(key_name)} != {key}); set {setting}=never to start over, or another "
                           f"{section}.out_dir")
        if meta.get("data_version") != data_version:
            log.warning("resuming %s (given as %s) trained on data %s, shards are now %s", run.resume, setting,
                        meta.get("data_version"), data_version)
        check_not_past(Path(run.resume), meta, run.max_steps, section)
        return ckpt.resolve_checkpoint(run.resume)
    if run.resume == RESUME_NEVER:
        if ckpt.has_checkpoints(root):
            move_aside(cfg, root, f"{setting}=never starts a fresh run")
        return None
    latest = ckpt.latest_checkpoint(root, verify=True)  # newest that verifies; skipped ones are warned about
    if latest is None:
        return None
    meta = ckpt.read_checkpoint_meta(latest)
    why = None
    if meta.get(key_name) != key:
        why = (f"{latest.name} was trained with other {section} settings ({key_name} {meta.get(key_name)} != {key}); "
               "only max_steps, save_every, keep_last and logging may change to resume")
    elif meta.get("data_version") != data_version:
        why = (f"{latest.name} was trained on data {str(meta.get('data_version'))[:12]}, the shards are now "
               f"{data_version[:12]}")
    if why:
        move_aside(cfg, root, why)
        return None
    check_not_past(latest, meta, run.max_steps, section)
    return latest


def check_not_past(checkpoint: Path, meta: dict, max_steps: int, section: str) -> None:
    """A run asked to stop before where its checkpoint already is refuses (non-zero), instead of reporting the
    longer model as done: the checkpoint stays the run's result, nothing is trained, removed or moved."""
    step = int(meta.get("step") or 0)
    if step > max_steps:
        raise VTGError(f"{section}.max_steps={max_steps} is below the step of the checkpoint it would resume, "
                       f"{checkpoint} (step {step}): nothing trained, that checkpoint is still the run's result. "
                       f"Set {section}.max_steps>={step} to keep it, or {section}.resume=never to train "
                       f"{max_steps} steps afresh (the current run is moved aside, not deleted)")


def check_roots_apart(cfg: PipelineConfig) -> None:
    """The config's own check again (vtg.config.output_roots_overlap), for a config built without validation."""
    overlap = output_roots_overlap(cfg)
    if overlap:
        raise VTGError(overlap)


class RunLifecycle:
    """One checkpoint root's lifecycle for one run of a stage: lock, resume, rank state, save, retention."""

    def __init__(self, cfg: PipelineConfig, section: str, key_name: str, dist: DistInfo):
        check_roots_apart(cfg)
        self.cfg, self.section, self.key_name, self.dist = cfg, section, key_name, dist
        self.run = getattr(cfg, section)
        self.root = Path(self.run.out_dir)
        # one trainer per checkpoint folder: rank 0 holds <root>/.lock until the run ends (or the process dies)
        self.lock = lock_checkpoint_root(self.root) if dist.is_main else None

    def guarded(self, setup, *args) -> None:
        """Run a trainer's setup; if it fails, release the lock before raising (an in-process caller may retry)."""
        try:
            setup(*args)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def resume_source(self, key: str, data_version: str) -> tuple[Path | None, dict]:
        """(checkpoint to resume from, its meta) on every rank, or (None, {}). Rank 0 decides; every rank raises
        the same one-line error when resuming is impossible."""
        decision = None
        if self.dist.is_main:
            try:
                src = resume_source(self.cfg, self.section, self.key_name, key, data_version)
                decision = ("ok", str(src) if src else "")
            except VTGError as e:
                decision = ("error", str(e))
        status, value = broadcast(decision, self.dist)
        if self.lock is not None:
            self.lock.refresh()  # a move-aside took the old root (and its lock file) away
        if status == "error":
            raise VTGError(value)
        if not value:
            return None, {}
        src = Path(value)
        meta = ckpt.read_checkpoint_meta(src)  # rank 0 verified every digest
        if meta.get("world_size", 1) != self.dist.world_size:
            raise VTGError(f"{src}: saved with world size {meta.get('world_size')}, now {self.dist.world_size}; "
                           f"exact resume needs the same world size (or set {self.section}.resume=never)")
        return src, meta

    def restore(self, src: Path, engine, num_workers: int) -> dict:
        """Load the engine state and this rank's RNG state from `src`; returns the rank's saved state (run, guard)."""
        saved = read_rank_state(src, self.dist.rank)
        engine.load(ckpt.engine_dir(src))
        if saved["num_workers"] != num_workers:
            raise VTGError(f"{src}: saved with train.data.num_workers={saved['num_workers']}; the data order "
                           "depends on it, resume with the same value")
        set_rng_state(saved["rng"])
        return saved

    def save(self, step: int, engine, tokenizer, state: dict, meta: dict) -> Path | None:
        """Every rank: engine state and rank state into the temp dir; rank 0: the HF export (full weights, or the
        adapter only for LoRA and QLoRA: peft filters the state dict; QLoRA adds its quantisation record), then
        meta.json, the rename, `latest` and retention.
        `state` holds the rank's `run`, `guard` and `num_workers`; returns the checkpoint on rank 0."""
        tmp = ckpt.temp_dir_for(self.root, step)
        try:
            return self._save(tmp, step, engine, tokenizer, state, meta)
        except Exception as e:
            if not out_of_space(e, self.root):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # our own temp: a failed save must not keep the disk full
            why = (f"{e.strerror}: {e.filename}" if isinstance(e, OSError) else
                   (str(e).strip().splitlines() or [type(e).__name__])[-1][:200])
            raise VTGError(f"step {step}: no room for the checkpoint under {self.root} ({why}); the partial "
                           f"{tmp.name} was removed and the last complete checkpoint is untouched: free space "
                           f"(`df -h {self.root}`) and rerun, training resumes from it") from None

    def _save(self, tmp: Path, step: int, engine, tokenizer, state: dict, meta: dict) -> Path | None:
        if self.dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            ckpt.engine_dir(tmp).mkdir(parents=True)
        barrier()
        engine.save(ckpt.engine_dir(tmp))
        write_rank_state(tmp, self.dist.rank, {**state, "rng": rng_state()})
        state_dict = engine.full_state_dict()
        if self.dist.is_main:
            engine.module.save_pretrained(ckpt.export_dir(tmp), state_dict=state_dict, safe_serialization=True)
            tokenizer.save_pretrained(ckpt.export_dir(tmp))
            save_processor_config(engine.module, ckpt.export_dir(tmp))  # the processor facts travel with it
            quant.save_record(engine.module, ckpt.export_dir(tmp))  # QLoRA: how its base was quantised
        barrier()  # every rank's files are in place before rank 0 lists and digests them into meta.json
        final = None
        if self.dist.is_main:
            final = ckpt.finalize(self.root, step, {**meta, "world_size": self.dist.world_size},
                                  self.cfg.model_dump(mode="json"), self.run.keep_last, protect=protected(self.cfg))
        barrier()
        return final
