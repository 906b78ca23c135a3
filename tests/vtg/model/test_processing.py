"""Video patchify parity with transformers' Qwen2VLImageProcessor, and the example encoding contract."""

import numpy as np
import pytest
import torch

from vtg.answer import format_answer, parse_answer
from vtg.model.processing import (
    IGNORE_INDEX,
    MM_VIDEO,
    answer_text,
    collate,
    encode_example,
    patchify_video,
    seconds_per_grid,
)


def _hf_image_patches(frames):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil()
    out = proc(images=list(frames), return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


@pytest.mark.parametrize("size", [(56, 56), (84, 56), (60, 90)])
def test_patchify_matches_hf_image_processor_exactly(size):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(6, *size, 3), dtype=np.uint8)
    ours, grid = patchify_video(frames)
    hf, hf_grid = _hf_image_patches(frames)
    t, gh, gw = grid[0].tolist()
    assert t == 3 and (gh, gw) == tuple(hf_grid[0, 1:].tolist())
    # HF's image path repeats each frame over the temporal patch; ours holds two real frames per patch.
    p = 14
    ours = ours.view(t, gh * gw, 3, 2, p, p)
    hf = hf.view(6, gh * gw, 3, 2, p, p)[:, :, :, 0]
    for frame in range(6):
        assert torch.equal(ours[frame // 2, :, :, frame % 2], hf[frame]), f"frame {frame} differs"


def test_patchify_pads_odd_frame_count_by_repeating_last():
    frames = np.random.default_rng(1).integers(0, 256, size=(3, 56, 56, 3), dtype=np.uint8)
    ours, grid = patchify_video(frames)
    assert grid.tolist() == [[2, 4, 4]]
    v = ours.view(2, 16, 3, 2, 14, 14)
    assert torch.equal(v[1, :, :, 0], v[1, :, :, 1])


def test_seconds_per_grid_uses_sampled_timestamps():
    assert seconds_per_grid([0.5, 1.5, 2.5, 3.5]) == pytest.approx(2.0)
    assert seconds_per_grid([0.25, 0.75, 1.25]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        seconds_per_grid([1.0, 1.0, 1.0])


def test_encode_example_labels_only_answer(tiny_tokenizer):
    frames = np.zeros((8, 56, 56, 3), np.uint8)
    ts = [(i + 0.5) * 1.5 for i in range(8)]
    answer = answer_text([(3.0, 7.5)])
    assert answer == format_answer(3.0, 7.5)
    ex = encode_example(tiny_tokenizer, frames, ts, "the red square appears", answer, key="v.0",
                        timestamps_mode="native")
    video_id = tiny_tokenizer.convert_tokens_to_ids("<|video_pad|>")
    n_video = int((ex["input_ids"] == video_id).sum())
    assert n_video == 4 * 4 * 4 // 4 == int((ex["mm_token_type_ids"] == MM_VIDEO).sum())
    labelled = ex["labels"] != IGNORE_INDEX
    text = tiny_tokenizer.decode(ex["labels"][labelled])
    assert text == answer + tiny_tokenizer.eos_token
    assert parse_answer(text) == (3.0, 7.5)
    assert ex["second_per_grid_ts"].item() == pytest.approx(3.0)  # 2 frames x 1.5 s actually sampled
    assert ex["pixel_values_videos"].shape == (64, 3 * 2 * 14 * 14)
    prompt = encode_example(tiny_tokenizer, frames, ts, "the red square appears", None, timestamps_mode="native")
    assert (prompt["labels"] == IGNORE_INDEX).all()
    assert torch.equal(prompt["input_ids"], ex["input_ids"][: len(prompt["input_ids"])])
    with pytest.raises(ValueError, match="truncated"):
        encode_example(tiny_tokenizer, frames, ts, "q", answer, max_length=20)


def test_text_timestamps_put_each_group_time_before_its_frames(tiny_tokenizer):
    frames = np.zeros((8, 56, 56, 3), np.uint8)
    ts = [0.4 + 1.5 * i for i in range(8)]
    ex = encode_example(tiny_tokenizer, frames, ts, "q", "1.0 - 2.0 seconds", timestamps_mode="text")
    text = tiny_tokenizer.decode(ex["input_ids"])
    for t in (1.15, 4.15, 7.15, 10.15):  # the mean of each temporal patch's two frames, as actually sampled
        assert f"<{t:.1f} seconds><|vision_start|>" + "<|video_pad|>" * 4 + "<|vision_end|>" in text
    assert ex["video_grid_thw"].tolist() == [[1, 4, 4]] * 4
    assert ex["second_per_grid_ts"].tolist() == pytest.approx([3.0] * 4)
    assert int((ex["mm_token_type_ids"] == MM_VIDEO).sum()) == 16
    # The default comes from the tokenizer's export (training records its choice there).
    assert encode_example(tiny_tokenizer, frames, ts, "q", None)["video_grid_thw"].tolist() == [[4, 4, 4]]
    tiny_tokenizer.init_kwargs["vtg_timestamps"] = "text"
    try:
        assert encode_example(tiny_tokenizer, frames, ts, "q", None)["video_grid_thw"].tolist() == [[1, 4, 4]] * 4
    finally:
        del tiny_tokenizer.init_kwargs["vtg_timestamps"]


def test_query_position_follows_the_export_and_keeps_the_video_tokens(tiny_tokenizer):
    frames = np.zeros((8, 56, 56, 3), np.uint8)
    ts = [0.5 * i for i in range(8)]

    def layout():
        ex = encode_example(tiny_tokenizer, frames, ts, "the red square appears", "1.0 - 2.0 seconds")
        text = tiny_tokenizer.decode(ex["input_ids"])
        assert int((ex["mm_token_type_ids"] == MM_VIDEO).sum()) == 16
        assert text.rstrip().endswith("1.0 - 2.0 seconds<|im_end|>")
        return text.index("the red square appears") < text.index("<|vision_start|>")

    assert layout() is False  # exports without the key were trained with Qwen's order: video, then query
    tiny_tokenizer.init_kwargs["vtg_query_position"] = "before"
    try:
        assert layout() is True
        tiny_tokenizer.init_kwargs["vtg_query_position"] = "middle"
        with pytest.raises(ValueError, match="query position"):
            layout()
    finally:
        del tiny_tokenizer.init_kwargs["vtg_query_position"]


def test_collate_pads_both_sides(tiny_tokenizer):
    frames = np.zeros((4, 56, 56, 3), np.uint8)
    a = encode_example(tiny_tokenizer, frames, [0, 1, 2, 3], "short", "1.0 - 2.0 seconds")
    b = encode_example(tiny_tokenizer, frames, [0, 1, 2, 3], "a much longer query text here", "1.0 - 2.0 seconds")
    pad = tiny_tokenizer.pad_token_id
    right = collate([a, b], pad)
    left = collate([a, b], pad, padding_side="left")
    n = len(b["input_ids"])
    assert right["input_ids"].shape == left["input_ids"].shape == (2, n)
    assert right["attention_mask"][0, len(a["input_ids"]):].sum() == 0
    assert left["attention_mask"][0, : n - len(a["input_ids"])].sum() == 0
    assert right["video_grid_thw"].shape == (2, 3) and right["second_per_grid_ts"].shape == (2,)
    assert right["pixel_values_videos"].shape[0] == 2 * (2 * 4 * 4)


def test_model_forward_uses_video_positions(tiny_model_dir, tiny_tokenizer):
    from vtg.model.modeling import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    frames = np.random.default_rng(0).integers(0, 256, size=(8, 56, 56, 3), dtype=np.uint8)
    ex = encode_example(tok, frames, [i * 0.5 for i in range(8)], "q", "1.0 - 2.0 seconds", timestamps_mode="native")
    batch = collate([ex], tok.pad_token_id)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "labels", "mm_token_type_ids",
                                     "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")}
    pos, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                        video_grid_thw=inputs["video_grid_thw"],
                                        second_per_grid_ts=inputs["second_per_grid_ts"])
    video = inputs["mm_token_type_ids"][0] == MM_VIDEO
    # 3-D positions: the temporal axis advances by tokens_per_second x seconds-per-grid between frame groups.
    t_pos = pos[0, 0, video].unique()
    assert len(t_pos) == 4 and (t_pos[1] - t_pos[0]).item() == 2  # tokens_per_second 2 x 1.0 s per grid
    out = model(**inputs)
    assert torch.isfinite(out.loss)
    text = collate([encode_example(tok, frames, [i * 0.5 for i in range(8)], "q", "1.0 - 2.0 seconds",
                                   timestamps_mode="text")], tok.pad_token_id)
    assert torch.isfinite(model(**{k: text[k] for k in inputs}).loss)
