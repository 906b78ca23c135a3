"""The placement rule of per-checkpoint evaluation beside training (`flows.placement`): a pure function."""

import pytest

from flows.placement import AFTER_TRAINING, CONCURRENT, Placement, device_ids, place_evaluation
from vtg.config import load_config
from vtg.errors import ConfigError

QWEN = "Qwen/Qwen2.5-VL-7B-Instruct"


@pytest.mark.parametrize("n_gpus, train, base, requested, expected", [
    # one GPU, and training takes it: evaluation waits for training to end
    (1, 1, QWEN, "auto", ("cuda:0", AFTER_TRAINING, None)),
    # 8 GPUs, all training: the same, on the last GPU once training has ended
    (8, 8, QWEN, "auto", ("cuda:7", AFTER_TRAINING, None)),
    # 8 GPUs, 7 training: evaluation on the free last GPU, concurrently; training on the other seven
    (8, 7, QWEN, "auto", ("cuda:7", CONCURRENT, (0, 1, 2, 3, 4, 5, 6))),
    (2, 1, QWEN, "auto", ("cuda:1", CONCURRENT, (0,))),
    # a machine without GPUs: the CPU, beside training
    (0, 1, QWEN, "auto", ("cpu", CONCURRENT, None)),
    (0, 2, "tiny", "auto", ("cpu", CONCURRENT, None)),
    # the tiny rung evaluates on the CPU even where GPUs are free
    (8, 1, "tiny", "auto", ("cpu", CONCURRENT, None)),
    # explicit devices win
    (8, 8, QWEN, "cpu", ("cpu", CONCURRENT, None)),
    (8, 7, QWEN, "cuda:3", ("cuda:3", CONCURRENT, (0, 1, 2, 4, 5, 6, 7))),
    (8, 8, QWEN, "cuda:3", ("cuda:3", AFTER_TRAINING, None)),
    (2, 1, QWEN, "cuda:0", ("cuda:0", CONCURRENT, (1,))),
    (8, 7, "tiny", "cuda", ("cuda:7", CONCURRENT, (0, 1, 2, 3, 4, 5, 6))),
    (1, 1, "tiny", "cuda:0", ("cuda:0", AFTER_TRAINING, None)),
])
def test_placement_rule(n_gpus, train, base, requested, expected):
    p = place_evaluation(n_gpus, train, base, requested)
    assert (p.device, p.when, p.train_gpus) == expected
    assert p.reason and p.device in p.line() and p.when.replace("_", " ") in p.line()
    if p.when == CONCURRENT and p.gpu is not None:  # never concurrently on a training GPU
        assert p.gpu not in p.train_gpus and len(p.train_gpus) == train


def test_the_decision_reads_as_one_line():
    line = place_evaluation(8, 7, QWEN).line()
    assert "\n" not in line
    assert line.startswith("evaluation on cuda:7, concurrent; training on cuda:0-6 (")
    assert "after training" in place_evaluation(8, 8, QWEN).line()
    assert place_evaluation(0, 1, QWEN).line() == "evaluation on cpu, concurrent (no GPU visible)"


@pytest.mark.parametrize("n_gpus, requested, message", [
    (0, "cuda", "no GPU is visible"),
    (0, "cuda:0", "no GPU is visible"),
    (8, "cuda:8", r"only 8 GPU\(s\) are visible"),
    (8, "mps", "expected auto, cpu, cuda or cuda:<index>"),
])
def test_impossible_requests_are_one_clear_error(n_gpus, requested, message):
    with pytest.raises(ConfigError, match=message):
        place_evaluation(n_gpus, 1, QWEN, requested)


def test_config_accepts_only_placeable_devices(repo_root):
    for ok in ("auto", "cpu", "cuda", "cuda:3"):
        assert load_config(repo_root / "params.yaml", None, [f"evaluate.device={ok}"]).evaluate.device == ok
    for bad in ("mps", "cuda:x", "gpu"):
        with pytest.raises(Exception, match="device"):
            load_config(repo_root / "params.yaml", None, [f"evaluate.device={bad}"])


def test_device_ids_follow_the_orchestrators_own_visible_devices():
    assert device_ids([0, 1, 2], None) == ["0", "1", "2"]
    assert device_ids([3], "") == ["3"]
    assert device_ids([0, 2], "4,5, 6,7") == ["4", "6"]
    assert device_ids([1], "GPU-aaa,GPU-bbb") == ["GPU-bbb"]
    with pytest.raises(ConfigError, match="outside CUDA_VISIBLE_DEVICES"):
        device_ids([4], "0,1")


def test_placement_names_its_gpu():
    assert Placement("cuda:2", CONCURRENT, "why", (0, 1)).gpu == 2
    assert Placement("cpu", CONCURRENT, "why").gpu is None
