"""The training loop: one function, `train(cfg)`, used by the CLI, the benchmarks and the tests.

Same loop for every launcher (deepspeed / torchrun / single process) and both engines (DeepSpeed ZeRO 0-3,
FSDP2). Side effects go through callbacks; this module imports no tracker.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from training.callbacks import Callback, CallbackList, default_callbacks
from training.data import StreamSpec, make_loader, read_examples, resolve_urls
from training.dist import (
    DistInfo,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    init_distributed,
    rng_state,
    seed_everything,
    set_determinism,
    set_rng_state,
)
from training.engine import build_engine
from training.guards import REASON_OF, REASONS, StabilityGuard
from training.metrics import PerfMonitor, model_flops, vision_patches
from training.preflight import check_before_training
from training.sanity import (
    SanityError,
    check_data_version,
    check_examples,
    check_model,
    check_shards_manifest,
    check_tokenizer,
)
from vtg import checkpoints as ckpt
from vtg import lineage
from vtg.config import PipelineConfig, config_hash
from vtg.config._base import trajectory_view, view_hash
from vtg.errors import VTGError
from vtg.model.modeling import apply_finetune_mode, choose_attn_implementation, count_parameters, resolve_base
from vtg.model.processing import QUERY_POSITION_KEY, TIMESTAMPS_KEY, VisionParams, model_inputs
from vtg.shards import data_version

log = logging.getLogger("training")


@dataclass
class RunState:
    """What a rank needs beyond the engine state to continue bit-exactly."""

    step: int = 0
    batches: int = 0
    """Batches taken from this rank's loader (including skipped and empty ones): the data position."""
    samples: int = 0
    skipped_batches: int = 0
    data_errors: int = 0
    losses: list[float] = field(default_factory=list)


def train_hash(tcfg) -> str:
    """Hash of what determines the trajectory (run length, logging, hooks and paths excluded: the fields marked
    `RUN_LENGTH` or `NOT_OUTPUT`): resuming needs a match."""
    return view_hash(trajectory_view(tcfg))


def build_model(tcfg, device: torch.device):
    from transformers import AutoModelForImageTextToText, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight loading/saving bars would interleave with ours

    base = resolve_base(tcfg.model.base)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tcfg.precision, torch.float32)
    attn = choose_attn_implementation(tcfg.model.attn_implementation, device, dtype)
    try:
        model = AutoModelForImageTextToText.from_pretrained(base, attn_implementation=attn, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(base)
    except OSError as e:
        raise VTGError(f"train.model.base={tcfg.model.base!r}: cannot load ({str(e).splitlines()[0]})") from None
    model.config.use_cache = False
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = tcfg.data.timestamps  # encode_example and every export follow it
    tokenizer.init_kwargs[QUERY_POSITION_KEY] = tcfg.data.query_position
    if tcfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model = apply_finetune_mode(model, tcfg.model.finetune, lora_r=tcfg.model.lora_r,
                                lora_alpha=tcfg.model.lora_alpha, freeze_vision=tcfg.model.freeze_vision)
    model.to(device).train()
    return model, tokenizer, base


def _broadcast(obj, dist: DistInfo):
    if dist.world_size == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _resume_dir(cfg: PipelineConfig, data_version: str) -> Path | None:
    """Where to resume from (rank 0). Checkpoints of another trajectory are moved aside, never deleted."""
    tcfg = cfg.train
    root = Path(tcfg.out_dir)
    if tcfg.resume not in ("auto", "never"):
        # the full check (digests) before anything of it is opened: DeepSpeed unpickles its state files
        try:
            ckpt.read_checkpoint_meta(tcfg.resume, verify=True)
        except VTGError as e:
            raise VTGError(f"train.resume={tcfg.resume}: cannot resume from it: {e}") from None
        return ckpt.resolve_checkpoint(tcfg.resume)
    if tcfg.resume == "never":
        if ckpt.has_checkpoints(root):
            ckpt.move_aside(root, "train.resume=never starts a fresh run")
        return None
    latest = ckpt.latest_checkpoint(root, verify=True)  # newest that verifies; skipped ones are warned about
    if latest is None:
        return None
    meta = ckpt.read_checkpoint_meta(latest)
    why = None
    if meta.get("train_hash") != train_hash(tcfg):
        why = (f"{latest.name} was trained with other train settings (train_hash {meta.get('train_hash')} != "
               f"{train_hash(tcfg)}); only max_steps, save_every, keep_last and logging may change to resume")
    elif meta.get("data_version") != data_version:
        why = f"{latest.name} was trained on data {str(meta.get('data_version'))[:12]}, the shards are now {data_version[:12]}"
    if why:
        ckpt.move_aside(root, why)
        return None
    return latest


def _write_rank_state(checkpoint: Path, rank: int, state: dict) -> None:
    """Run state, guard and python/numpy RNG as JSON; torch/CUDA RNG tensors apart (loadable weights_only)."""
    rng = dict(state["rng"])
    tensors = {"torch": rng.pop("torch"), "cuda": rng.pop("cuda")}
    ckpt.write_json_atomic(ckpt.rank_state_file(checkpoint, rank), {**state, "rng": rng})
    torch.save(tensors, ckpt.rank_rng_file(checkpoint, rank))


def _read_rank_state(checkpoint: Path, rank: int) -> dict:
    """What `_write_rank_state` wrote; nothing is unpickled (JSON, and tensors under `weights_only=True`).

    An older checkpoint's single pickled `rank-<r>.pt` is read with `weights_only=True` too (numpy arrays allowed)."""
    import pickle

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


def _protected(cfg: PipelineConfig) -> list[Path]:
    """Checkpoints retention must keep; the one place that decides (`vtg.checkpoints.prune` obeys the list):
    - the best one, as evaluation's pointer names it (`<evaluate.out_dir>/best.json`);
    - while this run's checkpoints are evaluated one by one (then the orchestrator sets VTG_CHECKPOINT_QUEUE, the
      file where the checkpoint hook reports each checkpoint), every reported checkpoint that has no evaluation
      record yet in the orchestration index `<orchestration.state_dir>/checkpoint_evals.jsonl` (`flows.evaluation`
      appends one line per finished evaluation; matched by directory and save time). A later save prunes it once
      it is evaluated.
    Training only reads these files; evaluation never writes into the checkpoint root."""
    import json

    best = ckpt.read_pointer(Path(cfg.evaluate.out_dir) / ckpt.BEST_POINTER)
    keep = [best["path"]] if best else []
    queue = os.environ.get(lineage.ENV_CHECKPOINT_QUEUE)
    if not queue:
        return keep

    def reported(path: Path) -> set[tuple[str, float]]:
        out = set()
        for line in path.read_text().splitlines() if path.is_file() else []:
            try:
                item = json.loads(line)
            except json.JSONDecodeError:  # a line being appended right now
                continue
            if isinstance(item, dict) and item.get("checkpoint_dir"):
                out.add((str(Path(item["checkpoint_dir"]).resolve()), round(float(item.get("saved_at") or 0), 3)))
        return out

    evaluated = reported(Path(cfg.orchestration.state_dir) / "checkpoint_evals.jsonl")
    pending = sorted({Path(d) for d, t in reported(Path(queue)) - evaluated})
    if pending:
        log.info("retention keeps %s: evaluation pending", ", ".join(p.name for p in pending))
    return keep + pending


class Trainer:
    def __init__(self, cfg: PipelineConfig, callbacks: list[Callback] | None = None):
        self.cfg, self.tcfg = cfg, cfg.train
        check_before_training(cfg)  # before the model: a recipe whose longest example cannot fit stops here
        self.dist = init_distributed(self.tcfg.strategy)
        seed_everything(self.tcfg.seed)
        set_determinism(self.tcfg.deterministic)
        self.check_shards()  # before the model: shards that disagree with their manifest stop the run here
        self.callbacks = CallbackList(default_callbacks(cfg, self.dist.is_main) if callbacks is None
                                      else callbacks)
        self.model, self.tokenizer, self.base_path = build_model(self.tcfg, self.dist.device)
        self.vision = VisionParams.from_model_config(self.model.config)
        self.urls = resolve_urls(self.tcfg.shards_dir, self.tcfg.data.split)
        self.data_version = _broadcast(data_version(self.tcfg.shards_dir) if self.dist.is_main else None,
                                       self.dist)
        self.git_commit = lineage.git_commit()
        self.trainable, self.total = count_parameters(self.model)
        self.monitor = PerfMonitor(self.dist.device, model_flops(self.model), self.tcfg.peak_tflops,
                                   self.dist.is_main)
        self.sanity_checks()
        # one trainer per checkpoint folder: rank 0 holds <out_dir>/.lock until the run ends (or the process dies)
        self.lock = ckpt.lock_checkpoint_root(self.tcfg.out_dir) if self.dist.is_main else None
        self.engine = build_engine(self.model, self.tcfg, self.dist.world_size)
        self.guard = StabilityGuard.from_config(self.tcfg.guards)
        self.state = RunState()
        self.resumed_meta: dict = {}
        self.resume()
        if self.lock is not None:
            self.lock.refresh()  # resume may have moved the old root (and its lock file) aside

    def release_lock(self) -> None:
        if getattr(self, "lock", None) is not None:
            self.lock.release()

    # ---- before step 1 -------------------------------------------------------------------------------
    def check_shards(self) -> None:
        """Rank 0 checks the split's shards against the manifest (sizes, sha256, none missing or extra); every
        rank stops with the same one-line error."""
        problem = None
        if self.dist.is_main:
            try:
                check_shards_manifest(self.tcfg.shards_dir, self.tcfg.data.split)
            except SanityError as e:
                problem = str(e)
        problem = _broadcast(problem, self.dist)
        if problem:
            raise SanityError(problem)

    def sanity_checks(self) -> None:
        check_tokenizer(self.tokenizer)
        vision_ids = {self.model.config.video_token_id, self.model.config.image_token_id,
                      self.model.config.vision_start_token_id, self.model.config.vision_end_token_id}
        examples, errors = read_examples(self.urls, self.tokenizer, self.vision, self.tcfg.data.sanity_examples,
                                         self.tcfg.data.max_seq_len)
        check_examples(examples, errors, self.tokenizer, vision_ids, self.tcfg.data.max_seq_len)
        check_model(self.model, self.tcfg.model.finetune, self.tcfg.model.freeze_vision, self.trainable,
                    self.total)
        check_data_version(self.data_version)

    def resume(self) -> None:
        src = _broadcast(str(_resume_dir(self.cfg, self.data_version) or "") if self.dist.is_main else None,
                         self.dist)
        if not src:
            return
        src = Path(src)
        meta = ckpt.read_checkpoint_meta(src)  # rank 0 verified every digest (`_resume_dir`)
        if meta.get("world_size", 1) != self.dist.world_size:
            raise VTGError(f"{src}: saved with world size {meta.get('world_size')}, now {self.dist.world_size}; "
                           "exact resume needs the same world size (or set train.resume=never)")
        if meta.get("train_hash") != train_hash(self.tcfg):
            raise VTGError(f"{src} was trained with different train settings (train_hash {meta.get('train_hash')} "
                           f"!= {train_hash(self.tcfg)}); set train.resume=never to start over, or another "
                           "train.out_dir")
        if meta.get("data_version") != self.data_version:
            log.warning("resuming %s (given as train.resume) trained on data %s, shards are now %s", src,
                        meta.get("data_version"), self.data_version)
        saved = _read_rank_state(src, self.dist.rank)
        self.engine.load(ckpt.engine_dir(src))
        if saved["num_workers"] != self.tcfg.data.num_workers:
            raise VTGError(f"{src}: saved with train.data.num_workers={saved['num_workers']}; the data order "
                           "depends on it, resume with the same value")
        self.state = RunState(**saved["run"])
        self.guard.load_state_dict(saved["guard"])
        set_rng_state(saved["rng"])
        self.resumed_meta = meta
        log.info("resumed from %s (step %d, %d batches consumed)", src, self.state.step, self.state.batches)

    # ---- checkpointing -------------------------------------------------------------------------------
    def save(self, last_loss: float) -> Path | None:
        step, root = self.state.step, Path(self.tcfg.out_dir)
        tmp = ckpt.temp_dir_for(root, step)
        if self.dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            ckpt.engine_dir(tmp).mkdir(parents=True)
        barrier()
        self.engine.save(ckpt.engine_dir(tmp))
        _write_rank_state(tmp, self.dist.rank, {"run": self.state.__dict__, "guard": self.guard.state_dict(),
                                                "rng": rng_state(), "num_workers": self.tcfg.data.num_workers})
        state_dict = self.engine.full_state_dict()
        final = None
        if self.dist.is_main:
            self.export_hf(state_dict, ckpt.export_dir(tmp))
        barrier()  # every rank's files are in place before rank 0 lists and digests them into meta.json
        if self.dist.is_main:
            meta = {"data_version": self.data_version, "git_commit": self.git_commit,
                    "config_hash": config_hash(self.cfg), "train_hash": train_hash(self.tcfg), "finetune": self.tcfg.model.finetune,
                    "base": self.tcfg.model.base, "base_path": self.base_path, "world_size": self.dist.world_size,
                    "samples_seen": self.state.samples, "metrics": {"train/loss": last_loss},
                    "deterministic": self.tcfg.deterministic, "mlflow_run_id": None, **self.callbacks.checkpoint_meta()}
            final = ckpt.finalize(root, step, meta, self.cfg.model_dump(mode="json"), self.tcfg.keep_last,
                                  protect=_protected(self.cfg))
        barrier()
        if final is not None:
            self.callbacks.on_checkpoint(final, step)
        return final

    def export_hf(self, state_dict: dict | None, out: Path) -> None:
        """save_pretrained of the full model, or of the adapter only for LoRA (peft filters the state dict)."""
        self.engine.module.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
        self.tokenizer.save_pretrained(out)

    # ---- the loop ------------------------------------------------------------------------------------
    def _loader(self):
        d = self.tcfg.data
        spec = StreamSpec(urls=tuple(self.urls), seed=self.tcfg.seed, resampled=d.resampled,
                          shuffle_buffer=d.shuffle_buffer, micro_batch_size=self.tcfg.micro_batch_size,
                          token_budget=d.token_budget, max_seq_len=d.max_seq_len, skip_batches=self.state.batches)
        return make_loader(spec, self.tokenizer, self.vision, d.num_workers, d.prefetch_factor)

    def run_info(self) -> dict:
        t = self.tcfg
        return {"base": t.model.base, "finetune": t.model.finetune, "trainable_params": self.trainable,
                "total_params": self.total, "world_size": self.dist.world_size,
                "micro_batch_size": t.micro_batch_size, "grad_accum": t.grad_accum,
                "effective_batch": t.micro_batch_size * t.grad_accum * self.dist.world_size,
                "data_version": self.data_version, "git_commit": self.git_commit, "start_step": self.state.step,
                "mlflow_run_id": self.resumed_meta.get("mlflow_run_id"), "shards": len(self.urls)}

    def fit(self, stop_after: int | None = None) -> dict:
        t, st, dev = self.tcfg, self.state, self.dist.device
        start_wall, start_step = time.perf_counter(), st.step
        self.callbacks.on_train_start(self.run_info())
        stop_at = min(t.max_steps, stop_after) if stop_after else t.max_steps
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.precision)
        micro_losses: list[float] = []
        step_samples = 0
        window = self.monitor.new_window()
        last_loss, completed = float("nan"), st.step >= stop_at
        loader = iter(self._loader()) if not completed else None
        while not completed:
            t0 = time.perf_counter()
            try:
                batch = next(loader)
            except StopIteration:
                raise VTGError("the training stream ended before max_steps (set train.data.resampled=true or "
                               "lower train.max_steps)") from None
            window["wait"] += time.perf_counter() - t0
            st.batches += 1
            if batch["data_errors"]:
                self._count_data_errors(batch["data_errors"])
            if not batch["keys"]:
                continue
            loss = self.engine.forward(model_inputs(batch, dev, dtype))
            value = float(loss.detach())
            verdict = REASON_OF[int(all_reduce_max(REASONS[self.guard.judge(value)], dev))]
            if verdict is not None:
                self._skip(verdict, value, batch["keys"])
                continue
            self.engine.backward(loss)
            micro_losses.append(value)
            window["tokens"] += float(batch["attention_mask"].sum())
            window["samples"] += len(batch["keys"])
            window["patches"] += vision_patches(batch)
            step_samples += len(batch["keys"])
            if not self.engine.step():
                continue
            st.step += 1
            total_loss, step_samples = all_reduce_sum([sum(micro_losses) / len(micro_losses), step_samples], dev)
            last_loss, micro_losses = total_loss / self.dist.world_size, []
            st.samples += int(step_samples)
            step_samples = 0
            self.guard.accept(last_loss)
            st.losses.append(last_loss)
            window["steps"] += 1
            self.monitor.poll()
            if st.step % t.log_every == 0 or st.step == stop_at:
                self._log_window(window, last_loss)
                window = self.monitor.new_window()
            if st.step % t.save_every == 0 or st.step == stop_at:
                self.save(last_loss)
                self.monitor.skip_idle(window)  # checkpoint time is not step time
            completed = st.step >= stop_at
        del loader
        wall = time.perf_counter() - start_wall
        summary = {"step": st.step, "final_loss": last_loss, "skipped_batches": st.skipped_batches,
                   "data_errors": st.data_errors, "wall_s": wall, "samples_seen": st.samples,
                   "steps_per_s": (st.step - start_step) / wall if wall > 0 else 0.0,
                   "completed": st.step >= t.max_steps, **self.monitor.summary(), "losses": list(st.losses)}
        self.callbacks.on_train_end(summary)
        return summary

    def _log_window(self, window: dict, loss: float) -> None:
        """Rates and system metrics over the steps since the last log, reduced over ranks (training/metrics.py;
        every rank calls this); the loss is this step's, all-rank mean."""
        st = self.state
        self.callbacks.on_step(st.step, {
            "train/loss": loss, "train/lr": self.engine.lr(),
            "train/grad_norm": self.engine.grad_norm() or float("nan"),
            "train/skipped_batches": st.skipped_batches, "data/errors": st.data_errors,
            **self.monitor.window_metrics(window)})

    def _count_data_errors(self, errors: list[tuple[str, str]]) -> None:
        self.state.data_errors += len(errors)
        for reason, where in errors:
            log.warning("skipped bad data (%s) at %s", reason, where)

    def _skip(self, reason: str, loss: float, keys: list[str]) -> None:
        self.state.skipped_batches += 1
        info = {"reason": reason, "loss": loss if math.isfinite(loss) else str(loss), "keys": keys,
                "rank": self.dist.rank}
        log.warning("rank %d step %d: skipped batch (%s, local loss %s) keys %s", self.dist.rank, self.state.step,
                    reason, info["loss"], ", ".join(keys[:8]) + (" ..." if len(keys) > 8 else ""))
        self.callbacks.on_skip(self.state.step, info)
        if self.guard.skipped():
            raise VTGError(f"{self.guard.consecutive_skips} batches skipped in a row ({reason}): the run has "
                           "diverged; lower train.lr or check the data")


def train(cfg: PipelineConfig, callbacks: list[Callback] | None = None, stop_after: int | None = None) -> dict:
    """Train per `cfg` (resuming per `train.resume`); returns a summary with the per-step losses."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer = Trainer(cfg, callbacks)
    try:
        return trainer.fit(stop_after=stop_after)
    finally:
        trainer.release_lock()
