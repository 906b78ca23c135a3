"""Qwen3.5: Qwen3-VL's processor facts and time encoding over a hybrid text model (Gated DeltaNet and full
attention layers: packed rows are not exact), its own 248k vocabulary and a reconstructed chat template."""

from vtg.model.families.base import Family, TokenizerFacts, template
from vtg.model.families.qwen_common import (
    QWEN3_5_ADDED,
    QWEN3_5_RANKS,
    QWEN3_IMAGE,
    QWEN3_SOURCE,
    QWEN3_VIDEO,
    SAMPLING,
    TINY_QWEN3_TEXT,
    TINY_QWEN3_VISION,
    VISION_TOKENS,
)

FAMILY = Family(
    name="qwen3_5", model_types=("qwen3_5",), config_class="Qwen3_5Config",
    model_class="Qwen3_5ForConditionalGeneration", processor=QWEN3_IMAGE, video_processor=QWEN3_VIDEO,
    processor_source="Qwen3.5 reuses Qwen3VLProcessor and Qwen3-VL's processor facts (" + QWEN3_SOURCE + ")",
    time_encoding="text", vision_tokens=VISION_TOKENS,
    # full-attention layers (q/k/v/o) and the Gated DeltaNet layers' projections
    lora_text=("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj", "gate_proj",
               "up_proj", "down_proj"),
    lora_vision=("qkv", "proj"), blocks=("DecoderLayer", "VisionBlock"), sampling=SAMPLING, packable=False,
    # The Qwen3-VL template with Qwen3.5's generation prompt (`<|im_start|>assistant\n<think>\n\n</think>\n\n`,
    # thinking off, the 0.8B/2B default; `<think>\n` with enable_thinking): reconstructed, not the published text
    # (vtg/model/qwen_tokenizer.py, docs/tokenizer-sources.md)
    tokenizer=TokenizerFacts(QWEN3_5_ADDED, template("qwen3_5"), 262_144, QWEN3_5_RANKS),
    # 3 Gated DeltaNet layers + 1 full-attention layer
    tiny=({**TINY_QWEN3_TEXT, "num_hidden_layers": 4, "partial_rotary_factor": 0.5,
           "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_conv_kernel_dim": 4,
           "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
           "linear_num_value_heads": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                               "mrope_interleaved": True, "partial_rotary_factor": 0.5}},
          {k: v for k, v in TINY_QWEN3_VISION.items() if k != "deepstack_visual_indexes"}),
)
