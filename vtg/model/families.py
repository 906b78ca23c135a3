"""Model families: the one home of what differs between VLM families (issue 22). Training, RL, evaluation, the
builders, the GPU smoke test and the FSDP wrapper ask `family_of(config)`; nothing else names a model class
(tests/test_contracts.py). Adding a family is one `Family` here (and its facts files in `vtg/model/archs/`).

Today: Qwen2.5-VL. Qwen3-VL and Qwen3.5 (DESIGN notes in docs/architecture.md, "Model families") come next: they
differ in their processor facts (patch 16, mean/std 0.5), their time encoding (`<t seconds>` text per temporal
patch instead of MRoPE temporal ids) and their layer classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vtg.errors import VTGError


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
    of each temporal patch written before it."""
    vision_tokens: tuple[str, str, str]
    """(vision start, video pad, vision end) of the family's tokenizer."""
    lora_text: tuple[str, ...]
    """LoRA target module names in the language model."""
    lora_vision: tuple[str, ...]
    """... and in the vision tower (used when it is not frozen)."""
    blocks: tuple[str, ...]
    """Class-name suffixes of the layers wrapped one by one (FSDP units, activation checkpointing)."""

    def config_cls(self):
        import transformers

        return getattr(transformers, self.config_class)

    def model_cls(self):
        import transformers

        return getattr(transformers, self.model_class)


QWEN2_5_VL = Family(
    name="qwen2_5_vl", model_types=("qwen2_5_vl",), config_class="Qwen2_5_VLConfig",
    model_class="Qwen2_5_VLForConditionalGeneration",
    processor={"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
               "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
               "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]},
    processor_source="Qwen/Qwen2.5-VL-{3B,7B}-Instruct preprocessor_config.json on the Hugging Face hub",
    time_encoding="mrope", vision_tokens=("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"),
    lora_text=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    lora_vision=("qkv", "proj"), blocks=("DecoderLayer", "VisionBlock"),
)

FAMILIES: dict[str, Family] = {f.name: f for f in (QWEN2_5_VL,)}
DEFAULT = QWEN2_5_VL
"""The family of the embedded default's tiny model and of the shipped recipes."""


def family_of(config) -> Family:
    """The family of a model config (or a model: its config), by `model_type`; an unknown one is a clear error."""
    config = getattr(config, "config", config)
    model_type = getattr(config, "model_type", None)
    for f in FAMILIES.values():
        if model_type in f.model_types:
            return f
    known = ", ".join(t for f in FAMILIES.values() for t in f.model_types)
    raise VTGError(f"model_type {model_type!r}: no model family here knows it (known: {known}); a family is one "
                   "entry in vtg/model/families.py")
