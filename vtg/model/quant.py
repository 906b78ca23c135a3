"""QLoRA's 4-bit base (`train.model.finetune: qlora`): how a base is quantised, what its weights cost, whether this
machine can run it, and the record an export carries so that it reloads as it was trained. The one home of these
facts: the loader (`vtg.model.modeling`), the planner and pre-flight (`training.plan`, `training.preflight`), the
config's refusals and the GPU check read them here.

- The quantisation is the QLoRA paper's (Dettmers et al. 2023): bitsandbytes NF4 in blocks of 64 with double
  quantisation (each block's absmax stored in 8 bits, those in fp32 per 256 blocks), packed two to a uint8; the
  base computes in `engine.precision`'s dtype and the LoRA adapters train in it (`bnb_config`).
- Which weights become 4-bit is transformers' rule (`replace_with_bnb_linear`): every plain `nn.Linear` except the
  modules `get_keys_to_not_convert` keeps (the output embedding, tied weights, the last parameter) and the
  model's `_keep_in_fp32_modules`. Embeddings, norms, biases, the vision tower's patch convolution and `lm_head`
  stay in the compute dtype (`quantized_weights`, `meta_quantized_weights`).
- `nf4_bytes`: what one such weight holds in memory: the packed codes, the 8-bit absmax, the fp32 nested absmax
  and the per-tensor code tables and offset (tests/training/test_qlora.py checks the planner's total against a
  loaded model's tensors).
- An export of a QLoRA run is its adapter (as LoRA's is) plus `QUANT_FILE`, the quantisation config; the loader
  quantises the base the same way before it applies the adapter, so the reloaded model is the one that trained.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

from vtg.errors import VTGError

QUANT_FILE = "quantization_config.json"
"""In an adapter export (`<checkpoint>/hf/`): the bitsandbytes config the base was quantised with."""

BLOCKSIZE = 64
"""Elements per absmax block (bitsandbytes' default for 4-bit on every backend)."""
NESTED_BLOCKSIZE = 256
"""First-level absmax values per nested (fp32) absmax under double quantisation."""
TABLE_BYTES = 4 * (16 + 256 + 1)
"""Per 4-bit tensor: the NF4 code (16 fp32), the nested 8-bit code (256 fp32) and the nested offset (fp32)."""

PIP = "pip install bitsandbytes==0.50.2"
"""The build measured here (docs/environment.md): its CPU backend runs NF4 forward and backward."""


def bnb_config(compute_dtype: torch.dtype):
    """transformers' `BitsAndBytesConfig` for the QLoRA base."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype, bnb_4bit_quant_storage=torch.uint8)


def nf4_bytes(numel: float, tensors: int = 1) -> float:
    """Bytes `tensors` 4-bit weights of `numel` elements in all hold (module docstring). Each tensor has at least
    one nested absmax; beyond that the per-tensor rounding (under 4 bytes a tensor) is left out."""
    blocks = math.ceil(numel / BLOCKSIZE)
    nested = max(math.ceil(blocks / NESTED_BLOCKSIZE), tensors)
    return math.ceil(numel / 2) + blocks + 4 * nested + TABLE_BYTES * tensors


def unavailable(device: str | torch.device = "cpu") -> str | None:
    """Why a 4-bit base cannot load and train on `device` here, with what to do; None when it can (bitsandbytes
    imports and its backend for the device type runs a 4-bit matmul)."""
    dev = torch.device(device)
    try:
        import bitsandbytes as bnb
    except ImportError as e:
        return (f"bitsandbytes is not installed ({e}): {PIP} (on a GPU machine: the `gpu` extra), or train "
                "train.model.finetune=lora")
    try:
        layer = bnb.nn.Linear4bit(BLOCKSIZE, 2, bias=False, compute_dtype=torch.float32, quant_type="nf4")
        layer = layer.to(dev)
        layer(torch.ones(1, BLOCKSIZE, device=dev))
    except Exception as e:  # noqa: BLE001 - any failure of the backend means: not on this device
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return (f"bitsandbytes {bnb.__version__} cannot run a 4-bit layer on {dev.type} ({first}): install a "
                f"build with a {dev.type} backend ({PIP}), or train train.model.finetune=lora")
    return None


def check_available(device: str | torch.device, what: str) -> None:
    """Raise a one-line VTGError naming `what` (a config key, a checkpoint) when `unavailable(device)`."""
    why = _unavailable_cached(str(torch.device(device)))
    if why:
        raise VTGError(f"{what}: a 4-bit (QLoRA) base cannot run here: {why}")


@functools.cache
def _unavailable_cached(device: str) -> str | None:
    return unavailable(device)


def quantized_weights(model: torch.nn.Module) -> list[tuple[str, int]]:
    """(module name, weight elements) of every Linear transformers' bitsandbytes loader turns into 4-bit in
    `model` (an unquantised instance; a meta-device one is enough): its own rule, not a copy of it."""
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = list(get_keys_to_not_convert(model)) + list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return [(name, m.weight.numel()) for name, m in model.named_modules()
            if type(m) is torch.nn.Linear and should_convert_module(name, skip)]


def meta_quantized_weights(model_type: str, text: dict, vision: dict, tied: bool) -> tuple[float, int]:
    """(elements, tensors) that become 4-bit in the architecture (a meta-device instance, ~1 s, cached)."""
    return _meta_quantized(model_type, json.dumps(text, sort_keys=True), json.dumps(vision, sort_keys=True), tied)


@functools.cache
def _meta_quantized(model_type: str, text: str, vision: str, tied: bool) -> tuple[float, int]:
    from vtg.model.families import config_cls_of, model_cls_of

    config = config_cls_of(model_type)(text_config=json.loads(text), vision_config=json.loads(vision),
                                       tie_word_embeddings=tied)
    with torch.device("meta"):
        model = model_cls_of(config)(config)
    found = quantized_weights(model)
    return float(sum(n for _, n in found)), len(found)


def is_quantized(model: torch.nn.Module) -> bool:
    """True for a model (or a peft wrapper of one) whose base was loaded in 4-bit."""
    base = getattr(model, "get_base_model", lambda: model)()
    return bool(getattr(base, "is_loaded_in_4bit", False))


def weight_bytes(model: torch.nn.Module) -> float:
    """Bytes a loaded model's weights hold in memory: every parameter as stored (4-bit weights packed) plus the
    quantisation state of each 4-bit weight (absmax, nested absmax, code tables, offset)."""
    total = 0.0
    for p in model.parameters():
        total += p.numel() * p.element_size()
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            for t in (qs.absmax, qs.code, qs.offset, *((qs.state2.absmax, qs.state2.code) if qs.nested else ())):
                total += 0 if t is None else t.numel() * t.element_size()
    return total


def save_record(model: torch.nn.Module, export_dir: str | Path) -> None:
    """An export of a 4-bit model records how its base was quantised (`QUANT_FILE`); other exports get none."""
    if not is_quantized(model):
        return
    base = getattr(model, "get_base_model", lambda: model)()
    (Path(export_dir) / QUANT_FILE).write_text(json.dumps(base.config.quantization_config.to_dict(), indent=2,
                                                          default=str) + "\n")


def read_record(export_dir: str | Path) -> dict | None:
    """The quantisation an export's base was trained with, or None (not a QLoRA export)."""
    path = Path(export_dir) / QUANT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def config_from_record(record: dict, compute_dtype: torch.dtype):
    """The `BitsAndBytesConfig` an export's record describes, computing in `compute_dtype` (the loader's dtype:
    the same 4-bit weights, whatever precision the reloading machine computes in)."""
    from transformers import BitsAndBytesConfig

    keep = {k: v for k, v in record.items() if k not in ("bnb_4bit_compute_dtype", "quant_method", "_load_in_4bit",
                                                         "_load_in_8bit")}
    return BitsAndBytesConfig(**{**keep, "load_in_4bit": True, "load_in_8bit": False,
                                 "bnb_4bit_compute_dtype": compute_dtype})


def accept_own_state(model: torch.nn.Module) -> None:
    """Let `model.load_state_dict` take back a state dict the model saved (DeepSpeed's resume loads the whole
    module, strictly): bitsandbytes' `Linear4bit` writes its quantisation state beside its weight (`weight.absmax`,
    `weight.quant_map`, ...) but only transformers' loader reads those keys back, so a strict load of an already
    quantised layer rejects them. Each 4-bit layer compares them with its own state (the same base quantised the
    same way) and drops them; a checkpoint of another base is a one-line error."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.register_load_state_dict_pre_hook(_take_quant_state)


def _take_quant_state(module, state_dict, prefix, *_) -> None:
    qs = getattr(module.weight, "quant_state", None) or getattr(module, "quant_state", None)
    if qs is None:
        return
    for key, own in qs.as_dict(packed=True).items():
        saved = state_dict.pop(f"{prefix}weight.{key}", None)
        if saved is not None and not torch.equal(saved.to(own.device), own):
            raise VTGError(f"{prefix}weight: the checkpoint's 4-bit quantisation state ({key}) differs from this "
                           "base's: it was trained from another base (or another quantisation); resume from a "
                           "checkpoint of this base, or set train.resume=never")


def numel(p: torch.Tensor) -> int:
    """A parameter's elements as the model uses them: a 4-bit weight's unpacked shape (its storage holds two per
    byte), else `p.numel()`."""
    qs = getattr(p, "quant_state", None)
    return qs.shape.numel() if qs is not None and qs.shape is not None else p.numel()
