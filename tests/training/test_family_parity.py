"""Issue 22: every family's inputs equal what its own processor would give, and the time each frame group is
given equals the time its frames were taken, in the three paths that build inputs (training's shard reader, the
RL rollout, evaluation).

What is compared how (transformers' video processors need torchvision, which cannot be installed here):
- the clip's resized size: against `Qwen3VLVideoProcessor`'s own `smart_resize` (pure Python) for Qwen3-VL/3.5,
  and the per-frame `smart_resize` for Qwen2.5-VL;
- the pixels, frame by frame: against `Qwen2VLImageProcessorPil` configured with the family's published patch,
  merge, mean/std and pixel bounds (same PIL bicubic resize, rescale, normalise, patch layout);
- the expanded prompt (Qwen3-VL/3.5): against `Qwen3VLProcessor.replace_video_token` and `_calculate_timestamps`
  themselves, fed the video metadata (source fps, source frame indices) the frames were taken with, then the
  token ids, `mm_token_type_ids` and the model's `get_rope_index` positions of both prompts.
"""

from __future__ import annotations

import re
import types

import numpy as np
import pytest
import torch
from support.train_fixtures import three_paths

from vtg.model.families import FAMILIES, family_named
from vtg.model.processing import (
    MM_VIDEO,
    TIMESTAMPS_KEY,
    VisionParams,
    build_messages,
    encode_example,
    frame_size_for,
    patch_times,
    patchify_video,
    query_position,
    vision_tokens,
)
from vtg.shards import QueryMeta, SampleMeta, encode_jpeg, write_shard

TEXT_TIMED = [f for f in FAMILIES if family_named(f).time_encoding == "text"]


@pytest.fixture(scope="module")
def tiny(request):
    """family name -> (model, tokenizer) of its tiny rung, loaded once per module."""
    from vtg.model.modeling import load_model_and_tokenizer

    cache: dict = {}

    def get(family: str):
        if family not in cache:
            cache[family] = load_model_and_tokenizer("tiny" if family == "qwen2_5_vl" else f"tiny-{family}")
        return cache[family]

    return get


# ---- pixels -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("size", [(56, 56), (72, 128), (544, 1280)])
def test_pixels_equal_the_family_processor_frame_by_frame(family, size):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    fam = family_named(family)
    vp = VisionParams.for_family(fam)
    frames = np.random.default_rng(1).integers(0, 256, size=(4, *size, 3), dtype=np.uint8)
    ours, grid = patchify_video(frames, vp)
    t, gh, gw = grid[0].tolist()
    p = vp.patch_size
    h, w = gh * p, gw * p
    assert abs(w / h - size[1] / size[0]) < 0.25 * size[1] / size[0], "the aspect ratio is kept, not squashed"
    published = fam.video_processor or fam.processor
    proc = Qwen2VLImageProcessorPil(patch_size=p, merge_size=vp.merge_size, temporal_patch_size=2,
                                    image_mean=published["image_mean"], image_std=published["image_std"],
                                    size={"shortest_edge": h * w, "longest_edge": h * w})
    hf = proc(images=list(frames), return_tensors="pt")
    assert tuple(hf["image_grid_thw"][0, 1:].tolist()) == (gh, gw)
    ours = ours.view(t, gh * gw, 3, 2, p, p)
    theirs = hf["pixel_values"].view(len(frames), gh * gw, 3, 2, p, p)[:, :, :, 0]
    for frame in range(len(frames)):
        assert torch.equal(ours[frame // 2, :, :, frame % 2], theirs[frame]), f"frame {frame} differs"


@pytest.mark.parametrize("frames,size", [(16, (56, 56)), (768, (1080, 1920)), (64, (720, 1280)), (4, (30, 400)),
                                         (2, (8, 8))])
def test_a_clip_is_resized_by_the_qwen3_video_rule(frames, size):
    """Qwen3-VL's pixel bounds hold for the whole clip (t x h x w), so many frames mean smaller frames."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    vp = VisionParams.for_family(family_named("qwen3_vl"))
    assert vp.pixel_scope == "video" and (vp.min_pixels, vp.max_pixels) == (4096, 25165824)
    want = smart_resize(frames, *size, temporal_factor=2, factor=32, min_pixels=4096, max_pixels=25165824)
    assert frame_size_for(frames, *size, vp) == want


# ---- the prompt ---------------------------------------------------------------------------------------------
def _hf_expansion(vp: VisionParams, grid: torch.Tensor, fps: float, indices: list[int], tokenizer) -> str:
    """`Qwen3VLProcessor.replace_video_token` itself, on a processor object holding only what it reads."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    start, video, end = vision_tokens(tokenizer)
    proc = types.SimpleNamespace(
        video_processor=types.SimpleNamespace(merge_size=vp.merge_size, temporal_patch_size=vp.temporal_patch_size),
        vision_start_token=start, video_token=video, vision_end_token=end)
    proc._calculate_timestamps = types.MethodType(Qwen3VLProcessor._calculate_timestamps, proc)
    meta = VideoMetadata(total_num_frames=max(indices) + 1, fps=fps, frames_indices=list(indices))
    return Qwen3VLProcessor.replace_video_token(proc, {"video_grid_thw": grid, "video_metadata": [meta]}, 0)


@pytest.mark.parametrize("family", TEXT_TIMED)
@pytest.mark.parametrize("fps,indices", [(30.0, [0, 15, 30, 45, 60, 75, 90, 105]), (24.0, [3, 9, 20, 41, 60, 61]),
                                         (10.0, [0, 2, 4, 6, 8])])
def test_the_prompt_equals_qwen3_vl_s_processor(tiny, family, fps, indices):
    model, tokenizer = tiny(family)
    vp = VisionParams.from_model(model)
    frames = np.random.default_rng(0).integers(0, 256, size=(len(indices), 56, 56, 3), dtype=np.uint8)
    ts = [i / fps for i in indices]
    query = "when does the red square appear"
    ours = encode_example(tokenizer, frames, ts, query, None, vision=vp)
    expansion = _hf_expansion(vp, ours["video_grid_thw"], fps, indices, tokenizer)
    start, video, end = vision_tokens(tokenizer)
    prompt = tokenizer.apply_chat_template(build_messages(query, query_position(tokenizer)), tokenize=False,
                                           add_generation_prompt=True)
    theirs = tokenizer(prompt.replace(f"{start}{video}{end}", expansion), add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ours["input_ids"]) == prompt.replace(f"{start}{video}{end}", expansion)
    assert ours["input_ids"].tolist() == theirs
    ids = torch.tensor([theirs])
    mm = torch.where(ids == tokenizer.convert_tokens_to_ids(video), MM_VIDEO, 0)
    assert torch.equal(ours["mm_token_type_ids"], mm[0].to(ours["mm_token_type_ids"].dtype))
    pos_ours, _ = model.model.get_rope_index(ours["input_ids"][None], ours["mm_token_type_ids"][None],
                                             video_grid_thw=ours["video_grid_thw"].clone())
    pos_hf, _ = model.model.get_rope_index(ids, mm, video_grid_thw=ours["video_grid_thw"].clone())
    assert torch.equal(pos_ours, pos_hf)
    assert "second_per_grid_ts" not in ours  # text-timed families take no rope timing


# ---- the time invariant -------------------------------------------------------------------------------------
def _shard(root, ts: list[float], window_start: float):
    rng = np.random.default_rng(0)
    jpegs = [encode_jpeg(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)) for _ in ts]
    meta = SampleMeta(key="v-0000", video_id="v", window_index=0, window_start_s=window_start,
                      window_end_s=window_start + ts[-1] + 0.5, frame_timestamps=ts, fps=len(ts) / (ts[-1] + 0.5),
                      num_frames=len(ts), queries=[QueryMeta(text="when does the red square appear",
                                                             windows=[(ts[1], ts[3])], annotation_id="a")],
                      split="train", source="synthetic:x")
    write_shard(root / "train" / "shard-000000.tar", [(meta, jpegs)])


TIMINGS = {
    "1fps": [0.5 + i for i in range(8)],
    "4fps": [0.125 + i / 4 for i in range(8)],
    "adaptive": [0.0, 0.4, 0.5, 0.6, 2.0, 5.5, 5.75, 9.0],
    "odd count": [0.25 + i / 2 for i in range(7)],
}


@pytest.mark.parametrize("family", TEXT_TIMED)
@pytest.mark.parametrize("timing", sorted(TIMINGS))
@pytest.mark.parametrize("window_start", [0.0, 37.0])
def test_text_time_equals_the_shard_timestamps_in_every_path(tiny, tmp_path, family, timing, window_start):
    """The seconds written before each temporal patch are the mean of its frames' window-relative times (the
    answers' convention), whatever the sampling rate, spacing or the window's place in its video."""
    model, tokenizer = tiny(family)
    ts = TIMINGS[timing]
    _shard(tmp_path, ts, window_start)
    padded = ts + [ts[-1]] * (len(ts) % 2)
    want = [f"{(padded[i] + padded[i + 1]) / 2:.1f}" for i in range(0, len(padded), 2)]
    assert [f"{t:.1f}" for t in patch_times(ts, 2)] == want
    for path, enc in three_paths(model, tokenizer, tmp_path).items():
        text = tokenizer.decode(enc["input_ids"])
        assert re.findall(r"<(\d+\.\d) seconds><\|vision_start\|>", text) == want, path
        assert int(enc["video_grid_thw"][0, 0]) == len(want), path


def test_qwen25vl_text_mode_writes_the_same_times(tiny, tmp_path):
    """`train.data.timestamps: text` gives Qwen2.5-VL the same `<t seconds>` text (one grid row per patch)."""
    model, tokenizer = tiny("qwen2_5_vl")
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = "text"
    try:
        ts = TIMINGS["4fps"]
        _shard(tmp_path, ts, 3.0)
        want = [f"{(ts[i] + ts[i + 1]) / 2:.1f}" for i in range(0, len(ts), 2)]
        for path, enc in three_paths(model, tokenizer, tmp_path).items():
            text = tokenizer.decode(enc["input_ids"])
            assert re.findall(r"<(\d+\.\d) seconds><\|vision_start\|>", text) == want, path
            assert enc["video_grid_thw"].tolist() == [[1, 4, 4]] * 4, path
    finally:
        tokenizer.init_kwargs.pop(TIMESTAMPS_KEY)


def test_a_video_without_timing_is_an_error():
    with pytest.raises(ValueError, match="without frame timestamps"):
        patch_times([], 2)


def test_the_plain_python_resize_rules_equal_transformers_own():
    """`vtg.model.geometry` (no torch, usable in Beam workers) against transformers' two `smart_resize`s over
    random sizes, frame counts and bounds, both scopes."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as frame_rule
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as clip_rule

    from vtg.model.geometry import Geometry, resized_size

    rng = np.random.default_rng(0)
    for _ in range(2000):
        h, w = (int(x) for x in rng.integers(8, 2200, 2))
        if max(h, w) / min(h, w) > 200:
            continue
        t = int(rng.integers(1, 800))
        lo, hi = sorted(int(x) for x in rng.integers(1000, 30_000_000, 2))
        patch = int(rng.choice([14, 16]))
        assert resized_size(1, h, w, Geometry(patch, 2, 2, lo, hi)) == frame_rule(h, w, 2 * patch, lo, hi)
        g = Geometry(patch, 2, 2, lo, hi, "video")
        assert resized_size(max(t, 2), h, w, g) == clip_rule(max(t, 2), h, w, 2, 2 * patch, lo, hi)


def test_the_family_policy_samples_2_fps_within_its_frame_and_token_budget():
    from vtg.model.geometry import policy_frames, video_tokens

    g = VisionParams.for_family(family_named("qwen3_vl")).geometry
    sampling = family_named("qwen3_vl").sampling
    args = (sampling["fps"], sampling["min_frames"], sampling["max_frames"])
    assert policy_frames(16.0, 56, 56, g, *args) == 32  # 2 fps
    assert policy_frames(1.0, 56, 56, g, *args) == 4  # at least min_frames
    assert policy_frames(3600.0, 360, 640, g, *args) == 768  # at most max_frames
    # Qwen3-VL's clip-level pixel bound already holds a 720p clip near 11.5k tokens at any length; a smaller
    # token budget takes the most frames (of the 2 fps count) that fit it
    n = policy_frames(600.0, 720, 1280, g, *args, max_tokens=8192)
    assert n % 2 == 0 and video_tokens(n, 720, 1280, g) <= 8192
    assert all(video_tokens(m, 720, 1280, g) > 8192 for m in range(n + 2, 769, 2))
