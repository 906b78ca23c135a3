"""Issue 25 item 4: one vision pass per video in GRPO. With the G rows of a group sharing their video's features
(`vtg.model.shared_vision`), every family's logits, log-probs and gradients (vision tower included) equal the
per-row encoding's within fp32 tolerance, in the rollout (`generate`) and the teacher-forced passes, and the
vision tower runs once per distinct video."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.rl import algo
from training.rl.rollout import Rollout, teacher_forced_logits, vision_token_ids
from vtg.model.generation import pad_id
from vtg.model.processing import VisionParams, collate, encode_example, model_inputs
from vtg.model.shared_vision import shared_video_features, vision_owner

G = 3
CASES = [("qwen2_5_vl", "native"), ("qwen2_5_vl", "text"), ("qwen3_vl", "native"), ("qwen3_5", "native")]
"""Each family's tiny model; Qwen2.5-VL also with text timestamps (one grid row per temporal patch)."""


def _prompts(tok, model, mode: str) -> list[dict]:
    """3 queries on 3 different videos (the last one longer), each prompt repeated G times as the rollout does
    (the same encoded dict: `training.rl.rollout.encode_prompts`)."""
    rng = np.random.default_rng(0)
    vp = VisionParams.from_model(model)
    out = []
    for q, n in enumerate((8, 8, 12)):
        frames = rng.integers(0, 256, size=(n, 64, 64, 3), dtype=np.uint8)
        ts = [0.5 * i for i in range(n)]
        enc = encode_example(tok, frames, ts, f"when does the red square appear {q}", None, vision=vp, key=f"v{q}",
                             timestamps_mode=mode)
        out.extend([enc] * G)
    return out


def _rollout(tok, model, encoded: list[dict], steps: int = 5) -> Rollout:
    vocab = model.config.get_text_config().vocab_size
    banned = set(vision_token_ids(model.config))
    ok = torch.tensor([t for t in range(vocab) if t not in banned])
    g = torch.Generator().manual_seed(1)
    comp = ok[torch.randint(len(ok), (len(encoded), steps), generator=g)]
    mask = torch.ones_like(comp)
    mask[1, 3:] = 0  # one answer ended early
    return Rollout(encoded, comp, mask, [""] * len(encoded))


class VisionCalls:
    """Counts the vision tower's calls and the patches it encodes."""

    def __init__(self, model):
        self.calls, self.patches = 0, 0
        self.handle = vision_owner(model).visual.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.calls += 1
        self.patches += args[0].shape[0]

    def close(self):
        self.handle.remove()


def _patches(encoded: list[dict]) -> tuple[int, int]:
    """(patches of every row, patches of the distinct videos)."""
    rows = sum(e["pixel_values_videos"].shape[0] for e in encoded)
    return rows, sum({id(e["pixel_values_videos"]): e["pixel_values_videos"].shape[0] for e in encoded}.values())


def _assert_teacher_forced_parity(model, tok, encoded: list[dict], rows: slice) -> dict:
    """Teacher-forced logits, log-probs and every parameter's gradient: shared features == per-row encoding;
    one vision call each, over the distinct videos' patches when shared. Returns the per-row gradients."""
    roll = _rollout(tok, model, encoded)
    masked = vision_token_ids(model.config)

    def forward(batch):
        return model(**batch)

    out = {}
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        calls = VisionCalls(model)
        try:
            logits = teacher_forced_logits(forward, tok, roll, rows, "cpu", torch.float32, 0.7, masked,
                                           model if shared else None)
        finally:
            calls.close()
        logp = algo.token_logprobs(logits, roll.completions[rows])
        weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)
        (logp * weights * roll.mask[rows]).sum().backward()
        out[shared] = ({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                       logits.detach(), logp.detach())
        every, distinct = _patches(encoded[rows])
        assert calls.calls == 1 and calls.patches == (distinct if shared else every), (shared, calls.patches)
    model.zero_grad(set_to_none=True)
    (g0, l0, p0), (g1, l1, p1) = out[False], out[True]
    assert torch.allclose(l0, l1, atol=1e-5, rtol=1e-5), (l0 - l1).nan_to_num().abs().max()
    assert torch.allclose(p0, p1, atol=1e-5), (p0 - p1).abs().max()
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-6, rtol=1e-4), (n, (g0[n] - g1[n]).abs().max())
    return g0


def _is_vision(name: str) -> bool:
    return ".visual." in name or name.startswith("visual.")


@pytest.mark.parametrize("family, mode", CASES)
def test_shared_features_equal_per_row_encoding(tiny, family, mode):
    """Teacher-forced logits and log-probs (whole rollout, and a micro-batch that splits groups), the gradient of
    every parameter (the trained vision tower's included), and the prompt-only prefill are the per-row
    encoding's."""
    model, tok = tiny(family)
    encoded = _prompts(tok, model, mode)
    assert any(p.requires_grad for p in vision_owner(model).visual.parameters())  # a trained vision tower
    model.train()
    for rows in (slice(0, len(encoded)), slice(2, 7)):  # 2..6 splits the first and last group
        grads = _assert_teacher_forced_parity(model, tok, encoded, rows)
        assert any(_is_vision(n) for n in grads)

    # rollout-style: the prompts alone (left-padded, as `sample` collates them)
    model.eval()
    with torch.no_grad():
        plain = model(**_batch(collate(encoded, pad_id(tok), "left"))).logits
        shared_batch = collate(encoded, pad_id(tok), "left", share_videos=True)
        with shared_video_features(model, shared_batch["video_share"]):
            shared = model(**_batch(shared_batch)).logits
    model.train()
    assert torch.allclose(plain, shared, atol=1e-5, rtol=1e-5), (plain - shared).abs().max()


def test_shared_features_with_a_frozen_vision_tower(tiny):
    """The recipes' frozen vision tower: the same logits and the same gradients of everything that trains."""
    model, tok = tiny("qwen3_vl")
    visual = vision_owner(model).visual
    visual.requires_grad_(False)
    try:
        model.train()
        grads = _assert_teacher_forced_parity(model, tok, _prompts(tok, model, "native"), slice(1, 8))
    finally:
        visual.requires_grad_(True)
    assert grads and not any(_is_vision(n) for n in grads)


def _batch(collated: dict) -> dict:
    batch = model_inputs(collated)
    batch.pop("labels", None)
    return batch


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_generate_encodes_each_video_once_with_the_same_scores(tiny, family):
    """`generate` (the rollout's sampler) with shared features: the same tokens and per-step scores as per-row
    encoding, and one vision pass over the distinct videos only."""
    model, tok = tiny(family)
    encoded = _prompts(tok, model, "native")
    kw = {"do_sample": False, "max_new_tokens": 6, "pad_token_id": pad_id(tok), "output_scores": True,
          "return_dict_in_generate": True, "use_cache": True, "suppress_tokens": vision_token_ids(model.config)}
    model.eval()
    outs, counts = {}, {}
    for shared in (False, True):
        collated = collate(encoded, pad_id(tok), "left", share_videos=shared)
        calls = VisionCalls(model)
        try:
            with torch.no_grad(), shared_video_features(model, collated.get("video_share")):
                outs[shared] = model.generate(**_batch(collated), **kw)
        finally:
            calls.close()
        counts[shared] = (calls.calls, calls.patches)
    model.train()
    every, distinct = _patches(encoded)
    assert counts == {False: (1, every), True: (1, distinct)} and distinct * G == every
    assert torch.equal(outs[False].sequences, outs[True].sequences)
    for a, b in zip(outs[False].scores, outs[True].scores, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).nan_to_num().abs().max()


def test_sample_shares_and_the_batch_layout(tiny):
    """`sample` runs one vision pass over the distinct videos; collate keeps the per-row grid (the rope reads it)
    and lays out the distinct videos' pixels once; a grid that does not match the share map is refused."""
    from training.rl.rollout import sample

    model, tok = tiny("qwen2_5_vl")
    encoded = _prompts(tok, model, "text")
    calls = VisionCalls(model)
    try:
        torch.manual_seed(0)
        roll = sample(model, tok, encoded, temperature=1.0, top_p=1.0, max_new_tokens=4, device="cpu",
                      dtype=torch.float32)
    finally:
        calls.close()
    assert (calls.calls, calls.patches) == (1, _patches(encoded)[1]) and roll.completions.shape[0] == len(encoded)
    assert model.training and "get_video_features" not in vision_owner(model).__dict__  # restored
    plain, shared = collate(encoded, 0, "left"), collate(encoded, 0, "left", share_videos=True)
    assert torch.equal(plain["video_grid_thw"], shared["video_grid_thw"])
    assert torch.equal(shared["video_share"].row_grid_thw, plain["video_grid_thw"])
    assert shared["video_share"].videos == 3 and shared["pixel_values_videos"].shape[0] == _patches(encoded)[1]
    with pytest.raises(ValueError, match="video_grid_thw"), torch.no_grad():
        wrong = collate(encoded[:G], 0, "left", share_videos=True)["video_share"]
        with shared_video_features(model, wrong):
            model(**_batch(shared))


@pytest.mark.parametrize("chunk", [G, 2 * G, 3 * G])
def test_padding_slots_count_the_batches_the_model_computes(tiny, chunk):
    """`padding_slots` counts what the rollout's prefill and each teacher-forced micro-batch really hold: slots =
    the collated batch's size, real tokens = its attention mask's ones; a micro-batch inside a group pads no
    prompt, and one across groups of different prompt lengths does."""
    from training.rl.rollout import padding_slots

    model, tok = tiny("qwen2_5_vl")
    encoded = _prompts(tok, model, "native")
    roll = _rollout(tok, model, encoded)
    chunks = [slice(i, min(i + chunk, len(encoded))) for i in range(0, len(encoded), chunk)]
    pad = padding_slots(roll, chunks)
    prefill = collate(encoded, 0, "left")["attention_mask"]
    assert (pad["prefill_slots"], pad["prefill_real"]) == (prefill.numel(), prefill.sum().item())
    slots = real = 0
    for rows in chunks:  # the layout teacher_forced_logits builds: the left-padded prompts, then the completions
        mask = torch.cat([collate(encoded[rows], 0, "left")["attention_mask"], roll.mask[rows]], dim=1)
        slots, real = slots + mask.numel(), real + mask.sum().item()
    assert (pad["update_slots"], pad["update_real"]) == (slots, real)
    prompt_pad = pad["update_slots"] - pad["update_real"] - (roll.mask == 0).sum().item()
    # the first two prompts are as long as each other, the third is longer: only a batch holding it and another pads
    assert (prompt_pad > 0) == (chunk == 3 * G)
