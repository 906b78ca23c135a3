"""Console: a tqdm progress bar over the stage's steps with its latest numbers, and log lines (one base, one
subclass per stage: what to say at the start, per step and at the end)."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

from training.callbacks import Callback
from training.metrics import summary_as_metrics

log = logging.getLogger("training")


class ProgressConsole(Callback):
    """The bar (or, with `progress` off, a log line per logged step) and a line per checkpoint."""

    desc = "train"
    logger = log

    def __init__(self, max_steps: int, progress: bool = True):
        self.max_steps, self.progress, self.bar = max_steps, progress, None

    def start_line(self, info: dict) -> None: ...

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {}

    def step_line(self, step: int, metrics: dict[str, float]) -> None: ...

    def end_line(self, summary: dict) -> None: ...

    def on_train_start(self, info: dict) -> None:
        self.start_line(info)
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.max_steps, initial=info["start_step"], desc=self.desc, unit="step",
                            dynamic_ncols=True, file=sys.stderr)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(self.postfix(metrics), refresh=False)  # a dict keeps this order (keywords get sorted)
            self.bar.refresh()
        else:
            self.step_line(step, metrics)

    def on_checkpoint(self, path: Path, step: int) -> None:
        self.logger.info("%s step %d: checkpoint %s", self.desc, step, path)

    def on_train_end(self, summary: dict) -> None:
        if self.bar is not None:
            self.bar.close()
        self.end_line(summary)

    def on_train_error(self, error: BaseException) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class ConsoleCallback(ProgressConsole):
    """SFT: loss, lr, samples/s, tokens/s (GPU utilisation and MFU when measured)."""

    def start_line(self, info: dict) -> None:
        log.info("training %s (%s, %s params trainable of %s) on %d rank(s), effective batch %d = micro %d x "
                 "accum %d x world %d; data version %s; %s", info["base"], info["finetune"],
                 f"{info['trainable_params']:,}", f"{info['total_params']:,}", info["world_size"],
                 info["effective_batch"], info["micro_batch_size"], info["grad_accum"], info["world_size"],
                 info["data_version"][:12], f"resumed from step {info['start_step']}" if info["start_step"]
                 else "fresh start")

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        out = {"loss": f"{metrics['train/loss']:.4f}", "lr": f"{metrics['train/lr']:.2e}",
               "sps": f"{metrics['perf/samples_per_s']:.1f}", "tok/s": f"{metrics['perf/tokens_per_s']:.0f}"}
        if "gpu/util_mean" in metrics:
            out["gpu"] = f"{metrics['gpu/util_mean']:.0f}%"
        if "perf/mfu" in metrics:
            out["mfu"] = f"{metrics['perf/mfu']:.1%}"
        return out

    def step_line(self, step: int, metrics: dict[str, float]) -> None:
        scale = (f" loss_scale {metrics['train/loss_scale']:g} ({metrics['train/overflow_steps']:g} overflow steps "
                 "skipped)" if "train/loss_scale" in metrics else "")
        log.info("step %d loss %.4f lr %.2e grad_norm %.3f%s %.1f samples/s %s", step, metrics["train/loss"],
                 metrics["train/lr"], metrics.get("train/grad_norm", float("nan")), scale,
                 metrics["perf/samples_per_s"], perf_line(metrics))

    def end_line(self, summary: dict) -> None:
        log.info("done: %d steps, final loss %.4f, %d skipped batches, %d bad samples skipped, %.1f s",
                 summary["step"], summary.get("final_loss", float("nan")), summary["skipped_batches"],
                 summary["data_errors"], summary["wall_s"])
        if "tokens_per_s" in summary:
            log.info("run throughput: %s", perf_line(summary_as_metrics(summary)))


class RLConsole(ProgressConsole):
    """GRPO: reward, IoU, entropy, rollout/update seconds (KL when measured)."""

    desc = "rl"
    logger = logging.getLogger("training.rl")

    def start_line(self, info: dict) -> None:
        self.logger.info("GRPO from %s (SFT step %s) on %d rank(s): %s per step, pool %d train queries; %s",
                         info["parent"], info["parent_step"], info["world_size"], info["batch"], info["pool"],
                         f"resumed at step {info['start_step']}" if info["start_step"] else "fresh start")

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        m = metrics
        out = {"reward": f"{m['rl/reward_mean']:.3f}", "iou": f"{m['rl/iou_mean']:.3f}",
               "ent": f"{m['rl/entropy']:.3f}", "roll/upd s": f"{m['rl/rollout_s']:.2f}/{m['rl/update_s']:.2f}"}
        if math.isfinite(m["rl/kl"]):
            out["kl"] = f"{m['rl/kl']:.4f}"
        return out

    def step_line(self, step: int, metrics: dict[str, float]) -> None:
        m, kl = metrics, metrics["rl/kl"]
        self.logger.info("rl step %d reward %.3f (std %.3f) iou %.3f parse-fail %.2f kl %s entropy %.3f clip %.3f "
                         "flat groups %d rollout %.2fs update %.2fs", step, m["rl/reward_mean"], m["rl/reward_std"],
                         m["rl/iou_mean"], m["rl/parse_failure_rate"], f"{kl:.4f}" if math.isfinite(kl) else "-",
                         m["rl/entropy"], m["rl/clip_frac"], m["rl/zero_advantage_groups"], m["rl/rollout_s"],
                         m["rl/update_s"])

    def end_line(self, summary: dict) -> None:
        self.logger.info("RL done: %d steps in %.1f s; reward %.3f -> %.3f (first/last 10 steps), entropy %.3f -> "
                         "%.3f", summary["step"], summary["wall_s"], summary["first10/reward_mean"],
                         summary["last10/reward_mean"], summary["first10/entropy"], summary["last10/entropy"])


def perf_line(m: dict[str, float]) -> str:
    """The infrastructure metrics (keys as logged) in words: tokens/s and data wait always; padding, TFLOP/s, MFU,
    GPU utilisation and memory when measured."""
    parts = [f"{m['perf/tokens_per_s']:.0f} tokens/s", f"data wait {m['perf/data_wait_frac']:.0%}"]
    if "perf/padding_frac" in m:
        parts.append(f"padding {m['perf/padding_frac']:.0%}")
    if "perf/tflops_per_device" in m:
        parts.append(f"{m['perf/tflops_per_device']:.3g} TFLOP/s per device")
    if "perf/mfu" in m:
        parts.append(f"MFU {m['perf/mfu']:.1%}")
    if "gpu/util_mean" in m:
        parts.append(f"GPU util {m['gpu/util_mean']:.0f}% (min rank {m['gpu/util_min']:.0f}%)")
    if "gpu/mem_reserved_pct" in m:
        parts.append(f"GPU memory {m['gpu/mem_reserved_pct']:.0f}% reserved")
    return ", ".join(parts)
