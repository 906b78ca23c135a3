"""RL benchmark: where a GRPO step's time goes, against a plain `generate` loop measured in the same run.

1. rollout tokens/s of the RL loop (prompt encoding, sampling B x G answers with the policy's `generate` through
   the engine, reward parsing) vs a plain `model.generate` loop over the same prompts (already collated, same
   sampling settings, same model): the ratio is the rollout's overhead (prompt encoding, rewards, the engine)
2. the split of one RL step: rollout seconds vs update seconds (teacher-forced forward + backward + ZeRO step),
   and the whole step vs the plain generate of the same batch.

    python -m benchmarks.rl [--steps 12] [--sft-steps 60] [--checkpoint DIR --shards DIR] [--json PATH]

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
    from vtg.shards import write_synthetic_shards

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
        from training.loop import train

        train(cfg)
    return cfg


def plain_generate(trainer, steps: int) -> dict:
    """The baseline: the same prompts, collated once, sampled with `model.generate` directly."""
    import torch

    from training.rl.loop import step_queries
    from training.rl.rollout import encode_prompts, end_token_ids, pad_id, vision_token_ids
    from vtg.model.processing import collate, model_inputs

    r, model, tok = trainer.rcfg, trainer.engine.module, trainer.tokenizer
    batches = []
    for s in range(steps):
        ids = step_queries(len(trainer.state.pool), s, r.queries_per_step, r.seed)
        exs = [trainer.by_key[trainer.state.pool[i]] for i in ids]
        b = model_inputs(collate(encode_prompts(tok, exs, r.group_size, trainer.vision), pad_id(tok), "left"))
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
    ap.add_argument("--steps", type=int, default=12, help="RL steps measured (the first 2 warm up when > 4)")
    ap.add_argument("--sft-steps", type=int, default=60, help="steps of the SFT built without --checkpoint")
    ap.add_argument("--checkpoint", default=None, help="an SFT checkpoint to start from (default: build one)")
    ap.add_argument("--shards", default=None, help="shard root of the checkpoint's data (with --checkpoint)")
    ap.add_argument("--json", default=default_json("rl"), help="where to write the figures")
    args = ap.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run = Run.start()
    from training.rl.loop import GRPOTrainer

    with tempfile.TemporaryDirectory() as d:
        cfg = build(Path(d), args.checkpoint, args.steps, args.shards, args.sft_steps)
        trainer = GRPOTrainer(cfg, callbacks=[])
        try:
            rows = [trainer.train_step() for _ in range(args.steps)]
            base = plain_generate(trainer, args.steps)
        finally:
            trainer.release_lock()
    skip = 2 if len(rows) > 4 else 0  # the first steps warm allocators up
    warm = rows[skip:]
    roll = sum(r["rollout_s"] for r in warm)
    upd = sum(r["update_s"] for r in warm)
    rl_tokens = sum(r["gen_tokens"] for r in warm)
    gen_s, gen_tokens = sum(base["seconds"][skip:]), sum(base["tokens"][skip:])
    gen_tokens_ratio = gen_tokens / max(rl_tokens, 1)
    res = {
        "steps_measured": len(warm), "rl_rollout_tokens_per_s": rl_tokens / roll,
        "plain_generate_tokens_per_s": gen_tokens / gen_s,
        "rollout_s_per_step": statistics.mean(r["rollout_s"] for r in warm),
        "update_s_per_step": statistics.mean(r["update_s"] for r in warm),
        "plain_generate_s_per_step": gen_s / len(warm),
    }
    res["note"] = (f"plain generate sampled {gen_tokens_ratio:.2f}x the RL rollout's answer tokens (same prompts, "
                   "other random draws)")
    ratios = {"rollout_tokens_per_s_vs_plain": res["rl_rollout_tokens_per_s"] / res["plain_generate_tokens_per_s"],
              "rollout_share_of_step": roll / (roll + upd), "step_vs_plain_generate": (roll + upd) / gen_s}
    print(f"rollout tokens/s: RL {res['rl_rollout_tokens_per_s']:.0f} vs plain generate "
          f"{res['plain_generate_tokens_per_s']:.0f} -> {ratios['rollout_tokens_per_s_vs_plain']:.2f}x")
    print(f"one RL step: rollout {res['rollout_s_per_step']:.3f} s + update {res['update_s_per_step']:.3f} s "
          f"(rollout {ratios['rollout_share_of_step']:.0%} of the step) = {ratios['step_vs_plain_generate']:.2f}x a "
          f"plain generate of the same batch ({res['plain_generate_s_per_step']:.3f} s)")
    run.write(args.json, "rl", ratios=ratios, figures={
        "steps": args.steps, "checkpoint": args.checkpoint or f"built: {args.sft_steps} SFT steps, tiny model", **res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
