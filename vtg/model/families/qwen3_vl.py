"""Qwen3-VL (dense, and the MoE's `qwen3_vl_moe`, which shares its processor and time encoding but has its own
`Qwen3VLMoe*` classes): a whole-clip video processor (patch 16, mean/std 0.5), time as text (`<t.t seconds>`
before each temporal patch), the Qwen3 vocabulary."""

from vtg.model.families.base import Family, TokenizerFacts, template
from vtg.model.families.qwen_common import (
    DENSE_LORA,
    QWEN3_IMAGE,
    QWEN3_SOURCE,
    QWEN3_VIDEO,
    QWEN3_VL_ADDED,
    QWEN_RANKS,
    SAMPLING,
    TINY_QWEN3_TEXT,
    TINY_QWEN3_VISION,
    VISION_TOKENS,
)

FAMILY = Family(
    name="qwen3_vl", model_types=("qwen3_vl", "qwen3_vl_moe"), config_class="Qwen3VLConfig",
    model_class="Qwen3VLForConditionalGeneration", processor=QWEN3_IMAGE, video_processor=QWEN3_VIDEO,
    processor_source=QWEN3_SOURCE, time_encoding="text", vision_tokens=VISION_TOKENS, lora_text=DENSE_LORA,
    lora_vision=("qkv", "proj"), blocks=("DecoderLayer", "VisionBlock"), sampling=SAMPLING,
    model_classes={"qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration")},
    # Qwen3-VL-Instruct chat_template (no default system turn; tool and tool_response turns; no thinking block):
    # the `chat_template_qwen3vl` constant of a version of `src/gui_actor/constants.py` in the microsoft/GUI-Actor
    # code line. Its sha256 (3636d0f0...) is the one vtg/model/archs/tokenizers_notes.md records for the template
    # shipped in Qwen/Qwen3-VL-8B-Instruct-GGUF; the same text is in a C++ test of the caiwei project, and its
    # opening is the one of the Qwen3-VL-30B-A3B-Instruct processor config mirrored at ai-nexus-293.pages.dev.
    tokenizer=TokenizerFacts(QWEN3_VL_ADDED, template("qwen3_vl"), 262_144, QWEN_RANKS),
    # 4 layers: with time as text the model must find the frames that show the event and read the time written
    # before them; 2 layers of 64 reached test R@1@0.5 0.63-0.83, 4 layers 0.85 (docs/results.md)
    tiny=({**TINY_QWEN3_TEXT, "num_hidden_layers": 4}, TINY_QWEN3_VISION),
)
