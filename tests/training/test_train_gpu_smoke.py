"""The GPU smoke script: says so and exits 0 without a GPU; the same step runs on the CPU."""

import pytest
import torch

from training.gpu_smoke import main


def test_without_gpu_says_so_and_exits_zero(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main([]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_step_runs_on_cpu(capsys):
    assert main(["--device", "cpu", "--dtype", "fp32", "--frames", "2", "--size", "28", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "attention sdpa" in out and "step " in out
