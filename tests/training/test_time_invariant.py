"""Issue 22, the time invariant for Qwen2.5-VL, stated absolutely (issue 35): the time the model is given for each
frame group equals the shard's recorded frame times (native: the group's first frame; text: the mean) (seconds from the window's start, the answers'
origin), in the three paths that build inputs (training's shard reader, the RL rollout's prompts, evaluation's
prompts), from the same shard sample.

- `native` (Qwen2.5-VL's own timing): the temporal rope id of group g in the `position_ids` every path hands the
  model is the video's start position + `floor(first_g x tokens_per_second)`, at the family's resolution (2 ids per
  second). 1, 2 and 4 fps (4 fps is where transformers' old int cast put every temporal id at 0) and a window whose
  frames do not start at 0: nothing is measured from the first frame.
- `text`: the prompt writes `<t_g seconds>` (t_g: the mean of the group's frame times) before each group, as
  Qwen3-VL's processor does (the other families: tests/training/test_family_parity.py).

Files with known presentation times through every path, for every family: tests/training/test_clock_*.py."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from support.train_fixtures import three_paths

from vtg.model.generation import vision_params
from vtg.model.processing import MM_VIDEO, TIMESTAMPS_KEY
from vtg.shards import QueryMeta, SampleMeta, encode_jpeg, write_shard


def _shard(root, fps: float, first: float, n: int = 8):
    ts = [round(first + i / fps, 6) for i in range(n)]
    rng = np.random.default_rng(0)
    jpegs = [encode_jpeg(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)) for _ in ts]
    end = ts[-1] + 1 / fps
    meta = SampleMeta(key=f"v.{fps}", video_id="v", window_index=0, window_start_s=0.0, window_end_s=end,
                      frame_timestamps=ts, fps=fps, num_frames=n,
                      queries=[QueryMeta(text="when does the red square appear", windows=[(ts[1], ts[3])],
                                         annotation_id="a")], split="train", source="synthetic:x")
    write_shard(root / "train" / "shard-000000.tar", [(meta, jpegs)])
    return ts


def _group_ticks(enc: dict) -> list[int]:
    """The temporal rope id of each frame group's video tokens in the `position_ids` the model gets, counted from the
    video's start position (where its height ids start), not from the first group."""
    pos, video = enc["position_ids"], enc["mm_token_type_ids"] == MM_VIDEO
    groups = pos[0][video].view(int(enc["video_grid_thw"][0, 0]), -1)
    assert (groups == groups[:, :1]).all()  # one time per group
    return (groups[:, 0] - int(pos[1][video].min())).tolist()


@pytest.mark.parametrize("fps,first", [(1.0, 0.5), (2.0, 0.25), (4.0, 0.125), (2.0, 3.0)])
def test_rope_time_equals_the_shard_timestamps_in_every_path(tiny_model_dir, tmp_path, fps, first):
    from vtg.model.modeling import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = "native"
    ts = _shard(tmp_path, fps, first)
    tps = model.config.vision_config.tokens_per_second
    tp = vision_params(model).temporal_patch_size
    want = [math.floor(ts[g * tp] * tps + 1e-6) for g in range(len(ts) // tp)]
    assert len(set(want)) == len(want)  # distinct times: 4 fps does not collapse to 0
    assert want[0] == math.floor(first * tps + 1e-6)  # counted from the window's origin, not from the first frame
    for path, enc in three_paths(model, tokenizer, tmp_path).items():
        assert _group_ticks(enc) == want, path


@pytest.mark.parametrize("fps,first", [(2.0, 0.25), (4.0, 3.125)])
def test_text_time_equals_the_shard_timestamps_in_every_path(tiny_model_dir, tmp_path, fps, first):
    from vtg.model.modeling import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = "text"
    ts = _shard(tmp_path, fps, first)
    tp = vision_params(model).temporal_patch_size
    want = [f"{(ts[g * tp] + ts[g * tp + tp - 1]) / 2:.1f}" for g in range(len(ts) // tp)]
    for path, enc in three_paths(model, tokenizer, tmp_path).items():
        text = tokenizer.decode(enc["input_ids"])
        assert re.findall(r"<(\d+\.\d) seconds><\|vision_start\|>", text) == want, path
