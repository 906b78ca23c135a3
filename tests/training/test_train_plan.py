"""The memory planner agrees with DeepSpeed's own estimators and recommends sensibly."""

import numpy as np
import pytest
import torch

from training.activations import activation_bytes
from training.arch import Arch
from training.plan import GB, Setup, model_size, plan, recommend
from training.plan.__main__ import activation_need, main


@pytest.mark.parametrize("params", [1.3e9, 7e9, 70e9])
@pytest.mark.parametrize("gpus,nodes", [(1, 1), (8, 1), (8, 4)])
def test_gpu_totals_equal_deepspeed_estimators(params, gpus, nodes, capsys):
    from deepspeed.runtime.zero.stage3 import (
        estimate_zero3_model_states_mem_needs,
        estimate_zero3_model_states_mem_needs_all_cold,
    )
    from deepspeed.runtime.zero.stage_1_and_2 import (
        estimate_zero2_model_states_mem_needs,
        estimate_zero2_model_states_mem_needs_all_cold,
    )

    largest = 0.04 * params
    s = Setup(params=params, largest_layer=largest, gpus_per_node=gpus, nodes=nodes)
    for offload in (False, True):
        ds = estimate_zero2_model_states_mem_needs(int(params), gpus, nodes, cpu_offload=offload)[1]
        assert plan(s, 2, offload).model_states_b == pytest.approx(ds, abs=2)
    for off_opt, off_param in ((False, False), (True, False), (True, True)):
        ds = estimate_zero3_model_states_mem_needs(int(params), int(largest), gpus, nodes, off_opt, off_param)[1]
        assert plan(s, 3, off_opt, off_param).model_states_b == pytest.approx(ds, abs=2)
    # The printed all-cold tables carry the same numbers.
    estimate_zero2_model_states_mem_needs_all_cold(int(params), gpus, nodes)
    estimate_zero3_model_states_mem_needs_all_cold(int(params), int(largest), gpus, nodes)
    out = capsys.readouterr().out
    gib = plan(s, 3).model_states_b / GB
    assert f"{gib:.2f}GB" in out.replace(" ", "")


def test_partitioning_order_and_recommendation():
    s = Setup(params=7e9, largest_layer=0.5e9, gpus_per_node=8, gpu_mem_gb=80)
    totals = [plan(s, st).model_states_b for st in range(4)]
    assert totals == sorted(totals, reverse=True)  # every ZeRO stage saves memory over the previous
    assert recommend(s, 8).stage == 2  # 7B on 8 x 80 GB: ZeRO-2 fits (the shipped 8-GPU experiment)
    one = Setup(params=7e9, largest_layer=0.5e9, gpus_per_node=1, gpu_mem_gb=80)
    rec = recommend(one, 8)
    assert rec.offload_optimizer  # full 7B on one 80 GB GPU needs offload
    lora = Setup(params=7e9, largest_layer=0.5e9, gpus_per_node=1, gpu_mem_gb=24, trainable_frac=0.01)
    assert recommend(lora, 4).stage == 2 and not recommend(lora, 4).offload_optimizer


def test_cli_plans_a_shipped_experiment(capsys):
    assert main(["-e", "qwen25vl_7b_zero2_8gpu", "--gpu-mem", "80"]) == 0
    out = capsys.readouterr().out
    assert "8 GPU(s)" in out and "recommended: ZeRO-2" in out
    assert main(["--params", "1e6", "--gpus", "1", "--precision", "fp32"]) == 0


def test_the_plan_leaves_room_for_the_experiment_s_token_budget(capsys):
    """With an experiment, the activations a recommendation must leave are the pre-flight's count of its micro-batch
    under its token budget; a budget no option holds gets the largest micro-batch (and budget) that fits."""
    from training.preflight import preflight
    from vtg.config import load_config

    cfg = load_config("params.yaml", "qwen25vl_3b_lora_1gpu")
    need, report = activation_need(cfg)
    assert need.token_budget == cfg.train.data.token_budget and need.packing == cfg.train.data.packing
    assert need.gb * GB == pytest.approx(preflight(cfg).configured.activations.total_b)
    assert need.micro_batch == cfg.train.data.token_budget // report.tokens.total
    assert main(["-e", "qwen25vl_3b_lora_1gpu"]) == 0
    out = capsys.readouterr().out
    assert f"activations {need.gb:.2f} GiB" in out and f"leaves >= {need.gb:.3g} GiB" in out

    big = ["train.data.token_budget=40960", "train.micro_batch_size=16"]
    wide, _ = activation_need(load_config("params.yaml", "qwen25vl_3b_lora_1gpu", big))
    assert wide.micro_batch == 16 and wide.gb == pytest.approx(need.gb * 16 / need.micro_batch, rel=0.01)
    assert main(["-e", "qwen25vl_3b_lora_1gpu", *big]) == 0
    out = capsys.readouterr().out
    assert "no option leaves" in out
    m = int(out.split("train.micro_batch_size=")[1].split()[0])
    assert f"train.data.token_budget={m * wide.seq}" in out
    setup = Setup(params=report.params, largest_layer=model_size(cfg.train.model.base)[1], gpu_mem_gb=cfg.train.gpu_mem_gb,
                  trainable_frac=report.trainable / report.params)
    assert recommend(setup, wide.gb * m / 16) is not None and recommend(setup, wide.gb * (m + 1) / 16) is None


def test_param_counts_from_the_architecture_alone(tiny_model_dir):
    """Counted from config shapes: the published totals of the real models, and every tensor of the tiny export."""
    from safetensors import safe_open

    from training.arch import arch_for
    from vtg.model.shape_true import arch_facts

    for hub_id in ("Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct"):
        arch, source, tokenizer = arch_for(hub_id)
        assert "vtg/model/archs" in source and tokenizer is None
        assert arch.param_count()[0] == arch_facts(hub_id)["total_params"]
    arch, _, tokenizer = arch_for("tiny")
    with safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as f:
        shapes = [f.get_slice(k).get_shape() for k in f.keys()]  # noqa: SIM118 - safe_open is not a dict
    numels = [int(np.prod(s)) for s in shapes]
    assert arch.param_count() == (sum(numels), max(numels)) and tokenizer is not None


@pytest.mark.parametrize("finetune,freeze_vision", [("full", False), ("full", True), ("lora", True), ("lora", False)])
def test_trainable_params_match_the_finetune_modes(finetune, freeze_vision, tiny_model_dir):
    from transformers import AutoModelForImageTextToText

    from training.activations import trainable_params
    from training.arch import arch_for
    from vtg.model.modeling import apply_finetune_mode, count_parameters

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    model = apply_finetune_mode(model, finetune, lora_r=8, freeze_vision=freeze_vision)
    trainable, _ = count_parameters(model)
    assert trainable_params(arch_for("tiny")[0], finetune, 8, freeze_vision) == trainable


def _saved_bytes(model, **inputs) -> int:
    """Bytes autograd keeps for backward in one forward (parameters excluded): the stored activations."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs)
    return sum(seen.values())


def _small_qwen(layers: int, blocks: int, attn: str, checkpointing: bool = False):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 1024,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]}}
    vision = {"depth": blocks, "hidden_size": 128, "intermediate_size": 320, "num_heads": 4, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 256,
              "fullatt_block_indexes": list(range(blocks))}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, video_token_id=1000, image_token_id=1001,
                              vision_start_token_id=1002, vision_end_token_id=1003)
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16).train()
    model.set_attn_implementation(attn)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, Arch.from_hf_config(config)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_activation_formula_matches_what_autograd_keeps(attn):
    """Per text layer and per vision block (one more of each, the rest equal), the bytes a bf16 forward of a small
    Qwen2.5-VL saves for backward are within 15% of `activation_bytes`; with checkpointing, ~2*s*h per layer."""
    gt, gh, gw = 2, 16, 16
    patches, video = gt * gh * gw, gt * gh * gw // 4
    ids = torch.tensor([[5] * 64 + [1000] * video + [6] * 64])
    seq = ids.shape[1]
    inputs = {"input_ids": ids, "labels": ids, "mm_token_type_ids": (ids == 1000).int() * 2,
              "pixel_values_videos": torch.randn(patches, 3 * 2 * 14 * 14, dtype=torch.bfloat16),
              "video_grid_thw": torch.tensor([[gt, gh, gw]])}
    eager = attn == "eager"
    base = _saved_bytes(_small_qwen(1, 1, attn)[0], **inputs)
    layer = _saved_bytes(_small_qwen(2, 1, attn)[0], **inputs) - base
    block = _saved_bytes(_small_qwen(1, 2, attn)[0], **inputs) - base
    arch = _small_qwen(1, 1, attn)[1]
    one = activation_bytes(arch, seq, 1, vision_patches=patches, vision_span=gh * gw, eager=eager)
    assert layer == pytest.approx(one.text_b, rel=0.15)
    assert block == pytest.approx(one.vision_b, rel=0.15)
    ckpt = _saved_bytes(_small_qwen(2, 1, attn, True)[0], **inputs) - \
        _saved_bytes(_small_qwen(1, 1, attn, True)[0], **inputs)
    assert ckpt == pytest.approx(2 * seq * arch.hidden, rel=0.15)
