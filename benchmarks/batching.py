"""Batching benchmark: variable-length micro-batches, padded vs length-grouped vs packed, through the real training
loop (`training.sft.train`, DeepSpeed ZeRO-2 on the CPU, shards streamed through the DataLoader), each against the
fixed-size padded batches measured in the same run (targets in brackets):

1. padding share of the token slots the model computes (the loop's `perf/padding_frac`)                  [<= 5%]
2. tokens/s (non-pad tokens, the loop's `perf/tokens_per_s`) vs fixed-size padded batches                [>= 1.3x]

    python -m benchmarks.batching [--windows 192] [--steps 30] [--repeats 3] [--json PATH]

The corpus is built here: windows whose lengths vary as real clips do under the families' fps policy (a 10 s clip
beside a 3 min one: 8 to 144 frames, 56 px, so 45 to 330 tokens on the tiny model). Runs: `fixed` (micro-batches
of 16 examples in stream order, each padded to its longest: the baseline), `grouped` (`train.data.token_budget` of
16 average examples, up to 64 of them, `length_groups: 8`), `packed` (`train.data.packing`, same budget and pool;
sdpa: rows of the pool's longest example), `packed_wide` (rows of 1.5x the longest: fuller rows, more masked
attention). The vision tower is frozen, as in every GPU recipe (`--train-vision` trains it: its cost, the same in
every run since it has no padding, then weighs more). They run interleaved, `--repeats` times; each figure is the median over repeats of (real tokens / time)
over the timed steps. The JSON's ratios: `tokens_per_s_grouped_vs_fixed`, `tokens_per_s_packed_vs_fixed`,
`tokens_per_s_packed_wide_vs_fixed`; figures: each run's padding share, tokens/s and step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.figures import REPO, Run, default_json

MICRO = 16
FRAMES = (8, 144)
"""Frames per window (even; uniform): a 2 fps policy over 4 s to 72 s, or 10 s to 3 min at the corpus's rates."""


def write_corpus(root: Path, n: int, seed: int = 0) -> tuple[Path, list[int]]:
    """Train shards of `n` windows of varied length (val/test: a few, for the loop's checks); the frame counts."""
    from vtg import shards
    from vtg.testing.shards import synthetic_window

    rng = np.random.default_rng(seed)
    frames = []
    for split, count in (("train", n), ("val", 4), ("test", 4)):
        samples = []
        for i in range(count):
            f = int(rng.integers(FRAMES[0] // 2, FRAMES[1] // 2 + 1)) * 2
            frames.append(f)
            samples.append(synthetic_window(rng, f"{split}vid{i:04d}-0000", split, num_frames=f,
                                            duration=f / 2.0, source="bench"))
        per = 64
        for s in range(-(-count // per)):
            shards.write_shard(root / split / (shards.SHARD_PATTERN % s), samples[s * per:(s + 1) * per])
    return root, frames[:n]


class Steps:
    """Keeps each logged step's metrics (the loop's callback interface, duck-typed)."""

    def __init__(self):
        self.metrics: list[dict] = []

    def on_train_start(self, info): ...
    def on_step(self, step, m): self.metrics.append(m)
    def on_skip(self, step, info): ...
    def on_checkpoint(self, path, step): ...
    def on_train_end(self, summary): ...
    def checkpoint_meta(self): return {}


RUNS = {
    "fixed": [],
    "grouped": ["train.data.length_groups=8"],
    "packed": ["train.data.packing=true", "train.data.length_groups=8"],
    "packed_wide": ["train.data.packing=true", "train.data.length_groups=8"],  # + pack_length: 1.5 x the longest
}


def run_once(name: str, shards: Path, out: Path, steps: int, warm: int, budget: int, wide: int,
             train_vision: bool = False) -> dict:
    from training.sft import train
    from vtg.config import load_config

    extra = RUNS[name] + ([f"train.data.token_budget={budget}", f"train.micro_batch_size={4 * MICRO}"]
                          if name != "fixed" else [f"train.micro_batch_size={MICRO}"])
    extra += [f"train.data.pack_length={wide}"] if name == "packed_wide" else []
    cfg = load_config(REPO / "params.yaml", None, [
        f"train.shards_dir={shards}", f"train.out_dir={out}", f"train.max_steps={steps + warm}",
        "train.grad_accum=1", f"train.save_every={10**6}", "train.log_every=1",
        "train.progress=false", "tracking.enabled=false", "train.resume=never", "train.teach.steps=0",
        "train.data.sanity_examples=4", "train.guards.min_steps=100000", "evaluate.forgetting.suite=",
        "train.data.max_seq_len=4096", f"train.model.freeze_vision={str(not train_vision).lower()}", *extra])
    rec = Steps()
    train(cfg, callbacks=[rec])
    timed = rec.metrics[warm:]
    seconds = [m["perf/step_time_s"] for m in timed]
    tokens = sum(m["perf/tokens_per_s"] * s for m, s in zip(timed, seconds, strict=True))
    pad = [m["perf/padding_frac"] for m in timed]
    return {"tokens_per_s": tokens / sum(seconds), "step_time_s": statistics.median(seconds),
            "padding_frac": statistics.mean(pad), "tokens_per_step": tokens / len(timed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=192, help="train windows of varied length")
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps per run")
    parser.add_argument("--warm", type=int, default=3, help="untimed steps first (start-up, the first batches)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the four runs")
    parser.add_argument("--train-vision", action="store_true",
                        help="train the vision tower too (default: frozen, as every GPU recipe has it)")
    parser.add_argument("--json", default=default_json("batching"), help="where to write the figures")
    args = parser.parse_args(argv)
    run = Run.start()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging

    logging.basicConfig(level=logging.WARNING)
    from training.batching import padding_fraction
    from training.data import ErrorLog, ShardStream, StreamSpec, resolve_urls
    from vtg.model.processing import VisionParams
    from vtg.model.tiny import build_tiny_model

    results: dict[str, list[dict]] = {name: [] for name in RUNS}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shards, _ = write_corpus(root / "shards", args.windows)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(build_tiny_model(seed=0))
        urls = tuple(resolve_urls(str(shards), "train"))
        spec = StreamSpec(urls=urls, seed=0, resampled=False, micro_batch_size=1, shuffle_buffer=1)
        lengths = [b[0]["n_tokens"] for b in ShardStream(spec, tok, VisionParams()).raw_batches(ErrorLog())]
        budget = MICRO * round(statistics.mean(lengths))
        wide = round(1.5 * max(lengths))
        stream = {}
        for name, extra in (("fixed", {}), ("grouped", {"length_groups": 8, "token_budget": budget}),
                            ("packed", {"packing": True, "length_groups": 8, "token_budget": budget}),
                            ("packed_wide", {"packing": True, "length_groups": 8, "token_budget": budget,
                                             "pack_length": wide})):
            s = StreamSpec(urls=urls, seed=0, resampled=False, micro_batch_size=MICRO * (4 if extra else 1), **extra)
            stream[name] = padding_fraction(ShardStream(s, tok, VisionParams()).raw_batches(ErrorLog()))[0]
        for k in range(args.repeats):
            for name in RUNS:
                results[name].append(run_once(name, shards, root / f"ck-{name}-{k}", args.steps, args.warm,
                                              budget, wide, args.train_vision))
    med = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in results.items()}
    base = med["fixed"]["tokens_per_s"]
    ratios = {f"tokens_per_s_{name}_vs_fixed": med[name]["tokens_per_s"] / base for name in RUNS if name != "fixed"}
    print(f"corpus: {args.windows} windows of {FRAMES[0]}-{FRAMES[1]} frames, {min(lengths)}-{max(lengths)} tokens "
          f"(mean {statistics.mean(lengths):.0f}); token budget {budget:,} (16 average examples); vision tower "
          + ("trained" if args.train_vision else "frozen"))
    for name in RUNS:
        m = med[name]
        vs = "" if name == "fixed" else f" -> {m['tokens_per_s'] / base:.2f}x fixed [target >= 1.3x]"
        print(f"{name:>8}: padding {100 * m['padding_frac']:5.1f}% [target <= 5%] (whole stream "
              f"{100 * stream[name]:.1f}%), {m['tokens_per_s']:,.0f} tokens/s, step {m['step_time_s'] * 1000:.0f} ms, "
              f"{m['tokens_per_step']:,.0f} tokens/step{vs}")
    run.write(args.json, "batching", ratios=ratios,
              figures={"windows": args.windows, "steps": args.steps, "repeats": args.repeats, "token_budget": budget,
                       "train_vision": args.train_vision, "pack_length_wide": wide,
                       "lengths": {"min": min(lengths), "max": max(lengths), "mean": statistics.mean(lengths)},
                       "stream_padding_frac": stream, "median": med, "runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
