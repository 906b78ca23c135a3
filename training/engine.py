"""Two engines behind one small interface: DeepSpeed ZeRO 0-3 (default) and PyTorch FSDP2 (`fully_shard`).

The loop calls: forward(inputs) -> loss (outputs(inputs) -> the model output, for RL), backward(loss) (the engine
divides by grad_accum) or backward(loss, window_share=True) (the loss is already this micro-batch's share of the
accumulation window's, `training.accumulation`), step() -> True on an optimizer step, grad_norm(), lr(),
loss_scale() and overflow_steps() (fp16's dynamic loss scaler; None / 0 without one), save(dir)/load(dir) on every
rank, and full_state_dict() (complete on rank 0) for the HF export. Both are built from `EngineSettings`: SFT's from
the `train` section, RL's from the `rl` section (a constant lr, its own clip and ZeRO stage), both over the shared
`engine` section (strategy, precision, offload).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from training.ds_config import LOSS_SCALE_POWER, LOSS_SCALE_WINDOW, build_ds_config
from training.optim import build_optimizer, build_scheduler
from vtg.errors import VTGError
from vtg.model.families import family_of
from vtg.model.modeling import half_dtype

log = logging.getLogger(__name__)
DS_TAG = "state"


@dataclass(frozen=True)
class EngineSettings:
    """What the engine, its optimizer and its lr schedule are built from (`training.optim`, `training.ds_config`)."""

    lr: float
    betas: tuple[float, float]
    weight_decay: float
    grad_clip: float
    warmup_ratio: float
    min_lr_ratio: float
    max_steps: int
    """Optimizer steps the schedule spans."""
    micro_batch_size: int
    grad_accum: int
    zero_stage: int
    offload_optimizer: bool
    offload_param: bool
    precision: str
    strategy: str

    @classmethod
    def for_sft(cls, cfg) -> EngineSettings:
        """The `train` section as it is (warmup + cosine over `train.max_steps`, `train.zero_stage`) over the
        `engine` section."""
        tcfg, e = cfg.train, cfg.engine
        return cls(lr=tcfg.lr, betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay, grad_clip=tcfg.grad_clip,
                   warmup_ratio=tcfg.warmup_ratio, min_lr_ratio=tcfg.min_lr_ratio, max_steps=tcfg.max_steps,
                   micro_batch_size=tcfg.micro_batch_size, grad_accum=tcfg.grad_accum, zero_stage=tcfg.zero_stage,
                   offload_optimizer=e.offload_optimizer, offload_param=e.offload_param,
                   precision=e.precision, strategy=e.strategy)

    @classmethod
    def for_rl(cls, cfg, micro_steps: int) -> EngineSettings:
        """RL's optimizer over the shared `engine` (precision, strategy and offload): constant `rl.lr` (no warmup,
        no decay), RL's clip and ZeRO stage, no weight decay; gradients accumulate over the rollout's `micro_steps`
        micro-batches."""
        r, e = cfg.rl, cfg.engine
        return cls(lr=r.lr, betas=tuple(r.betas), weight_decay=0.0, grad_clip=r.grad_clip, warmup_ratio=0.0,
                   min_lr_ratio=1.0, max_steps=r.max_steps * r.updates_per_rollout, micro_batch_size=r.micro_batch_size,
                   grad_accum=micro_steps, zero_stage=r.zero_stage, offload_optimizer=e.offload_optimizer,
                   offload_param=e.offload_param, precision=e.precision, strategy=e.strategy)


class DeepSpeedEngine:
    def __init__(self, model: torch.nn.Module, tcfg: EngineSettings, world_size: int):
        import deepspeed

        self.stage = tcfg.zero_stage
        if tcfg.precision == "fp16":
            refuse_fp16_without_support()
        self.ds_config = build_ds_config(tcfg, world_size, gpu=next(model.parameters()).device.type == "cuda")
        optimizer = build_optimizer(model, tcfg)
        scheduler = build_scheduler(optimizer, tcfg)
        self.schedule = dict(vars(scheduler.lr_lambdas[0]))
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler,
            config=self.ds_config, dist_init_required=False)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def forward(self, inputs: dict) -> torch.Tensor:
        return self.engine(**inputs).loss

    def outputs(self, inputs: dict):
        """The model's full output (logits) through the engine (ZeRO-3 gathers parameters on the way)."""
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor, window_share: bool = False) -> None:
        self.engine.backward(loss, scale_wrt_gas=not window_share)

    def step(self) -> bool:
        boundary = self.engine.is_gradient_accumulation_boundary()
        self.engine.step()
        return boundary

    def grad_norm(self) -> float | None:
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def loss_scale(self) -> float | None:
        """fp16's current dynamic loss scale (DeepSpeed's fp16 optimizer keeps it); None in fp32/bf16."""
        if not self.engine.fp16_enabled():
            return None
        return float(self.engine.optimizer.loss_scale)

    def overflow_steps(self) -> int:
        """Optimizer steps skipped because the fp16 gradients overflowed (DeepSpeed counts them; in its checkpoint)."""
        return int(self.engine.skipped_steps)

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag=DS_TAG, save_latest=False)

    def load(self, directory: Path) -> None:
        # DeepSpeed reads its state files with torch.load(weights_only=False) (TorchCheckpointEngine.load, 0.19):
        # it unpickles them. The loop calls this only on a checkpoint whose every file matched the sha256 that
        # meta.json recorded at save time (`vtg.checkpoints.read_checkpoint_meta(verify=True)` in `_resume_dir`),
        # so a truncated, swapped or crafted file is refused before DeepSpeed opens it.
        path, _ = self.engine.load_checkpoint(str(directory), tag=DS_TAG, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
        if path is None:
            raise VTGError(f"{directory}: no DeepSpeed state to resume from (tag {DS_TAG!r})")
        keep_schedule_from_config(self.scheduler, self.schedule)

    def full_state_dict(self) -> dict | None:
        """Complete weights on rank 0 (gathered under ZeRO-3; every rank must call this)."""
        if self.stage == 3:
            return self.engine._zero3_consolidated_16bit_state_dict()
        return self.module.state_dict() if self.engine.global_rank == 0 else None


class FSDPEngine:
    """FSDP2: each decoder layer and vision block is its own `fully_shard` unit, then the root.

    fp16 (`engine.precision: fp16`): the weights FSDP shards, and AdamW steps, are fp32 (the policy casts them to fp16
    for compute and reduces gradients in fp32), and `torch.amp.GradScaler` (DTensor-aware: its inf check is reduced
    over the mesh) scales the loss, unscales before clipping, and skips the step and halves the scale when a gradient
    holds an inf or a NaN (`training.ds_config.LOSS_SCALE_POWER`). Measured on the CPU: with fp16 weights instead,
    AdamW's update turns them to NaN at the second step, and the scaler refuses to unscale fp16 gradients.
    """

    def __init__(self, model: torch.nn.Module, tcfg: EngineSettings, world_size: int):
        import warnings

        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # HF returns a ModelOutput whose loss is a view; we never modify it in place.
        warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
        dtype = half_dtype(tcfg.precision)
        self.fp16 = tcfg.precision == "fp16"
        if self.fp16:
            model.float()  # fp32 master weights (class doc); fp16 is the compute dtype only
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        for unit in _shard_units(model):
            fully_shard(unit, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        self.model = model
        self.optimizer = build_optimizer(model, tcfg)
        self.scheduler = build_scheduler(self.optimizer, tcfg)
        self.schedule = dict(vars(self.scheduler.lr_lambdas[0]))
        self.grad_accum, self.clip = tcfg.grad_accum, tcfg.grad_clip
        self.micro = 0
        self._norm: float | None = None
        device = next(model.parameters()).device.type
        self.scaler = (torch.amp.GradScaler(device, init_scale=2.0 ** LOSS_SCALE_POWER,
                                            growth_interval=LOSS_SCALE_WINDOW) if self.fp16 else None)
        self.overflows = 0

    @property
    def module(self) -> torch.nn.Module:
        return self.model

    def forward(self, inputs: dict) -> torch.Tensor:
        return self.model(**inputs).loss

    def outputs(self, inputs: dict):
        return self.model(**inputs)

    def backward(self, loss: torch.Tensor, window_share: bool = False) -> None:
        loss = loss if window_share else loss / self.grad_accum
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self) -> bool:
        """At the accumulation boundary: (unscale,) clip, step, schedule. A step the grad scaler skips (an overflow)
        leaves the lr schedule where it is, as DeepSpeed does."""
        self.micro += 1
        if self.micro % self.grad_accum:
            return False
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.clip if self.clip > 0 else float("inf"))
        self._norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if self.scaler is None:
            self.optimizer.step()
            self.scheduler.step()
        else:
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < before:  # the scaler found an inf/NaN: no step was taken
                self.overflows += 1
            else:
                self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return True

    def grad_norm(self) -> float | None:
        return self._norm

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def loss_scale(self) -> float | None:
        return None if self.scaler is None else float(self.scaler.get_scale())

    def overflow_steps(self) -> int:
        return self.overflows

    def _state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def save(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=str(directory / "fsdp"))
        scaler = {} if self.scaler is None else {"scaler": self.scaler.state_dict(), "overflows": self.overflows}
        torch.save({"scheduler": self.scheduler.state_dict(), "micro": self.micro, **scaler},
                   directory / f"fsdp_extra_rank{torch.distributed.get_rank()}.pt")

    def load(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=str(directory / "fsdp"))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        # scheduler state (numbers, lists, dicts) and a counter: no pickle needed. The DCP metadata above is read
        # with pickle by torch; like DeepSpeed's files, its digest was verified before resuming.
        extra = torch.load(directory / f"fsdp_extra_rank{torch.distributed.get_rank()}.pt", weights_only=True)
        self.scheduler.load_state_dict(extra["scheduler"])
        keep_schedule_from_config(self.scheduler, self.schedule)
        self.micro = extra["micro"]
        if self.scaler is not None and "scaler" in extra:
            self.scaler.load_state_dict(extra["scaler"])
            self.overflows = extra["overflows"]

    def full_state_dict(self) -> dict | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return sd if torch.distributed.get_rank() == 0 else None


def refuse_fp16_without_support() -> None:
    """DeepSpeed trains fp16 only where its accelerator says the device can: on a GPU, and on the CPU only with
    oneDNN's fp16 support (AVX512-FP16 / AMX-FP16, `torch.ops.mkldnn._is_mkldnn_fp16_supported()`; False on this
    project's AMD EPYC build machines). Say so, and what to do, before `deepspeed.initialize` fails with "Type fp16 is
    not supported on your device". (With that answer lifted, DeepSpeed's fp16 optimizer and loss scaler do run on
    such a CPU: tests/training/test_fp16.py.)"""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.is_fp16_supported():
        return
    raise VTGError(f"engine.precision=fp16 with engine.strategy=deepspeed: DeepSpeed's {accelerator.device_name()} "
                   "accelerator refuses fp16 on this machine (on a CPU it needs oneDNN fp16 support, AVX512-FP16 or "
                   "AMX-FP16, which this CPU lacks). Train in fp32 here (engine.precision=fp32; bf16 is ~40x slower "
                   "on such a CPU), use engine.strategy=fsdp (fp16 with a grad scaler runs on the CPU), or run on a "
                   "GPU (make gpu-check has an fp16 case)")


def keep_schedule_from_config(scheduler, schedule: dict) -> None:
    """LambdaLR.load_state_dict restores the lambda's saved attributes; the current config's schedule wins
    (identical for an exact resume; a raised max_steps extends the cosine instead of staying at its floor)."""
    for fn in scheduler.lr_lambdas:
        vars(fn).update(schedule)


def _shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers FSDP wraps one by one: the family's blocks (`vtg.model.families`)."""
    blocks = family_of(model.config).blocks
    return [module for _, module in model.named_modules() if type(module).__name__.endswith(blocks)]


def build_engine(model: torch.nn.Module, tcfg: EngineSettings, world_size: int):
    if tcfg.strategy == "fsdp":
        if tcfg.zero_stage != 2 or tcfg.offload_optimizer or tcfg.offload_param:
            log.info("strategy fsdp: zero_stage/offload settings are DeepSpeed's and are ignored")
        return FSDPEngine(model, tcfg, world_size)
    return DeepSpeedEngine(model, tcfg, world_size)
