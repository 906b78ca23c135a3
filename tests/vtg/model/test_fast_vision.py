"""Issue 40's exact cuts: the vision towers' attention in a few calls (`vtg.model.fast_vision`), and a suite's clips
read two passes per video and cached (`vtg.general_tasks.suite_frames`), each the same numbers as what it replaced."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.clock_fixtures import write_pts_video
from vtg.errors import VTGError
from vtg.general_tasks import CACHE_ENV, GeneralItem, load_frames, suite_frames
from vtg.model.fast_vision import VARLEN_SDPA, use_varlen_vision
from vtg.model.modeling import load_model_and_tokenizer
from vtg.model.tiny import build_tiny_model


def _tower_run(model, pixels, grid):
    model.zero_grad()
    out = model.model.visual(pixels, grid_thw=grid)
    out = out.pooler_output if hasattr(out, "pooler_output") else out[0]
    out.float().pow(2).mean().backward()
    return out.detach().clone(), [p.grad.clone() for p in model.model.visual.parameters() if p.grad is not None]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_varlen_vision_equals_the_per_span_loop_bit_for_bit(family):
    """Square frames (every span one length: the reshape path) and wide frames plus a short video (spans of several
    lengths: Qwen2.5-VL's edge windows, the grouped path), forward and every gradient, against transformers' sdpa."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(build_tiny_model(seed=0, family=family),
                                                        attn_implementation="sdpa")
    cfg = model.model.visual.config
    width = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    for grid in (torch.tensor([[4, 4, 4]] * 3), torch.tensor([[4, 4, 6]] * 2 + [[1, 10, 14]])):
        pixels = torch.randn(int(grid.prod(-1).sum()), width, generator=torch.Generator().manual_seed(0))
        model.set_attn_implementation({"vision_config": "sdpa"})
        out_loop, grads_loop = _tower_run(model, pixels, grid)
        assert use_varlen_vision(model)
        out_varlen, grads_varlen = _tower_run(model, pixels, grid)
        assert torch.equal(out_loop, out_varlen), (family, grid.tolist())
        assert len(grads_loop) == len(grads_varlen) > 0
        assert all(torch.equal(a, b) for a, b in zip(grads_loop, grads_varlen)), (family, grid.tolist())


def test_loader_switches_only_the_vision_tower_and_exports_stay_plain(tmp_path, tiny_model_dir):
    model, _ = load_model_and_tokenizer(tiny_model_dir)
    before = set(model.state_dict())
    assert model.config.vision_config._attn_implementation == VARLEN_SDPA
    assert model.config._attn_implementation == "sdpa"
    assert model.config.text_config._attn_implementation == "sdpa"
    model.save_pretrained(tmp_path / "export")
    assert VARLEN_SDPA not in (tmp_path / "export" / "config.json").read_text()
    from transformers import AutoModelForImageTextToText

    plain = AutoModelForImageTextToText.from_pretrained(tmp_path / "export")
    assert set(plain.state_dict()) == before
    eager, _ = load_model_and_tokenizer(tiny_model_dir, attn_implementation="eager")
    assert eager.config.vision_config._attn_implementation == "eager"  # asked for: left alone
    assert not use_varlen_vision(eager)


def test_suite_frames_equal_one_clip_per_item(tmp_path, monkeypatch):
    """Several clips of one file (overlapping, to the end, one with no frame inside), a variable-rate file and an
    image: the grouped reader gives each item exactly what `load_frames` gives it alone."""
    import cv2

    steady, vfr = tmp_path / "steady.mp4", tmp_path / "vfr.mp4"
    write_pts_video(steady, [i / 8 for i in range(40)], (1.0, 2.0), size=64)
    write_pts_video(vfr, [0.0, 0.1, 0.15, 0.5, 0.55, 1.2, 1.25, 1.3, 2.0, 2.6, 2.7, 3.3], (0.4, 1.4), size=64)
    image = tmp_path / "still.png"
    cv2.imwrite(str(image), np.full((40, 70, 3), 120, np.uint8))
    spans = [(steady, 0.0, 2.0), (steady, 1.0, 3.0), (steady, 3.5, None), (steady, 4.9, 4.95), (vfr, 0.1, 1.3),
             (vfr, 1.0, None), (steady, 0.0, 2.0)]
    items = [GeneralItem.model_validate({"id": f"i{k}", "task": "t", "question": "q?", "answer": "a", "video": str(v),
                                         "start_s": s, "end_s": e}) for k, (v, s, e) in enumerate(spans)]
    items.append(GeneralItem.model_validate({"id": "img", "task": "t", "question": "q?", "answer": "a",
                                             "image": str(image)}))
    cache = tmp_path / "suite_frames"  # this test's own (the run's is shared by both workers)
    monkeypatch.setenv(CACHE_ENV, str(cache))

    def entries() -> set[Path]:  # the decoded suites (not the builders' lock files beside them)
        return {p for p in cache.glob("*") if not p.name.startswith(".")} if cache.is_dir() else set()

    before = entries()
    grouped = suite_frames(items, 5, 56)  # decoded, then kept on disk
    (made,) = entries() - before
    cached = suite_frames(items, 5, 56)  # read back from the cache
    assert len(grouped) == len(cached) == len(items)
    for item, (frames, times), (frames2, times2) in zip(items, grouped, cached):
        alone, alone_times = load_frames(item, 5, 56)
        assert np.array_equal(frames, alone) and times == alone_times, json.loads(item.model_dump_json())
        assert np.array_equal(frames2, alone) and times2 == alone_times and frames2.dtype == np.uint8
    assert len(grouped[3][0]) == 1  # no frame inside: the nearest one, as alone
    gone = GeneralItem.model_validate({"id": "gone", "task": "t", "question": "q?", "answer": "a",
                                       "video": str(tmp_path / "gone.mp4")})
    with pytest.raises(VTGError, match="gone.mp4: cannot read the video"):
        suite_frames([*items, gone], 5, 56)
    # a changed file is a new key: decoded again, never served stale frames
    write_pts_video(steady, [i / 8 for i in range(40)], (2.0, 3.0), size=64)
    again = suite_frames(items, 5, 56)
    assert entries() - before - {made}
    assert np.array_equal(again[0][0], load_frames(items[0], 5, 56)[0])
