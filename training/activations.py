"""Activation memory of one micro-batch and the parameters that train: what `python -m training.preflight` adds
to the planner's model states (`training.plan`; the architecture model is `training.arch`), per GPU.

Activations (`activation_bytes`, used by `python -m training.preflight` and training's pre-flight) are a documented
estimate per micro-batch of b examples of s tokens, in bytes of 16-bit training (x2 for fp32). The form is
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), per GPT layer
s*b*h*(34 + 5*a*s/h): attention 11 + LayerNorms 4 + a 4h GeLU MLP 19, and 5*a*s^2*b for the attention scores
(softmax, dropout mask and output). Recounted for Qwen2.5-VL as transformers runs it, and checked against the
bytes autograd saves in a bf16 forward (transformers 5.24; tests/training/test_train_plan.py, within 15%):

- each text decoder layer (hidden h, heads a, MLP width i): s*b*h*(22 + 8*i/h) [+ 6*a*s^2*b with eager
  attention]. 22: attention (input, q, k, v, output; no dropout) and the two RMSNorms, which keep fp32
  copies; 8*i/h: the gated MLP's four i-wide 16-bit tensors (gate, up, silu(gate), their product) where GeLU
  keeps two 4h-wide ones. 6*a*s^2*b: eager attention keeps the fp32 softmax and its 16-bit copy;
  flash-attention-2 and PyTorch sdpa's fused kernels keep only O(s) softmax statistics, so no s^2 term.
- each vision block: s_v*b*w*(30 + 8*i_v/w) at the tower's own token count s_v (patches before the 2x2 merge:
  4 per LLM video token) and width w (its rotary embedding runs in fp32), + 6*a_v*s_v*span*b with eager
  attention (span: patches of one temporal group, the widest its attention reaches). A frozen tower
  (`freeze_vision`) stores nothing for backward and counts one block (its transient forward working set).
- the output layer: s*b*V*(2 + 4 + 4 + 4) bytes (16-bit logits, the fp32 copy the loss takes, the fp32
  log-softmax cross-entropy keeps, its fp32 gradient at the start of backward; fp32 training: no copy).
- with gradient checkpointing only each layer's input is kept (2*s*b*h per layer, the same per vision block)
  plus one layer's full activations while it is recomputed in backward (the larger of a text layer and a
  vision block); the output layer is not checkpointed.

Left out (each under one layer's worth): embeddings, the vision merger, norms outside the layers. Per GPU the
pre-flight adds model states + activations + `reserve_gb`, and compares with the declared GPU memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.arch import Arch

TEXT_LAYER_BASE, VISION_BLOCK_BASE = 22, 30
"""Bytes per token per hidden unit a layer keeps besides its MLP's i-wide tensors (module docstring)."""


@dataclass(frozen=True)
class Activations:
    """Bytes of activations per GPU for one micro-batch (see the module docstring for the formulas)."""

    text_b: float
    vision_b: float
    logits_b: float
    recompute_b: float
    """Checkpointing only: one layer's full activations while it is recomputed (0 without checkpointing)."""

    @property
    def total_b(self) -> float:
        return self.text_b + self.vision_b + self.logits_b + self.recompute_b


def activation_bytes(arch: Arch, seq: int, micro_batch: int, *, vision_patches: int = 0, vision_span: int = 0,
                     checkpointing: bool = False, precision: str = "bf16", train_vision: bool = True,
                     eager: bool = False) -> Activations:
    """Activation memory of one micro-batch of `micro_batch` examples of `seq` tokens (module docstring).

    `vision_patches`: vision tokens per example before the spatial merge; `vision_span`: patches one vision
    attention spans (one temporal group); `eager`: the attention scores are materialised (s x s per head).
    """
    unit = 1 if precision in ("bf16", "fp16") else 2      # the formulas count 16-bit bytes; fp32 doubles them
    s, b, h = seq, micro_batch, arch.hidden

    def layer(tokens: int, width: int, heads: int, inter: int, span: int, base: int) -> float:
        scores = 6 * heads * tokens * span * b if eager else 0
        return unit * (tokens * b * width * (base + 8 * inter / width) + scores)

    text_layer = layer(s, h, arch.heads, arch.intermediate, s, TEXT_LAYER_BASE)
    sv, wv = vision_patches, arch.vision_hidden
    vision_block = layer(sv, wv, arch.vision_heads, arch.vision_intermediate, vision_span or sv,
                         VISION_BLOCK_BASE) if sv else 0.0
    logits = s * b * arch.vocab * ((2 + 4 + 4 + 4) if unit == 1 else (4 + 4 + 4))
    if not checkpointing:
        vision = arch.vision_depth * vision_block if train_vision else vision_block
        return Activations(arch.layers * text_layer, vision, logits, 0.0)
    text = arch.layers * unit * 2 * s * b * h
    vision = arch.vision_depth * unit * 2 * sv * b * wv if train_vision else 0.0
    return Activations(text, vision, logits, max(text_layer, vision_block))


def trainable_params(arch: Arch, finetune: str, lora_r: int = 16, freeze_vision: bool = False) -> float:
    """Parameters that carry gradients and optimizer states: everything (full), everything but the vision tower
    (full + freeze_vision), or the LoRA adapters (r x (in + out) per adapted module, as peft matches
    vtg/model/modeling.py's targets by name: the 7 projections of every text layer; unless the tower is frozen
    also every vision block's qkv, proj, gate/up/down projections and the patch-embedding conv `proj`)."""
    total, _ = arch.param_count()
    h, i, w = arch.hidden, arch.intermediate, arch.vision_hidden
    if finetune == "full":
        return total - arch.vision_param_count() if freeze_vision else total
    kv = arch.text["num_key_value_heads"] * (h // arch.heads)
    per_layer = (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h)
    lora = lora_r * arch.layers * per_layer
    if not freeze_vision:
        iv, patch = arch.vision_intermediate, 3 * arch.temporal_patch_size * arch.patch_size ** 2
        block = (w + 3 * w) + (w + w) + 2 * (w + iv) + (iv + w)
        lora += lora_r * (arch.vision_depth * block + patch + w)
    return float(lora)
