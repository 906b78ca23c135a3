"""`python -m training.merge` (WiSE-FT): the interpolated weights, the checkpoint contract of the result, and the
refusals."""

from __future__ import annotations

import json

import pytest
import torch

from training.merge import main, merge, merged_root
from vtg import checkpoints as ckpt
from vtg.errors import VTGError
from vtg.model.modeling import load_model_and_tokenizer
from vtg.model.processing import save_processor_config


@pytest.fixture
def tuned(tiny_model_dir, tmp_path):
    """A 'fine-tuned' checkpoint: the tiny base with every floating parameter moved, finalized as an SFT step."""
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    root = tmp_path / "checkpoints" / "sft"
    tmp = ckpt.temp_dir_for(root, 1500)
    model.save_pretrained(ckpt.export_dir(tmp))
    tok.save_pretrained(ckpt.export_dir(tmp))
    save_processor_config(model, ckpt.export_dir(tmp))
    meta = {"data_version": "d", "git_commit": "c", "config_hash": "h", "finetune": "full", "base": "tiny",
            "base_path": str(tiny_model_dir), "train_hash": "k"}
    return ckpt.finalize(root, 1500, meta, {"train": {"seed": 1}}, keep_last=3)


def weights(path):
    model, _ = load_model_and_tokenizer(path)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_merge_interpolates_every_weight_and_writes_a_checkpoint(tuned, tiny_model_dir, capsys):
    assert main(["--checkpoint", str(tuned), "--alpha", "0.25"]) == 0
    out = merged_root(tuned, 0.25) / "step-001500"
    assert capsys.readouterr().out.strip() == str(out) and out.parent.name == "sft-merged-a0.25"
    base, ft, mixed = weights(tiny_model_dir), weights(ckpt.export_dir(tuned)), weights(ckpt.export_dir(out))
    moved = 0
    for k, v in mixed.items():
        if v.is_floating_point():
            assert torch.allclose(v, 0.75 * base[k] + 0.25 * ft[k], atol=1e-6), k
            moved += not torch.equal(v, ft[k])
    assert moved > 10
    meta = ckpt.read_checkpoint_meta(out, verify=True)  # a complete checkpoint: files, digests, meta last
    assert meta["merged_from"]["alpha"] == 0.25 and meta["base_path"] == str(tiny_model_dir) and meta["step"] == 1500
    assert ckpt.parent_checkpoint(out, {"parent_checkpoint": meta["merged_from"]["checkpoint"]}) == tuned.resolve()
    assert json.loads((out / "config.json").read_text()) == {"train": {"seed": 1}}


def test_the_ends_are_the_base_and_the_checkpoint_and_a_rerun_writes_nothing(tuned, tiny_model_dir, tmp_path):
    zero = merge(tuned, 0.0, tmp_path / "a0")
    one = merge(tuned, 1.0, tmp_path / "a1")
    base, ft = weights(tiny_model_dir), weights(ckpt.export_dir(tuned))
    for k, v in weights(ckpt.export_dir(zero)).items():
        assert torch.equal(v, base[k]), k
    for k, v in weights(ckpt.export_dir(one)).items():
        assert torch.equal(v, ft[k]), k
    stamp = (zero / "meta.json").stat().st_mtime_ns
    assert merge(tuned, 0.0, tmp_path / "a0") == zero and (zero / "meta.json").stat().st_mtime_ns == stamp
    with pytest.raises(VTGError, match="is not the merge of .* at alpha 0.5: nothing written"):
        merge(tuned, 0.5, tmp_path / "a0")


def test_refusals_are_one_line(tuned, tmp_path):
    with pytest.raises(VTGError, match=r"--alpha 1.5: must be in \[0, 1\]"):
        merge(tuned, 1.5)
    meta = ckpt.read_checkpoint_meta(tuned)
    root = tmp_path / "other"
    tmp = ckpt.temp_dir_for(root, 1)
    ckpt.export_dir(tmp).mkdir(parents=True)
    (ckpt.export_dir(tmp) / "model.safetensors").write_text("weights")
    lost = ckpt.finalize(root, 1, {**{k: meta[k] for k in ckpt.REQUIRED_META if k != "step"},
                                   "base_path": str(tmp_path / "gone")}, {}, keep_last=3)
    with pytest.raises(VTGError, match="is not a local export"):
        merge(lost, 0.5)
