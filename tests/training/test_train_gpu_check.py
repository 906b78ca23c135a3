"""The GPU check script (`make gpu-check`) runs its whole sequence here on the CPU at toy sizes (`--cpu-dry-run`):
synthetic shards, pre-flight, the 3B recipe on a shape-true model, a resume compared step by step, one
evaluation, the JSON and markdown report; and its fp16 case (both engines in fp16, a resume each), where DeepSpeed's
refusal on this CPU is the result. On a machine without CUDA the real check says so and exits 0."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_without_a_gpu_the_check_says_so_and_exits_0():
    r = subprocess.run([sys.executable, "-m", "training.gpu_check"], cwd=REPO, capture_output=True, text=True,
                       check=False, timeout=120)
    assert r.returncode == 0 and "no CUDA device here" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("rung,model", [("qwen25vl_3b", "Qwen2.5-VL-3B"),
                                        pytest.param("qwen3vl_2b", "Qwen3-VL-2B", marks=pytest.mark.heavy)])
def test_cpu_dry_run_of_the_whole_check(tmp_path: Path, rung, model):
    r = subprocess.run([sys.executable, "-m", "training.gpu_check", "--cpu-dry-run", "--rung", rung, "--cases",
                        "recipe", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, check=False,
                       timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    tmp_path = tmp_path / rung
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["resume"] == {"from_step": 2, "steps_compared": 2, "bit_exact": True, "mismatched_steps": []}
    assert report["tokens_per_s"] > 0 and report["planner"]["verdict"] == "OK"
    assert report["evaluation"]["queries"] == 4 and report["evaluation"]["split"] == "val"
    assert report["attention"].startswith("sdpa") and model in report["model"]
    assert "| resume bit-exact | True" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.slow
def test_cpu_dry_run_of_the_fp16_case(tmp_path: Path):
    """~40 s on two idle cores: FSDP fp16 trains 8 steps and resumes from 4 bit-exact; DeepSpeed is refused."""
    r = subprocess.run([sys.executable, "-m", "training.gpu_check", "--cpu-dry-run", "--rung", "qwen25vl_3b",
                        "--cases", "fp16", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                       check=False, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    report = json.loads((tmp_path / "qwen25vl_3b" / "fp16.json").read_text())
    assert "accelerator refuses fp16" in report["deepspeed"]["refused"]
    fsdp = report["fsdp"]
    assert fsdp["steps"] == 8 and fsdp["loss_scale"] == 2.0 ** 16 and fsdp["overflow_steps"] == 0
    assert fsdp["resume"] == {"from_step": 4, "steps_compared": 4, "bit_exact": True, "mismatched_steps": []}
    assert not (tmp_path / "qwen25vl_3b" / "gpu_check.json").exists()  # --cases fp16: the recipe did not run
