"""`python -m training.plan`: per-GPU memory for model states under ZeRO 0-3 (+ offload), and a recommendation.

    python -m training.plan --params 7e9 --gpus 8 --gpu-mem 80
    python -m training.plan -e qwen25vl_7b_zero2_8gpu          # size, GPUs, stage, precision from a config

Accounting (bytes per parameter, 16-bit mixed precision with Adam) follows DeepSpeed's own estimators, and the
ZeRO-2/3 totals equal `estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs` exactly
(tests/training/test_train_plan.py): 16-bit params 2, gradients 2 (16-bit) + 4 (fp32), optimizer 4 (fp32
master) + 8 (Adam moments). ZeRO-1 partitions the optimizer and fp32 gradients, ZeRO-2 also the 16-bit
gradients, ZeRO-3 also the parameters (plus a gathered-layer working buffer of 4 x the largest layer). fp32
training keeps no master copy: params 4, gradients 4, moments 8. LoRA: only the adapter fraction carries
gradients and optimizer state. QLoRA: the same, over a base whose linear weights are 4-bit NF4 (`quantized`
elements: ~0.52 bytes each with their quantisation state, `vtg.model.quant.nf4_bytes`; under ZeRO-3 / FSDP the
packed codes are sharded, the small state is not). What is left of the GPU after model states and a reserve is
the activation budget (batch x sequence x layers must fit in it; gradient checkpointing shrinks what they need).

Activations and trainable parameters are counted in `training.activations`; `python -m training.preflight` adds
them up per GPU. With an experiment, the planner's recommendation leaves room for the experiment's micro-batch as
the pre-flight counts it.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass

from training.arch import arch_for
from vtg.errors import VTGError
from vtg.model.quant import nf4_bytes

GB = 2**30
# Parameter counts (total, largest single layer = the token embedding) of common bases, so the planner works
# offline for hub ids. Anything else: pass --params, or a local path / `tiny` (counted from its config).
KNOWN_SIZES = {
    "qwen/qwen2.5-vl-3b-instruct": (3.75e9, 151936 * 2048),
    "qwen/qwen2.5-vl-7b-instruct": (8.29e9, 152064 * 3584),
    "qwen/qwen2.5-vl-32b-instruct": (33.5e9, 152064 * 5120),
    "qwen/qwen2.5-vl-72b-instruct": (73.4e9, 152064 * 8192),
}
OPTIONS = [(2, False, False), (3, False, False), (2, True, False), (3, True, False), (3, True, True)]
"""Preference order for the recommendation: least communication and offload first."""


@dataclass(frozen=True)
class Setup:
    params: float
    largest_layer: float
    gpus_per_node: int = 1
    nodes: int = 1
    gpu_mem_gb: float = 80.0
    precision: str = "bf16"
    trainable_frac: float = 1.0
    reserve_gb: float = 1.5
    """CUDA context, allocator fragmentation, communication buffers."""
    quantized: float = 0.0
    """Of `params`, the elements held in 4-bit (QLoRA's frozen base); 0: none."""
    quantized_tensors: int = 0
    """How many 4-bit weights hold them (each carries its own code tables)."""

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Plan:
    stage: int
    offload_optimizer: bool
    offload_param: bool
    params_b: float
    grads_b: float
    optim_b: float
    buffer_b: float
    cpu_b: float
    activation_budget_b: float

    @property
    def model_states_b(self) -> float:
        return self.params_b + self.grads_b + self.optim_b + self.buffer_b


def plan(s: Setup, stage: int, offload_optimizer: bool = False, offload_param: bool = False) -> Plan:
    """Per-GPU bytes for parameters, gradients, optimizer states (+ ZeRO-3 gather buffer) and CPU bytes/node."""
    if offload_param and stage != 3:
        raise VTGError("offload_param needs ZeRO stage 3")
    n, p, t = s.world, s.params, s.params * s.trainable_frac
    mixed = s.precision in ("bf16", "fp16")
    w = 2 if mixed else 4                        # working parameter bytes
    g16, g32 = (2, 4) if mixed else (0, 4)       # gradient bytes: 16-bit copy + fp32 (partition) copy
    opt = 12 if mixed else 8                     # fp32 master (mixed only) + Adam m, v
    q = s.quantized
    packed = math.ceil(q / 2)                    # 4-bit codes, two per byte (sharded under ZeRO-3)
    qstate = nf4_bytes(q, s.quantized_tensors) - packed if q else 0.0  # absmax, nested absmax, code tables
    sharded = w * (p - q) + packed
    params = sharded / n + qstate if stage == 3 else sharded + qstate
    grads = g16 * t / n + g32 * t / n if stage >= 2 else g16 * t + g32 * t / (n if stage == 1 else 1)
    optim = opt * t / (n if stage >= 1 else 1)
    if stage == 3:
        grads = g32 * t / n                      # DeepSpeed's ZeRO-3 accounting: 18 = 2 + 4 + 12
    buffer = 4 * s.largest_layer if stage == 3 else 0.0
    cpu = 0.0
    if offload_optimizer:
        cpu, grads, optim = (grads + optim) * n / s.nodes, 0.0, 0.0
    if offload_param:
        cpu, params = cpu + params * n / s.nodes, 0.0
    budget = s.gpu_mem_gb * GB - s.reserve_gb * GB - (params + grads + optim + buffer)
    return Plan(stage, offload_optimizer, offload_param, params, grads, optim, buffer, cpu, budget)


def deepspeed_estimate(s: Setup, stage: int, offload_optimizer: bool, offload_param: bool) -> float | None:
    """DeepSpeed's own per-GPU estimate (16-bit mixed precision, everything trainable), or None if it has none."""
    if stage == 2 and not offload_param:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        return estimate_zero2_model_states_mem_needs(int(s.params), s.gpus_per_node, s.nodes, offload_optimizer)[1]
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        return estimate_zero3_model_states_mem_needs(int(s.params), int(s.largest_layer), s.gpus_per_node, s.nodes,
                                                     offload_optimizer, offload_param)[1]
    return None


def recommend(s: Setup, min_activation_gb: float) -> Plan | None:
    for stage, off_opt, off_param in OPTIONS:
        p = plan(s, stage, off_opt, off_param)
        if p.activation_budget_b >= min_activation_gb * GB:
            return p
    return None


def model_size(base: str) -> tuple[float, float]:
    """(total params, largest layer params) for a known hub id, `tiny`, or a local HF directory."""
    if base.lower() in KNOWN_SIZES:
        return KNOWN_SIZES[base.lower()]
    with contextlib.suppress(KeyError, TypeError):  # a config that is not Qwen2.5-VL's: count a meta instance
        if (found := arch_for(base)) is not None:
            return found[0].param_count()
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from vtg.model.modeling import resolve_base

    try:
        config = AutoConfig.from_pretrained(resolve_base(base))
    except OSError:
        m = re.search(r"(\d+(?:\.\d+)?)[bB]\b", base)
        if m:
            return float(m.group(1)) * 1e9, 0.05 * float(m.group(1)) * 1e9
        raise VTGError(f"cannot size {base!r} offline: pass --params (and --largest-layer)") from None
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return float(total), float(largest)


@dataclass(frozen=True)
class ActivationNeed:
    """What one micro-batch of the experiment needs for activations per GPU (training.preflight's count)."""

    gb: float
    micro_batch: int
    seq: int
    """Tokens of the experiment's longest example."""
    token_budget: int
    packing: bool
    checkpointing: bool

    def describe(self) -> str:
        budget = (f", train.data.token_budget {self.token_budget:,}" + (" packed" if self.packing else "")
                  if self.token_budget else "")
        return (f"activations {self.gb:.2f} GiB per GPU: micro-batch {self.micro_batch} x {self.seq:,} tokens"
                f"{budget}, gradient checkpointing {'on' if self.checkpointing else 'off'} (training.preflight's "
                "count)")

    def fitting(self, s: Setup) -> tuple[int, Plan] | None:
        """The largest micro-batch (its activations are linear in it) some option leaves room for, and the option."""
        for m in range(self.micro_batch - 1, 0, -1):
            if (best := recommend(s, self.gb * m / self.micro_batch)) is not None:
                return m, best
        return None


def _option_name(p: Plan) -> str:
    off = " with parameter + optimizer offload" if p.offload_param else (
        " with optimizer offload" if p.offload_optimizer else "")
    return f"ZeRO-{p.stage}{off}"


def render(s: Setup, min_activation_gb: float, need: ActivationNeed | None = None) -> str:
    best = recommend(s, min_activation_gb)
    four_bit = f" ({s.quantized / 1e9:.3g}B of them 4-bit NF4)" if s.quantized else ""
    lines = [(f"model {s.params / 1e9:.3g}B params{four_bit} (largest layer {s.largest_layer / 1e6:.3g}M), "
              f"{s.precision}, trainable {s.trainable_frac:.0%}; {s.nodes} node(s) x {s.gpus_per_node} GPU(s) "
              f"x {s.gpu_mem_gb:g} GiB"), *([need.describe()] if need else []), "",
             (f"{'ZeRO':<6}{'offload':<11}{'params':>9}{'grads':>9}{'optim':>9}{'buffer':>9}{'states':>9}"
              f"{'DS est.':>9}{'act.budget':>12}{'CPU/node':>10}  (GiB per GPU)")]
    for stage in range(4):
        for off_opt, off_param in ((False, False), (True, False), (True, True)):
            if (off_opt and stage == 0) or (off_param and stage != 3):
                continue
            p = plan(s, stage, off_opt, off_param)
            ds = deepspeed_estimate(s, stage, off_opt, off_param) if s.precision != "fp32" and \
                s.trainable_frac == 1.0 and not s.quantized else None
            off = "param+opt" if off_param else ("optimizer" if off_opt else "-")
            mark = "  <- recommended" if best is not None and (stage, off_opt, off_param) == \
                (best.stage, best.offload_optimizer, best.offload_param) else ""
            lines.append(f"{stage:<6}{off:<11}{p.params_b / GB:9.2f}{p.grads_b / GB:9.2f}{p.optim_b / GB:9.2f}"
                         f"{p.buffer_b / GB:9.2f}{p.model_states_b / GB:9.2f}"
                         f"{(f'{ds / GB:.2f}' if ds is not None else '-'):>9}{p.activation_budget_b / GB:12.2f}"
                         f"{p.cpu_b / GB:10.2f}{mark}")
    lines.append("")
    if best is None:
        lines.append(f"no option leaves {min_activation_gb:.3g} GiB for activations: add GPUs, use LoRA or "
                     "QLoRA, or a smaller model")
        if need is not None and (fit := need.fitting(s)) is not None:
            m, option = fit
            budget = f" train.data.token_budget={m * need.seq}" if need.token_budget else ""
            lines.append(f"or a smaller micro-batch: train.micro_batch_size={m}{budget} leaves room with "
                         f"{_option_name(option)} (raise train.grad_accum to keep the global batch; "
                         "`python -m training.preflight` checks the whole recipe)")
    else:
        lines.append(f"recommended: {_option_name(best)} (first option, in order of communication cost, that "
                     f"leaves >= {min_activation_gb:.3g} GiB per GPU for activations)")
    lines.append("DS est. = DeepSpeed's estimate_zero{2,3}_model_states_mem_needs (same accounting).")
    return "\n".join(lines)
