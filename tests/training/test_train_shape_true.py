"""Shape-true builder (vtg/model/shape_true.py): architecture facts, widths and head layout, token ids, reload.

The 3B build (1 text layer, 1 vision block, vocab 1024: 138 M parameters, 0.5 GB) is cached like the tiny
model, so only the first run pays its ~15 s.
"""

import json

import numpy as np
import pytest
import torch

from vtg.errors import ConfigError
from vtg.model import shape_true
from vtg.model.modeling import LORA_TARGETS, apply_finetune_mode, load_model_and_tokenizer, resolve_base
from vtg.model.processing import VisionParams, collate, encode_example, model_inputs

B3, B7 = "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct"
SPEC_3B = f"shape-true:{B3}?vocab=1024"


@pytest.fixture(scope="module")
def st3b():
    return shape_true.build_shape_true(B3, vocab=1024)


def _meta_model(config):
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        return Qwen2_5_VLForConditionalGeneration(config)


def test_arch_facts_are_the_published_numbers():
    f3, f7 = shape_true.arch_facts(B3), shape_true.arch_facts(B7.upper())  # case-insensitive
    assert f3["hub_id"] == B3 and f7["hub_id"] == B7
    assert shape_true.arch_facts("tiny") is None and shape_true.arch_facts(f"shape-true:{B3}") is None
    t3, t7, v3, v7 = f3["text"], f7["text"], f3["vision"], f7["vision"]
    assert (t3["hidden_size"], t3["intermediate_size"], t3["num_hidden_layers"], t3["num_attention_heads"],
            t3["num_key_value_heads"], t3["vocab_size"], t3["tie_word_embeddings"]) == (
        2048, 11008, 36, 16, 2, 151936, True)
    assert (t7["hidden_size"], t7["intermediate_size"], t7["num_hidden_layers"], t7["num_attention_heads"],
            t7["num_key_value_heads"], t7["vocab_size"], t7["tie_word_embeddings"]) == (
        3584, 18944, 28, 28, 4, 152064, False)
    for t, v, out in ((t3, v3, 2048), (t7, v7, 3584)):
        head_dim = t["hidden_size"] // t["num_attention_heads"]
        assert head_dim == 128 and sum(t["rope_scaling"]["mrope_section"]) == head_dim // 2
        assert t["rope_scaling"]["mrope_section"] == [16, 24, 24] and t["rope_theta"] == 1e6
        assert (v["depth"], v["hidden_size"], v["num_heads"], v["intermediate_size"], v["patch_size"],
                v["spatial_merge_size"], v["temporal_patch_size"], v["window_size"], v["fullatt_block_indexes"],
                v["tokens_per_second"], v["out_hidden_size"], v["in_chans"]) == (
            32, 1280, 16, 3420, 14, 2, 2, 112, [7, 15, 23, 31], 2, out, 3)
    for f in (f3, f7):
        assert f["token_ids"] == {"bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
                                  "vision_end_token_id": 151653, "vision_token_id": 151654,
                                  "image_token_id": 151655, "video_token_id": 151656}


@pytest.mark.parametrize("hub_id", [B3, B7])
def test_full_config_from_facts_has_the_published_parameter_count(hub_id):
    """The facts rebuilt into a full-depth model (on the meta device) hold exactly the parameters of the published
    safetensors (3,754,622,976 and 8,292,166,656), and training/plan.py's table agrees."""
    from training.plan import KNOWN_SIZES

    facts = shape_true.arch_facts(hub_id)
    model = _meta_model(shape_true.hub_config(facts))
    assert sum(p.numel() for p in model.parameters()) == facts["total_params"]
    assert KNOWN_SIZES[hub_id.lower()][0] == pytest.approx(facts["total_params"], rel=2e-3)
    assert KNOWN_SIZES[hub_id.lower()][1] == facts["text"]["vocab_size"] * facts["text"]["hidden_size"]


@pytest.mark.parametrize("hub_id", [B3, B7])
def test_cut_config_keeps_every_width_and_the_head_layout(hub_id):
    facts = shape_true.arch_facts(hub_id)
    cut, _ = shape_true.shape_true_config(hub_id, text_layers=2, vision_blocks=2, vocab=1024)
    full = shape_true.hub_config(facts)
    assert cut.text_config.num_hidden_layers == 2 and cut.vision_config.depth == 2
    assert cut.text_config.vocab_size == 1024 and cut.vision_config.fullatt_block_indexes == [1]
    same_text = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "hidden_act",
                 "rms_norm_eps", "max_position_embeddings", "rope_parameters")
    same_vision = ("hidden_size", "intermediate_size", "num_heads", "patch_size", "spatial_merge_size",
                   "temporal_patch_size", "window_size", "tokens_per_second", "out_hidden_size", "in_channels")
    for k in same_text:
        assert getattr(cut.text_config, k) == getattr(full.text_config, k), k
    for k in same_vision:
        assert getattr(cut.vision_config, k) == getattr(full.vision_config, k), k
    assert cut.tie_word_embeddings == full.tie_word_embeddings == facts["text"]["tie_word_embeddings"]
    # Every parameter of the cut model has its real shape (the vocabulary rows aside).
    cut_params = dict(_meta_model(cut).named_parameters())
    full_params = dict(_meta_model(full).named_parameters())
    for name, p in cut_params.items():
        want = full_params[name].shape
        if "embed_tokens" in name or "lm_head" in name:
            want = (1024, *want[1:])
        assert p.shape == want, name


def test_full_attention_blocks_follow_the_cut_depth():
    real = [7, 15, 23, 31]
    assert [shape_true.cut_fullatt_blocks(real, d) for d in (1, 2, 8, 9, 16, 32)] == [
        [0], [1], [7], [7, 8], [7, 15], real]


def test_real_vocabulary_keeps_the_real_token_ids():
    """Uncut vocabulary: the tokenizer is the real one (Qwen's ranks rebuilt offline), so the config keeps the
    published ids and a prompt has a real checkpoint's tokens."""
    config, tok = shape_true.shape_true_config(B7)
    facts = shape_true.arch_facts(B7)["token_ids"]
    assert config.text_config.vocab_size == 152064 and len(tok) == 151665
    assert (config.image_token_id, config.video_token_id, config.vision_start_token_id,
            config.vision_end_token_id) == (facts["image_token_id"], facts["video_token_id"],
                                            facts["vision_start_token_id"], facts["vision_end_token_id"])
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|video_pad|>"]) == [
        151643, 151644, 151645, 151656]
    assert (config.text_config.eos_token_id, config.text_config.pad_token_id) == (151645, 151643)
    assert tok("Hello world!", add_special_tokens=False)["input_ids"] == [9707, 1879, 0]
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")  # Qwen2.5-VL's own


def test_spec_parsing_and_errors():
    assert shape_true.parse_spec(f"shape-true:{B3}") == {"base": B3}
    assert shape_true.parse_spec(f"shape-true:{B7}?text_layers=2&vision_blocks=3&vocab=1024&seed=5") == {
        "base": B7, "text_layers": 2, "vision_blocks": 3, "vocab": 1024, "seed": 5}
    with pytest.raises(ConfigError, match="unknown option 'layers'"):
        shape_true.parse_spec(f"shape-true:{B3}?layers=2")
    with pytest.raises(ConfigError, match="no architecture facts"):
        shape_true.parse_spec("shape-true:Qwen/Qwen9-VL")
    with pytest.raises(ConfigError, match="text_layers must be in 1..36"):
        shape_true.shape_true_config(B3, text_layers=37)
    with pytest.raises(ConfigError, match="smaller than the local tokenizer"):
        shape_true.shape_true_config(B3, vocab=100)


def test_build_has_real_widths_consistent_ids_and_reloads_with_equal_logits(st3b, tmp_path):
    assert resolve_base(SPEC_3B) == str(st3b)  # the training/evaluation base resolves to the cached build
    marker = json.loads((st3b / shape_true.MARKER).read_text())
    assert marker["hub_id"] == B3 and marker["vocab"] == 1024 and marker["text_layers"] == 1
    model, tok = load_model_and_tokenizer(SPEC_3B)
    cfg = model.config
    layer = model.model.language_model.layers[0]
    assert len(model.model.language_model.layers) == 1 and len(model.model.visual.blocks) == 1
    assert layer.self_attn.q_proj.weight.shape == (2048, 2048) and layer.self_attn.k_proj.weight.shape == (256, 2048)
    assert layer.mlp.gate_proj.weight.shape == (11008, 2048)
    assert model.model.visual.blocks[0].attn.qkv.weight.shape == (3 * 1280, 1280)
    assert model.model.visual.merger.mlp[-1].weight.shape == (2048, 5120)
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight  # tied, like the 3B
    assert cfg.vision_config.fullatt_block_indexes == [0]
    ids = dict(zip(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"],
                   tok.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                              "<|vision_end|>"])))
    assert (cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id) == tuple(
        ids.values())
    assert (cfg.text_config.eos_token_id, cfg.text_config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert max(ids.values()) < cfg.text_config.vocab_size == 1024

    frames = np.random.default_rng(0).integers(0, 256, size=(4, 56, 56, 3), dtype=np.uint8)
    batch = model_inputs(collate([encode_example(tok, frames, [0.5, 1.5, 2.5, 3.5], "the red square appears",
                                                 "1.0 - 2.0 seconds", vision=VisionParams.from_model_config(cfg))],
                                 tok.pad_token_id))
    with torch.no_grad():
        want = model(**batch).logits
        model.save_pretrained(tmp_path / "again")
        tok.save_pretrained(tmp_path / "again")
        got = load_model_and_tokenizer(tmp_path / "again")[0](**batch).logits
    assert want.shape[-1] == 1024 and torch.isfinite(want).all()
    assert torch.equal(want, got)


def test_lora_targets_are_the_real_module_names(st3b):
    """The recipe's LoRA (freeze_vision) adapts exactly the 7 text projections of every decoder layer."""
    model, _ = load_model_and_tokenizer(st3b)
    peft_model = apply_finetune_mode(model, "lora", lora_r=16, lora_alpha=32, freeze_vision=True)
    adapted = {n.removesuffix(".lora_A.default.weight") for n, _ in peft_model.named_parameters()
               if n.endswith("lora_A.default.weight")}
    assert not any("visual" in n for n in adapted)
    assert sorted(n.rsplit(".", 1)[-1] for n in adapted) == sorted(LORA_TARGETS)
    assert all(".language_model.layers.0." in n for n in adapted)
