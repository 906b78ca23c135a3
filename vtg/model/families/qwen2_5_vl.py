"""Qwen2.5-VL: per-frame processor facts (patch 14, CLIP mean/std), time through the temporal rope ids
(`second_per_grid_ts` x `vision_config.tokens_per_second`), the Qwen2 vocabulary. The embedded default's family."""

from vtg.model.families.base import CLIP_MEAN, CLIP_STD, Family, TokenizerFacts, template
from vtg.model.families.qwen_common import DENSE_LORA, QWEN2_5_VL_ADDED, QWEN_RANKS, SAMPLING, VISION_TOKENS

# docs/environment.md's recipe: text 64 wide x 2 layers, 4 heads / 2 KV heads, `mrope_section` [4, 2, 2]; vision
# 32 wide x 2 blocks, patch 14, merge 2, temporal patch 2.
TINY_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}}
TINY_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14,
               "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [1],
               "tokens_per_second": 2, "out_hidden_size": 64}

FAMILY = Family(
    name="qwen2_5_vl", model_types=("qwen2_5_vl",), config_class="Qwen2_5_VLConfig",
    model_class="Qwen2_5_VLForConditionalGeneration",
    processor={"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
               "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
               "image_mean": CLIP_MEAN, "image_std": CLIP_STD},
    processor_source="Qwen/Qwen2.5-VL-{3B,7B}-Instruct preprocessor_config.json on the Hugging Face hub",
    time_encoding="mrope", vision_tokens=VISION_TOKENS, lora_text=DENSE_LORA, lora_vision=("qkv", "proj"),
    blocks=("DecoderLayer", "VisionBlock"), sampling=SAMPLING, counted_from_shapes=True,
    # Qwen2.5-VL-Instruct chat_template (the same as Qwen2-VL's): as vendored in the MLX Swift VLM library
    # (ml-explore/mlx-swift-examples line), `Libraries/MLXVLM/Models/Qwen25VL.swift`,
    # `Qwen25VLProcessorConfiguration.chatTemplate`; the same text is in shell-nlp/gpt_server
    # `tests/test_chat_template.py` and in Qwen2-VL-2B-Instruct's processor config. A conversation that does not
    # open with a system turn gets the default one, "You are a helpful assistant.".
    tokenizer=TokenizerFacts(QWEN2_5_VL_ADDED, template("qwen2_5_vl"), 131_072, QWEN_RANKS),
    tiny=(TINY_TEXT, TINY_VISION),
)
