"""Issue 22, first step: the processor facts (patch sizes, pixel bounds, mean/std) are the checkpoint's own.

Before, min/max pixels were hard-coded (56x56 and 28x28x1280; Qwen2.5-VL's preprocessor configs say 3,136 and
12,845,056) and the CLIP mean/std were constants: a checkpoint with other facts (Qwen3-VL: patch 16, mean/std 0.5)
would have been given wrong pixels. Now every model's facts come from the `preprocessor_config.json` beside its
weights, every export keeps a copy, and a checkpoint without one is an error."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from vtg.errors import VTGError
from vtg.model.processing import (
    CLIP_MEAN,
    PROCESSOR_CONFIG,
    QWEN25VL_PROCESSOR,
    VisionParams,
    patchify_video,
    save_processor_config,
)

QWEN3VL_LIKE = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "size": {"shortest_edge": 4096, "longest_edge": 2 * 1024 * 1024}}
"""Qwen3-VL's facts in transformers 5's layout (size.shortest_edge/longest_edge): patch 16, mean/std 0.5."""


def test_the_tiny_model_carries_qwen25vl_s_real_processor_config(tiny_model_dir):
    data = json.loads((tiny_model_dir / PROCESSOR_CONFIG).read_text())
    assert data == QWEN25VL_PROCESSOR and (data["min_pixels"], data["max_pixels"]) == (3136, 12845056)
    assert VisionParams.from_checkpoint(tiny_model_dir) == VisionParams()


def test_a_loaded_model_and_its_export_give_the_checkpoint_s_facts(tiny_model_dir, tmp_path):
    from vtg.model.modeling import load_model_and_tokenizer

    ck = tmp_path / "ck"
    shutil.copytree(tiny_model_dir, ck)
    facts = {**QWEN25VL_PROCESSOR, "min_pixels": 8000, "image_mean": [0.4, 0.4, 0.4]}
    (ck / PROCESSOR_CONFIG).write_text(json.dumps(facts))
    model, _ = load_model_and_tokenizer(ck)
    vp = VisionParams.from_model(model)
    assert vp.min_pixels == 8000 and vp.image_mean == (0.4, 0.4, 0.4) and vp.max_pixels == 12845056
    export = tmp_path / "export"
    export.mkdir()
    save_processor_config(model, export)  # what every checkpoint save writes into hf/
    assert json.loads((export / PROCESSOR_CONFIG).read_text()) == facts


def test_a_checkpoint_without_processor_facts_is_an_error_not_a_default(tiny_model_dir, tmp_path):
    from vtg.model.modeling import load_model_and_tokenizer

    ck = tmp_path / "ck"
    shutil.copytree(tiny_model_dir, ck)
    (ck / PROCESSOR_CONFIG).unlink()
    model, _ = load_model_and_tokenizer(ck)
    with pytest.raises(VTGError, match=r"no preprocessor_config.json: the checkpoint's own processor facts"):
        VisionParams.from_model(model)
    (ck / PROCESSOR_CONFIG).write_text(json.dumps({**QWEN25VL_PROCESSOR, "patch_size": 16}))
    with pytest.raises(VTGError, match=r"patch/merge/temporal patch 16/2/2, but the model's vision tower has 14/2/2"):
        VisionParams.from_model(model)
    (ck / PROCESSOR_CONFIG).write_text(json.dumps({"patch_size": 14}))
    with pytest.raises(VTGError, match=r"no merge_size, temporal_patch_size, min_pixels, max_pixels, image_mean"):
        VisionParams.from_model(model)


@pytest.mark.parametrize("size", [(64, 64), (96, 160), (544, 1280)])
def test_patchify_with_other_facts_matches_the_hf_processor_configured_alike(size):
    """The pixels follow the facts: Qwen3-VL-like (patch 16, mean/std 0.5) against transformers' own processor
    configured with them, frame by frame (a 16:9-ish and a 1280x544 frame keep their aspect ratio)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    vp = VisionParams.from_processor_config(QWEN3VL_LIKE)
    frames = np.random.default_rng(0).integers(0, 256, size=(2, *size, 3), dtype=np.uint8)
    ours, grid = patchify_video(frames, vp)
    proc = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size=dict(QWEN3VL_LIKE["size"]))
    hf = proc(images=list(frames), return_tensors="pt")
    t, gh, gw = grid[0].tolist()
    assert (gh, gw) == tuple(hf["image_grid_thw"][0, 1:].tolist())
    assert abs(gw / gh - size[1] / size[0]) < 0.2 * size[1] / size[0]  # the aspect ratio is kept, not squashed
    p = 16
    ours = ours.view(t, gh * gw, 3, 2, p, p)
    theirs = hf["pixel_values"].view(2, gh * gw, 3, 2, p, p)[:, :, :, 0]
    for frame in range(2):
        assert torch.equal(ours[0, :, :, frame], theirs[frame]), f"frame {frame} differs"
    clip = patchify_video(frames[:, :64, :64], VisionParams(patch_size=16))[0]  # CLIP mean/std: other pixels
    assert not torch.equal(clip, patchify_video(frames[:, :64, :64], vp)[0]) and CLIP_MEAN != (0.5, 0.5, 0.5)
