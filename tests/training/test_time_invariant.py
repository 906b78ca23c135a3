"""Issue 22, the time invariant for Qwen2.5-VL: the time the model is given for each frame group equals the
shard's recorded frame timestamps, in the three paths that build inputs (training's shard reader, the RL rollout's
prompts, evaluation's prompts), from the same shard sample.

- `rope` (Qwen2.5-VL's own timing): the temporal rope id of group g, from the model's own `get_rope_index`, is
  `floor((t_g - t_0) x tokens_per_second)` (t_g: the first frame of the group): time relative to the first frame,
  at the family's resolution (Qwen2.5-VL: 2 ids per second). 1, 2 and 4 fps (4 fps is where transformers' old int
  cast put every temporal id at 0) and a window whose frames do not start at 0.
- `text`: the prompt writes `<t_g seconds>` (t_g: the mean of the group's frame times, window-relative seconds, the
  answers' convention) before each group, as Qwen3-VL's processor does (the other families:
  tests/training/test_family_parity.py).

Uneven (adaptive) frames under `rope` get one mean interval per video: approximate, a gap issue 22 keeps open."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from train_fixtures import three_paths

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


def _group_times(model, enc: dict) -> list[int]:
    """The temporal rope id of each frame group's video tokens (relative to the first group)."""
    ids = enc["input_ids"][None]
    pos, _ = model.model.get_rope_index(ids, enc["mm_token_type_ids"][None], video_grid_thw=enc["video_grid_thw"],
                                        second_per_grid_ts=enc["second_per_grid_ts"],
                                        attention_mask=torch.ones_like(ids))
    t = pos[0, 0][enc["mm_token_type_ids"] == MM_VIDEO]
    per_group = len(t) // int(enc["video_grid_thw"][:, 0].sum())
    groups = t.view(-1, per_group)
    assert (groups == groups[:, :1]).all()  # one time per group
    return (groups[:, 0] - groups[0, 0]).tolist()


@pytest.mark.parametrize("fps,first", [(1.0, 0.5), (2.0, 0.25), (4.0, 0.125), (2.0, 3.0)])
def test_rope_time_equals_the_shard_timestamps_in_every_path(tiny_model_dir, tmp_path, fps, first):
    from vtg.model.modeling import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = "native"
    ts = _shard(tmp_path, fps, first)
    tps = model.config.vision_config.tokens_per_second
    tp = vision_params(model).temporal_patch_size
    want = [math.floor((ts[g * tp] - ts[0]) * tps + 1e-9) for g in range(len(ts) // tp)]
    assert len(set(want)) == len(want)  # distinct times: 4 fps does not collapse to 0
    for path, enc in three_paths(model, tokenizer, tmp_path).items():
        assert _group_times(model, enc) == want, path


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
