"""Issue 22: the Qwen3-VL-2B and Qwen3.5-2B rungs' exact recipes, shape-true on this CPU, as
`test_train_recipes.py` runs the Qwen2.5-VL rungs (its helpers; a file of its own so that the two workers of
`make test` share the recipes' time)."""

import json
import time

import pytest
import torch
from support.train_fixtures import REPO_ROOT
from test_train_recipes import (
    VOCAB,
    _evaluate,
    _lifecycle,
    _logits_on,
    _peak_rss,
    cpu_overrides,
    recipe_shards,
    rl_step_overrides,
)

from vtg import checkpoints as ckpt
from vtg.config import load_config
from vtg.model.shape_true import build_shape_true

pytestmark = pytest.mark.slow
__all__ = ["recipe_shards"]  # the shared module fixture


NEW_FAMILIES = [
    pytest.param("Qwen/Qwen3-VL-2B-Instruct", "qwen3vl_2b_lora_1gpu", "", True, "Qwen3VLForConditionalGeneration",
                 id="qwen3vl_2b"),
    pytest.param("Qwen/Qwen3.5-2B", "qwen3_5_2b_lora_1gpu", "&text_layers=2", False,
                 "Qwen3_5ForConditionalGeneration", id="qwen3_5_2b", marks=pytest.mark.heavy),
]


@pytest.mark.parametrize("hub_id,experiment,depth,kill,model_class", NEW_FAMILIES)
def test_new_family_lora_recipe_shape_true_world_size_2(recipe_shards, tmp_path, hub_id, experiment, depth, kill,
                                                         model_class):
    """Issue 22: the Qwen3-VL-2B and Qwen3.5-2B rungs' recipes at world size 2 on shape-true models (real widths:
    Qwen3-VL-2B text 2048 x 16 heads / 8 KV heads of 128, vision 1024 wide, patch 16, one deepstack merger;
    Qwen3.5-2B with 2 text layers, one Gated DeltaNet and one full-attention layer). Qwen3-VL is SIGKILLed in the
    middle of step 2, Qwen3.5 stops after step 1 (`--stop-after`); both resume to the end, the LoRA export is
    reloaded with plain transformers + `PeftModel`, one GRPO step runs from it, and it is evaluated, with the
    family's own inputs (time as `<t seconds>` text, clip-level pixel bounds, mean/std 0.5).

    Measured (2026-12-02, 2 cores shared with other work): Qwen3-VL-2B 153 s, 1.50 GB peak RSS per rank."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from training.rl.grpo import run_rl

    t0 = time.monotonic()
    base_dir = build_shape_true(hub_id, vocab=VOCAB, **({"text_layers": 2} if depth else {}))
    overrides = [o.replace(f"?vocab={VOCAB}", f"?vocab={VOCAB}{depth}")
                 for o in cpu_overrides(hub_id, tmp_path, recipe_shards, *rl_step_overrides(tmp_path))]
    t = load_config(REPO_ROOT / "params.yaml", experiment, overrides).train
    assert (t.model.finetune, t.model.freeze_vision, t.zero_stage, t.micro_batch_size, t.grad_accum) == (
        "lora", True, 2, 2, 8)
    run = _lifecycle(tmp_path, experiment, overrides, kill=kill)
    assert "effective batch 32 = micro 2 x accum 8 x world 2" in run["log"]

    hf = ckpt.export_dir(ckpt.resolve_checkpoint(tmp_path / "ck"))
    adapter = json.loads((hf / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(base_dir)
    base = AutoModelForImageTextToText.from_pretrained(adapter["base_model_name_or_path"])
    assert type(base).__name__ == model_class
    tok = AutoTokenizer.from_pretrained(hf)
    before = _logits_on(base, tok, recipe_shards)
    model = PeftModel.from_pretrained(base, str(hf)).eval()
    assert not torch.equal(before, _logits_on(model, tok, recipe_shards))  # the adapters trained

    rl = run_rl(load_config(REPO_ROOT / "params.yaml", experiment, [*overrides, "rl.init=latest"]))
    assert len(rl["history"]) == 1 and ckpt.read_checkpoint_meta(ckpt.latest_checkpoint(tmp_path / "rl"))["step"] == 1
    metrics = _evaluate(tmp_path, experiment, overrides)
    print(f"\n{hub_id} recipe: {time.monotonic() - t0:.0f} s, peak RSS/rank {_peak_rss(tmp_path):.2f} GB, "
          f"losses {run['losses']}, metrics {metrics}")
