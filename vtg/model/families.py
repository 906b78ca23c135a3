"""Model families: the one home of what differs between VLM families (issue 22). Training, RL, evaluation, the
builders, the GPU smoke test and the FSDP wrapper ask `family_of(config)`; nothing else names a model class
(tests/test_contracts.py). Adding a family is one `Family` here (and its facts files in `vtg/model/archs/`).

What differs (docs/architecture.md, "Model families"):
- the processor facts a checkpoint publishes: Qwen2.5-VL one `preprocessor_config.json` whose pixel bounds hold
  per frame (patch 14, CLIP mean/std); Qwen3-VL and Qwen3.5 a `video_preprocessor_config.json` whose bounds hold
  for the whole clip (t x h x w; patch 16, mean/std 0.5), with the sampling policy (fps, min/max frames);
- how the model is told the time: Qwen2.5-VL through its temporal rope ids (`second_per_grid_ts` x
  `tokens_per_second`), Qwen3-VL and Qwen3.5 through text (`<t.t seconds>` before each temporal patch);
- the layer classes (FSDP units, activation checkpointing) and LoRA target names (Qwen3.5's linear-attention
  layers have their own projections).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

from vtg.errors import VTGError

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    """`config.model_type` values of the family's checkpoints."""
    config_class: str
    model_class: str
    """transformers class names (`transformers.<name>`)."""
    processor: dict = field(repr=False)
    """The published `preprocessor_config.json` (what the builders write; a loaded checkpoint's own file wins)."""
    processor_source: str
    time_encoding: str
    """`mrope`: temporal rope ids from `second_per_grid_ts` x `vision_config.tokens_per_second`; `text`: the time
    of each temporal patch written before it (`<t.t seconds>`, Qwen3-VL's processor)."""
    vision_tokens: tuple[str, str, str]
    """(vision start, video pad, vision end) of the family's tokenizer."""
    lora_text: tuple[str, ...]
    """LoRA target module names in the language model."""
    lora_vision: tuple[str, ...]
    """... and in the vision tower (used when it is not frozen)."""
    blocks: tuple[str, ...]
    """Class-name suffixes of the layers wrapped one by one (FSDP units, activation checkpointing)."""
    video_processor: dict | None = field(default=None, repr=False)
    """The published `video_preprocessor_config.json` (None: videos use `processor`'s facts, per frame). Its
    pixel bounds hold for the whole clip (t x h x w), as `Qwen3VLVideoProcessor.resize` applies them."""
    sampling: dict = field(default_factory=dict, repr=False)
    """The family's frame-sampling policy (fps, min_frames, max_frames) where its processor states one."""
    packable: bool = True
    """Whether packed rows are exact (`vtg.model.packing`): every text layer is attention. Qwen3.5's Gated DeltaNet
    layers carry state along the row on the torch path, so its examples cannot share one."""

    def config_cls(self):
        import transformers

        return getattr(transformers, self.config_class)

    def model_cls(self):
        import transformers

        return getattr(transformers, self.model_class)

    def video_geometry(self):
        """The published video geometry (`vtg.model.geometry.Geometry`): patch sizes and pixel bounds."""
        from vtg.model.geometry import published_geometry

        return published_geometry(self.video_processor or self.processor,
                                  "video" if self.video_processor else "frame")

    @property
    def model_inputs(self) -> tuple[str, ...]:
        """The video inputs the model's forward takes besides the token tensors."""
        timing = ("second_per_grid_ts",) if self.time_encoding == "mrope" else ()
        return ("pixel_values_videos", "video_grid_thw", *timing)


QWEN2_5_VL = Family(
    name="qwen2_5_vl", model_types=("qwen2_5_vl",), config_class="Qwen2_5_VLConfig",
    model_class="Qwen2_5_VLForConditionalGeneration",
    processor={"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
               "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
               "image_mean": CLIP_MEAN, "image_std": CLIP_STD},
    processor_source="Qwen/Qwen2.5-VL-{3B,7B}-Instruct preprocessor_config.json on the Hugging Face hub",
    time_encoding="mrope", vision_tokens=("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"),
    lora_text=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    lora_vision=("qkv", "proj"), blocks=("DecoderLayer", "VisionBlock"),
    sampling={"fps": 2.0, "min_frames": 4, "max_frames": 768},
)

_QWEN3_IMAGE = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": HALF, "image_std": HALF,
                "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}
_QWEN3_VIDEO = {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": HALF, "image_std": HALF,
                "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor"}
_QWEN3_SOURCE = ("Qwen/Qwen3-VL-{2B,4B,8B}-Instruct preprocessor_config.json and video_preprocessor_config.json on "
                 "the Hugging Face hub (vtg/model/archs/qwen3_vl_*.json name the copies read); the sampling policy "
                 "(fps 2, 4-768 frames): Qwen3VLVideoProcessor's class defaults in transformers 5.24, which the "
                 "published video config leaves to them")

QWEN3_VL = Family(
    name="qwen3_vl", model_types=("qwen3_vl", "qwen3_vl_moe"), config_class="Qwen3VLConfig",
    model_class="Qwen3VLForConditionalGeneration", processor=_QWEN3_IMAGE, video_processor=_QWEN3_VIDEO,
    processor_source=_QWEN3_SOURCE, time_encoding="text",
    vision_tokens=("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"),
    lora_text=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    lora_vision=("qkv", "proj"), blocks=("DecoderLayer", "VisionBlock"),
    sampling={"fps": 2.0, "min_frames": 4, "max_frames": 768},
)
"""Qwen3-VL (dense; the MoE's `qwen3_vl_moe` shares its processor and time encoding: its model classes are
`Qwen3VLMoe*`, see `MODEL_CLASSES`)."""

QWEN3_5 = Family(
    name="qwen3_5", model_types=("qwen3_5",), config_class="Qwen3_5Config",
    model_class="Qwen3_5ForConditionalGeneration", processor=_QWEN3_IMAGE, video_processor=_QWEN3_VIDEO,
    processor_source="Qwen3.5 reuses Qwen3VLProcessor and Qwen3-VL's processor facts (" + _QWEN3_SOURCE + ")",
    time_encoding="text", vision_tokens=("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"),
    # full-attention layers (q/k/v/o) and the Gated DeltaNet layers' projections
    lora_text=("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj", "gate_proj",
               "up_proj", "down_proj"),
    lora_vision=("qkv", "proj"), blocks=("DecoderLayer", "VisionBlock"),
    sampling={"fps": 2.0, "min_frames": 4, "max_frames": 768}, packable=False,
)

FAMILIES: dict[str, Family] = {f.name: f for f in (QWEN2_5_VL, QWEN3_VL, QWEN3_5)}
DEFAULT = QWEN2_5_VL
"""The family of the embedded default's tiny model and of the shipped Qwen2.5-VL recipes."""

MODEL_CLASSES = {"qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration")}
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
                   "entry in vtg/model/families.py")


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
