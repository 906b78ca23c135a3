"""Issue 22, faithful frames (shard contract 2): a frame keeps its aspect ratio from the source file to the
model, a short window is never padded with repeated frames, and every sample records the source fps and the
source frame index of each frame, from which its timestamps follow."""

from __future__ import annotations

import numpy as np
import pytest
from support.videokit import write_video

from beam_jobs.video import build_windows, decode
from vtg.config.preprocess import PreprocessConfig
from vtg.records import CanonicalRecord
from vtg.shards import SHARD_CONTRACT, decode_jpegs, stored_frame_size


def _windows(tmp_path, size: tuple[int, int], n_frames: int, fps: float, **cfg):
    path = tmp_path / "clip.mp4"
    write_video(path, n_frames, fps=fps, size=size)
    cfg = PreprocessConfig(**cfg)
    video = decode(str(path), cfg)
    duration = n_frames / fps
    record = CanonicalRecord(video_id="clip", video_path=str(path), duration_s=duration, query="the red square",
                             windows=[(0.2 * duration, 0.6 * duration)], source="native:x", annotation_id="a")
    windows, dropped, _ = build_windows("clip", [record], video, cfg)
    assert dropped == [] and len(windows) == 1
    return video, windows[0]


@pytest.mark.parametrize("size", [(1280, 544), (544, 1280), (320, 180)])
def test_a_real_clip_keeps_its_aspect_ratio_through_to_the_model(tmp_path, size):
    """1280x544 and 544x1280 came out 56x56 before; now the stored frame and every family's grid keep the
    ratio (within what their patch rounding allows)."""
    from vtg.model.families import FAMILIES
    from vtg.model.processing import VisionParams, patchify_video

    _, w = _windows(tmp_path, size, 24, 8.0, frame_size=112, max_window_s=16.0)
    frames = decode_jpegs(w.jpegs)
    ratio = size[0] / size[1]
    assert frames.shape[1:3] == stored_frame_size(*size, 112)[::-1]
    assert abs(frames.shape[2] / frames.shape[1] - ratio) < 0.05 * ratio
    for name, family in FAMILIES.items():
        vp = VisionParams.for_family(family)
        _, grid = patchify_video(frames, vp)
        _, gh, gw = grid[0].tolist()
        assert abs(gw / gh - ratio) < 0.3 * ratio, (name, gh, gw)
        assert gh != gw, name  # not squashed to a square


def test_a_square_source_is_stored_exactly_at_frame_size():
    assert stored_frame_size(112, 112, 56) == (56, 56) and stored_frame_size(640, 640, 336) == (336, 336)
    w, h = stored_frame_size(1920, 1080, 336)
    assert abs(w * h - 336 ** 2) < 0.02 * 336 ** 2 and (w % 2, h % 2) == (0, 0)


def test_a_short_window_gets_fewer_frames_never_repeated_ones(tmp_path):
    """A 3 s, 10 fps clip with a 16-frame budget: 12 distinct candidates at 4 fps, so 12 frames (before: 16, of
    which 4 copies carrying the same timestamps, and an `fps` of 5.33)."""
    _, w = _windows(tmp_path, (96, 96), 30, 10.0, num_frames=16, candidate_fps=4.0, frame_size=56)
    assert len(w.jpegs) == len(w.timestamps) == len(set(w.timestamps)) == 12
    assert w.timestamps == sorted(w.timestamps)
    assert w.fps == pytest.approx(12 / 3.0)
    frames = decode_jpegs(w.jpegs)
    assert all(not np.array_equal(frames[i], frames[i + 1]) for i in range(len(frames) - 1))


@pytest.mark.parametrize("mode", ["uniform", "adaptive"])
def test_every_sample_records_its_source_fps_and_frame_indices(tmp_path, mode):
    video, w = _windows(tmp_path, (96, 96), 80, 8.0, num_frames=8, frame_mode=mode)
    assert w.source_fps == pytest.approx(video.fps) == pytest.approx(8.0)
    assert len(w.frame_indices) == len(w.timestamps) == len(set(w.frame_indices))
    for i, t in zip(w.frame_indices, w.timestamps):
        assert t == pytest.approx(i / w.source_fps - w.start_s, abs=1e-4)


def test_shards_of_an_older_contract_are_refused_with_what_to_do(tmp_path):
    import json

    from vtg.errors import VTGError
    from vtg.shards import MANIFEST, list_shards
    from vtg.testing.shards import write_synthetic_shards

    root = write_synthetic_shards(tmp_path, n_train=2, n_val=1, shards_per_split=1)
    assert len(list_shards(root, "train")) == 1  # hand-made shards without a manifest: read
    (root / MANIFEST).write_text(json.dumps({"shards": []}))  # a manifest from before the contract field
    with pytest.raises(VTGError, match=r"sample contract 1 .* re-run preprocess"):
        list_shards(root, "train")
    (root / MANIFEST).write_text(json.dumps({"shards": [], "shard_contract": SHARD_CONTRACT}))
    assert len(list_shards(root, "train")) == 1


def test_the_family_policy_samples_2_fps_of_distinct_frames(tmp_path):
    """`frame_mode: family` (Qwen3-VL's policy): 2 fps over a 10 s window = 20 frames, within 4-768; with a token
    budget, fewer; never more than the distinct candidates."""
    _, w = _windows(tmp_path, (96, 96), 80, 8.0, frame_mode="family", family="qwen3_vl", candidate_fps=4.0)
    assert len(w.jpegs) == 20 and len(set(w.frame_indices)) == 20
    # 96x96 stored at 56x56 -> 64x64 under Qwen3-VL's rule: 4 tokens per 2 frames; a budget of 24 tokens: 12 frames
    _, w = _windows(tmp_path, (96, 96), 80, 8.0, frame_mode="family", family="qwen3_vl", max_video_tokens=24)
    assert len(w.jpegs) == 12
