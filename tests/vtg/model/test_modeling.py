"""Tiny model build (deterministic, cached), loading full and LoRA exports, attention choice."""

import logging

import numpy as np
import torch

from vtg.model.modeling import (
    apply_finetune_mode,
    choose_attn_implementation,
    count_parameters,
    load_model_and_tokenizer,
)
from vtg.model.processing import collate, encode_example, model_inputs
from vtg.model.tiny import build_tiny_model, build_tokenizer


def _batch(tok):
    frames = np.random.default_rng(0).integers(0, 256, size=(4, 56, 56, 3), dtype=np.uint8)
    return model_inputs(collate([encode_example(tok, frames, [0, 1, 2, 3], "q", "1.0 - 2.0 seconds")],
                                tok.pad_token_id))


def test_tiny_build_is_deterministic_and_cached(tmp_path, tiny_model_dir):
    again = build_tiny_model(tmp_path / "m", seed=0)
    assert (again / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    assert build_tiny_model(seed=0) == tiny_model_dir  # cache hit, same directory


def test_the_tiny_tokenizer_built_alone_is_the_saved_one(tiny_tokenizer):
    """Ingest counts query tokens with `build_tokenizer` when no tiny model is built (`vtg.model.tiny.tiny_tokenizer`,
    no torch): it must be the tokenizer the built model saved, token for token."""
    alone = build_tokenizer(0)
    assert alone.get_vocab() == tiny_tokenizer.get_vocab() and len(alone) == len(tiny_tokenizer)
    for text in ("When does the red ball appear?", "Zebra xyz <|im_end|> 12.5 \u00fcn\u00efcode", "3.0 - 7.5 seconds", ""):
        assert alone(text, split_special_tokens=True)["input_ids"] == \
            tiny_tokenizer(text, split_special_tokens=True)["input_ids"]
    assert alone.chat_template == tiny_tokenizer.chat_template


def test_attention_choice_logs_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="vtg.model.modeling"):
        assert choose_attn_implementation("auto", "cpu") == "sdpa"
    assert [r.message for r in caplog.records] == ["attention implementation: sdpa (no CUDA device)"]


def test_lora_export_reloads_with_identical_logits(tmp_path, tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    peft_model = apply_finetune_mode(model, "lora", lora_r=4, lora_alpha=8, freeze_vision=True)
    trainable, total = count_parameters(peft_model)
    assert 0 < trainable < total / 5
    assert not any(p.requires_grad for n, p in peft_model.named_parameters() if "visual" in n)
    with torch.no_grad():  # make the adapter non-trivial
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    peft_model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    batch = _batch(tok)
    with torch.no_grad():
        want = peft_model(**batch).logits
        reloaded, _ = load_model_and_tokenizer(tmp_path / "hf")
        got = reloaded(**batch).logits
    assert torch.equal(want, got)
