"""Issue 35, Qwen2.5-VL: the time the model is given for each temporal patch is the presentation time of its
frames from the answer's origin (native rope: the patch's first frame, as `get_rope_index`; text: their mean), on every path (support.clock_fixtures.check_every_path), under its native rope timing and
under text timestamps; on a variable-frame-rate file and on one whose video track starts late."""

from __future__ import annotations

import math

import pytest
import torch
from support.clock_fixtures import check_every_path, model_is_told, patch_firsts

from vtg.model.processing import TIMESTAMPS_KEY, VisionParams, encode_example

FAMILY = "qwen2_5_vl"


@pytest.mark.parametrize("mode", ["native", "text"])
def test_every_path_gives_the_presentation_time(tiny, clock_project, mode):
    model, tokenizer = tiny(FAMILY)
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = mode
    try:
        hows = check_every_path(model, tokenizer, clock_project)
    finally:
        tokenizer.init_kwargs.pop(TIMESTAMPS_KEY)
    assert hows == {"rope" if mode == "native" else "text"}


def test_the_rope_ids_are_transformers_own_for_a_video_that_starts_at_its_first_frame(tiny):
    """`vtg.model.rope_time` follows `get_rope_index` everywhere but the temporal ids: for frames at a constant rate
    with the first at 0 (where a patch's first-frame time is g x second_per_grid_t) the ids every path gives the
    model are transformers' own, at every rate."""
    import numpy as np

    from vtg.model.rope_time import rope_positions

    model, tokenizer = tiny(FAMILY)
    vision = VisionParams.from_model(model)
    frames = np.random.default_rng(0).integers(0, 255, (8, 56, 56, 3), dtype=np.uint8)
    for fps in (1.0, 2.0, 4.0):
        ts = [i / fps for i in range(8)]
        enc = encode_example(tokenizer, frames, ts, "the red square", "1.0 - 2.0 seconds", vision=vision)
        stock, _ = model.model.get_rope_index(enc["input_ids"][None], enc["mm_token_type_ids"][None],
                                              video_grid_thw=enc["video_grid_thw"],
                                              second_per_grid_ts=enc["second_per_grid_ts"])
        firsts = [ts[g * 2] for g in range(4)]
        ours_first = rope_positions(enc["mm_token_type_ids"], enc["video_grid_thw"], vision.merge_size, [firsts],
                                    vision.tokens_per_second)
        assert torch.equal(ours_first, stock[:, 0])
        assert torch.equal(enc["position_ids"], stock[:, 0]), fps


def test_a_window_that_starts_later_moves_the_rope_time_and_the_model_sees_it(tiny):
    """The same frames told 0.5 s or 3.25 s later: the temporal ids move by floor(t x tps) and the logits change
    (the model's forward reads the ids every path passes); the height/width ids and the text after do not move."""
    import numpy as np

    model, tokenizer = tiny(FAMILY)
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = "native"
    try:
        vision = VisionParams.from_model(model)
        frames = np.random.default_rng(1).integers(0, 255, (8, 56, 56, 3), dtype=np.uint8)
        base = [0.25 + i / 2 for i in range(8)]
        encs = {d: encode_example(tokenizer, frames, [t + d for t in base], "q", None, vision=vision)
                for d in (0.0, 3.25)}
        video = encs[0.0]["mm_token_type_ids"] == 2
        shift = encs[3.25]["position_ids"][0][video] - encs[0.0]["position_ids"][0][video]
        want = [math.floor((m + 3.25) * 2 + 1e-6) - math.floor(m * 2 + 1e-6) for m in patch_firsts(base)]
        assert shift.view(4, -1)[:, 0].tolist() == want and min(want) > 0
        assert torch.equal(encs[3.25]["position_ids"][1:], encs[0.0]["position_ids"][1:])
        assert not torch.allclose(model_is_told(model, encs[0.0]), model_is_told(model, encs[3.25]))
    finally:
        tokenizer.init_kwargs.pop(TIMESTAMPS_KEY)


def test_generate_extends_the_given_positions_as_the_update_does(tiny):
    """A greedy answer under the given ids equals the teacher-forced argmax over the same ids extended by
    `extend_positions` (what RL's update does), so rollout and update see one clock."""
    import numpy as np

    from training.rl.rollout import Rollout, teacher_forced_logits
    from vtg.model.processing import collate, model_inputs

    model, tokenizer = tiny(FAMILY)
    vision = VisionParams.from_model(model)
    frames = np.random.default_rng(2).integers(0, 255, (8, 56, 56, 3), dtype=np.uint8)
    enc = encode_example(tokenizer, frames, [2.0 + i / 2 for i in range(8)], "q", None, vision=vision)
    batch = model_inputs(collate([enc], tokenizer.pad_token_id, padding_side="left"))
    batch.pop("labels")
    model.eval()
    out = model.generate(**batch, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    comp = out[:, batch["input_ids"].shape[1]:]
    roll = Rollout([enc], comp, torch.ones_like(comp), [""])
    logits = teacher_forced_logits(lambda b: model(**b), tokenizer, roll, slice(0, 1), "cpu", torch.float32, 1.0, [])
    assert torch.equal(logits.argmax(-1), comp)
