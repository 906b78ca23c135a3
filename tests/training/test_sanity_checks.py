"""Every check of `training/sanity.py` fires once, with the message the user reads (issue 37, item 5).

Where a user can produce the bad input (a tokenizer export edited by hand, hand-written shards, a LoRA export used
as a full fine-tuning base, a LoRA rank too large for the model), `python -m training` runs in-process on it and
stops before step 1 with a `SanityError` (the CLI prints it as `error: <message>`, exit 2). Where no input reaches
a check (a state the loader never returns), the check is called on a real tiny model or a real encoded example in
the state it guards against, and the test says why. The manifest, chat-template and max_seq_len checks fire in
test_train_shard_faults.py and test_train_loop.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from support.train_fixtures import write_undecodable_shard

from training.__main__ import main
from training.sanity import SanityError, check_examples, check_model
from vtg.config.train import ModelConfig
from vtg.model.modeling import count_parameters, load_model_and_tokenizer
from vtg.model.processing import VisionParams, encode_example, save_processor_config


def _refusal(shards_dir: Path, out: Path, *overrides: str) -> str:
    """`python -m training` with small-run settings: the SanityError's message; nothing was written."""
    argv = [f"train.shards_dir={shards_dir}", f"train.out_dir={out}", "train.micro_batch_size=4",
            "train.max_steps=2", "train.progress=false", "train.data.num_workers=0", "train.data.sanity_examples=4",
            "tracking.enabled=false", "train.teach.steps=0", "evaluate.forgetting.suite=", *overrides]
    with pytest.raises(SanityError) as e:
        main(argv)
    assert not out.exists()  # refused before the engine: no checkpoint folder
    return str(e.value)


def _edited_export(src: Path, dst: Path, config: dict | None = None, added: dict | None = None) -> Path:
    """A copy of the tiny export with its tokenizer files edited by hand: `config` keys of tokenizer_config.json
    set (None: removed), `added` flags set on the eos entry of tokenizer.json's added_tokens."""
    shutil.copytree(src, dst)
    path = dst / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg = {k: v for k, v in {**cfg, **(config or {})}.items() if v is not None}
    path.write_text(json.dumps(cfg))
    path = dst / "tokenizer.json"
    tok = json.loads(path.read_text())
    for entry in tok["added_tokens"]:
        if entry["content"] == cfg.get("eos_token"):
            entry.update(added or {})
    path.write_text(json.dumps(tok))
    return dst


@pytest.fixture(scope="module")
def tiny_full(tiny_model_dir):
    """The tiny model as SFT builds it for full fine-tuning (train mode, every weight trainable) and its tokenizer."""
    torch.manual_seed(0)
    return load_model_and_tokenizer(tiny_model_dir, dtype=torch.float32, trainable=True, finetune=ModelConfig())


def _vision_ids(model) -> set[int]:
    c = model.config
    return {c.video_token_id, c.image_token_id, c.vision_start_token_id, c.vision_end_token_id}


def _example(model, tokenizer, answer: str | None) -> dict:
    frames = np.random.default_rng(0).integers(0, 256, size=(8, 56, 56, 3), dtype=np.uint8)
    return encode_example(tokenizer, frames, [i * 1.5 for i in range(8)], "the red square appears", answer,
                          vision=VisionParams.from_model(model), key="vid-0000#0")


# ---- the tokenizer -------------------------------------------------------------------------------------------
def test_an_export_without_an_eos_token_is_refused(shards_dir, tiny_model_dir, tmp_path):
    """`eos_token` deleted from tokenizer_config.json: every answer ends with eos, so nothing could train."""
    base = _edited_export(tiny_model_dir, tmp_path / "no_eos", config={"eos_token": None})
    message = _refusal(shards_dir, tmp_path / "ck", f"train.model.base={base}")
    assert message.startswith("the tokenizer has no eos token")
    assert "set `eos_token` in the export's tokenizer_config.json" in message and "<|im_end|>" in message


def test_an_export_without_a_pad_token_is_refused(shards_dir, tiny_model_dir, tmp_path):
    """`pad_token` deleted from tokenizer_config.json: batches could not be padded."""
    base = _edited_export(tiny_model_dir, tmp_path / "no_pad", config={"pad_token": None})
    message = _refusal(shards_dir, tmp_path / "ck", f"train.model.base={base}")
    assert message.startswith("the tokenizer has no pad token")
    assert "set `pad_token` in the export's tokenizer_config.json to a token other than eos" in message
    assert "<|endoftext|>" in message


def test_an_eos_token_the_model_does_not_have_is_refused(shards_dir, tiny_model_dir, tmp_path):
    """`eos_token: "</s>"` (another family's eos) in a Qwen export's tokenizer_config.json: the tokenizer adds it past
    the vocabulary, an id with no embedding row, which every answer would end with."""
    base = _edited_export(tiny_model_dir, tmp_path / "foreign_eos", config={"eos_token": "</s>"})
    message = _refusal(shards_dir, tmp_path / "ck", f"train.model.base={base}")
    assert message.startswith("the tokenizer's eos token '</s>' has id ")
    assert "it is not one of the model's tokens" in message and "set `eos_token`" in message and "<|im_end|>" in message


# ---- the first examples --------------------------------------------------------------------------------------
def test_a_pad_token_that_is_the_eos_puts_pad_ids_in_the_labels(shards_dir, tiny_model_dir, tmp_path):
    """The common `tokenizer.pad_token = tokenizer.eos_token`, saved: every answer's last label is the pad id."""
    base = _edited_export(tiny_model_dir, tmp_path / "pad_is_eos", config={"pad_token": "<|im_end|>"})
    message = _refusal(shards_dir, tmp_path / "ck", f"train.model.base={base}")
    assert "labels contain vision/pad token ids [2]" in message  # <|im_end|> is id 2 in the tiny vocabulary
    assert "the tokenizer's pad token is its eos token '<|im_end|>'" in message
    assert "set `pad_token` in the export's tokenizer_config.json to a token other than eos" in message


def test_an_eos_the_tokenizer_splits_after_an_answer_leaves_the_answer_without_it(shards_dir, tiny_model_dir,
                                                                                  tmp_path):
    """The eos entry of tokenizer.json marked `single_word` (matched only standing alone): after an answer's last
    word its text is split into ordinary tokens, so the labels end without the eos id and the model would never
    learn to stop (encode_example appends the eos and refuses to cut an answer; this is how an answer without it
    reaches training)."""
    base = _edited_export(tiny_model_dir, tmp_path / "eos_single_word", added={"single_word": True})
    message = _refusal(shards_dir, tmp_path / "ck", f"train.model.base={base}")
    assert "the answer does not end with the eos token '<|im_end|>' (id 2" in message
    assert "the model would not learn to stop" in message and "`single_word`" in message


def test_shards_whose_frames_are_not_jpeg_have_no_decodable_example(tmp_path):
    """Hand-written shards whose frames are raw pixel bytes (not JPEG-encoded): every sample is skipped. (Without
    this check the run spins on empty batches, never taking a step.)"""
    write_undecodable_shard(tmp_path / "shards")
    message = _refusal(tmp_path / "shards", tmp_path / "ck")
    assert message.startswith("no decodable training examples in the first shards (first error: bad_sample: ")
    assert "trainvid000-0000" in message and "nothing would train" in message
    assert "re-run preprocess, python -m beam_jobs.preprocess" in message


def test_an_example_without_an_answer_has_an_empty_answer_mask(tiny_full):
    """No input reaches this check: every encoded answer holds at least the eos. An example encoded as a prompt
    (`answer=None`, what evaluation and RL encode) is the state it guards against."""
    model, tokenizer = tiny_full
    prompt = _example(model, tokenizer, None)
    with pytest.raises(SanityError, match=r"^vid-0000#0: empty answer mask \(no label tokens\): nothing would be "
                                          r"learned from it \(encoded as a prompt, without its answer\?\)$"):
        check_examples([prompt], [], tokenizer, _vision_ids(model), 4096)
    check_examples([_example(model, tokenizer, "1.5 - 4.5 seconds")], [], tokenizer, _vision_ids(model), 4096)


# ---- the model -------------------------------------------------------------------------------------------------
def test_a_lora_rank_that_outweighs_the_model_is_refused(shards_dir, tmp_path):
    """`train.model.lora_r=64` on the tiny model (64 wide): the adapters hold 56% of the parameters."""
    message = _refusal(shards_dir, tmp_path / "ck", "train.model.finetune=lora", "train.model.lora_r=64")
    assert re.match(r"train.model.finetune=lora trains [\d,]+/[\d,]+ parameters \(5\d%\): the adapters outweigh "
                    r"the model they adapt", message), message
    assert "lower train.model.lora_r or set train.model.finetune=full" in message


@pytest.fixture(scope="module")
def adapter_export(tiny_model_dir, tmp_path_factory) -> Path:
    """A LoRA run's export (`hf/`), written as the lifecycle writes it: the adapter, the tokenizer, the processor."""
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, dtype=torch.float32, trainable=True,
                                                finetune=ModelConfig(finetune="lora"))
    out = tmp_path_factory.mktemp("lora_run") / "hf"
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    save_processor_config(model, out)
    assert (out / "adapter_config.json").is_file()
    return out


def test_full_fine_tuning_from_a_lora_export_trains_only_the_adapters(shards_dir, adapter_export, tmp_path):
    """`train.model.base=<a LoRA run's hf/>` with `finetune=full`: the base loads frozen under its adapters."""
    message = _refusal(shards_dir, tmp_path / "ck", f"train.model.base={adapter_export}")
    assert re.match(r"train.model.finetune=full trains only [\d,]+/[\d,]+ parameters \(\d+ tensors frozen, e.g. "
                    r"base_model\.model\.", message), message
    assert "train.model.base is a LoRA adapter export, its base loads frozen" in message
    assert "python -m training.merge --checkpoint <its checkpoint> --alpha 1" in message


def test_a_model_in_eval_mode_is_refused(tiny_full):
    """No input reaches this check: the loader returns a trainable model in train mode. The same model after
    `.eval()` is the state it guards against."""
    model, _ = tiny_full
    trainable, total = count_parameters(model)
    model.eval()
    try:
        with pytest.raises(SanityError, match=r"^the model is in eval mode before step 1"):
            check_model(model, "full", False, trainable, total)
    finally:
        model.train()


def test_a_model_with_nothing_trainable_is_refused(tiny_model_dir):
    """No input reaches this check (each finetune mode leaves something trainable). A model loaded for evaluation
    (`trainable=False`: every weight frozen), put in train mode, is the state it guards against."""
    model, _ = load_model_and_tokenizer(tiny_model_dir, dtype=torch.float32)
    model.train()
    trainable, total = count_parameters(model)
    with pytest.raises(SanityError, match=r"^no trainable parameters \(all [\d,]+ frozen\): nothing would train"):
        check_model(model, "full", False, trainable, total)


def test_freeze_vision_that_freezes_nothing_is_refused(tiny_full):
    """No shipped family reaches this check: each has its tower at `model.visual`, where apply_finetune_mode
    freezes it. A full fine-tuning model whose tower was left trainable is the state it guards against."""
    model, _ = tiny_full
    trainable, total = count_parameters(model)
    with pytest.raises(SanityError, match=r"^train.model.freeze_vision=true, but the vision tower trains: .* set "
                                          r"train.model.freeze_vision=false"):
        check_model(model, "full", True, trainable, total)


@pytest.mark.parametrize("finetune,freeze_vision", [("full", False), ("full", True), ("lora", False),
                                                    ("lora", True)])
def test_the_model_checks_pass_what_each_finetune_mode_builds(tiny_model_dir, finetune, freeze_vision):
    """No false alarm: the model each mode builds from the tiny base passes."""
    model, _ = load_model_and_tokenizer(tiny_model_dir, dtype=torch.float32, trainable=True,
                                        finetune=ModelConfig(finetune=finetune, freeze_vision=freeze_vision))
    check_model(model, finetune, freeze_vision, *count_parameters(model))
