"""RL benchmark: where a GRPO step's time goes, against a plain `generate` loop measured in the same run.

1. rollout tokens/s of the RL loop (prompt encoding, sampling B x G answers with the policy's `generate` through
   the engine, reward parsing) vs a plain `model.generate` loop over the same prompts (already collated, same
   sampling settings, same model): the ratio is the rollout's overhead (prompt encoding, rewards, the engine)
   [target >= 1.0x: one vision pass per video makes up for the rest]
2. the split of one RL step: rollout seconds vs update seconds (teacher-forced forward + backward + ZeRO step),
   and the whole step vs the plain generate of the same batch; seconds per phase (`training.rl.outputs.PHASES`)
   and the padding shares of the prefill and the update.

Each of `--repeats` rounds runs `--steps` RL steps, then the plain loop over the same steps' prompts; the ratios
are the median over rounds (the first round's first 2 steps warm up when it has more than 4).

    python -m benchmarks.rl [--steps 12] [--repeats 3] [--sft-steps 60] [--checkpoint DIR --shards DIR] [--json PATH]

Without `--checkpoint` it builds synthetic shards and a short SFT (`--sft-steps` of the tiny model) in a temp
folder; pass a real SFT checkpoint (e.g. `checkpoints/sft/step-001500` after `make run`) and its shards to measure
the embedded default's model. Ratios are what matter; absolute times depend on the machine's load. The JSON's
ratios: `rollout_tokens_per_s_vs_plain` (1), `rollout_share_of_step` and `step_vs_plain_generate` (2).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.figures import REPO, Run, default_json


def build(tmp: Path, checkpoint: str | None, steps: int, shards: str | None, sft_steps: int):
    """The run's config; without `checkpoint`, first synthetic shards and a `sft_steps` SFT of the tiny model."""
    from vtg.config import load_config
    from vtg.testing.shards import write_synthetic_shards

    shards_dir = Path(shards) if shards else write_synthetic_shards(tmp / "shards", 24, 6, 2, 0, source="fixture")
    overrides = [f"train.shards_dir={shards_dir}", f"train.out_dir={tmp / 'sft'}", f"train.max_steps={sft_steps}",
                 "train.micro_batch_size=8", "train.save_every=1000", "train.log_every=1", "train.progress=false",
                 "train.data.num_workers=0", "train.data.shuffle_buffer=16", "train.data.sanity_examples=4",
                 "train.guards.min_steps=1000", "train.teach.steps=0", "tracking.enabled=false",
                 f"evaluate.shards_dir={shards_dir}", f"evaluate.out_dir={tmp / 'eval'}",
                 f"evaluate.store_dir={tmp / 'store'}", "evaluate.forgetting.suite=", f"rl.out_dir={tmp / 'rl'}",
                 f"rl.report_dir={tmp / 'rlrep'}", f"rl.max_steps={steps}", "rl.save_every=100000",
                 "rl.progress=false", "rl.kl_every=0", "rl.resume=never",
                 f"rl.init={checkpoint}" if checkpoint else "rl.init=latest"]
    cfg = load_config(REPO / "params.yaml", None, overrides)
    if not checkpoint:
        from training.sft import train

        train(cfg)
    return cfg


def plain_generate(module, steps: range) -> dict:
    """The baseline: the same prompts as RL `steps`, collated once, sampled with `model.generate` directly."""
    import torch

    from training.rl.grpo import step_queries
    from training.rl.rollout import encode_prompts, end_token_ids, pad_id, vision_token_ids
    from vtg.model.processing import collate, model_inputs

    r, model, tok = module.rcfg, module.engine.module, module.tokenizer
    batches = []
    for s in steps:
        ids = step_queries(len(module.state.pool), s, r.queries_per_step, r.seed)
        exs = [module.by_key[module.state.pool[i]] for i in ids]
        b = model_inputs(collate(encode_prompts(tok, exs, r.group_size, module.vision), pad_id(tok), "left"))
        b.pop("labels", None)
        batches.append(b)
    model.eval()
    times, tokens = [], []
    with torch.no_grad():
        for b in batches:
            t0 = time.perf_counter()
            out = model.generate(**b, do_sample=True, temperature=r.temperature, top_p=r.top_p, top_k=0,
                                 max_new_tokens=r.max_new_tokens, pad_token_id=pad_id(tok),
                                 eos_token_id=end_token_ids(model, tok),
                                 suppress_tokens=vision_token_ids(model.config), use_cache=True)
            times.append(time.perf_counter() - t0)
            comp = out[:, b["input_ids"].shape[1]:]
            from training.rl.rollout import completion_mask

            tokens.append(int(completion_mask(comp, end_token_ids(model, tok)).sum()))
    model.train()
    return {"seconds": times, "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="RL steps measured per round")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (RL steps, then the plain loop); median ratios")
    ap.add_argument("--sft-steps", type=int, default=60, help="steps of the SFT built without --checkpoint")
    ap.add_argument("--checkpoint", default=None, help="an SFT checkpoint to start from (default: build one)")
    ap.add_argument("--shards", default=None, help="shard root of the checkpoint's data (with --checkpoint)")
    ap.add_argument("--json", default=default_json("rl"), help="where to write the figures")
    args = ap.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run = Run.start()
    from training.rl.grpo import GRPOModule
    from training.rl.outputs import PHASES
    from training.trainer import Trainer

    rounds, rows = [], []
    with tempfile.TemporaryDirectory() as d:
        cfg = build(Path(d), args.checkpoint, args.steps * args.repeats, args.shards, args.sft_steps)
        trainer = Trainer(cfg, GRPOModule(cfg), callbacks=[])
        module = trainer.module
        try:
            for k in range(args.repeats):
                first = module.state.step
                steps = [module.train_step() for _ in range(args.steps)]
                base = plain_generate(module, range(first, first + args.steps))
                skip = 2 if k == 0 and len(steps) > 4 else 0  # the first steps warm allocators up
                rounds.append(_round(steps[skip:], base["seconds"][skip:], base["tokens"][skip:]))
                rows += steps[skip:]
        finally:
            trainer.release_lock()
    ratios = {k: statistics.median(r[k] for r in rounds)
              for k in ("rollout_tokens_per_s_vs_plain", "rollout_share_of_step", "step_vs_plain_generate")}
    res = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k not in ratios}
    phases = {p: statistics.mean(v) for p in PHASES if (v := [r[p] for r in rows if r[p] == r[p]])}
    res.update(phases_s_per_step=phases, rounds=rounds,
               prefill_padding_frac=statistics.mean(r["prefill_padding_frac"] for r in rows),
               update_padding_frac=statistics.mean(r["update_padding_frac"] for r in rows))
    per_round = " / ".join(f"{r['rollout_tokens_per_s_vs_plain']:.2f}" for r in rounds)
    print(f"rollout tokens/s: RL {res['rl_rollout_tokens_per_s']:.0f} vs plain generate "
          f"{res['plain_generate_tokens_per_s']:.0f} -> {ratios['rollout_tokens_per_s_vs_plain']:.2f}x, median of "
          f"{len(rounds)} rounds ({per_round}) [target >= 1.0x]")
    print(f"one RL step: rollout {res['rollout_s_per_step']:.3f} s + update {res['update_s_per_step']:.3f} s "
          f"(rollout {ratios['rollout_share_of_step']:.0%} of the step) = {ratios['step_vs_plain_generate']:.2f}x a "
          f"plain generate of the same batch ({res['plain_generate_s_per_step']:.3f} s)")
    print("per phase (s/step): " + ", ".join(f"{p} {v:.3f}" for p, v in phases.items())
          + f"; padding: prefill {res['prefill_padding_frac']:.1%}, update {res['update_padding_frac']:.1%}")
    run.write(args.json, "rl", ratios=ratios, figures={
        "steps": args.steps, "repeats": args.repeats,
        "checkpoint": args.checkpoint or f"built: {args.sft_steps} SFT steps, tiny model", **res})
    return 0


def _round(rows: list[dict], gen_seconds: list[float], gen_token_counts: list[int]) -> dict:
    """One round's figures: the RL steps' rollout and update against the plain loop over the same prompts."""
    roll = sum(r["rollout_s"] for r in rows)
    upd = sum(r["update_s"] for r in rows)
    rl_tokens = sum(r["gen_tokens"] for r in rows)
    gen_s, gen_tokens = sum(gen_seconds), sum(gen_token_counts)
    return {"rl_rollout_tokens_per_s": rl_tokens / roll, "plain_generate_tokens_per_s": gen_tokens / gen_s,
            "rollout_s_per_step": roll / len(rows), "update_s_per_step": upd / len(rows),
            "plain_generate_s_per_step": gen_s / len(rows),
            "plain_vs_rl_answer_tokens": gen_tokens / max(rl_tokens, 1),
            "rollout_tokens_per_s_vs_plain": (rl_tokens / roll) / (gen_tokens / gen_s),
            "rollout_share_of_step": roll / (roll + upd), "step_vs_plain_generate": (roll + upd) / gen_s}


if __name__ == "__main__":
    sys.exit(main())
