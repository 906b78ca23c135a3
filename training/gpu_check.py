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

Then the fp16 case (`fp16_check`; `--cases` picks `recipe`, `fp16` or both, the default): the rung's recipe in
`engine.precision=fp16` with dynamic loss scaling under DeepSpeed ZeRO-2 and under FSDP2, on the model cut to 4
decoder layers, 8 steps and a resume from 4, into `<out>/<rung>/fp16.json` and `fp16.md` (loss scale, overflow steps
skipped, resume bit-exactness). Its overflow path (skip, halve, log, go on) is tested on the CPU
(tests/training/test_fp16.py); this case checks that fp16 trains and resumes on a GPU with both engines.

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


def _workspace(a: argparse.Namespace, out: Path) -> tuple[Path, dict[str, str]]:
    """A fresh `out/work` with the rung's synthetic shards, and the environment of the commands run on them."""
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"), "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if a.cpu_dry_run:
        env["DS_ACCELERATOR"] = "cpu"
    write_synthetic_shards(work / "shards", n_train=a.train_samples, n_val=max(4, a.eval_examples),
                           num_frames=a.frames, size=a.frame_size, duration=a.window_s)
    return work, env


def _train_and_resume(cmd: list[str], root: Path, steps: int, out: Path, prefix: str,
                      env: dict[str, str]) -> tuple[dict, dict, float, float]:
    """`cmd` (`python -m training ...`, checkpoints in `root`) for `steps` steps, then the half-way checkpoint alone in
    a fresh root trained to the end again: (first run's summary, the resume's comparison, seconds of each run)."""
    first = out / f"{prefix}train.json"
    train_s = _run(cmd + ["--summary", str(first)], out / f"{prefix}train.log", {**env, "MASTER_PORT": str(free_port())})
    half = steps // 2
    resumed_root = root.with_name(f"{root.name}-resume")
    shutil.copytree(root / checkpoints.step_dir_name(half), resumed_root / checkpoints.step_dir_name(half))
    checkpoints.write_pointer(resumed_root / checkpoints.LATEST, resumed_root / checkpoints.step_dir_name(half),
                              step=half)
    second = out / f"{prefix}resume.json"
    resume_s = _run(cmd + [f"train.out_dir={resumed_root}", "--summary", str(second)], out / f"{prefix}resume.log",
                    {**env, "MASTER_PORT": str(free_port())})
    a_loss, b_loss = _losses(first), _losses(second)
    after = sorted(s for s in b_loss if s > half)
    mismatched = [s for s in after if a_loss.get(s) != b_loss[s]]
    resume = {"from_step": half, "steps_compared": len(after), "bit_exact": bool(after) and not mismatched,
              "mismatched_steps": mismatched[:10]}
    return json.loads(first.read_text()), resume, train_s, resume_s


def check(a: argparse.Namespace) -> dict:
    """One rung's whole sequence (`a.rung`, `a.experiment`, `a.base` set by `main`)."""
    import torch

    out = Path(a.out) / a.rung
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    work, env = _workspace(a, out)
    timings["shards_s"] = time.perf_counter() - t0
    depth = (f"text_layers={a.text_layers}&vision_blocks={a.vision_blocks}" +
             (f"&vocab={a.vocab}" if a.vocab else ""))
    ov = _overrides(a, work, depth)
    py = [sys.executable, "-m"]
    params = ["--params", str(REPO / "params.yaml"), "-e", a.experiment]

    pre_json = out / "preflight.json"
    timings["preflight_s"] = _run(py + ["training.preflight", *params, *ov, "--json", str(pre_json)],
                                  out / "preflight.log", env)
    preflight = json.loads(pre_json.read_text())

    summary, resume, timings["train_s"], timings["resume_s"] = _train_and_resume(
        py + ["training", *params, *ov], work / "ck", a.steps, out, "", env)

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
        "resume": resume,
        "evaluation": {"split": ev.get("split"), "step": ev.get("step"), "model": ev.get("model"),
                       "queries": (ev.get("counts") or {}).get("scored")},
        "seconds": {k: round(v, 1) for k, v in timings.items()},
    }


FP16_STEPS = 8
"""Optimizer steps of each run of the fp16 case (its resume starts from half)."""
FP16_DEPTH = (4, 2)
"""(decoder layers, vision blocks) of the rung's model in the fp16 case: the loss scaler, not throughput, is checked."""
FP16_REFUSAL = "accelerator refuses fp16"
"""What `training.engine.refuse_fp16_without_support` says where DeepSpeed cannot train fp16 (a CPU without oneDNN fp16)."""


def fp16_check(a: argparse.Namespace) -> dict:
    """The fp16 case (`--cases fp16`): the rung's recipe in `engine.precision=fp16` with dynamic loss scaling, under
    each engine (DeepSpeed ZeRO-2: its fp16 optimizer; FSDP2: fp32 master weights and `torch.amp.GradScaler`), on
    its model cut to `FP16_DEPTH`: `FP16_STEPS` steps, then a resume from half compared loss by loss (the scaler's
    state is in the checkpoint); reports the final loss scale, the overflow steps skipped and the final loss. On the
    CPU (`--cpu-dry-run`) DeepSpeed refuses fp16 (no oneDNN fp16 here): that refusal is then its result."""
    import torch

    out = Path(a.out) / a.rung / "fp16"
    work, env = _workspace(a, out)
    depth = f"text_layers={FP16_DEPTH[0]}&vision_blocks={FP16_DEPTH[1]}" + (f"&vocab={a.vocab}" if a.vocab else "")
    model = f"{a.base}?{depth}"
    # fp16 matmuls on a CPU without fp16 units are slow (4 steps of the 1-layer shape-true 3B: ~11 min here), so the
    # dry run takes the tiny Qwen2.5-VL: it tests the script, not the rung
    base = ["train.model.base=tiny", "train.teach.steps=0"] if a.cpu_dry_run else []
    params = ["--params", str(REPO / "params.yaml"), "-e", a.experiment]
    results: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)",
                     "model": "tiny" if a.cpu_dry_run else model, "experiment": a.experiment, "steps": FP16_STEPS}
    for strategy in ("deepspeed", "fsdp"):
        ov = [*_overrides(a, work, depth), *base, "engine.precision=fp16", f"engine.strategy={strategy}",
              f"train.max_steps={FP16_STEPS}", f"train.save_every={FP16_STEPS // 2}",
              f"train.out_dir={work / strategy}"]
        cmd = [sys.executable, "-m", "training", *params, *ov]
        try:
            summary, resume, train_s, resume_s = _train_and_resume(cmd, work / strategy, FP16_STEPS, out,
                                                                   f"{strategy}_", env)
        except VTGError as e:
            if not (a.cpu_dry_run and FP16_REFUSAL in str(e)):
                raise
            refusal = [line.strip() for line in str(e).splitlines() if FP16_REFUSAL in line]
            results[strategy] = {"refused": (refusal[-1] if refusal else str(e)).removeprefix("error: ")}
            continue
        results[strategy] = {"final_loss": summary.get("final_loss"), "loss_scale": summary.get("loss_scale"),
                             "overflow_steps": summary.get("overflow_steps"), "steps": summary.get("step"),
                             "resume": resume, "seconds": {"train_s": round(train_s, 1),
                                                           "resume_s": round(resume_s, 1)}}
    return results


def fp16_problems(r: dict) -> list[str]:
    """What is wrong in an fp16 case's results (empty: it passed)."""
    problems = []
    for strategy in ("deepspeed", "fsdp"):
        x = r[strategy]
        if "refused" in x:
            if not r["device"].startswith("cpu"):
                problems.append(f"fp16 {strategy}: refused on a GPU ({x['refused']})")
            continue
        if not x["resume"]["bit_exact"]:
            problems.append(f"fp16 {strategy}: resume not bit-exact (steps {x['resume']['mismatched_steps']})")
        if x["loss_scale"] is None or not (x["final_loss"] == x["final_loss"] and abs(x["final_loss"]) < 1e30):
            problems.append(f"fp16 {strategy}: no loss scale or a non-finite loss ({x})")
        elif x["overflow_steps"] >= x["steps"]:
            problems.append(f"fp16 {strategy}: every step overflowed (loss scale {x['loss_scale']})")
    return problems


def fp16_markdown(r: dict) -> str:
    rows = [("device", r["device"]), ("model", r["model"])]
    for strategy in ("deepspeed", "fsdp"):
        x = r[strategy]
        rows.append((f"fp16 {strategy}", f"refused: {x['refused']}" if "refused" in x else
                     (f"{x['steps']} steps, final loss {x['final_loss']:.4f}, loss scale {x['loss_scale']:g}, "
                      f"{x['overflow_steps']} overflow steps skipped, resume bit-exact {x['resume']['bit_exact']} "
                      f"({x['resume']['steps_compared']} steps after step {x['resume']['from_step']})")))
    return "# GPU check: fp16\n\n| | |\n| --- | --- |\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"


QLORA_STEPS = 8
"""Optimizer steps of each run of the qlora case (its resume starts from half)."""
QLORA_REFUSAL = "a 4-bit base cannot train here"
"""What training's pre-flight says where bitsandbytes is missing or cannot run (`training.preflight`)."""


def qlora_check(a: argparse.Namespace) -> dict:
    """The QLoRA case (`--cases qlora`): the rung's recipe with its base in 4-bit NF4 (`train.model.finetune=qlora`,
    bitsandbytes on the GPU) at the rung's depth: `QLORA_STEPS` steps (2 in the dry run), a resume from half
    compared loss by loss,
    one evaluation of the export (adapter + quantisation record: the base reloads in 4-bit), and the peak memory
    against the pre-flight's per-GPU figure, which counts the base at ~0.52 bytes an element. Where bitsandbytes is
    missing there, training's pre-flight refuses before any weights load: that refusal is the result (a problem
    on a GPU)."""
    import torch

    out = Path(a.out) / a.rung / "qlora"
    work, env = _workspace(a, out)
    depth = (f"text_layers={a.text_layers}&vision_blocks={a.vision_blocks}" + (f"&vocab={a.vocab}" if a.vocab else ""))
    steps = 2 if a.cpu_dry_run else QLORA_STEPS
    ov = [*_overrides(a, work, depth), "train.model.finetune=qlora", f"train.max_steps={steps}",
          f"train.save_every={steps // 2}"]
    py, params = [sys.executable, "-m"], ["--params", str(REPO / "params.yaml"), "-e", a.experiment]
    r: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)",
               "model": f"{a.base}?{depth}", "experiment": a.experiment, "steps": steps}
    _run(py + ["training.preflight", *params, *ov, "--json", str(out / "preflight.json")], out / "preflight.log", env)
    pre = json.loads((out / "preflight.json").read_text())
    try:
        summary, resume, train_s, resume_s = _train_and_resume(py + ["training", *params, *ov], work / "ck", steps,
                                                               out, "", env)
    except VTGError as e:
        if QLORA_REFUSAL not in str(e):
            raise
        return {**r, "refused": next(line.strip() for line in str(e).splitlines() if QLORA_REFUSAL in line)}
    latest = checkpoints.latest_checkpoint(work / "ck")
    eval_s = _run(py + ["evaluation", "--checkpoint", str(latest), "--split", "val", "--out",
                        str(work / "eval_adhoc"), *params, *ov], out / "eval.log", env)
    [ev_file] = (work / "eval_adhoc").glob("*/metrics.json")
    ev = json.loads(ev_file.read_text())
    total_gb = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None
    peak_pct = summary.get("gpu_mem_allocated_pct_max")
    return {**r, "final_loss": summary.get("final_loss"), "tokens_per_s": summary.get("tokens_per_s"),
            "quantized_params": pre.get("quantized_params"), "params": pre.get("params"),
            "peak_mem_allocated_gb": round(peak_pct / 100 * total_gb, 2) if peak_pct and total_gb else None,
            "planner_per_gpu_gib": round(pre["memory"]["configured"]["total_gib"], 2),
            "planner_model_states_gib": round(pre["memory"]["configured"]["model_states_b"] / 2**30, 2),
            "resume": resume, "export_files": sorted(p.name for p in checkpoints.export_dir(latest).iterdir()),
            "evaluation": {"split": ev.get("split"), "queries": (ev.get("counts") or {}).get("scored"),
                           "miou": (ev.get("model") or {}).get("miou")},
            "seconds": {"train_s": round(train_s, 1), "resume_s": round(resume_s, 1), "eval_s": round(eval_s, 1)}}


def qlora_problems(r: dict) -> list[str]:
    """What is wrong in a qlora case's results (empty: it passed)."""
    if "refused" in r:
        return [] if r["device"].startswith("cpu") else [f"qlora: refused on a GPU ({r['refused']})"]
    problems = []
    if not r["resume"]["bit_exact"]:
        problems.append(f"qlora: resume not bit-exact (steps {r['resume']['mismatched_steps']})")
    if "quantization_config.json" not in r["export_files"] or "model.safetensors" in r["export_files"]:
        problems.append(f"qlora: the export is not an adapter with its quantisation record ({r['export_files']})")
    if r["peak_mem_allocated_gb"] and r["peak_mem_allocated_gb"] > r["planner_per_gpu_gib"] * 2**30 / 1e9:
        problems.append(f"qlora: peak memory {r['peak_mem_allocated_gb']} GB above the pre-flight's "
                        f"{r['planner_per_gpu_gib']} GiB")
    return problems


def qlora_markdown(r: dict) -> str:
    rows = [("device", r["device"]), ("model", r["model"])]
    if "refused" in r:
        rows.append(("qlora", f"refused: {r['refused']}"))
    else:
        rows += [("4-bit elements / all", f"{r['quantized_params']:.4g} / {r['params']:.4g}"),
                 ("steps, final loss", f"{r['steps']}, {r['final_loss']:.4f}"), ("tokens/s", r["tokens_per_s"]),
                 ("peak memory allocated (GB) / pre-flight per GPU (GiB, incl. reserve; model states)",
                  f"{r['peak_mem_allocated_gb']} / {r['planner_per_gpu_gib']} ({r['planner_model_states_gib']})"),
                 ("resume bit-exact", (f"{r['resume']['bit_exact']} ({r['resume']['steps_compared']} steps "
                                       f"after step {r['resume']['from_step']})")),
                 ("export", ", ".join(r["export_files"])),
                 ("evaluation", (f"{r['evaluation']['queries']} queries on {r['evaluation']['split']}: mIoU "
                                 f"{r['evaluation']['miou']}")),
                 ("seconds", ", ".join(f"{k} {v}" for k, v in r["seconds"].items()))]
    return "# GPU check: QLoRA\n\n| | |\n| --- | --- |\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"


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


CASES = {"fp16": (fp16_check, fp16_markdown, fp16_problems), "qlora": (qlora_check, qlora_markdown, qlora_problems)}
"""The option cases beside the recipe: (run, its markdown, its problems), each written to `<case>.json` / `.md`."""


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
    p.add_argument("--cases", default="recipe,fp16,qlora",
                   help="what to run per rung, comma-separated: recipe (train, resume, evaluate the recipe), fp16 "
                        "(both engines in fp16 with loss scaling, cut depth), qlora (the recipe over a 4-bit base: "
                        "train, resume, evaluate, memory against the pre-flight); default %(default)s")
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
    cases = {c.strip() for c in a.cases.split(",") if c.strip()}
    if not cases or cases - {"recipe", "fp16", "qlora"}:
        raise VTGError(f"--cases takes recipe, fp16 and/or qlora, got {a.cases!r}")
    for rung in RUNGS if a.rung == "all" else [a.rung]:
        experiment, base, layers, blocks = RUNGS[rung]
        r = argparse.Namespace(**{**vars(a), "rung": rung, "experiment": experiment, "base": base,
                                  "text_layers": a.text_layers or layers, "vision_blocks": a.vision_blocks or blocks})
        out = Path(a.out) / rung
        if "recipe" in cases:
            report = check(r)
            (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
            (out / "gpu_check.md").write_text(markdown(report))
            print(markdown(report))
            if not report["resume"]["bit_exact"]:
                raise VTGError(f"{rung}: resume was not bit-exact: steps {report['resume']['mismatched_steps']} "
                               "differ")
        for case, (run_case, to_markdown, problems_of) in CASES.items():
            if case in cases:
                result = run_case(r)
                (out / f"{case}.json").write_text(json.dumps(result, indent=1) + "\n")
                (out / f"{case}.md").write_text(to_markdown(result))
                print(to_markdown(result))
                if problems := problems_of(result):
                    raise VTGError(f"{rung}: " + "; ".join(problems))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
