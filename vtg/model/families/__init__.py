"""Model families: the one home of what differs between VLM families (issue 22, issue 36). Each family is a module
here (`qwen2_5_vl.py`, `qwen3_vl.py`, `qwen3_5.py`: its `Family` record with its processor facts, tiny recipe,
tokenizer facts and chat template `<name>.jinja` beside it); this registry is the one line per family that
training, RL, evaluation, the builders, the GPU smoke test and the FSDP wrapper reach them through
(`family_of(config)`, `family_named(name)`), in the role of transformers' auto mappings. Nothing else names a
model class or a family (tests/test_contracts.py). Adding a family: docs/adding-a-family.md.

What differs (docs/architecture.md, "Model families"):
- the processor facts a checkpoint publishes: Qwen2.5-VL one `preprocessor_config.json` whose pixel bounds hold
  per frame (patch 14, CLIP mean/std); Qwen3-VL and Qwen3.5 a `video_preprocessor_config.json` whose bounds hold
  for the whole clip (t x h x w; patch 16, mean/std 0.5), with the sampling policy (fps, min/max frames);
- how the model is told the time: Qwen2.5-VL through its temporal rope ids (`second_per_grid_ts` x
  `tokens_per_second`), Qwen3-VL and Qwen3.5 through text (`<t.t seconds>` before each temporal patch);
- the layer classes (FSDP units, activation checkpointing) and LoRA target names (Qwen3.5's linear-attention
  layers have their own projections);
- the tokenizer (vocabulary, added tokens, chat template) and the tiny model's widths.
"""

from __future__ import annotations

import functools
import json

from vtg.errors import VTGError
from vtg.model.families import qwen2_5_vl, qwen3_5, qwen3_vl
from vtg.model.families.base import CLIP_MEAN, CLIP_STD, HALF, Family, TokenizerFacts

__all__ = ["CLIP_MEAN", "CLIP_STD", "DEFAULT", "FAMILIES", "HALF", "MODEL_CLASSES", "QWEN2_5_VL", "QWEN3_5",
           "QWEN3_VL", "Family", "TokenizerFacts", "config_cls_of", "family_named", "family_of", "meta_param_count",
           "model_cls_of"]

# ---- the registry: one line per family ------------------------------------------------------------------------
QWEN2_5_VL = qwen2_5_vl.FAMILY
QWEN3_VL = qwen3_vl.FAMILY
QWEN3_5 = qwen3_5.FAMILY

FAMILIES: dict[str, Family] = {f.name: f for f in (QWEN2_5_VL, QWEN3_VL, QWEN3_5)}
DEFAULT = QWEN2_5_VL
"""The family of the embedded default's tiny model and of the shipped Qwen2.5-VL recipes."""

MODEL_CLASSES = {t: classes for f in FAMILIES.values() for t, classes in f.model_classes.items()}
"""Model types whose classes differ from their family's (config class, model class)."""


def family_of(config) -> Family:
    """The family of a model config (or a model: its config), by `model_type`; an unknown one is a clear error."""
    config = getattr(config, "config", config)
    model_type = getattr(config, "model_type", None) if not isinstance(config, str) else config
    for f in FAMILIES.values():
        if model_type in f.model_types:
            return f
    known = ", ".join(t for f in FAMILIES.values() for t in f.model_types)
    raise VTGError(f"model_type {model_type!r}: no model family here knows it (known: {known}); a family is one "
                   "module in vtg/model/families/ and one line in its registry (docs/adding-a-family.md)")


def family_named(name: str) -> Family:
    if name not in FAMILIES:
        raise VTGError(f"unknown model family {name!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[name]


def config_cls_of(model_type: str):
    """The transformers config class of a model type (its own class where it differs from the family's)."""
    import transformers

    if model_type in MODEL_CLASSES:
        return getattr(transformers, MODEL_CLASSES[model_type][0])
    return family_of(model_type).config_cls()


def model_cls_of(config):
    """The transformers model class of a config (its model type's own class where it differs from the family's)."""
    import transformers

    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_CLASSES:
        return getattr(transformers, MODEL_CLASSES[model_type][1])
    return family_of(config).model_cls()


@functools.cache
def _meta_count(model_type: str, text: str, vision: str, tied: bool) -> tuple[float, float]:
    import torch
    import transformers

    config_cls = getattr(transformers, MODEL_CLASSES[model_type][0]) if model_type in MODEL_CLASSES else \
        family_of(model_type).config_cls()
    config = config_cls(text_config=json.loads(text), vision_config=json.loads(vision), tie_word_embeddings=tied)
    with torch.device("meta"):
        model = model_cls_of(config)(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    return float(total), float(largest)


def meta_param_count(model_type: str, text: dict, vision: dict, tied: bool) -> tuple[float, float]:
    """(total, largest single parameter) of a meta-device instance of the architecture (no memory, ~1 s)."""
    return _meta_count(model_type, json.dumps(text, sort_keys=True), json.dumps(vision, sort_keys=True), tied)
