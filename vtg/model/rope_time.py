"""Qwen2.5-VL's native timing at absolute time (issue 35): the temporal rope id of each temporal patch from the
presentation times of its frames, counted from the answer's origin.

transformers' `Qwen2_5_VLModel.get_rope_index` gives temporal patch g of a video the id `st + floor(g x
second_per_grid_t x tokens_per_second)` (`st`: the text position where the video starts). That is the time of the
patch's first frame only for a constant-rate video whose first frame is at the origin, as Qwen's processor samples
a whole video; a window's frames start wherever the window's first frame was shown, and a variable-frame-rate
video's patches are not evenly spaced. Here patch g gets `st + floor(t_g x tokens_per_second)`, t_g the
presentation time of its first frame (`vtg.model.processing.patch_starts`, seconds from the answer's origin: the
window's start, or the video's for the whole-video benchmark): the time the model is told is when the patch's
frames began to be shown, at the family's resolution (1 / tokens_per_second), and for a clip sampled from its first
frame at the origin it is transformers' own id at every rate. (The patch's mean time, the rule before, is
Qwen3-VL's text timestamp; as a rope id it put a 1-fps patch one id later than Qwen2.5-VL's convention and a
window's first patch never at id 0, where the whole-video benchmark's first patch is: docs/results.md, issue 35.)
Everything else follows transformers 5.24's
`get_rope_index` exactly (height and width ids from `st`, text after a video at `st + max(h, w) / merge`), which
`tests/training/test_clock_qwen2_5_vl.py` pins: with frames from 0 at a constant rate the ids are transformers' own.

The ids are computed once per example, beside its tokens (`encode_example`'s `position_ids`), and travel with it
through collation, packing, the teacher-forced RL update and `generate` (which extends them one per new token, as it
extends its own), so every path gives the model the same time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

EPS = 1e-6
"""A patch whose time lies on a tick of the rope's grid (`t x tps` an integer up to float noise) gets that tick."""


def temporal_ids(times: Sequence[float], tokens_per_second: float) -> list[int]:
    """The temporal rope offset of each temporal patch: floor(t x tokens_per_second)."""
    return [math.floor(float(t) * tokens_per_second + EPS) for t in times]


def rope_positions(mm_token_type_ids: torch.Tensor, video_grid_thw: torch.Tensor, merge_size: int,
                   patch_times: Sequence[Sequence[float]], tokens_per_second: float) -> torch.Tensor:
    """(3, L) rope positions of one example: `mm_token_type_ids` (L,) marks text (0) and video (2) tokens, one row
    of `video_grid_thw` and one list of patch times (seconds from the answer's origin) per video run, in order."""
    types = mm_token_type_ids.tolist()
    grids = iter(video_grid_thw.tolist())
    times = iter(patch_times)
    parts, pos = [], 0
    for kind, run in itertools.groupby(types):
        n = len(list(run))
        if kind == 0:
            parts.append(torch.arange(pos, pos + n).expand(3, n))
            pos += n
            continue
        if kind != 2:
            raise ValueError(f"rope_positions: token type {kind} (images) is not a video")
        t, h, w = next(grids)
        gh, gw = h // merge_size, w // merge_size
        ticks = temporal_ids(next(times), tokens_per_second)
        if len(ticks) != t or n != t * gh * gw:
            raise ValueError(f"rope_positions: a video of {n} tokens, grid {t}x{h}x{w}, {len(ticks)} patch times")
        tt, hh, ww = torch.meshgrid(torch.tensor(ticks) + pos, torch.arange(gh) + pos, torch.arange(gw) + pos,
                                    indexing="ij")
        parts.append(torch.stack([tt, hh, ww]).reshape(3, -1))
        pos += max(gh, gw)
    return torch.cat(parts, dim=1).long()


def extend_positions(position_ids: torch.Tensor, steps: int) -> torch.Tensor:
    """(3, B, L + steps): the positions of `steps` text tokens appended after each row's last one (what `generate`
    does for its new tokens, and what the teacher-forced update must do for the sampled ones)."""
    last = position_ids[..., -1:]
    return torch.cat([position_ids, last + torch.arange(1, steps + 1, dtype=position_ids.dtype)], dim=-1)
