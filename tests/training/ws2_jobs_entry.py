"""torchrun entry for the world-size-2 engine tests (test_fsdp_ws2.py, test_zero3_offload.py): several training
runs in one launch, so that the ranks pay their start-up (~20 s on 2 cores) once.

    torchrun --standalone --nproc_per_node=2 ws2_jobs_entry.py JOBS.json REPORT_DIR

JOBS.json is a list of {"name", "overrides" (dotted keys over params.yaml), "stop_after" (or null), "hold_at" (or
null)}. Each job is the real `training.sft.train` with the default callbacks. After each job every rank writes
REPORT_DIR/<name>.rank<r>.json: the summary, what the engine holds on this rank (local vs global parameter elements,
optimizer state elements; DTensor placements under FSDP2, the ZeRO-3 partition and its offload under DeepSpeed) and
the rank's peak RSS over the job; rank 0 also writes <name>.logits.pt, the trained model's logits on a fixed input
(every rank runs that forward: the engine gathers the sharded weights).

`hold_at: N`: after step N is logged, every rank logs "holding at step N" and sleeps until killed (the kill -9
test). `"probe_generate": true` on the last job: then `generate` on the FSDP2 model, as the RL rollout calls it,
and the error it raises, in REPORT_DIR/generate.rank<r>.json (RL's refusal under FSDP2 cites it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from training import engine as engines
from training import lifecycle
from training.callbacks import Callback, default_callbacks
from training.sft import train
from vtg.cli_common import run_cli
from vtg.config import load_config

REPO_ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger("training")
_built: list = []
_rss: dict = {}
"""This job's memory at its phases (kB): `model_loaded` (the model built on this rank, before the engine shards
it), `engine_built` (sharded), `before_first_save` (peak of the steps before any checkpoint)."""


def _keep(cls):
    real = cls.__init__

    def init(self, *args, **kwargs):
        _rss["model_loaded"] = _status_kb("VmRSS")
        real(self, *args, **kwargs)
        _rss["engine_built"] = _status_kb("VmRSS")
        _built.append(self)

    cls.__init__ = init


def _watch_save():
    real = lifecycle.RunLifecycle.save

    def save(self, *args, **kwargs):
        _rss.setdefault("before_first_save", _status_kb("VmHWM"))
        return real(self, *args, **kwargs)

    lifecycle.RunLifecycle.save = save


_keep(engines.FSDPEngine)
_keep(engines.DeepSpeedEngine)
_watch_save()


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM), so each job has its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


class Hold(Callback):
    def __init__(self, at: int | None):
        self.at = at

    def on_step(self, step: int, metrics: dict) -> None:
        if step == self.at:
            log.info("rank %s holding at step %d", os.environ["RANK"], step)
            for h in logging.getLogger().handlers:
                h.flush()
            while True:
                time.sleep(1)


def _local(t) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def fsdp_facts(engine) -> dict:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    params = dict(engine.module.named_parameters())
    state = engine.optimizer.state
    return {
        "units": sorted(type(m).__name__ for m in engine.module.modules() if isinstance(m, FSDPModule)),
        "global_numel": sum(p.numel() for p in params.values()),
        "local_numel": sum(_local(p).numel() for p in params.values()),
        "trainable_global_numel": sum(p.numel() for p in params.values() if p.requires_grad),
        "trainable_local_numel": sum(_local(p).numel() for p in params.values() if p.requires_grad),
        "params": len(params),
        "dtensor_params": sum(isinstance(p, DTensor) for p in params.values()),
        "placements": sorted({str(p.placements) for p in params.values() if isinstance(p, DTensor)}),
        "local_shapes": {n: list(_local(p).shape) for n, p in params.items()},
        "global_shapes": {n: list(p.shape) for n, p in params.items()},
        "optim_local_numel": sum(_local(v).numel() for s in state.values() for k, v in s.items()
                                 if k in ("exp_avg", "exp_avg_sq")),
        "optim_dtensor": all(isinstance(v, DTensor) for s in state.values() for k, v in s.items()
                             if k in ("exp_avg", "exp_avg_sq")) and bool(state),
    }


def zero3_facts(engine) -> dict:
    opt = engine.engine.optimizer
    params = list(engine.module.parameters())
    parts = [p.ds_tensor for p in params]
    return {
        "global_numel": sum(p.ds_numel for p in params),
        "local_numel": sum(t.numel() for t in parts),
        "params": len(params),
        "gathered_now": sum(p.numel() for p in params),  # 0: nothing is left gathered between forwards
        "offload_param": bool(getattr(opt, "offload_param", False)),
        "offload_param_pin_memory": bool(getattr(opt, "offload_param_pin_memory", False)),
        "partition_devices": sorted({str(t.device) for t in parts}),
        "zero_config": engine.ds_config["zero_optimization"],
        # the offload path keeps the partitions in a flat host buffer; without offload they stay where they are
        # (`lp_param_buffer`, on the accelerator)
        "offload_flat_buffer_numel": sum(t.numel() for t in getattr(opt, "param_groups_fp16_flat_cpu_memory", [])),
        "lp_param_buffer": getattr(opt, "lp_param_buffer", None) is not None,
    }


def fixed_inputs(model, tokenizer) -> dict:
    from vtg.model.processing import VisionParams, collate, encode_example, model_inputs

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    frames = np.random.default_rng(0).integers(0, 256, size=(8, 56, 56, 3), dtype=np.uint8)
    enc = encode_example(tokenizer, frames, [i * 1.5 for i in range(8)], "the red square appears", None,
                         vision=VisionParams.from_model_config(base.config))
    inputs = model_inputs(collate([enc], tokenizer.pad_token_id))
    inputs.pop("labels", None)
    return inputs


def trained_logits(engine, tokenizer) -> torch.Tensor:
    model = engine.module
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = engine.outputs(fixed_inputs(model, tokenizer)).logits
    model.train(was)
    return logits.detach().clone()


def probe_generate(engine, tokenizer) -> dict:
    """The RL rollout's `generate` on this engine's model (FSDP2) as a rollout after an update meets it: every
    unit resharded (a backward reshards the root too; a forward alone leaves the root gathered): what it raises."""
    from training.rl.rollout import sample
    from vtg.model.processing import VisionParams, encode_example

    model = engine.module
    model.reshard()
    frames = np.random.default_rng(0).integers(0, 256, size=(8, 56, 56, 3), dtype=np.uint8)
    enc = encode_example(tokenizer, frames, [i * 1.5 for i in range(8)], "the red square appears", None,
                         vision=VisionParams.from_model(model))
    try:
        sample(model, tokenizer, [enc, enc], temperature=1.0, top_p=1.0, max_new_tokens=2,
               device=torch.device("cpu"), dtype=None, synced=True)
    except Exception as e:  # noqa: BLE001 - the error is what is recorded
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    return {"error": None}


def run_job(job: dict, report: Path, rank: int) -> None:
    cfg = load_config(REPO_ROOT / "params.yaml", None, job["overrides"])
    _built.clear()
    _rss.clear()
    _reset_peak_rss()
    rss0 = _status_kb("VmRSS")
    t0 = time.perf_counter()
    callbacks = [*default_callbacks(cfg, rank == 0), Hold(job.get("hold_at"))]
    summary = train(cfg, callbacks=callbacks, stop_after=job.get("stop_after"))
    wall = time.perf_counter() - t0
    engine, tokenizer = _built[-1], engine_tokenizer(cfg)
    facts = fsdp_facts(engine) if isinstance(engine, engines.FSDPEngine) else zero3_facts(engine)
    out = {"summary": {k: v for k, v in summary.items() if k != "early_stop"}, "engine": facts, "wall_s": wall,
           "rss_kb": {"start": rss0, **_rss, "peak": _status_kb("VmHWM") or rss0}}
    (report / f"{job['name']}.rank{rank}.json").write_text(json.dumps(out, indent=1, default=str))
    if job.get("probe_generate"):  # before any forward of ours (which would leave the root gathered)
        result = probe_generate(engine, tokenizer)
        (report / f"generate.rank{rank}.json").write_text(json.dumps(result))
    logits = trained_logits(engine, tokenizer)
    if rank == 0:
        torch.save(logits, report / f"{job['name']}.logits.pt")


def engine_tokenizer(cfg):
    from transformers import AutoTokenizer

    from vtg.checkpoints import export_dir, resolve_checkpoint

    return AutoTokenizer.from_pretrained(export_dir(resolve_checkpoint(cfg.train.out_dir)))


def main(argv: list[str] | None = None) -> int:
    jobs_file, report = (argv or sys.argv[1:])[:2]
    report = Path(report)
    rank = int(os.environ["RANK"])
    for job in json.loads(Path(jobs_file).read_text()):
        run_job(job, report, rank)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
