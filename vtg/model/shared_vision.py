"""One vision pass per distinct video of a batch, its features shared by every row that shows that video.

A GRPO step holds each query's prompt G times (its G answers): encoding the video once per row runs the vision
tower G times on the same pixels, in the rollout's `generate` prefill and again in every teacher-forced pass.
`collate(..., share_videos=True)` (`vtg.model.processing`) concatenates only the distinct videos and returns a
`VideoShare`, the map from each row's video grid rows to the distinct ones; `shared_video_features(model, share)`
then makes the model's own `get_video_features` run the tower on the distinct videos and hand every row its
video's features (the same tensors, indexed: autograd sums the rows' gradients into the one vision pass, so a
trained vision tower gets exactly the gradient of the per-row encoding).

Everything else the model does is unchanged: the rope (3-D positions, Qwen2.5-VL's `second_per_grid_ts`) still
reads the per-row `video_grid_thw`, and the features reach the text model through the family's own code path
(`pooler_output`, plus Qwen3-VL's per-layer `deepstack_features`). transformers 5 calls `get_video_features` from
the model's forward and, in `generate`, once before the prefill; both go through the wrapper. Parity with the
per-row encoding for every family: tests/training/test_rl_shared_vision.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VideoShare:
    """How the rows of a batch map onto its distinct videos (each video: one or more grid rows)."""

    grid_thw: torch.Tensor
    """(distinct grid rows, 3): the grids of the distinct videos, in the order of their pixels in the batch."""
    take: tuple[int, ...]
    """For each grid row of the per-row `video_grid_thw` (rows in order): its index in `grid_thw`."""
    videos: int
    """Number of distinct videos (what the vision tower encodes)."""

    @property
    def row_grid_thw(self) -> torch.Tensor:
        """The per-row grid this map expands to (what the batch's `video_grid_thw` must equal)."""
        return self.grid_thw[list(self.take)]


def distinct_videos(examples: list[dict]) -> tuple[list[int], list[int]]:
    """(for each example the index of its video among the distinct ones, the first example of each distinct video).

    Examples share a video when they hold the same pixel tensor object, as `training.rl.rollout.encode_prompts`
    repeats each query's encoded prompt for its group (content is not compared: no pass over the pixels)."""
    first_of: dict[int, int] = {}
    video_of, firsts = [], []
    for i, e in enumerate(examples):
        key = id(e["pixel_values_videos"])
        if key not in first_of:
            first_of[key] = len(firsts)
            firsts.append(i)
        video_of.append(first_of[key])
    return video_of, firsts


def video_share(examples: list[dict]) -> tuple[VideoShare, list[int]]:
    """The share map of `examples` and the examples whose pixels the batch holds (one per distinct video)."""
    video_of, firsts = distinct_videos(examples)
    grids = [examples[i]["video_grid_thw"] for i in firsts]
    offsets = [0]
    for g in grids:
        offsets.append(offsets[-1] + len(g))
    take = tuple(offsets[u] + j for u in video_of for j in range(len(grids[u])))
    return VideoShare(torch.cat(grids), take, len(firsts)), firsts


def vision_owner(model: torch.nn.Module) -> torch.nn.Module:
    """The module that owns the vision tower (`visual`) and `get_video_features`: the family's base model
    (`Qwen2_5_VLModel`, `Qwen3VLModel`, `Qwen3_5Model`, ...), found through any wrapper (peft, an engine)."""
    for m in model.modules():
        if "visual" in m._modules and callable(getattr(m, "get_video_features", None)):
            return m
    raise TypeError(f"{type(model).__name__} has no module with a vision tower and get_video_features")


def expand_features(out, take: tuple[int, ...]):
    """`get_video_features`' output for the distinct videos -> the same for every row: its per-grid-row
    `pooler_output` (and Qwen3-VL's per-layer `deepstack_features`) indexed by `take`, the tensors shared."""
    if not hasattr(out, "pooler_output"):
        raise TypeError(f"get_video_features returned {type(out).__name__}, not a ModelOutput with pooler_output")
    out.pooler_output = tuple(out.pooler_output[i] for i in take)
    deep = getattr(out, "deepstack_features", None)
    if deep is not None:
        out.deepstack_features = [tuple(layer[i] for i in take) for layer in deep]
    return out


@contextmanager
def shared_video_features(model: torch.nn.Module, share: VideoShare | None) -> Iterator[None]:
    """Within the block, `model`'s forward and `generate` encode the batch's distinct videos once (pixels as
    `collate(..., share_videos=True)` lays them out) and give each row its video's features. `share=None`: no
    change (each row's own pixels)."""
    if share is None:
        yield
        return
    owner = vision_owner(model)
    if "get_video_features" in owner.__dict__:
        raise RuntimeError("shared_video_features blocks cannot nest on one model")
    encode = owner.get_video_features
    row_grid = share.row_grid_thw

    def get_video_features(pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor | None = None,
                           **kwargs):
        if video_grid_thw is not None and not torch.equal(video_grid_thw.cpu(), row_grid):
            raise ValueError(f"the batch's video_grid_thw {tuple(video_grid_thw.shape)} is not the one its video "
                             f"share expands to {tuple(row_grid.shape)}: collate with share_videos=True")
        out = encode(pixel_values_videos, share.grid_thw.to(pixel_values_videos.device), **kwargs)
        return expand_features(out, share.take)

    owner.get_video_features = get_video_features
    try:
        yield
    finally:
        del owner.get_video_features
