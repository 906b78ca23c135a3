"""Issue 25 item 3: packing is exact. Examples of different lengths laid end to end in rows
(`vtg.model.packing`) give the padded batch's loss and gradients within fp32 tolerance for each family whose text
layers are attention (Qwen2.5-VL with its temporal rope, and with text timestamps; Qwen3-VL), in rows of the
longest example (sdpa) and in one row (flash-attn's layout); no token attends across examples; Qwen3.5 (linear
attention) is refused; the training loop trains the same steps packed as padded and resumes bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from support.train_fixtures import train_config

from training.batching import packed_batches, padding_fraction, token_budget_batches
from training.sft import train
from vtg import shards
from vtg.errors import VTGError
from vtg.model.packing import (
    check_packable,
    first_fit_rows,
    pack,
    packed_inputs,
    rope_owner,
)
from vtg.model.processing import VisionParams, answer_text, collate, encode_example, model_inputs
from vtg.testing.shards import synthetic_window

CASES = [("qwen2_5_vl", "native"), ("qwen2_5_vl", "text"), ("qwen3_vl", "native")]
SIZES = [(8, 64, 64), (4, 56, 84), (16, 64, 48), (6, 48, 48), (10, 56, 56)]
"""(frames, height, width) of five examples: lengths differ by video, aspect and query."""


def _examples(tok, model, mode: str) -> list[dict]:
    rng = np.random.default_rng(0)
    vp = VisionParams.from_model(model)
    out = []
    for q, (n, h, w) in enumerate(SIZES):
        frames = rng.integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)
        out.append(encode_example(tok, frames, [0.5 * i for i in range(n)], "when does the red square appear " * (q + 1), answer_text([(0.5 * q, 0.5 * q + 1.0)]), vision=vp, key=f"v{q}",
                                  timestamps_mode=mode))
    return out


def _loss_and_grads(model, inputs: dict) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_first_fit_rows_place_every_example_once_within_the_capacity():
    rng = random.Random(0)
    lengths = [rng.choice([40, 60, 90, 150, 300, 700]) for _ in range(64)]
    rows = first_fit_rows(lengths, 700)
    assert sorted(i for r in rows for i in r) == list(range(64))
    assert all(sum(lengths[i] for i in r) <= 700 for r in rows)
    assert rows == first_fit_rows(lengths, 700)  # deterministic
    assert len(rows) <= -(-sum(lengths) // 700) + 2  # first fit decreasing: close to the bound
    assert first_fit_rows([50, 900, 20], 100) == [[1], [0, 2]]  # too long: a row of its own


@pytest.mark.parametrize(("family", "mode"), CASES)
@pytest.mark.parametrize("one_row", [False, True])
def test_packed_loss_and_gradients_equal_the_padded_batch(tiny, family, mode, one_row):
    model, tok = tiny(family)
    exs = _examples(tok, model, mode)
    lengths = [len(e["input_ids"]) for e in exs]
    assert len(set(lengths)) == len(lengths)
    padded_loss, padded_grads = _loss_and_grads(model, model_inputs(collate(exs, tok.pad_token_id)))
    rows = [list(range(len(exs)))] if one_row else first_fit_rows(lengths, max(lengths) + min(lengths))  # 2 share one
    batch = pack(exs, tok.pad_token_id, rows)
    rows = batch["input_ids"].shape[0]
    assert rows == 1 if one_row else 1 < rows < len(exs), (rows, lengths)  # shorter examples share rows
    assert int(batch["attention_mask"].sum()) == sum(lengths)
    packed_loss, packed_grads = _loss_and_grads(model, packed_inputs(rope_owner(model), batch, model_inputs(batch)))
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5, abs=1e-6)
    assert packed_grads.keys() == padded_grads.keys()
    for name, g in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(("family", "mode"), CASES[:1] + CASES[2:])
def test_no_token_attends_across_packed_examples(tiny, family, mode):
    """Changing the first example's query changes no logit of the examples after it in its row; the same row with
    positions that do not restart (one long sequence) does: the check can fail."""
    model, tok = tiny(family)
    exs = _examples(tok, model, mode)
    batch = pack(exs, tok.pad_token_id)  # one row: every example shares it
    first = batch["pack_segments"][0]
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    r, at, n = first
    text = (batch["mm_token_type_ids"][r, at:at + n] == 0).nonzero().flatten()[2:6] + at
    changed["input_ids"][r, text] = (changed["input_ids"][r, text] + 7) % 300
    owner = rope_owner(model)

    def logits(b, restart=True):
        inputs = packed_inputs(owner, b, model_inputs(b))
        if not restart:
            inputs["position_ids"] = torch.arange(b["input_ids"].shape[1]).expand(4, 1, -1).clone()
        with torch.no_grad():
            return model(**inputs).logits

    after = slice(at + n, None)
    assert torch.equal(logits(batch)[0, after], logits(changed)[0, after])
    assert not torch.allclose(logits(batch, False)[0, after], logits(changed, False)[0, after])


def test_packing_is_refused_for_linear_attention_layers(tiny):
    model, _ = tiny("qwen3_5")
    with pytest.raises(VTGError, match="linear_attention.*packing=false"):
        check_packable(model)
    check_packable(tiny("qwen2_5_vl")[0])


def test_an_example_that_starts_with_a_label_is_refused(tiny):
    model, tok = tiny("qwen2_5_vl")
    exs = _examples(tok, model, "native")[:2]
    exs[1] = {**exs[1], "labels": exs[1]["input_ids"].clone()}
    with pytest.raises(ValueError, match="starts with a label token"):
        pack(exs, tok.pad_token_id)


def test_packed_batches_keep_every_example_within_the_budget_with_little_padding():
    """10 s to 3 min clips under a 2 fps policy: padded to the longest, ~40% of a micro-batch is padding; packed
    (rows of the pool's longest, a pool of 8 micro-batches' tokens) under 5%; in one row (flash-attn) none."""
    rng = random.Random(0)
    exs = [{"key": f"k{i}", "n_tokens": 40 + 4 * rng.randrange(20, 360)} for i in range(640)]
    padded = padding_fraction(token_budget_batches(iter(exs), 16, 0))[0]

    def packed(groups, one_row):
        return list(packed_batches(iter(exs), 16, 8192, groups, 0, one_row, random.Random(1)))

    rows = packed(8, False)
    assert sorted(e["key"] for b in rows for e in b) == sorted(e["key"] for e in exs)  # each example once
    assert [[e["key"] for e in b] for b in rows] == [[e["key"] for e in b] for b in packed(8, False)]
    longest = max(e["n_tokens"] for e in exs)
    assert all(len({e["pack_row"] for e in b}) * longest <= 8192 for b in rows)  # the budget holds
    assert padded > 0.3 and padding_fraction(iter(rows))[0] < 0.05
    assert padding_fraction(iter(packed(8, True)))[0] == 0.0
    assert all(sum(e["n_tokens"] for e in b) <= 8192 and len(b) <= 16 for b in packed(0, True))
    assert all(len(b) <= 16 for b in rows)


def _varied_shards(root):
    """Train windows of 4-16 frames (lengths vary), val and test as usual."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("val", 4), ("test", 4)):
        samples = [synthetic_window(rng, f"{split}vid{i:03d}-0000", split, num_frames=int(rng.integers(2, 9)) * 2,
                                    source="fixture") for i in range(n)]
        shards.write_shard(root / split / (shards.SHARD_PATTERN % 0), samples)
    return root


@pytest.fixture(scope="module")
def varied(tmp_path_factory):
    return _varied_shards(tmp_path_factory.mktemp("varied"))


def test_the_loop_trains_the_same_steps_packed_as_padded(varied, tmp_path):
    common = ("train.max_steps=4", "train.save_every=4", "train.data.num_workers=0", "engine.deterministic=true")
    padded = train(train_config(varied, tmp_path / "pad", *common))
    packed = train(train_config(varied, tmp_path / "pack", *common, "train.data.packing=true",
                                "train.data.token_budget=4096", "train.data.pack_length=2048"))
    np.testing.assert_allclose(packed["losses"], padded["losses"], rtol=1e-4)
    assert padded["losses"][0] != padded["losses"][-1]
    assert padded["padding_frac"] > 0.05 and packed["padding_frac"] < padded["padding_frac"]
    from training.callbacks.console import perf_line
    from training.metrics import summary_as_metrics

    assert f"padding {padded['padding_frac']:.0%}" in perf_line(summary_as_metrics(padded))


def test_a_run_with_much_padding_is_told_how_to_batch(caplog):
    from types import SimpleNamespace

    from training.sft import SFTModule

    def advise(padding, **data):
        fake = SimpleNamespace(tcfg=SimpleNamespace(data=SimpleNamespace(**{"packing": False, "length_groups": 0,
                                                                                **data})),
                               dist=SimpleNamespace(is_main=True), _advised=False)
        caplog.clear()
        with caplog.at_level("WARNING", logger="training.sft"):
            SFTModule._advise_batching(fake, padding)
        return [r.getMessage() for r in caplog.records]

    [msg] = advise(0.4)
    assert "40% of the token slots" in msg and "length_groups=8" in msg and "packing=true" in msg
    assert advise(0.1) == [] and advise(0.4, length_groups=8) == [] and advise(0.4, packing=True) == []
    assert advise(None) == []


def test_packed_training_resumes_bit_for_bit(varied, tmp_path):
    common = ("train.max_steps=4", "train.save_every=2", "train.data.num_workers=1", "train.data.packing=true",
              "train.data.token_budget=600", "train.data.length_groups=2")
    straight = train(train_config(varied, tmp_path / "a", *common))["losses"]
    first = train(train_config(varied, tmp_path / "b", *common), stop_after=2)["losses"]
    second = train(train_config(varied, tmp_path / "b", *common))["losses"]
    assert first == straight[:2] and second == straight
