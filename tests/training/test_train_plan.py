"""The memory planner agrees with DeepSpeed's own estimators and recommends sensibly."""

import pytest

from training.plan import GB, Setup, main, plan, recommend


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
