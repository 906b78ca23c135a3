"""The model side that training and evaluation share: the one model loader, the precision map, attention choice.

`load_model_and_tokenizer` is the only way a model is loaded: SFT (a base with its fine-tuning mode applied),
RL (the policy from a checkpoint's export, trainable; the frozen reference), evaluation and the benchmarks.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from vtg.errors import VTGError
from vtg.model import quant
from vtg.model.families import DEFAULT, family_of
from vtg.model.fast_vision import fast_vision
from vtg.model.tiny import build_tiny_model

__all__ = [
    "DTYPES",
    "apply_finetune_mode",
    "build_tiny_model",
    "choose_attn_implementation",
    "count_parameters",
    "load_model_and_tokenizer",
    "resolve_base",
    "torch_dtype",
]

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""`engine.precision` -> torch dtype: the one map."""


def torch_dtype(precision: str) -> torch.dtype:
    return DTYPES[precision]


def half_dtype(precision: str) -> torch.dtype | None:
    """The reduced-precision dtype of `precision`, or None for fp32 (inputs and FSDP's policy stay as they are)."""
    return None if precision == "fp32" else DTYPES[precision]


def choose_attn_implementation(requested: str = "auto", device: str | torch.device = "cpu",
                               dtype: torch.dtype | None = None) -> str:
    """`auto` -> flash_attention_2 only with CUDA, flash-attn installed and a 16-bit `dtype` (flash-attn has no
    fp32 kernels), else sdpa. `dtype` is the model's (None: torch's default, fp32). Logs the choice once."""
    on_cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    dtype = dtype or torch.get_default_dtype()
    half = dtype in (torch.bfloat16, torch.float16)
    if requested == "auto":
        from transformers.utils import is_flash_attn_2_available

        choice = "sdpa"
        if not on_cuda:
            why = "no CUDA device"
        elif not half:
            why = f"flash-attn needs bf16/fp16, the model is {str(dtype).removeprefix('torch.')}"
        elif not is_flash_attn_2_available():
            why = "flash-attn not installed"
        else:
            choice, why = "flash_attention_2", "CUDA + flash-attn available"
    else:
        choice, why = requested, "requested in config"
        if choice == "flash_attention_2" and not on_cuda:
            raise VTGError("attn_implementation=flash_attention_2 needs a CUDA device; use auto or sdpa on CPU")
        if choice == "flash_attention_2" and not half:
            raise VTGError("attn_implementation=flash_attention_2 needs bf16 or fp16 weights (flash-attn has no "
                           "fp32 kernels); set engine.precision=bf16, or attn_implementation auto or sdpa")
    log.info("attention implementation: %s (%s)", choice, why)
    return choice


def resolve_base(base: str, seed: int = 0) -> str:
    """`tiny` (`tiny-qwen3_vl`, `tiny-qwen3_5`) -> the cached tiny model directory of that family; `shape-true:<hub id>[?text_layers=..&vision_blocks=..&vocab=..]`
    -> the cached shape-true model directory (vtg/model/shape_true.py); anything else (hub id or local path)
    unchanged."""
    from vtg.model import shape_true
    from vtg.model.tiny import tiny_family

    if shape_true.is_spec(base):
        return str(shape_true.resolve_spec(base, seed=seed))
    family = tiny_family(base)
    return str(build_tiny_model(seed=seed, family=family)) if family else base


def resolve_device(device: str, key: str = "evaluate.device") -> str:
    """`auto` -> cuda when there is one, else cpu; a cuda device without CUDA is an error naming `key`."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise VTGError(f"{key}={device} but no CUDA device is available; use auto or cpu")
    return device


def _default_dtype(device: str | torch.device) -> torch.dtype:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_model_and_tokenizer(path_or_id: str | Path, *, attn_implementation: str = "auto",
                             device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                             trainable: bool = False, finetune=None, seed: int = 0, dequantize: bool = False):
    """Load a full HF export, a LoRA adapter export (adapter + its base), a hub id/local path, `tiny` or a
    `shape-true:` spec. Returns (model, tokenizer).

    - `trainable=False` (evaluation, RL's frozen reference): eval mode, no parameter requires grad.
    - the vision tower runs `vtg.model.fast_vision`: sdpa attention span by span in a few calls (the same
      numbers), the patch embedding as a matrix product.
    - `trainable=True` with an adapter export (RL's policy): the adapters train, the base stays frozen.
    - `trainable=True` with `finetune` (a `train.model` section; SFT from a base): KV cache off, gradient
      checkpointing if asked, then full fine-tuning or fresh LoRA adapters (`apply_finetune_mode`); `qlora`
      loads the base in 4-bit first (`vtg.model.quant`).
    An adapter export of a QLoRA run (`vtg.model.quant.QUANT_FILE`) loads its base quantised as it trained;
    `dequantize=True` turns those 4-bit weights back into plain ones before the adapter goes on (what a merge
    folds the adapter into: the weights the run trained against).
    The tokenizer comes from the export when it holds one (every checkpoint `hf/` does), else from the base.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForImageTextToText, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight loading/saving bars would interleave with ours
    path = Path(str(path_or_id))
    source = resolve_base(str(path_or_id), seed=seed)
    dtype = dtype or _default_dtype(device)
    attn = choose_attn_implementation(attn_implementation, device, dtype)
    adapter_cfg = path / "adapter_config.json"
    record = quant.read_record(path) if adapter_cfg.is_file() else None
    if record is not None:
        quant.check_available(device, f"{path} (a QLoRA export)")
    elif trainable and finetune is not None and finetune.finetune == "qlora":
        quant.check_available(device, "train.model.finetune=qlora")
        record = quant.bnb_config(dtype).to_dict()
    kw = {"attn_implementation": attn, "dtype": dtype}
    if record is not None:
        kw.update(quantization_config=quant.config_from_record(record, dtype), device_map={"": torch.device(device)})
    try:
        if adapter_cfg.is_file():
            from peft import PeftModel

            base = json.loads(adapter_cfg.read_text()).get("base_model_name_or_path")
            if not base:
                raise VTGError(f"{adapter_cfg}: no base_model_name_or_path; cannot load the LoRA base")
            model = AutoModelForImageTextToText.from_pretrained(base, **kw)
            fast_vision(model)
            if record is not None and dequantize:
                model = model.dequantize().to(dtype)
            model = PeftModel.from_pretrained(model, str(path), is_trainable=trainable)
            tok_src = str(path) if (path / "tokenizer_config.json").is_file() else base
        else:
            model = AutoModelForImageTextToText.from_pretrained(source, **kw)
            fast_vision(model)
            tok_src = source
        tokenizer = AutoTokenizer.from_pretrained(tok_src)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:
        what = "its weights are corrupt or truncated: " if isinstance(e, SafetensorError) else ""
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise VTGError(f"cannot load model from {path_or_id}: {what}{first} (rebuild or re-export it, or name "
                       "another checkpoint)") from None
    if not trainable:
        model.to(device).eval().requires_grad_(False)
        return model, tokenizer
    if finetune is not None:
        model.config.use_cache = False
        if finetune.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        model = apply_finetune_mode(model, finetune.finetune, lora_r=finetune.lora_r, lora_alpha=finetune.lora_alpha,
                                    freeze_vision=finetune.freeze_vision)
    if quant.is_quantized(model):
        quant.accept_own_state(model)  # an engine's resume loads back the state dict it saved
    model.to(device).train()
    return model, tokenizer


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (a 4-bit weight counted unpacked)."""
    total = sum(quant.numel(p) for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total


LORA_TARGETS = list(DEFAULT.lora_text)
"""The default family's LoRA targets in the language model (`vtg.model.families`; a model's own: its family's)."""


def apply_finetune_mode(model, finetune: str, *, lora_r: int = 16, lora_alpha: int = 32,
                        freeze_vision: bool = False):
    """Full fine-tuning (optionally with the vision tower frozen) or peft LoRA on the language model; QLoRA is
    LoRA on a base loaded in 4-bit (`load_model_and_tokenizer` quantises it)."""
    visual = model.model.visual if hasattr(model, "model") and hasattr(model.model, "visual") else None
    if finetune == "qlora" and not quant.is_quantized(model):
        raise VTGError("finetune=qlora needs a base loaded in 4-bit (load_model_and_tokenizer with finetune does it)")
    if finetune in ("lora", "qlora"):
        # Not peft's prepare_model_for_kbit_training: it upcasts every parameter that is not 4-bit to fp32, a
        # second copy of the embeddings and lm_head that DeepSpeed casts back to engine.precision at once (and
        # the planner does not count); the base is frozen by get_peft_model, and gradient checkpointing's input
        # gradients are enabled above as for LoRA.
        from peft import LoraConfig, get_peft_model

        # Adapters on the language model, and on the vision blocks (qkv/proj) unless the tower is frozen, so
        # that an adapter-only export holds everything that trained.
        family = family_of(model.config)
        targets = list(family.lora_text) + ([] if freeze_vision else list(family.lora_vision))
        cfg = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=targets,
                         exclude_modules=r".*visual.*" if freeze_vision else None)
        model = get_peft_model(model, cfg)
    elif freeze_vision and visual is not None:
        for p in visual.parameters():
            p.requires_grad_(False)
    return model
