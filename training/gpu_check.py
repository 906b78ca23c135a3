"""`python -m training.gpu_check` (`make gpu-check` on a GPU machine): the 1-GPU rungs' recipes on real shapes.

Each rung (`--rung`, default both: `qwen25vl_3b`, then `qwen3vl_2b`) runs, on one GPU, in one command (budget:
under 8 minutes per rung on one H200):
1. synthetic shards (contract-true WebDataset samples, no Beam: `vtg.testing.shards.write_synthetic_shards`) at
   the recipe's frame size;
2. the pre-flight of the resulting config (`training.preflight`): tokens and the planner's per-GPU memory;
3. `python -m training` with the rung's experiment (`qwen25vl_3b_lora_1gpu`, `qwen3vl_2b_lora_1gpu`) on its
   shape-true model (`shape-true:Qwen/Qwen2.5-VL-3B-Instruct`, `shape-true:Qwen/Qwen3-VL-2B-Instruct`: random
   init at the real widths, the real tokenizer; full depth by default) in bf16, sdpa
   or flash-attn when installed, gradient checkpointing, LoRA on the recipe's modules, ZeRO-2, the recipe's
   micro-batch and accumulation, `engine.deterministic=true`, for `--steps` optimizer steps;
4. a resume: the checkpoint at half the steps, copied alone into a fresh root, trained to the end again; the
   per-step losses after the resume point must be bit-equal to the first run's;
5. one checkpoint evaluation (`python -m evaluation --checkpoint ... --split val`, greedy generation);
then writes `<out>/<rung>/gpu_check.json` and `<out>/<rung>/gpu_check.md`: device, versions, attention, tokens/s, MFU, peak
memory against the planner's prediction, resume bit-exactness, the evaluation's numbers, seconds per part.

Without a CUDA device it exits 0 with a message (CI never has one). `--cpu-dry-run` runs the same sequence on
the CPU at toy sizes (fp32, 1 layer, a cut vocabulary) so the script itself is tested here
(tests/training/test_train_gpu_check.py).

On the project's lent H200 (no network): `make gpu-wheels` here puts the pure-Python packages that machine lacks
into `.whl/` (git-ignored); the device command carries `.whl` and runs `make gpu-check`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from vtg import checkpoints
from vtg.cli_common import run_cli
from vtg.errors import VTGError
from vtg.net import free_port
from vtg.testing.shards import write_synthetic_shards

RUNGS = {
    "qwen25vl_3b": ("qwen25vl_3b_lora_1gpu", "shape-true:Qwen/Qwen2.5-VL-3B-Instruct", 36, 32),
    "qwen3vl_2b": ("qwen3vl_2b_lora_1gpu", "shape-true:Qwen/Qwen3-VL-2B-Instruct", 28, 24),
}
"""rung -> (experiment, shape-true base, real decoder layers, real vision blocks)."""
REPO = Path(__file__).resolve().parents[1]


def _overrides(a: argparse.Namespace, work: Path, depth: str) -> list[str]:
    cpu = a.cpu_dry_run
    ov = [f"train.model.base={a.base}?{depth}", f"train.shards_dir={work / 'shards'}", f"train.out_dir={work / 'ck'}",
          f"train.max_steps={a.steps}", f"train.save_every={a.steps // 2}", "train.keep_last=10",
          "train.model.gradient_checkpointing=true", "engine.deterministic=true", "train.num_gpus=1",
          "train.progress=false", "train.log_every=5", "tracking.enabled=false",
          f"train.data.num_workers={0 if cpu else 2}", "train.data.sanity_examples=4",
          f"preprocess.num_frames={a.frames}", f"preprocess.frame_size={a.frame_size}",
          f"preprocess.max_window_s={a.window_s}",
          f"evaluate.shards_dir={work / 'shards'}", f"evaluate.out_dir={work / 'eval'}",
          f"evaluate.store_dir={work / 'eval_runs'}", f"evaluate.max_examples={a.eval_examples}",
          "evaluate.baselines=[prior]", f"evaluate.device={'cpu' if cpu else 'cuda:0'}"]
    if cpu:
        ov += ["engine.precision=fp32", "train.grad_accum=2", "train.micro_batch_size=1"]
    return ov


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, check=False).returncode
    if rc != 0:
        tail = "\n  ".join(log.read_text().splitlines()[-15:])
        raise VTGError(f"{' '.join(cmd[:4])} ... failed (exit {rc}); last lines of {log}:\n  {tail}")
    return time.perf_counter() - t0


def _losses(summary: Path) -> dict[int, str]:
    rows = summary.with_name(f"{summary.stem}_loss.csv").read_text().splitlines()[1:]
    return {int(s): loss for s, loss in (r.split(",") for r in rows)}


def _attention(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if "attention implementation:" in line]
    return lines[0].split("attention implementation:", 1)[1].strip() if lines else "?"


def check(a: argparse.Namespace) -> dict:
    """One rung's whole sequence (`a.rung`, `a.experiment`, `a.base` set by `main`)."""
    import torch

    out = Path(a.out) / a.rung
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    depth = (f"text_layers={a.text_layers}&vision_blocks={a.vision_blocks}" +
             (f"&vocab={a.vocab}" if a.vocab else ""))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"), "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if a.cpu_dry_run:
        env["DS_ACCELERATOR"] = "cpu"
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    write_synthetic_shards(work / "shards", n_train=a.train_samples, n_val=max(4, a.eval_examples),
                           num_frames=a.frames, size=a.frame_size, duration=a.window_s)
    timings["shards_s"] = time.perf_counter() - t0
    ov = _overrides(a, work, depth)
    py = [sys.executable, "-m"]
    params = ["--params", str(REPO / "params.yaml"), "-e", a.experiment]

    pre_json = out / "preflight.json"
    timings["preflight_s"] = _run(py + ["training.preflight", *params, *ov, "--json", str(pre_json)],
                                  out / "preflight.log", env)
    preflight = json.loads(pre_json.read_text())

    first = out / "train.json"
    timings["train_s"] = _run(py + ["training", *params, *ov, "--summary", str(first)], out / "train.log",
                              {**env, "MASTER_PORT": str(free_port())})
    summary = json.loads(first.read_text())

    half = a.steps // 2  # resume: the half-way checkpoint alone in a fresh root, trained to the end again
    resumed_root = work / "ck-resume"
    shutil.copytree(work / "ck" / checkpoints.step_dir_name(half), resumed_root / checkpoints.step_dir_name(half))
    checkpoints.write_pointer(resumed_root / checkpoints.LATEST, resumed_root / checkpoints.step_dir_name(half),
                              step=half)
    second = out / "resume.json"
    timings["resume_s"] = _run(py + ["training", *params, *ov, f"train.out_dir={resumed_root}",
                                     "--summary", str(second)], out / "resume.log",
                               {**env, "MASTER_PORT": str(free_port())})
    a_loss, b_loss = _losses(first), _losses(second)
    after = sorted(s for s in b_loss if s > half)
    mismatched = [s for s in after if a_loss.get(s) != b_loss[s]]

    latest = checkpoints.latest_checkpoint(work / "ck")
    # an ad-hoc evaluation leaves the stage's outputs alone: its copy goes to --out (one folder per checkpoint)
    timings["eval_s"] = _run(py + ["evaluation", "--checkpoint", str(latest), "--split", "val",
                                   "--out", str(work / "eval_adhoc"), *params, *ov], out / "eval.log", env)
    [ev_file] = (work / "eval_adhoc").glob("*/metrics.json")
    ev = json.loads(ev_file.read_text())

    total_gb = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None
    peak_pct = summary.get("gpu_mem_allocated_pct_max")
    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)",
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "model": f"{a.base}?{depth}", "experiment": a.experiment, "attention": _attention(out / "train.log"),
        "steps": a.steps, "frames": a.frames, "frame_size": a.frame_size,
        "tokens_per_s": summary.get("tokens_per_s"), "mfu": summary.get("mfu"),
        "tflops_per_device": summary.get("tflops_per_device"), "steps_per_s": summary.get("steps_per_s"),
        "final_loss": summary.get("final_loss"),
        "peak_mem_allocated_gb": round(peak_pct / 100 * total_gb, 2) if peak_pct and total_gb else None,
        "peak_mem_reserved_pct": summary.get("gpu_mem_reserved_pct_max"),
        "planner": {"verdict": preflight.get("verdict"), "tokens": (preflight.get("tokens") or {}).get("total"),
                    "max_seq_len": (preflight.get("tokens") or {}).get("max_seq_len"),
                    "per_gpu_gib": round(((preflight.get("memory") or {}).get("configured") or {})
                                         .get("total_gib", float("nan")), 2)},
        "resume": {"from_step": half, "steps_compared": len(after), "bit_exact": bool(after) and not mismatched,
                   "mismatched_steps": mismatched[:10]},
        "evaluation": {"split": ev.get("split"), "step": ev.get("step"), "model": ev.get("model"),
                       "queries": (ev.get("counts") or {}).get("scored")},
        "seconds": {k: round(v, 1) for k, v in timings.items()},
    }


def markdown(r: dict) -> str:
    ev, res, sec = r["evaluation"], r["resume"], r["seconds"]
    model = ev.get("model") or {}
    rows = [("device", r["device"]), ("torch / transformers", f"{r['torch']} / {r['transformers']}"),
            ("model", r["model"]), ("attention", r["attention"]),
            ("steps (frames x px)", f"{r['steps']} ({r['frames']} x {r['frame_size']})"),
            ("tokens/s", r["tokens_per_s"]), ("MFU", r["mfu"]), ("TFLOP/s per device", r["tflops_per_device"]),
            ("peak memory allocated (GB) / planner's per-GPU figure (GiB, incl. reserve)",
             f"{r['peak_mem_allocated_gb']} / {r['planner']['per_gpu_gib']}"),
            ("pre-flight", (f"{r['planner']['verdict']}: {r['planner']['tokens']} tokens "
                            f"(max_seq_len {r['planner']['max_seq_len']})")),
            ("resume bit-exact", f"{res['bit_exact']} ({res['steps_compared']} steps after step {res['from_step']})"),
            ("evaluation", (f"{ev.get('queries')} queries on {ev.get('split')}: mIoU {model.get('miou')}, "
                            f"parse failures {model.get('parse_failure_rate')}")),
            ("seconds", ", ".join(f"{k} {v}" for k, v in sec.items()))]
    return "# GPU check\n\n| | |\n| --- | --- |\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/gpu_check", help="folder for the JSON, markdown and logs")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps of the first run (default %(default)s)")
    p.add_argument("--rung", choices=[*RUNGS, "all"], default="all", help="which rung (default: %(default)s)")
    p.add_argument("--text-layers", type=int, default=None, help="decoder layers (default: the rung's real depth)")
    p.add_argument("--vision-blocks", type=int, default=None, help="vision blocks (default: the real depth)")
    p.add_argument("--vocab", type=int, default=None, help="cut the vocabulary to this size (default: real)")
    p.add_argument("--frames", type=int, default=16, help="frames per window (default %(default)s)")
    p.add_argument("--frame-size", type=int, default=336, help="frame side in px (default %(default)s)")
    p.add_argument("--window-s", type=float, default=30.0, help="window length in seconds")
    p.add_argument("--train-samples", type=int, default=64, help="synthetic training windows")
    p.add_argument("--eval-examples", type=int, default=8, help="queries in the checkpoint evaluation")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="run the same sequence on the CPU at toy sizes (tests the script, measures nothing)")
    a = p.parse_args(argv)
    if a.cpu_dry_run:
        a.text_layers, a.vision_blocks, a.vocab = 1, 1, a.vocab or 1024
        a.frames, a.frame_size, a.steps, a.train_samples, a.eval_examples = 2, 56, min(a.steps, 4), 16, 4
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device here; nothing to check (run it on a GPU machine: make gpu-check)")
            return 0
    if a.steps < 2 or a.steps % 2:
        raise VTGError(f"--steps must be even and >= 2 (the resume check restarts from half), got {a.steps}")
    for rung in RUNGS if a.rung == "all" else [a.rung]:
        experiment, base, layers, blocks = RUNGS[rung]
        r = argparse.Namespace(**{**vars(a), "rung": rung, "experiment": experiment, "base": base,
                                  "text_layers": a.text_layers or layers, "vision_blocks": a.vision_blocks or blocks})
        report = check(r)
        out = Path(a.out) / rung
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "gpu_check.md").write_text(markdown(report))
        print(markdown(report))
        if not report["resume"]["bit_exact"]:
            raise VTGError(f"{rung}: resume was not bit-exact: steps {report['resume']['mismatched_steps']} differ")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
