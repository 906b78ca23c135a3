"""Vision benchmark (issue 40): what `vtg.model.fast_vision` and the suite-frames cache buy, each against the code
path they replace, measured in the same run (targets in brackets):

1. a tiny SFT step (forward, backward, AdamW; 16 videos of 16 frames at 56 px, the embedded default's shape) with
   `fast_vision` (the vision attention span-grouped, the same numbers) vs transformers' own path (sdpa once per
   span)                                                                                              [>= 1.15x]
   and, as a figure, the patch embedding as a matrix product instead of oneDNN's Conv3d, alone and with it: not
   adopted (it changes the last bits, so the default's trajectory; see docs/results.md)
2. reading a general-task suite's clips: `suite_frames` from its cache vs one `load_frames` per clip   [>= 10x]
   (and the first, uncached read: two passes per video instead of two per clip)

    python -m benchmarks.vision [--videos 60] [--steps 10] [--repeats 5] [--json PATH]

Step times alternate between the variants round by round (`--repeats` rounds of `--steps` steps each after two
warm-up steps, each round starting at another variant), so a neighbour's load falls on all of them alike; each
figure is the median round. The suite is the
corpus's own (`build_corpus` at `--videos` clean videos, its `teach_all.jsonl`), read with the cache in a temporary
folder (`VTG_TINY_CACHE`).
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

VARIANTS = ("transformers", "fast_vision", "patch_embed", "both")
"""transformers' path; `fast_vision` (the attention); the patch embedding as a product alone; both."""


def _patch_conv3d():
    """An `nn.Conv3d` (kernel = stride) computing an input of one kernel per item as `F.linear`: the candidate."""
    import torch
    import torch.nn.functional as F

    class PatchConv3d(torch.nn.Conv3d):
        def forward(self, x):
            if tuple(x.shape[2:]) == tuple(self.kernel_size):
                out = F.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.out_channels, -1), self.bias)
                return out.view(x.shape[0], self.out_channels, 1, 1, 1)
            return super().forward(x)

    return PatchConv3d


def step_times(steps: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per step of each variant, one figure per round (rounds alternate the variants)."""
    import numpy as np
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from vtg.model.fast_vision import use_varlen_vision
    from vtg.model.processing import VisionParams, collate, encode_example, model_inputs
    from vtg.model.tiny import build_tiny_model

    torch.manual_seed(0)
    path = build_tiny_model(seed=0)
    model = AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(path)
    vision, rng = VisionParams.from_model(model), np.random.default_rng(0)
    batch = [encode_example(tok, rng.integers(0, 256, (16, 56, 56, 3), dtype=np.uint8), [i * 0.75 for i in range(16)],
                            "the red square moves to the left", "3.2 - 7.5 seconds", vision=vision, key=str(k))
             for k in range(16)]
    inputs = model_inputs(collate(batch, tok.pad_token_id))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    proj, patch_conv3d = model.model.visual.patch_embed.proj, _patch_conv3d()

    def use(variant: str) -> None:
        if variant in ("fast_vision", "both"):
            use_varlen_vision(model)
        else:
            model.set_attn_implementation({"vision_config": "sdpa"})
        proj.__class__ = patch_conv3d if variant in ("patch_embed", "both") else torch.nn.Conv3d

    def step() -> None:
        model(**inputs).loss.backward()
        optim.step()
        optim.zero_grad()

    out: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(repeats):
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:  # each round starts elsewhere
            use(variant)
            for _ in range(2):
                step()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            out[variant].append((time.perf_counter() - t0) / steps)
    return out


def suite_times(videos: int, root: Path) -> dict[str, float]:
    """Seconds to read the corpus's teaching suite: one `load_frames` per clip, `suite_frames` uncached, cached."""
    os.environ["VTG_TINY_CACHE"] = str(root / "cache" / "tiny_models")
    from corpus import build_corpus
    from vtg.config import load_config
    from vtg.general_tasks import load_frames, read_suite, suite_frames

    cfg = load_config(REPO / "params.yaml").corpus
    build_corpus(cfg.model_copy(update={"out_dir": str(root / "corpus"), "n_videos": videos, "workers": 2}))
    items = read_suite(root / "corpus" / "general" / "teach_all.jsonl")
    t0 = time.perf_counter()
    clips: dict[tuple, object] = {}
    for item in items:
        where = (item.video or item.image, item.start_s, item.end_s)
        if where not in clips:
            clips[where] = load_frames(item, 8, 56)
    per_clip = time.perf_counter() - t0
    t0 = time.perf_counter()
    suite_frames(items, 8, 56)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    suite_frames(items, 8, 56)
    return {"items": len(items), "clips": len(clips), "per_clip_s": per_clip, "first_s": first,
            "cached_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=60, help="clean videos of the corpus whose suite is read")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (each runs every variant)")
    parser.add_argument("--json", default=default_json("vision"), help="where to write the figures")
    args = parser.parse_args(argv)
    run = Run.start()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    steps = step_times(args.steps, args.repeats)
    med = {v: statistics.median(ts) for v, ts in steps.items()}
    with tempfile.TemporaryDirectory() as tmp:
        suite = suite_times(args.videos, Path(tmp))
    ratios = {f"step_speedup_{v}_vs_transformers": med["transformers"] / med[v] for v in VARIANTS[1:]}
    ratios["suite_read_speedup_cached_vs_per_clip"] = suite["per_clip_s"] / suite["cached_s"]
    ratios["suite_read_speedup_first_vs_per_clip"] = suite["per_clip_s"] / suite["first_s"]
    print(f"tiny SFT step (16 videos x 16 frames, 56 px), median of {args.repeats} rounds of {args.steps} steps:")
    for v in VARIANTS:
        vs = "" if v == "transformers" else f" -> {med['transformers'] / med[v]:.2f}x"
        print(f"  {v:>12}: {med[v] * 1000:6.1f} ms{vs}" + (" [target >= 1.15x]" if v == "fast_vision" else ""))
    print(f"suite of {suite['items']} items ({suite['clips']} clips, {args.videos} clean videos): one load per clip "
          f"{suite['per_clip_s']:.2f} s, suite_frames first {suite['first_s']:.2f} s "
          f"({ratios['suite_read_speedup_first_vs_per_clip']:.2f}x), cached {suite['cached_s']:.3f} s "
          f"({ratios['suite_read_speedup_cached_vs_per_clip']:.0f}x) [target >= 10x]")
    run.write(args.json, "vision", ratios=ratios,
              figures={"steps": args.steps, "repeats": args.repeats, "step_s": steps, "median_step_s": med,
                       "suite": suite})
    return 0


if __name__ == "__main__":
    sys.exit(main())
