"""Throughput, utilisation and memory metrics of each log window, reduced over ranks.

Every rank measures its own window (`RankWindow`); one all-gather brings all of them to every rank and
`reduce_windows` (pure, unit-tested with fake per-rank values) turns them into the logged metrics:

    perf/step_time_s        window wall time / optimizer steps, slowest rank
    perf/tokens_per_s       non-pad tokens (text + video) of all ranks / window time (global)
    perf/samples_per_s      examples of all ranks / window time (global)
    perf/padding_frac       share of the token slots the model computed that were padding (all ranks)
    perf/data_wait_frac     share of the window spent waiting for the loader, max over ranks
    perf/tflops_per_device  model FLOP/s achieved per device (see `ModelFlops`), mean over ranks
    perf/mfu                perf/tflops_per_device / peak bf16 TFLOP/s of one device (only when the peak is known)
    sys/rss_gb              host memory of the rank process, max over ranks
    gpu/util_mean           NVML GPU utilisation %, mean over the window per rank, then mean over ranks
    gpu/util_min            ... then min over ranks (the rank that waits most)
    gpu/mem_allocated_pct   peak allocated memory in the window, % of the device's total, max over ranks
    gpu/mem_reserved_pct    peak memory the caching allocator reserved, % of total, max over ranks
    gpu/mem_allocated_gb    the same peaks in GiB
    gpu/mem_reserved_gb

On a CPU the gpu/* keys are absent (not zero), and so is perf/mfu unless `train.peak_tflops` is set. GPU
utilisation needs NVML (`nvidia-ml-py`, the `gpu` extra), imported lazily; without it only gpu/util_* is absent.
A reserved-memory peak above 90% of the device logs a warning (OOM risk; fragmentation needs headroom).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import psutil
import torch

log = logging.getLogger("training")

MEMORY_WARN_PCT = 90.0
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 PCIE": 756.0, "H100": 989.0, "A100": 312.0}
"""Dense bf16 peak TFLOP/s per device (vendor datasheets, no sparsity), matched in order as substrings of the
upper-cased device name. Measured on an H200 here: ~790 TFLOP/s for a large bf16 matmul (docs/environment.md), so an
MFU computed against 989 tops out near 0.8; set `train.peak_tflops` to use another denominator."""


# ---- model FLOPs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFlops:
    """Model FLOPs of one training step per unit of input, the usual 6N accounting split by tower.

    A matmul with N parameters costs 2N FLOPs per input row forward, 2N backward for the input gradient and 2N for
    the weight gradient, which only trainable parameters (T) need: 4N + 2T per row, i.e. 6N for full fine-tuning
    and ~4N for LoRA. The language model runs once per non-pad token; the vision tower once per video patch
    (4 patches per merged video token in Qwen2.5-VL, `video_grid_thw`), and needs no backward at all when frozen
    (2N). N counts every parameter that takes part in a matmul: all of them except an input embedding that is not
    tied to the LM head (a lookup). Not counted: attention scores (~seq^2, a few % at 2-3k tokens), and
    recomputation under gradient checkpointing (model FLOPs, not hardware FLOPs, as in PaLM's MFU).
    """

    per_token: float
    per_patch: float

    def window(self, tokens: float, patches: float) -> float:
        return self.per_token * tokens + self.per_patch * patches


def _count(params) -> tuple[int, int]:
    from vtg.model.quant import numel  # a QLoRA base's 4-bit weights hold two elements per stored byte

    params = list(params)
    return sum(numel(p) for p in params), sum(p.numel() for p in params if p.requires_grad)


def model_flops(model: torch.nn.Module) -> ModelFlops:
    """`ModelFlops` of a (possibly peft-wrapped) Qwen2.5-VL-style model: the vision tower is the `visual` module."""
    visual = next((m for name, m in model.named_modules() if name.split(".")[-1] == "visual"), None)
    vision_ids = {id(p) for p in visual.parameters()} if visual is not None else set()
    skip = set(vision_ids)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embed is not None and (head is None or head.weight is not embed.weight):
        skip.add(id(embed.weight))
    n_lm, t_lm = _count(p for p in model.parameters() if id(p) not in skip)
    n_vis, t_vis = _count(visual.parameters()) if visual is not None else (0, 0)
    per_patch = 4 * n_vis + 2 * t_vis if t_vis else 2 * n_vis
    return ModelFlops(per_token=4 * n_lm + 2 * t_lm, per_patch=per_patch)


def vision_patches(batch: dict) -> float:
    """Vision-tower input rows of a batch (temporal x spatial patches over all its videos)."""
    grid = batch.get("video_grid_thw")
    return float(grid.prod(-1).sum()) if grid is not None and len(grid) else 0.0


def peak_tflops(device: torch.device, configured: float = 0.0) -> float | None:
    """The MFU denominator: `train.peak_tflops` when set, else the GPU's entry in PEAK_BF16_TFLOPS, else None."""
    if configured > 0:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


# ---- GPU utilisation (NVML) ----------------------------------------------------------------------------
@functools.cache
def _nvml_handle(index: int):
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as e:  # noqa: BLE001 - NVML is optional (nvidia-ml-py in the gpu extra)
        log.info("no GPU utilisation metrics (NVML unavailable: %s: %s)", type(e).__name__, e)
        return None


def _nvml_index(device: torch.device) -> int:
    """NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES renumbers them for torch."""
    try:
        return torch.cuda._get_nvml_device_index(device)
    except Exception:  # noqa: BLE001 - private torch helper; fall back to the torch index
        return device.index or 0


class UtilSampler:
    """Mean GPU utilisation over a window from NVML's own sample buffer (`nvmlDeviceGetSamples`, one sample
    every 1/6-1 s), read since the last poll so that no sample is lost or counted twice; if the driver does not
    offer samples, the instantaneous utilisation is read at every poll instead."""

    def __init__(self, handle):
        self.handle, self.use_samples, self.broken = handle, True, False
        self.total, self.count = 0.0, 0
        self.since_us = self._now_us()

    @staticmethod
    def _now_us() -> int:
        return int(time.time() * 1e6)

    def poll(self) -> None:
        import pynvml

        if self.use_samples:
            try:
                _, samples = pynvml.nvmlDeviceGetSamples(self.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                         self.since_us)
            except pynvml.NVMLError as e:
                if e.value == pynvml.NVML_ERROR_NOT_FOUND:  # no new sample since the last poll
                    return
                self.use_samples = False
            else:
                for s in samples:
                    if s.timeStamp > self.since_us:
                        self.total += s.sampleValue.uiVal
                        self.count += 1
                        self.since_us = max(self.since_us, s.timeStamp)
                return
        if self.broken:
            return
        try:
            self.total += pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
            self.count += 1
        except pynvml.NVMLError as e:  # never fatal to training: the gpu/util_* keys just stop appearing
            self.broken = True
            log.warning("NVML stopped answering (%s): no GPU utilisation from here on", e)

    def skip_to_now(self) -> None:
        """Ignore the samples taken so far but not yet polled (e.g. while a checkpoint was written)."""
        self.since_us = self._now_us()

    def take(self) -> float | None:
        """Mean since the last take (None without samples) and start over."""
        self.poll()
        mean = self.total / self.count if self.count else None
        self.total, self.count = 0.0, 0
        return mean


# ---- one window on one rank, and the reduction over ranks ------------------------------------------------
@dataclass
class RankWindow:
    """What one rank measured over one log window (GPU fields None on a CPU)."""

    elapsed_s: float
    steps: int
    tokens: float
    samples: float
    patches: float
    wait_s: float
    rss_gb: float
    slots: float = 0.0
    """Token slots computed (rows x row length of each micro-batch: real tokens + padding)."""
    gpu_util: float | None = None
    mem_allocated_gb: float | None = None
    mem_reserved_gb: float | None = None
    mem_total_gb: float | None = None


def reduce_windows(windows: list[RankWindow], flops: ModelFlops | None = None,
                   peak: float | None = None) -> dict[str, float]:
    """The logged metrics from every rank's window (see the module docstring for each key's reduction)."""
    world = len(windows)
    elapsed = max(1e-9, *(w.elapsed_s for w in windows))
    tokens = sum(w.tokens for w in windows)
    out = {"perf/step_time_s": elapsed / max(1, max(w.steps for w in windows)),
           "perf/tokens_per_s": tokens / elapsed,
           "perf/samples_per_s": sum(w.samples for w in windows) / elapsed,
           "perf/data_wait_frac": max(min(1.0, w.wait_s / max(w.elapsed_s, 1e-9)) for w in windows),
           "sys/rss_gb": max(w.rss_gb for w in windows)}
    slots = sum(w.slots for w in windows)
    if slots > 0:
        out["perf/padding_frac"] = max(0.0, 1 - tokens / slots)
    if flops is not None:
        achieved = flops.window(tokens, sum(w.patches for w in windows)) / elapsed / world / 1e12
        out["perf/tflops_per_device"] = achieved
        if peak:
            out["perf/mfu"] = achieved / peak
    utils = [w.gpu_util for w in windows]
    if all(u is not None for u in utils):
        out["gpu/util_mean"] = sum(utils) / world
        out["gpu/util_min"] = min(utils)
    if all(w.mem_total_gb for w in windows):
        out["gpu/mem_allocated_pct"] = max(100 * w.mem_allocated_gb / w.mem_total_gb for w in windows)
        out["gpu/mem_reserved_pct"] = max(100 * w.mem_reserved_gb / w.mem_total_gb for w in windows)
        out["gpu/mem_allocated_gb"] = max(w.mem_allocated_gb for w in windows)
        out["gpu/mem_reserved_gb"] = max(w.mem_reserved_gb for w in windows)
    return out


SUMMARY_MEANS = {"perf/tokens_per_s": "tokens_per_s", "perf/data_wait_frac": "data_wait_frac",
                 "perf/padding_frac": "padding_frac",
                 "perf/tflops_per_device": "tflops_per_device", "perf/mfu": "mfu",
                 "gpu/util_mean": "gpu_util_mean", "gpu/util_min": "gpu_util_min"}
"""Window metric -> run-summary key, averaged over the run weighted by window time."""
SUMMARY_PEAKS = {"gpu/mem_allocated_pct": "gpu_mem_allocated_pct_max",
                 "gpu/mem_reserved_pct": "gpu_mem_reserved_pct_max"}
"""Window metric -> run-summary key, max over the run."""
RUN_PERF_KEYS = (*SUMMARY_MEANS.values(), *SUMMARY_PEAKS.values())
"""The run summary's perf keys (each present only when measured)."""


def summary_as_metrics(summary: dict) -> dict[str, float]:
    """The run summary's perf figures under their window-metric keys (for code that formats either)."""
    names = {name: key for key, name in (SUMMARY_MEANS | SUMMARY_PEAKS).items()}
    return {names[k]: v for k, v in summary.items() if k in names}


class RunTotals:
    """Run-level figures for the summary, from the reduced windows: time-weighted means (throughput, data wait,
    GPU utilisation: mean over ranks and the slowest rank's) and the peak memory."""

    def __init__(self):
        self.weighted: dict[str, float] = {}
        self.time: dict[str, float] = {}
        self.peaks: dict[str, float] = {}

    def add(self, metrics: dict[str, float], seconds: float) -> None:
        for key, name in SUMMARY_MEANS.items():
            if key in metrics:
                self.weighted[name] = self.weighted.get(name, 0.0) + metrics[key] * seconds
                self.time[name] = self.time.get(name, 0.0) + seconds
        for key, name in SUMMARY_PEAKS.items():
            if key in metrics:
                self.peaks[name] = max(self.peaks.get(name, 0.0), metrics[key])

    def summary(self) -> dict[str, float]:
        out = {name: total / self.time[name] for name, total in self.weighted.items() if self.time[name] > 0}
        return {**out, **self.peaks}


class PerfMonitor:
    """The loop's one handle on these metrics: `new_window()` at the start of a log window, `poll()` after each
    optimizer step, `skip_idle(window)` after time that is not training (a checkpoint), `window_metrics(window)`
    on every rank at the end of a window (it all-gathers), `summary()` at the end of the run."""

    def __init__(self, device: torch.device, flops: ModelFlops | None = None, peak_tflops_cfg: float = 0.0,
                 is_main: bool = True):
        self.device, self.flops, self.is_main = device, flops, is_main
        self.gpu = device.type == "cuda"
        self.peak = peak_tflops(device, peak_tflops_cfg)
        handle = _nvml_handle(_nvml_index(device)) if self.gpu else None
        self.util = UtilSampler(handle) if handle is not None else None
        self.totals = RunTotals()
        self._warned_pct = MEMORY_WARN_PCT

    def new_window(self) -> dict:
        if self.gpu:
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.util is not None:
            self.util.take()  # drop what came before this window
        return {"steps": 0, "tokens": 0.0, "samples": 0.0, "patches": 0.0, "wait": 0.0, "slots": 0.0,
                "start": time.perf_counter()}

    def poll(self) -> None:
        if self.util is not None:
            self.util.poll()

    def skip_idle(self, window: dict) -> None:
        window["start"] = time.perf_counter()
        if self.util is not None:
            self.util.skip_to_now()

    def rank_window(self, window: dict) -> RankWindow:
        w = RankWindow(elapsed_s=time.perf_counter() - window["start"], steps=window["steps"],
                       tokens=window["tokens"], samples=window["samples"], patches=window.get("patches", 0.0),
                       wait_s=window["wait"], rss_gb=psutil.Process().memory_info().rss / 2**30,
                       slots=window.get("slots", 0.0))
        if self.gpu:
            w.mem_allocated_gb = torch.cuda.max_memory_allocated(self.device) / 2**30
            w.mem_reserved_gb = torch.cuda.max_memory_reserved(self.device) / 2**30
            w.mem_total_gb = torch.cuda.get_device_properties(self.device).total_memory / 2**30
            w.gpu_util = self.util.take() if self.util is not None else None
        return w

    def window_metrics(self, window: dict) -> dict[str, float]:
        """Every rank calls this (collective); the result is the same on all ranks."""
        from training.dist import all_gather_objects

        windows = all_gather_objects(self.rank_window(window))
        out = reduce_windows(windows, self.flops, self.peak)
        self.totals.add(out, max(w.elapsed_s for w in windows))
        self._warn_memory(out)
        return out

    def _warn_memory(self, metrics: dict[str, float]) -> None:
        pct = metrics.get("gpu/mem_reserved_pct", 0.0)
        if self.is_main and pct > self._warned_pct:  # once per new whole-percent high above 90%
            self._warned_pct = float(int(pct) + 1)
            log.warning("GPU memory at %.1f%% of the device (reserved; allocated %.1f%%), above %g%%: close to an "
                        "out-of-memory error; lower micro_batch_size or frames, or enable gradient checkpointing",
                        pct, metrics.get("gpu/mem_allocated_pct", 0.0), MEMORY_WARN_PCT)

    def summary(self) -> dict[str, float]:
        return self.totals.summary()
