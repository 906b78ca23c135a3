"""SFT as a train module (`SFTModule`) and `train(cfg)`, used by the CLI, the benchmarks and the tests.

Same module for every launcher (deepspeed / torchrun / single process) and both engines (DeepSpeed ZeRO 0-3,
FSDP2). The outer loop (lock, resume, cadence, save, error reporting) is the one `training.trainer.Trainer` that
GRPO runs under too; side effects go through callbacks; this module imports no tracker.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from training import accumulation, early_stop
from training.callbacks import Callback
from training.data import (
    StreamSpec,
    make_loader,
    read_examples,
    resolve_urls,
    source_keep,
)
from training.dist import (
    all_reduce_max,
    all_reduce_sum,
    broadcast,
    rng_state,
    seed_everything,
    set_determinism,
    set_rng_state,
)
from training.engine import EngineSettings, build_engine
from training.guards import REASON_OF, REASONS, StabilityGuard
from training.metrics import PerfMonitor, model_flops, vision_patches
from training.mix import check_mix_sources, check_mix_suites
from training.preflight import check_before_training
from training.sanity import (
    SanityError,
    check_examples,
    check_model,
    check_shards_manifest,
    check_tokenizer,
    check_vocabulary,
)
from training.trainer import Trainer, TrainModule, run_module
from vtg.config import PipelineConfig
from vtg.config.keys import trajectory_view, view_hash
from vtg.errors import VTGError
from vtg.model.modeling import (
    count_parameters,
    half_dtype,
    load_model_and_tokenizer,
    resolve_base,
    torch_dtype,
)
from vtg.model.packing import check_packable, is_packed, packed_inputs, rope_owner
from vtg.model.processing import QUERY_POSITION_KEY, TIMESTAMPS_KEY, VisionParams, model_inputs
from vtg.model.teach import teach_if_tiny
from vtg.selection import TRAIN_LOSS_AVG, window_mean
from vtg.shards import data_sources, data_version

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
    mix_counts: dict[str, int] = field(default_factory=dict)
    """`train.data.mix`: examples trained on per source, this rank (meta.json sums the ranks)."""


PADDING_ADVICE = 0.2
"""Padding share of a log window above which a run that neither groups nor packs is told how to (once)."""

TRAIN_KEY = "train_hash"
"""meta.json key of the SFT run key (`train_hash`): resuming needs a match."""


def train_hash(cfg: PipelineConfig) -> str:
    """Hash of what determines the trajectory: the `train` and `engine` sections (run length, logging, hooks and
    paths excluded: the fields marked `RUN_LENGTH` or `NOT_OUTPUT`). Resuming needs a match."""
    return view_hash({"train": trajectory_view(cfg.train), "engine": trajectory_view(cfg.engine)})


def build_model(cfg: PipelineConfig, device: torch.device):
    """The model to train from `train.model.base` (the shared loader, `vtg.model.modeling`; a tiny base first
    taught `train.teach`'s general task), its tokenizer told how examples are encoded (every export records it),
    and the resolved base path."""
    tcfg = cfg.train
    seeded = rng_state()  # building or teaching a tiny base reseeds torch; a base from the cache does not
    base = teach_if_tiny(cfg, tcfg.model.base, resolve_base(tcfg.model.base))
    set_rng_state(seeded)  # so the run's RNGs go on as `train.seed` left them either way (exact resume)
    try:
        model, tokenizer = load_model_and_tokenizer(base, device=device, dtype=torch_dtype(cfg.engine.precision),
                                                    attn_implementation=tcfg.model.attn_implementation,
                                                    trainable=True, finetune=tcfg.model)
    except VTGError as e:
        raise VTGError(f"train.model.base={tcfg.model.base!r}: {e}") from None
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = tcfg.data.timestamps  # encode_example and every export follow it
    tokenizer.init_kwargs[QUERY_POSITION_KEY] = tcfg.data.query_position
    return model, tokenizer, base


class SFTModule(TrainModule):
    """Supervised fine-tuning on the grounding shards (and `train.data.mix`'s other sources): one optimizer step
    = `train.grad_accum` micro-batches of the teacher-forced answer loss, with the stability guard's skips."""

    section, key_name = "train", TRAIN_KEY

    def __init__(self, cfg: PipelineConfig, evaluator: early_stop.Evaluator | None = None):
        """`evaluator`: what `train.early_stop` scores each checkpoint with (`checkpoint -> val loss`; default
        `training.early_stop.val_loss_evaluator`, training's own val split)."""
        self.cfg, self.tcfg = cfg, cfg.train
        self.mix = self.tcfg.mix_sources()  # `train.data.mix` as trained on (`suite: taught` resolved)
        self.evaluator = evaluator
        self.num_workers = self.tcfg.data.num_workers
        check_before_training(cfg)  # before the model: a recipe whose longest example cannot fit stops here

    def setup(self, trainer: Trainer) -> None:
        self.trainer, self.dist = trainer, trainer.dist
        seed_everything(self.tcfg.seed)
        set_determinism(self.cfg.engine.deterministic)
        self.check_shards()  # before the model: shards that disagree with their manifest stop the run here
        check_mix_suites(self.mix)
        self.model, self.tokenizer, self.base_path = build_model(self.cfg, self.dist.device)
        self.vision = VisionParams.from_model(self.model)  # the base checkpoint's processor facts
        if self.tcfg.data.packing:
            check_packable(self.model)
        self.rope = rope_owner(self.model) if self.tcfg.data.packing else None
        self._advised = False
        self.one_row = getattr(self.model.config, "_attn_implementation", "") == "flash_attention_2"
        self.urls = resolve_urls(self.tcfg.shards_dir, self.tcfg.data.split)
        self.data_version = broadcast(data_version(self.tcfg.shards_dir) if self.dist.is_main else None, self.dist)
        self.data_sources = broadcast(data_sources(self.tcfg.shards_dir, self.tcfg.data.split)
                                      if self.dist.is_main else None, self.dist)
        check_mix_sources(self.mix, self.data_sources, self.tcfg.shards_dir, self.tcfg.data.split)
        self.trainable, self.total = count_parameters(self.model)
        self.monitor = PerfMonitor(self.dist.device, model_flops(self.model), self.tcfg.peak_tflops,
                                   self.dist.is_main)
        self.sanity_checks()
        self.engine = build_engine(self.model, EngineSettings.for_sft(self.cfg), self.dist.world_size)
        self.guard = StabilityGuard.from_config(self.tcfg.guards)
        self.state = RunState()

    def run_key(self) -> str:
        """`train_hash`, and for a base built here (a tiny base, taught or not) its build's identity: the cache
        directory's name carries the builder's and the teaching's versions, suite and settings, so a changed
        taught base starts a new trajectory instead of resuming one trained from the old base."""
        from vtg.model.tiny import tiny_family

        if tiny_family(self.tcfg.model.base):
            return view_hash({"train": train_hash(self.cfg), "base": Path(self.base_path).name})
        return train_hash(self.cfg)

    def state_dict(self) -> dict:
        return {"run": self.state.__dict__, "guard": self.guard.state_dict()}

    def load_state_dict(self, saved: dict, src: Path) -> None:
        self.state = RunState(**saved["run"])
        self.guard.load_state_dict(saved["guard"])
        log.info("resumed from %s (step %d, %d batches consumed)", src, self.state.step, self.state.batches)

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
        problem = broadcast(problem, self.dist)
        if problem:
            raise SanityError(problem)

    def sanity_checks(self) -> None:
        check_tokenizer(self.tokenizer)
        check_vocabulary(self.tokenizer, self.model)
        vision_ids = {self.model.config.video_token_id, self.model.config.image_token_id,
                      self.model.config.vision_start_token_id, self.model.config.vision_end_token_id}
        examples, errors = read_examples(self.urls, self.tokenizer, self.vision, self.tcfg.data.sanity_examples,
                                         self.tcfg.data.max_seq_len)
        check_examples(examples, errors, self.tokenizer, vision_ids, self.tcfg.data.max_seq_len)
        check_model(self.model, self.tcfg.model.finetune, self.tcfg.model.freeze_vision, self.trainable,
                    self.total)

    # ---- checkpointing -------------------------------------------------------------------------------
    def checkpoint_meta(self) -> dict:
        meta = {"finetune": self.tcfg.model.finetune, "base": self.tcfg.model.base, "base_path": self.base_path,
                "samples_seen": self.state.samples,
                "metrics": {"train/loss": self.last_loss,
                            TRAIN_LOSS_AVG: window_mean(self.state.losses, self.tcfg.save_every)}}
        if self.mix:
            meta["data_mix"] = self.mix_totals()
        return meta

    def after_save(self, saved: Path | None, completed: bool) -> bool:
        if self.tcfg.early_stop and not completed:
            self.early = self._early_stop(self.stopper, saved)
        self.monitor.skip_idle(self.window)  # checkpoint time (and the early-stop evaluation) is not step time
        return self.early is not None

    # ---- the steps -----------------------------------------------------------------------------------
    def _loader(self):
        d = self.tcfg.data
        spec = StreamSpec(urls=tuple(self.urls), seed=self.tcfg.seed, resampled=d.resampled,
                          shuffle_buffer=d.shuffle_buffer, micro_batch_size=self.tcfg.micro_batch_size,
                          token_budget=d.token_budget, length_groups=d.length_groups, max_seq_len=d.max_seq_len,
                          packing=d.packing, pack_length=d.pack_length, one_row=self.one_row,
                          skip_batches=self.state.batches, keep=source_keep(self.data_sources, d.auto_share),
                          mix=tuple((m.name, m.weight, m.suite, tuple(m.sources)) for m in self.mix),
                          general_frames=(self.cfg.evaluate.forgetting.num_frames,
                                          self.cfg.evaluate.forgetting.frame_size))
        return make_loader(spec, self.tokenizer, self.vision, d.num_workers, d.prefetch_factor)

    def run_info(self) -> dict:
        t = self.tcfg
        return {"base": t.model.base, "finetune": t.model.finetune, "trainable_params": self.trainable,
                "total_params": self.total, "micro_batch_size": t.micro_batch_size, "grad_accum": t.grad_accum,
                "effective_batch": t.micro_batch_size * t.grad_accum * self.dist.world_size,
                "shards": len(self.urls)}

    def start(self, stop_at: int) -> bool:
        t, st = self.tcfg, self.state
        self.micro_losses: list[float] = []
        self.step_samples = 0
        self.window = self.monitor.new_window()
        self.mix_window: dict[str, int] = {}
        self.last_loss, self.step_lr = float("nan"), float("nan")
        completed = st.step >= stop_at
        self.early = None
        recorded = early_stop.stopped_at(self.cfg, train_hash(self.cfg)) if t.early_stop and st.step else None
        if recorded is not None and recorded["step"] <= st.step:
            log.info("this run ended early at step %d (%s): nothing to train", recorded["step"],
                     early_stop.marker_path(self.cfg))
            self.early, completed = recorded, True
        self.stopper = (early_stop.EarlyStop(self.cfg, self.evaluator or early_stop.val_loss_evaluator(
            self.cfg, str(self.dist.device)), train_hash(self.cfg), st.step)
            if t.early_stop and self.dist.is_main and not completed else None)
        self.loader = iter(self._loader()) if not completed else None
        return completed

    def _next_batch(self) -> dict:
        """The loader's next non-empty micro-batch (data errors counted; empty batches are consumed, not trained)."""
        st, window = self.state, self.window
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(self.loader)
            except StopIteration:
                raise VTGError("the training stream ended before max_steps (set train.data.resampled=true or "
                               "lower train.max_steps)") from None
            window["wait"] += time.perf_counter() - t0
            st.batches += 1
            if batch["data_errors"]:
                self._count_data_errors(batch["data_errors"])
            if batch["keys"]:
                return batch

    def train_step(self) -> None:
        """One optimizer step over an accumulation window of `train.grad_accum` micro-batches, its loss the mean over
        all their label tokens (`training.accumulation`: the update of one batch that holds them all); a micro-batch
        the guard skips is replaced by the stream's next one."""
        st, dev, window = self.state, self.dist.device, self.window
        dtype = half_dtype(self.cfg.engine.precision)
        pending = [self._next_batch() for _ in range(self.tcfg.grad_accum)]
        tokens = accumulation.window_tokens(pending, dev)
        while True:
            batch = pending.pop(0) if pending else self._next_batch()
            loss = self.engine.forward(micro_inputs(batch, self.rope, dev, dtype))
            value = float(loss.detach())
            verdict = REASON_OF[int(all_reduce_max(REASONS[self.guard.judge(value)], dev))]
            if verdict is not None:
                self._skip(verdict, value, batch["keys"])
                continue
            share = accumulation.window_share(loss, batch, tokens)
            self.engine.backward(share, window_share=True)
            self.micro_losses.append(float(share.detach()))
            window["tokens"] += float(batch["attention_mask"].sum())
            window["slots"] += batch["input_ids"].numel()
            window["samples"] += len(batch["keys"])
            for name in batch.get("mix", ()):
                st.mix_counts[name] = st.mix_counts.get(name, 0) + 1
                self.mix_window[name] = self.mix_window.get(name, 0) + 1
            window["patches"] += vision_patches(batch)
            self.step_samples += len(batch["keys"])
            self.step_lr = self.engine.lr()  # the lr this optimizer step uses (the scheduler moves on in step())
            if self.engine.step():
                break
        st.step += 1
        # the window's per-token loss on this rank (times the world size, as `window_tokens` counts): its mean over
        # ranks is the step's loss over all its label tokens, what one big batch would report
        total_loss, step_samples = all_reduce_sum([sum(self.micro_losses), self.step_samples], dev)
        self.last_loss, self.micro_losses = total_loss / self.dist.world_size, []
        st.samples += int(step_samples)
        self.step_samples = 0
        self.guard.accept(self.last_loss)
        st.losses.append(self.last_loss)
        window["steps"] += 1
        self.monitor.poll()

    def finish(self) -> None:
        self.loader = None

    def summary(self, wall_s: float, start_step: int) -> dict:
        st, t = self.state, self.tcfg
        return {"step": st.step, "final_loss": self.last_loss, "skipped_batches": st.skipped_batches,
                "data_errors": st.data_errors, "wall_s": wall_s, "samples_seen": st.samples,
                "steps_per_s": (st.step - start_step) / wall_s if wall_s > 0 else 0.0,
                "completed": st.step >= t.max_steps or self.early is not None, "early_stop": self.early,
                "data_mix": self.mix_totals(), **self.scaler_metrics(""),
                **self.monitor.summary(), "losses": list(st.losses)}

    def scaler_metrics(self, prefix: str = "train/") -> dict[str, float]:
        """fp16's dynamic loss scaler (`training.engine`): the current scale and the optimizer steps it skipped for
        an overflow so far (each skip halves the scale); {} without one (fp32, bf16)."""
        scale = self.engine.loss_scale()
        if scale is None:
            return {}
        return {f"{prefix}loss_scale": scale, f"{prefix}overflow_steps": self.engine.overflow_steps()}

    def _early_stop(self, stopper: early_stop.EarlyStop | None, saved: Path | None) -> dict | None:
        """`train.early_stop`: rank 0 scores the new checkpoint with the evaluator it was handed and reads the
        overfitting signal (training/early_stop.py); every rank gets the decision."""
        signal = None
        if stopper is not None and saved is not None:
            signal = stopper.check(saved)
            if signal is not None:
                early_stop.record(self.cfg, signal, train_hash(self.cfg))
        if not all_reduce_max(float(signal is not None), self.dist.device):
            return None
        return signal or early_stop.stopped_at(self.cfg, train_hash(self.cfg)) or {"step": self.state.step}

    def step_metrics(self) -> dict[str, float]:
        """Rates and system metrics over the steps since the last log, reduced over ranks (training/metrics.py;
        every rank calls this); the loss is this step's, all-rank mean, the lr the one this step used; with
        `train.data.mix`, each source's share of the window's examples (`data/mix/<name>`). Starts a new window."""
        st = self.state
        norm = self.engine.grad_norm()
        perf = self.monitor.window_metrics(self.window)
        self._advise_batching(perf.get("perf/padding_frac"))
        metrics = {"train/loss": self.last_loss, "train/lr": self.step_lr,
                   "train/grad_norm": float("nan") if norm is None else norm,
                   "train/skipped_batches": st.skipped_batches, "data/errors": st.data_errors,
                   **self.scaler_metrics(), **perf,
                   **self._mix_shares(self.mix_window)}
        self.window, self.mix_window = self.monitor.new_window(), {}
        return metrics
    def _mix_shares(self, counts: dict[str, int]) -> dict[str, float]:
        """Each mix source's share of `counts` summed over ranks (every rank calls this); {} without a mix."""
        names = [m.name for m in self.mix]
        if not names:
            return {}
        total = all_reduce_sum([float(counts.get(n, 0)) for n in names], self.dist.device)
        n = sum(total) or 1.0
        return {f"data/mix/{name}": v / n for name, v in zip(names, total, strict=True)}

    def mix_totals(self) -> dict | None:
        """`train.data.mix`'s weights and the examples trained on per source, all ranks (every rank calls this)."""
        mix = self.mix
        if not mix:
            return None
        counts = all_reduce_sum([float(self.state.mix_counts.get(m.name, 0)) for m in mix], self.dist.device)
        total = sum(counts) or 1.0
        return {"weights": {m.name: m.weight for m in mix},
                "counts": {m.name: int(c) for m, c in zip(mix, counts, strict=True)},
                "shares": {m.name: c / total for m, c in zip(mix, counts, strict=True)}}

    def _advise_batching(self, padding: float | None) -> None:
        d = self.tcfg.data
        if padding is None or padding <= PADDING_ADVICE or d.packing or d.length_groups or self._advised:
            return
        self._advised = True
        if self.dist.is_main:
            log.warning("%.0f%% of the token slots in the last steps were padding (lengths vary): set "
                        "train.data.token_budget with train.data.length_groups=8, or train.data.packing=true "
                        "(docs/stages.md, \"Variable lengths\"; `python -m benchmarks.batching` measures both)",
                        100 * padding)

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
        self.trainer.callbacks.on_skip(self.state.step, info)
        if self.guard.skipped():
            raise VTGError(f"{self.guard.consecutive_skips} batches skipped in a row ({reason}): the run has "
                           "diverged; lower train.lr or check the data")


def micro_inputs(batch: dict, rope: torch.nn.Module | None, device: torch.device,
                 dtype: torch.dtype | None) -> dict:
    """The model's inputs for one collated or packed micro-batch (`rope`: the model's rope owner, for packing)."""
    inputs = model_inputs(batch, device, dtype)
    return packed_inputs(rope, batch, inputs) if is_packed(batch) else inputs


def train(cfg: PipelineConfig, callbacks: list[Callback] | None = None, stop_after: int | None = None,
          evaluator: early_stop.Evaluator | None = None) -> dict:
    """Train per `cfg` (resuming per `train.resume`); returns a summary with the per-step losses. `evaluator`:
    what `train.early_stop` scores checkpoints with (`SFTModule`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return run_module(cfg, SFTModule(cfg, evaluator), callbacks, stop_after)[1]
