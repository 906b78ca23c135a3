"""Console: a tqdm progress bar over optimizer steps with the latest loss/lr/speed, and a log line per skip."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from training.callbacks import Callback
from training.metrics import summary_as_metrics

log = logging.getLogger("training")


class ConsoleCallback(Callback):
    def __init__(self, max_steps: int, progress: bool = True):
        self.max_steps, self.progress, self.bar = max_steps, progress, None

    def on_train_start(self, info: dict) -> None:
        log.info("training %s (%s, %s params trainable of %s) on %d rank(s), effective batch %d = micro %d x "
                 "accum %d x world %d; data version %s; %s", info["base"], info["finetune"],
                 f"{info['trainable_params']:,}", f"{info['total_params']:,}", info["world_size"],
                 info["effective_batch"], info["micro_batch_size"], info["grad_accum"], info["world_size"],
                 info["data_version"][:12], f"resumed from step {info['start_step']}" if info["start_step"]
                 else "fresh start")
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.max_steps, initial=info["start_step"], desc="train", unit="step",
                            dynamic_ncols=True, file=sys.stderr)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.n = step
            postfix = {"loss": f"{metrics['train/loss']:.4f}", "lr": f"{metrics['train/lr']:.2e}",
                       "sps": f"{metrics['perf/samples_per_s']:.1f}", "tok/s": f"{metrics['perf/tokens_per_s']:.0f}"}
            if "gpu/util_mean" in metrics:
                postfix["gpu"] = f"{metrics['gpu/util_mean']:.0f}%"
            if "perf/mfu" in metrics:
                postfix["mfu"] = f"{metrics['perf/mfu']:.1%}"
            self.bar.set_postfix(postfix, refresh=False)  # a dict keeps this order (keywords get sorted)
            self.bar.refresh()
        else:
            log.info("step %d loss %.4f lr %.2e grad_norm %.3f %.1f samples/s %s", step, metrics["train/loss"],
                     metrics["train/lr"], metrics.get("train/grad_norm", float("nan")),
                     metrics["perf/samples_per_s"], perf_line(metrics))

    def on_checkpoint(self, path: Path, step: int) -> None:
        log.info("step %d: checkpoint %s", step, path)

    def on_train_end(self, summary: dict) -> None:
        if self.bar is not None:
            self.bar.close()
        log.info("done: %d steps, final loss %.4f, %d skipped batches, %d bad samples skipped, %.1f s",
                 summary["step"], summary.get("final_loss", float("nan")), summary["skipped_batches"],
                 summary["data_errors"], summary["wall_s"])
        if "tokens_per_s" in summary:
            log.info("run throughput: %s", perf_line(summary_as_metrics(summary)))


def perf_line(m: dict[str, float]) -> str:
    """The infrastructure metrics (keys as logged) in words: tokens/s and data wait always; TFLOP/s, MFU, GPU
    utilisation and memory when measured."""
    parts = [f"{m['perf/tokens_per_s']:.0f} tokens/s", f"data wait {m['perf/data_wait_frac']:.0%}"]
    if "perf/tflops_per_device" in m:
        parts.append(f"{m['perf/tflops_per_device']:.3g} TFLOP/s per device")
    if "perf/mfu" in m:
        parts.append(f"MFU {m['perf/mfu']:.1%}")
    if "gpu/util_mean" in m:
        parts.append(f"GPU util {m['gpu/util_mean']:.0f}% (min rank {m['gpu/util_min']:.0f}%)")
    if "gpu/mem_reserved_pct" in m:
        parts.append(f"GPU memory {m['gpu/mem_reserved_pct']:.0f}% reserved")
    return ", ".join(parts)
