"""Infrastructure metrics: reductions over ranks (fake per-rank values and a real 2-process gloo group), model
FLOPs / MFU, NVML sampling (a fake pynvml), the memory warning, and a real CPU run: tokens/s and data wait are
logged (console, MLflow, summary) and no gpu/* key is."""

import dataclasses
import logging
import sys
import types

import pytest
import torch
from support.train_fixtures import Recorder, train_config

from training.callbacks.console import ConsoleCallback, perf_line
from training.metrics import (
    ModelFlops,
    PerfMonitor,
    RankWindow,
    RunTotals,
    UtilSampler,
    model_flops,
    peak_tflops,
    reduce_windows,
    summary_as_metrics,
    vision_patches,
)

GPU_WINDOW = RankWindow(elapsed_s=10.0, steps=5, tokens=1000.0, samples=8.0, patches=400.0, wait_s=1.0,
                        rss_gb=3.0, gpu_util=80.0, mem_allocated_gb=40.0, mem_reserved_gb=50.0, mem_total_gb=100.0)


def _gpu_window(**kw) -> RankWindow:
    return dataclasses.replace(GPU_WINDOW, **kw)


def test_reductions_over_fake_ranks():
    windows = [_gpu_window(),
               _gpu_window(elapsed_s=12.0, tokens=3000.0, wait_s=6.0, rss_gb=5.0, gpu_util=40.0,
                           mem_allocated_gb=70.0, mem_reserved_gb=95.0),
               _gpu_window(elapsed_s=11.0, tokens=2000.0, wait_s=0.0, gpu_util=60.0)]
    flops = ModelFlops(per_token=6e9, per_patch=1e9)
    m = reduce_windows(windows, flops, peak=1000.0)
    assert m["perf/step_time_s"] == 12.0 / 5                     # the slowest rank's wall time
    assert m["perf/tokens_per_s"] == 6000.0 / 12.0                # global: all ranks' tokens
    assert m["perf/samples_per_s"] == 24.0 / 12.0
    assert m["perf/data_wait_frac"] == 0.5                        # max over ranks (6 s of 12)
    assert m["sys/rss_gb"] == 5.0
    assert m["gpu/util_mean"] == 60.0 and m["gpu/util_min"] == 40.0
    assert m["gpu/mem_allocated_pct"] == 70.0 and m["gpu/mem_reserved_pct"] == 95.0
    assert m["gpu/mem_reserved_gb"] == 95.0
    achieved = (6e9 * 6000 + 1e9 * 1200) / 12.0 / 3 / 1e12      # per device, TFLOP/s
    assert m["perf/tflops_per_device"] == pytest.approx(achieved)
    assert m["perf/mfu"] == pytest.approx(achieved / 1000.0)


def test_cpu_windows_have_no_gpu_keys_and_no_mfu_without_a_peak():
    cpu = [RankWindow(elapsed_s=2.0, steps=2, tokens=100.0, samples=4.0, patches=0.0, wait_s=0.5, rss_gb=1.0)] * 2
    m = reduce_windows(cpu, ModelFlops(6.0, 0.0), peak=None)
    assert not [k for k in m if k.startswith("gpu/")] and "perf/mfu" not in m
    assert m["perf/tokens_per_s"] == 100.0 and m["perf/data_wait_frac"] == 0.25
    with_peak = reduce_windows(cpu, ModelFlops(6.0, 0.0), peak=1e-12)  # train.peak_tflops set on a CPU
    assert with_peak["perf/tflops_per_device"] == pytest.approx(6.0 * 200 / 2.0 / 2 / 1e12)  # per device
    assert with_peak["perf/mfu"] == pytest.approx(with_peak["perf/tflops_per_device"] / 1e-12)


def test_one_rank_without_nvml_drops_only_utilisation():
    m = reduce_windows([_gpu_window(), _gpu_window(gpu_util=None)])
    assert "gpu/util_mean" not in m and "gpu/util_min" not in m and m["gpu/mem_allocated_pct"] == 40.0
    assert "perf/tflops_per_device" not in m  # no FLOPs model given


def test_run_totals_are_time_weighted_and_peak():
    totals = RunTotals()
    totals.add({"perf/tokens_per_s": 100.0, "perf/data_wait_frac": 0.5, "gpu/util_mean": 50.0,
                "gpu/util_min": 20.0, "gpu/mem_reserved_pct": 60.0}, seconds=1.0)
    totals.add({"perf/tokens_per_s": 400.0, "perf/data_wait_frac": 0.0, "gpu/util_mean": 90.0,
                "gpu/util_min": 80.0, "gpu/mem_reserved_pct": 55.0}, seconds=3.0)
    s = totals.summary()
    assert s["tokens_per_s"] == 325.0 and s["data_wait_frac"] == 0.125  # (100 + 1200) / 4 s
    assert s["gpu_util_mean"] == 80.0 and s["gpu_util_min"] == 65.0 and s["gpu_mem_reserved_pct_max"] == 60.0
    assert "mfu" not in s
    assert summary_as_metrics(s)["gpu/mem_reserved_pct"] == 60.0
    assert "GPU util 80% (min rank 65%)" in perf_line(summary_as_metrics(s))


def test_model_flops_full_lora_and_frozen_vision(tiny_model_dir):
    from transformers import AutoModelForImageTextToText

    from vtg.model.modeling import apply_finetune_mode

    def build():
        return AutoModelForImageTextToText.from_pretrained(tiny_model_dir)

    model = build()
    n_vis = sum(p.numel() for p in model.model.visual.parameters())
    n_embed = model.get_input_embeddings().weight.numel()  # untied in the tiny model: a lookup, not counted
    n_lm = sum(p.numel() for p in model.parameters()) - n_vis - n_embed
    full = model_flops(model)
    assert full == ModelFlops(per_token=6 * n_lm, per_patch=6 * n_vis)
    frozen = model_flops(apply_finetune_mode(build(), "full", freeze_vision=True))
    assert frozen == ModelFlops(per_token=6 * n_lm, per_patch=2 * n_vis)  # frozen tower: forward only
    lora = model_flops(apply_finetune_mode(build(), "lora", lora_r=4, freeze_vision=True))
    assert 4 * n_lm < lora.per_token < 4.5 * n_lm and lora.per_patch == 2 * n_vis
    grid = torch.tensor([[4, 2, 2], [2, 4, 4]])
    assert vision_patches({"video_grid_thw": grid}) == 16 + 32 and vision_patches({}) == 0.0


def test_peak_tflops_setting_table_and_cpu(monkeypatch):
    assert peak_tflops(torch.device("cpu")) is None
    assert peak_tflops(torch.device("cpu"), 2.5) == 2.5
    for name, want in [("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                       ("NVIDIA A100-SXM4-80GB", 312.0), ("Tesla T4", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert peak_tflops(torch.device("cuda", 0)) == want
    assert peak_tflops(torch.device("cuda", 0), 790.0) == 790.0  # the measured H200 matmul peak, if preferred


class _FakeNVML(types.ModuleType):
    """pynvml's surface that UtilSampler uses: a sample buffer, NOT_FOUND when nothing is new."""

    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_ERROR_NOT_FOUND = 6

    class NVMLError(Exception):
        def __init__(self, value):
            self.value = value

    def __init__(self, samples_supported=True):
        super().__init__("pynvml")
        self.samples, self.supported, self.instant = [], samples_supported, 33

    def nvmlDeviceGetSamples(self, handle, kind, since):
        if not self.supported:
            raise self.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
        new = [s for s in self.samples if s.timeStamp > since]
        if not new:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return 0, new

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.instant is None:
            raise self.NVMLError(15)  # NVML_ERROR_GPU_IS_LOST
        return types.SimpleNamespace(gpu=self.instant)

    def add(self, ts_us, value):
        self.samples.append(types.SimpleNamespace(timeStamp=ts_us, sampleValue=types.SimpleNamespace(uiVal=value)))


def test_util_sampler_reads_each_nvml_sample_once(monkeypatch):
    nvml = _FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = UtilSampler(handle="gpu0")
    t0 = sampler.since_us
    nvml.add(t0 - 5, 0)             # before the window: ignored
    assert sampler.take() is None   # NOT_FOUND: nothing yet
    nvml.add(t0 + 1, 100)
    nvml.add(t0 + 2, 50)
    sampler.poll()
    sampler.poll()                  # the same samples again: not counted twice
    nvml.add(t0 + 3, 30)
    assert sampler.take() == 60.0
    nvml.add(t0 + 4, 90)
    sampler.skip_to_now()           # e.g. a checkpoint was written meanwhile
    assert sampler.take() is None
    fallback = _FakeNVML(samples_supported=False)
    monkeypatch.setitem(sys.modules, "pynvml", fallback)
    sampler = UtilSampler(handle="gpu0")
    sampler.poll()
    assert sampler.take() == 33.0 and not sampler.use_samples
    fallback.instant = None        # the driver stops answering: no metric, and training goes on
    sampler.poll()
    assert sampler.take() is None and sampler.broken


def test_memory_warning_above_90_percent_once_per_new_high(caplog):
    monitor = PerfMonitor(torch.device("cpu"))
    with caplog.at_level(logging.WARNING, logger="training"):
        for pct in (85.0, 91.5, 91.9, 93.2, 50.0):
            monitor._warn_memory({"gpu/mem_reserved_pct": pct, "gpu/mem_allocated_pct": pct - 5})
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "91.5%" in warned[0] and "93.2%" in warned[1] and "out-of-memory" in warned[0]
    quiet = PerfMonitor(torch.device("cpu"), is_main=False)
    caplog.clear()
    quiet._warn_memory({"gpu/mem_reserved_pct": 99.0})
    assert not caplog.records


def _gather_rank(rank: int, port: int, out) -> None:
    import os

    import torch.distributed as dist

    from training.dist import all_gather_objects

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mine = _gpu_window(tokens=100.0 * (rank + 1), wait_s=3.0 * rank, gpu_util=90.0 - 50 * rank)
        out.put((rank, reduce_windows(all_gather_objects(mine))))
    finally:
        dist.destroy_process_group()


def test_all_gather_reduction_over_two_gloo_ranks():
    import torch.multiprocessing as mp

    from training.dist import all_gather_objects
    from vtg.net import free_port

    assert all_gather_objects("solo") == ["solo"]  # no process group: this process only
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_gather_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results[0] == results[1]  # every rank gets the same reduced metrics
    m = results[0]
    assert m["perf/tokens_per_s"] == 300.0 / 10.0 and m["perf/data_wait_frac"] == 0.3
    assert m["gpu/util_mean"] == 65.0 and m["gpu/util_min"] == 40.0


def _train_examples(shards_dir, export):
    """(token count, vision patches) of every train example, encoded as training encodes them (the export's
    tokenizer, which records the timestamps / query-position settings)."""
    from transformers import AutoConfig, AutoTokenizer

    from vtg.model.processing import VisionParams, answer_text, encode_example
    from vtg.queries import ReadStats, iter_examples
    from vtg.shards import list_shards

    tok = AutoTokenizer.from_pretrained(export)
    vision = VisionParams.from_model_config(AutoConfig.from_pretrained(export))
    out = []
    for ex in iter_examples(list_shards(shards_dir, "train"), ReadStats()):
        enc = encode_example(tok, ex.frames, ex.timestamps, ex.query, answer_text(ex.windows), vision=vision)
        out.append((int(enc["attention_mask"].sum()), vision_patches({"video_grid_thw": enc["video_grid_thw"][None]})))
    return out


def test_cpu_run_logs_throughput_and_no_gpu_keys(shards_dir, tiny_model_dir, tmp_path, caplog):
    """A real 3-step CPU run, log_every 2 (windows of 2 steps and 1 step): every logged rate is checked against
    what it measures. samples/s x step time = the micro-batch (4 examples per step, no skips); tokens/s / samples/s
    lies within the train examples' token counts; TFLOP/s = (FLOPs per token x tokens/s + FLOPs per patch x
    patches/s) / 1e12 from the model's parameter counts; the windows' time fits in the run's wall time; RSS is at
    most this process's peak; the run summary's rates are time-weighted means of the windows'; MLflow holds the
    same values at the same steps, and the console line prints them."""
    import resource

    import mlflow
    import psutil
    from transformers import AutoModelForImageTextToText

    from training.callbacks.mlflow_cb import MLflowCallback
    from training.sft import train
    from vtg.checkpoints import export_dir, resolve_checkpoint

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = train_config(shards_dir, tmp_path / "ck", "train.max_steps=3", "train.save_every=3",
                       "train.log_every=2", "tracking.enabled=true", f"tracking.tracking_uri={uri}",
                       "tracking.experiment=metrics")
    rec, mlf = Recorder(), MLflowCallback(cfg)
    with caplog.at_level(logging.INFO, logger="training"):
        summary = train(cfg, callbacks=[rec, mlf, ConsoleCallback(3, progress=False)])
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    assert [s for s, _ in rec.steps] == [2, 3]
    examples = _train_examples(shards_dir, export_dir(resolve_checkpoint(tmp_path / "ck")))
    lengths = [n for n, _ in examples]
    patches = {p for _, p in examples}
    assert len(patches) == 1  # every fixture video has the same grid
    flops = model_flops(AutoModelForImageTextToText.from_pretrained(tiny_model_dir))  # full fine-tuning
    window_time = 0.0
    for (_, m), n_steps in zip(rec.steps, (2, 1), strict=True):
        assert {"perf/tokens_per_s", "perf/samples_per_s", "perf/data_wait_frac", "perf/step_time_s",
                "perf/tflops_per_device", "sys/rss_gb"} <= set(m)
        assert not [k for k in m if k.startswith("gpu/")] and "perf/mfu" not in m
        assert m["perf/samples_per_s"] * m["perf/step_time_s"] == pytest.approx(cfg.train.micro_batch_size)
        per_example = m["perf/tokens_per_s"] / m["perf/samples_per_s"]
        assert min(lengths) <= per_example <= max(lengths), (per_example, min(lengths), max(lengths))
        achieved = flops.per_token * m["perf/tokens_per_s"] + flops.per_patch * m["perf/samples_per_s"] * min(patches)
        assert m["perf/tflops_per_device"] == pytest.approx(achieved / 1e12)
        assert 0 <= m["perf/data_wait_frac"] <= 1
        assert 0.05 < m["sys/rss_gb"] <= peak_rss_gb * (1 + 1e-6) and m["sys/rss_gb"] < psutil.virtual_memory().total / 2**30
        window_time += m["perf/step_time_s"] * n_steps
    assert 0 < window_time <= summary["wall_s"]
    windows = [m for _, m in rec.steps]
    for key, name in (("perf/tokens_per_s", "tokens_per_s"), ("perf/data_wait_frac", "data_wait_frac"),
                      ("perf/tflops_per_device", "tflops_per_device")):
        lo, hi = min(w[key] for w in windows), max(w[key] for w in windows)
        assert lo * (1 - 1e-9) <= summary[name] <= hi * (1 + 1e-9), (name, summary[name], lo, hi)
    assert not [k for k in summary if k.startswith("gpu_")] and "mfu" not in summary

    run_id = _last_run_id(uri)
    client = mlflow.MlflowClient(uri)
    for key in ("perf/tokens_per_s", "perf/samples_per_s", "perf/data_wait_frac", "train/loss"):
        history = sorted((h.step, h.value) for h in client.get_metric_history(run_id, key))
        assert history == [(s, pytest.approx(m[key], rel=1e-12)) for s, m in rec.steps], key
    logged = client.get_run(run_id).data.metrics
    assert logged["summary/tokens_per_s"] == pytest.approx(summary["tokens_per_s"], rel=1e-12)
    assert logged["summary/data_wait_frac"] == pytest.approx(summary["data_wait_frac"], rel=1e-12)
    assert logged["summary/skipped_batches"] == 0 and not [k for k in logged if "gpu" in k]
    lines = [r.getMessage() for r in caplog.records]
    step3 = [line for line in lines if line.startswith("step 3 ") and "tokens/s" in line]
    assert len(step3) == 1 and f"{windows[1]['perf/tokens_per_s']:.0f} tokens/s, data wait" in step3[0]
    assert any(line.startswith("run throughput:") and f"{summary['tokens_per_s']:.0f} tokens/s" in line
               and "GPU" not in line for line in lines)


def _last_run_id(uri: str) -> str:
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=["metrics"], output_format="list")[0].info.run_id
