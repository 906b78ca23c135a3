"""Do auto labels help? The low-label measurement on the embedded default (issue 24, docs/results.md).

Withhold the annotations of `--hide` of the corpus's train-split videos and let the annotate stage label them, the
self-training loop a team runs with its first grounding model:
1. annotate with the taught annotator proposing and verifying (pass A), preprocess: shards whose labelled queries
   are the low-label set;
2. SFT a verifier on them without the auto labels (`train.data.auto_share=0`, seed `--verifier-seed`);
3. annotate again, the same proposer, that SFT checkpoint verifying (pass B), preprocess;
4. on pass B's shards, for each seed, SFT without the auto labels (`auto_share=0`: only the labelled rest) and with
   them (`null`: as they come), and score each run's last checkpoint on the held-out test split.
Both passes' accepted labels are scored against the withheld truth. Every step is the stage's own CLI in a
subprocess (what `dvc repro` runs), writing under `--out` only; the corpus and ingest's records are the project's
(built first when missing). `--verifier taught` skips steps 2-3 (the annotator verifies itself).

    python -m annotate.measure                       # 3 seeds x 2 arms, ~40 min on 2 cores
    python -m annotate.measure --seeds 42 --steps 200 --out /tmp/auto   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from vtg.checkpoints import step_dir_name

METRICS = ("r1@0.5", "r1@0.7", "miou")
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78}


def _run(args: list[str], log: Path) -> None:
    t0 = time.perf_counter()
    with log.open("a") as f:
        f.write(f"$ {' '.join(args)}\n")
        f.flush()
        r = subprocess.run([sys.executable, "-m", *args], check=False, stdout=f, stderr=subprocess.STDOUT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    print(f"  {' '.join(args[:1])}: {time.perf_counter() - t0:.0f} s", flush=True)
    if r.returncode:
        raise SystemExit(f"{args[0]} failed (exit {r.returncode}); see {log}")


def _mean_ci(values: list[float]) -> dict:
    m = statistics.fmean(values)
    half = T95.get(len(values) - 1, 2.0) * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0
    return {"mean": round(m, 4), "ci95": [round(m - half, 4), round(m + half, 4)], "values": values}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m annotate.measure", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="reports/auto_labels", help="everything this writes (default: %(default)s)")
    p.add_argument("--hide", type=float, default=0.75, help="annotate.hide_fraction (default: %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 7, 1], help="train.seed per run")
    p.add_argument("--steps", type=int, default=1500, help="SFT steps per run (default: %(default)s)")
    p.add_argument("--annotate", nargs="*", default=[], help="more annotate.* overrides")
    p.add_argument("--verifier", choices=["sft", "taught"], default="sft",
                   help="who verifies the proposals of the measured pass (default: %(default)s)")
    p.add_argument("--verifier-seed", type=int, default=0, help="train.seed of the SFT verifier")
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "measure.log"
    common = ["tracking.enabled=false"]
    if not Path("data/interim/records.jsonl").is_file():
        _run(["corpus", *common], log)
        _run(["ingest", *common], log)

    def annotate_pass(name: str, *extra: str) -> tuple[Path, dict]:
        i, shards = out / name / "interim", out / name / "shards"
        _run(["annotate", *common, "annotate.enabled=true", f"annotate.hide_fraction={a.hide}",
              "annotate.progress=false", f"annotate.out={i}/annotated.jsonl", f"annotate.proposals={i}/proposals.jsonl",
              f"annotate.withheld={i}/withheld.jsonl", f"annotate.summary={i}/summary.json", *a.annotate, *extra], log)
        _run(["beam_jobs.preprocess", *common, f"preprocess.records={i}/annotated.jsonl",
              f"preprocess.out_dir={shards}", "preprocess.progress=false"], log)
        return shards, json.loads((i / "summary.json").read_text())

    def sft(name: str, shards: Path, seed: int, share: str) -> Path:
        ckpts = out / "sft" / name
        _run(["training", *common, f"train.seed={seed}", f"train.data.auto_share={share}",
              f"train.shards_dir={shards}", f"train.out_dir={ckpts}", f"train.max_steps={a.steps}",
              f"train.save_every={a.steps}", "train.progress=false", "train.resume=never"], log)
        return ckpts / step_dir_name(a.steps)

    shards, first = annotate_pass("pass_a")
    passes = {"pass_a": first}
    if a.verifier == "sft":
        verifier = sft(f"verifier-{a.verifier_seed}", shards, a.verifier_seed, "0")
        shards, passes["pass_b"] = annotate_pass("pass_b", f"annotate.verifier={verifier}")
    manifest = json.loads((shards / "manifest.json").read_text())
    runs: dict[str, dict[int, dict]] = {"without": {}, "with": {}}
    for seed in a.seeds:
        for arm, share in (("without", "0"), ("with", "null")):
            ckpt = sft(f"{arm}-{seed}", shards, seed, share)
            res = out / "eval" / f"{arm}-{seed}"
            _run(["evaluation", *common, f"evaluate.shards_dir={shards}", f"evaluate.store_dir={out / 'eval_store'}",
                  "--checkpoint", str(ckpt), "--split", "test", "--out", str(res)], log)
            result = json.loads(next(res.rglob("metrics.json")).read_text())
            runs[arm][seed] = {k: result["model"][k] for k in METRICS}
            print(f"  {arm} seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[arm][seed].items()), flush=True)
    keys = ("withheld", "withheld_videos", "proposals", "accepted", "rejected", "rejected_by_reason",
            "videos_by_verdict", "precision", "annotator", "seconds")
    report = {
        "hide_fraction": a.hide, "seeds": a.seeds, "sft_steps": a.steps, "verifier": a.verifier,
        "annotate": {name: {k: summary.get(k) for k in keys} for name, summary in passes.items()},
        "train_queries_by_source": manifest.get("sources"),
        "dropped_per_reason": manifest.get("dropped_per_reason"),
        "test": {arm: {"per_seed": r, **{k: _mean_ci([r[s][k] for s in a.seeds]) for k in METRICS}}
                 for arm, r in runs.items()},
        "with_minus_without": {k: _mean_ci([runs["with"][s][k] - runs["without"][s][k] for s in a.seeds])
                               for k in METRICS},
    }
    (out / "auto_labels.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("annotate", "with_minus_without")}, indent=1))
    print(f"-> {out / 'auto_labels.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
