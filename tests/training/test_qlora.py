"""QLoRA (`train.model.finetune: qlora`, issue 37 item 4): LoRA adapters over a base quantised to 4-bit NF4 by
bitsandbytes, whose CPU backend runs it here (docs/environment.md, "QLoRA on this CPU").

- the tiny rung trains (DeepSpeed ZeRO-2, world size 1), resumes bit for bit (DeepSpeed's strict reload of the
  module meets bitsandbytes' quantisation-state keys), exports its adapter with the quantisation record, and the
  export reloads with its base in 4-bit and answers; merged at alpha 1 it is a plain full-precision export with
  the same logits;
- the planner's 4-bit bytes equal the loaded model's (tiny and the shape-true Qwen3-VL-2B rung);
- one shape-true rung (Qwen3-VL-2B, real widths, 1 layer) trains, exports, reloads and answers;
- ZeRO-3 and FSDP2 at world size 2 shard the packed 4-bit weights; both train and resume bit for bit;
- without bitsandbytes, training refuses before the model loads, saying what to do.

Measured (2026-12-05, 2 cores shared with other test runs): tiny 48 s, planner 19 s (tiny) and 15 s (the shape-true
rung, slow), refusal 10 s; slow: shape-true 75 s, world size 2 ZeRO-3 110 s; heavy (make test-heavy): FSDP2 at world
size 2, 86 s.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.train_fixtures import REPO_ROOT, Recorder, train_config

from training.sft import train
from vtg import checkpoints as ckpt
from vtg.model import quant

QWEN3VL_2B = "shape-true:Qwen/Qwen3-VL-2B-Instruct?text_layers=1&vision_blocks=1&vocab=1024"


def _qlora(shards, out, *extra):
    return train_config(shards, out, "train.model.finetune=qlora", "train.model.lora_r=4", "train.keep_last=10",
                        *extra)


def _val_example(shards):
    from vtg.queries import ReadStats, iter_examples
    from vtg.shards import list_shards

    return next(iter_examples(list_shards(shards, "val"), ReadStats(), 1))


def _logits(model, tokenizer, ex):
    from vtg.model.generation import vision_params
    from vtg.model.processing import answer_text, collate, encode_example, model_inputs

    enc = encode_example(tokenizer, ex.frames, ex.timestamps, ex.query, answer_text(ex.windows),
                         vision=vision_params(model))
    with torch.no_grad():
        return model(**model_inputs(collate([enc], tokenizer.pad_token_id))).logits


def _adapter(step_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(ckpt.export_dir(step_dir) / "adapter_model.safetensors")


def _four_bit(model) -> int:
    import bitsandbytes as bnb

    return sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


def test_tiny_qlora_trains_resumes_exports_and_reloads(shards_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from training.merge import merge
    from vtg.model.generation import greedy_answers
    from vtg.model.modeling import load_model_and_tokenizer

    rec = Recorder()
    straight = train(_qlora(shards_dir, tmp_path / "a", "train.max_steps=4", "train.save_every=2"), callbacks=[rec])
    assert rec.info["finetune"] == "qlora" and 0 < rec.info["trainable_params"] < rec.info["total_params"] / 5
    # a resume from step 2 into another root: DeepSpeed reloads the whole module, 4-bit layers included
    resumed = train(_qlora(shards_dir, tmp_path / "b", "train.max_steps=4", "train.save_every=2",
                           f"train.resume={tmp_path / 'a' / 'step-000002'}"))
    assert resumed["losses"] == straight["losses"] and straight["losses"][-1] < straight["losses"][0]
    a, b = _adapter(tmp_path / "a" / "step-000004"), _adapter(tmp_path / "b" / "step-000004")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    hf = ckpt.export_dir(ckpt.resolve_checkpoint(tmp_path / "a"))
    assert (hf / "adapter_config.json").is_file() and not (hf / "model.safetensors").exists()
    record = quant.read_record(hf)
    assert (record["bnb_4bit_quant_type"], record["bnb_4bit_use_double_quant"], record["load_in_4bit"]) == (
        "nf4", True, True)
    assert not any("lora" not in k for k in a)  # the adapter only: the 4-bit base is not in the export

    ex = _val_example(shards_dir)
    model, tok = load_model_and_tokenizer(hf)
    assert quant.is_quantized(model) and _four_bit(model) == 26  # every Linear but lm_head
    four_bit = _logits(model, tok, ex)
    [answer] = greedy_answers(model, tok, [ex], "cpu", max_new_tokens=12)
    assert isinstance(answer, str) and answer

    # merged at alpha 1: the adapter folded into the dequantised 4-bit weights, a plain export with the same model
    merged = ckpt.export_dir(merge(tmp_path / "a", 1.0, tmp_path / "merged"))
    assert (merged / "model.safetensors").is_file() and quant.read_record(merged) is None
    plain, _ = load_model_and_tokenizer(merged)
    assert not quant.is_quantized(plain) and not hasattr(plain, "peft_config")
    assert torch.allclose(_logits(plain, tok, ex), four_bit, atol=1e-4, rtol=1e-4)
    assert greedy_answers(plain, tok, [ex], "cpu", max_new_tokens=12) == [answer]

    # the record matters: the same adapter on the unquantised base is another model
    base = AutoModelForImageTextToText.from_pretrained(json.loads((hf / "adapter_config.json").read_text())
                                                       ["base_model_name_or_path"])
    wrong = _logits(PeftModel.from_pretrained(base, str(hf)).eval(), tok, ex)
    assert (wrong - four_bit).abs().max() > 100 * 1e-4


@pytest.mark.parametrize("base", ["tiny", pytest.param(QWEN3VL_2B, marks=pytest.mark.slow, id="qwen3vl_2b")])
def test_planner_counts_the_4bit_base_as_loaded(shards_dir, tmp_path, base):
    """The pre-flight's 4-bit elements and the planner's parameter bytes (ZeRO-0, fp32) against the model training
    builds: its frozen parameters as stored (packed codes, fp32 rest) plus each 4-bit weight's quantisation state."""
    from training.plan import Setup, plan
    from training.preflight import preflight
    from vtg.model.modeling import load_model_and_tokenizer

    cfg = _qlora(shards_dir, tmp_path, f"train.model.base={base}")
    report = preflight(cfg)
    setup = Setup(params=report.params, largest_layer=0, precision="fp32", trainable_frac=report.trainable /
                  report.params, quantized=report.quantized, quantized_tensors=report.quantized_tensors)
    model, _ = load_model_and_tokenizer(base, dtype=torch.float32, trainable=True, finetune=cfg.train.model)
    four_bit = [p for p in model.parameters() if getattr(p, "quant_state", None) is not None]
    trained = [p for p in model.parameters() if p.requires_grad]
    assert report.quantized == sum(quant.numel(p) for p in four_bit) > 0.5 * report.params
    assert report.quantized_tensors == len(four_bit)
    assert report.params == sum(quant.numel(p) for p in model.parameters()) - sum(p.numel() for p in trained)
    frozen_b = quant.weight_bytes(model) - sum(p.numel() * p.element_size() for p in trained)
    assert plan(setup, 0).params_b == pytest.approx(frozen_b, rel=1e-3)
    # the quantised share under 1 byte an element (0.52 and the per-tensor tables) instead of fp32's 4
    dense = Setup(params=report.params, largest_layer=0, precision="fp32")
    assert plan(setup, 0).params_b - 4 * (report.params - report.quantized) < 1.0 * report.quantized
    assert plan(setup, 0).params_b < plan(dense, 0).params_b
    assert "in 4-bit NF4" in report.render()


@pytest.mark.slow
def test_shape_true_qlora_trains_exports_and_answers(tmp_path):
    """The Qwen3-VL-2B rung at its real widths (text 2048 x 16 heads, MLP 6144, vision 1024 wide; 1 layer, 1 block,
    vocabulary cut to 1024): 113 M elements in 4-bit, 2 steps, export, reload in 4-bit, an answer."""
    from support.train_fixtures import write_fixture_shards

    from vtg.model.generation import greedy_answers
    from vtg.model.modeling import load_model_and_tokenizer

    shards = write_fixture_shards(tmp_path / "shards", n_train=8, n_val=2, shards_per_split=1, num_frames=4, size=56)
    rec = Recorder()
    summary = train(_qlora(shards, tmp_path / "ck", f"train.model.base={QWEN3VL_2B}", "train.max_steps=2",
                           "train.save_every=2", "train.micro_batch_size=2", "train.data.sanity_examples=2",
                           "preprocess.num_frames=4"), callbacks=[rec])
    assert summary["step"] == 2 and all(math.isfinite(v) for v in summary["losses"])
    hf = ckpt.export_dir(ckpt.resolve_checkpoint(tmp_path / "ck"))
    assert quant.read_record(hf) is not None and not (hf / "model.safetensors").exists()
    model, tok = load_model_and_tokenizer(hf)
    assert quant.is_quantized(model) and type(model.get_base_model()).__name__ == "Qwen3VLForConditionalGeneration"
    assert _four_bit(model) == 15 and rec.info["total_params"] == 119_318_784 + rec.info["trainable_params"]
    [answer] = greedy_answers(model, tok, [_val_example(shards)], "cpu", max_new_tokens=8)
    assert isinstance(answer, str)


@pytest.mark.slow
@pytest.mark.parametrize("engine", [pytest.param("train.zero_stage=3", id="zero3"),
                                    pytest.param("engine.strategy=fsdp", marks=pytest.mark.heavy, id="fsdp2")])
def test_sharded_engines_train_and_resume_4bit_at_world_size_2(shards_dir, tmp_path, engine):
    """ZeRO-3 and FSDP2 shard the packed 4-bit weights (measured: 1,024 of a layer's 2,048 bytes per rank; the
    quantisation state stays whole on each rank, where bitsandbytes' Linear4bit finds it after the gather): both
    train, and a resume from step 2 gives the straight run's losses and adapter bit for bit."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    common = [f"train.shards_dir={shards_dir}", "train.micro_batch_size=4", "train.max_steps=4", "train.save_every=2",
              "train.log_every=1", "train.progress=false", "train.data.num_workers=0", "train.data.shuffle_buffer=16",
              "tracking.enabled=false", "train.teach.steps=0", "evaluate.forgetting.suite=", "train.keep_last=10",
              "train.data.sanity_examples=4", "train.model.finetune=qlora", "train.model.lora_r=4", engine]

    def run(name: str, *extra: str) -> list[str]:
        summary = tmp_path / f"{name}.json"
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2", "-m", "training",
               "--summary", str(summary), f"train.out_dir={tmp_path / name}", *common, *extra]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return summary.with_name(f"{name}_loss.csv").read_text().splitlines()[1:]

    straight = run("a")
    resumed = run("b", f"train.resume={tmp_path / 'a' / 'step-000002'}")
    assert resumed == straight and len(straight) == 4
    assert ckpt.read_checkpoint_meta(tmp_path / "b" / "latest")["world_size"] == 2
    a, b = _adapter(tmp_path / "a" / "step-000004"), _adapter(tmp_path / "b" / "step-000004")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert quant.read_record(ckpt.export_dir(tmp_path / "a" / "step-000004")) is not None


@pytest.mark.slow
@pytest.mark.heavy
def test_gpu_check_qlora_case_cpu_dry_run(tmp_path):
    """`make gpu-check`'s qlora case at toy sizes on the CPU (the Qwen3-VL-2B rung, 1 layer): 2 steps, a resume from
    step 1 compared loss by loss, the export evaluated, the pre-flight's 4-bit count in the report."""
    r = subprocess.run([sys.executable, "-m", "training.gpu_check", "--cpu-dry-run", "--rung", "qwen3vl_2b", "--cases",
                        "qlora", "--out", str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                       timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    report = json.loads((tmp_path / "qwen3vl_2b" / "qlora.json").read_text())
    assert report["resume"] == {"from_step": 1, "steps_compared": 1, "bit_exact": True, "mismatched_steps": []}
    assert report["evaluation"]["queries"] == 4 and "refused" not in report
    assert "quantization_config.json" in report["export_files"] and "model.safetensors" not in report["export_files"]
    assert 0.5 * report["params"] < report["quantized_params"] < report["params"]
    assert "| resume bit-exact | True" in (tmp_path / "qwen3vl_2b" / "qlora.md").read_text()


REFUSAL = """
import sys
sys.modules["bitsandbytes"] = None  # a machine without bitsandbytes: its import fails
sys.path[:0] = [{repo!r}, {tests!r}]
from support.train_fixtures import train_config
from training.preflight import PreflightError, check_before_training
from vtg.errors import VTGError
from vtg.model.modeling import load_model_and_tokenizer
try:
    check_before_training(train_config({shards!r}, {out!r}, "train.model.finetune=qlora"))
except PreflightError as e:
    print("PREFLIGHT", e)
try:
    load_model_and_tokenizer({export!r})
except VTGError as e:
    print("LOAD", e)
"""


def test_without_bitsandbytes_qlora_is_refused_before_the_model(shards_dir, tmp_path):
    """A machine without bitsandbytes: training's pre-flight refuses `finetune=qlora` before any weights load, and
    a QLoRA export does not load as something else; both say what to do."""
    export = tmp_path / "hf"
    export.mkdir()
    (export / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "unused"}))
    (export / quant.QUANT_FILE).write_text(json.dumps(quant.bnb_config(torch.float32).to_dict()))
    script = REFUSAL.format(repo=str(REPO_ROOT), tests=str(REPO_ROOT / "tests"), shards=str(shards_dir),
                            out=str(tmp_path / "ck"), export=str(export))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("PREFLIGHT pre-flight failed: train.model.finetune=qlora: a 4-bit base cannot train here: "
            "bitsandbytes is not installed") in out
    assert f"LOAD {export} (a QLoRA export): a 4-bit (QLoRA) base cannot run here: bitsandbytes is not" in out
    assert out.count(quant.PIP) == 2 and out.count("train.model.finetune=lora") == 2
    assert not (tmp_path / "ck").exists()  # refused before anything was written
