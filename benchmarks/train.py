"""Training benchmarks, each against a baseline measured in the same run (targets in brackets):

1. step time of our loop (`training.sft`, DeepSpeed ZeRO-2, shards streamed through the DataLoader, guards,
   metrics) vs a plain PyTorch loop (same tiny model, same batches already in memory, torch AdamW)  [<= 1.3x]
2. loader throughput: encoded examples/s from shards (frames already extracted) vs decoding the source videos
   at train time (open the mp4, decode up to the window, sample the same frames, resize)            [>= 10x]

    python -m benchmarks.train [--steps 60] [--videos 24] [--examples 200] [--json PATH]

The data are built here (synthetic mp4s at the corpus's defaults and shards cut from them), so both sides of
each comparison see identical content. Ratios are what matter; absolute times depend on the machine's load. The
JSON's ratios: `step_time_vs_plain` (1), `loader_corpus_vs_decode` and `loader_camera_vs_decode` (2, for sources at
the corpus's size and at 360p).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import numpy as np

from benchmarks.figures import REPO, Run, default_json
from vtg.shards import SHARD_PATTERN, QueryMeta, SampleMeta, encode_jpeg, write_shard

FRAMES, SIZE = 16, 56
SOURCES = {"corpus": (112, 112, 8.0), "camera": (640, 360, 30.0)}
"""Source video settings: the synthetic corpus's defaults, and a typical real dataset video (360p, 30 fps)."""


def make_videos(root: Path, n: int, width: int, height: int, fps: float, seed: int = 0) -> list[dict]:
    """n mp4 videos (10-30 s) with one coloured square visible over a span each, on a moving texture."""
    import cv2

    rng = np.random.default_rng(seed)
    out = []
    (root / "videos").mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:height, 0:width]
    for i in range(n):
        n_frames = int(rng.uniform(10, 30) * fps)
        a, b = sorted(rng.choice(n_frames, 2, replace=False))
        side = min(width, height) // 5
        y, x = rng.integers(0, height - side), rng.integers(0, width - side)
        path = root / "videos" / f"v{width}_{i:03d}.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
        for f in range(n_frames):
            frame = np.repeat((((xx + 2 * f) // 8 + yy // 8) % 2 * 60 + 90).astype(np.uint8)[..., None], 3, 2)
            if a <= f <= b:
                frame[y:y + side, x:x + side] = (30, 30, 220)
            writer.write(frame)
        writer.release()
        out.append({"video_id": f"v{width}_{i:03d}", "path": str(path), "n_frames": n_frames, "fps": fps,
                    "span": (a / fps, (b + 1) / fps)})
    return out


def sample_indices(n_frames: int) -> list[int]:
    return [min(n_frames - 1, int((k + 0.5) * n_frames / FRAMES)) for k in range(FRAMES)]


def decode_window(path: str, n_frames: int) -> np.ndarray:
    """What a loader without preprocessing does: decode the video up to the last sampled frame, keep 16, resize."""
    import cv2

    wanted = set(sample_indices(n_frames))
    cap = cv2.VideoCapture(path)
    frames, idx = [], 0
    while len(frames) < FRAMES and cap.grab():  # grab() decodes; only sampled frames are converted
        if idx in wanted:
            _, frame = cap.retrieve()
            frames.append(cv2.resize(frame, (SIZE, SIZE), interpolation=cv2.INTER_AREA)[:, :, ::-1])
        idx += 1
    cap.release()
    while len(frames) < FRAMES:
        frames.append(frames[-1])
    return np.stack(frames)


def write_shards(root: Path, videos: list[dict], name: str) -> Path:
    samples = []
    for v in videos:
        frames = decode_window(v["path"], v["n_frames"])
        fps = v["fps"]
        ts = [i / fps for i in sample_indices(v["n_frames"])]
        meta = SampleMeta(key=f"{v['video_id']}.0", video_id=v["video_id"], window_index=0, window_start_s=0.0,
                          window_end_s=v["n_frames"] / fps, frame_timestamps=ts, fps=FRAMES * fps / v["n_frames"],
                          num_frames=FRAMES, queries=[QueryMeta(text="the blue square appears", windows=[v["span"]],
                                                                annotation_id=v["video_id"])], split="train")
        samples.append((meta, [encode_jpeg(f) for f in frames]))
    shards = root / f"shards_{name}"
    write_shard(shards / "train" / (SHARD_PATTERN % 0), samples)
    return shards


def bench_loader(shards: Path, videos: list[dict], tok, n: int, n_decode: int) -> dict:
    from training.data import StreamSpec, make_loader, resolve_urls
    from vtg.model.processing import VisionParams, answer_text, encode_example

    urls = resolve_urls(str(shards), "train")
    spec = StreamSpec(urls=tuple(urls), seed=0, resampled=True, shuffle_buffer=16, micro_batch_size=1)
    out = {}
    for workers in (0, 1):
        loader = make_loader(spec, tok, VisionParams(), workers, 4)
        it = iter(loader)
        next(it)  # start-up (worker spawn) is not throughput
        t0 = time.perf_counter()
        got = sum(len(b["keys"]) for b in islice(it, n))
        out[f"shards_workers{workers}"] = got / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for k in range(n_decode):
        v = videos[k % len(videos)]
        frames = decode_window(v["path"], v["n_frames"])
        encode_example(tok, frames, [i / v["fps"] for i in sample_indices(v["n_frames"])],
                       "the blue square appears", answer_text([v["span"]]))
    out["decode_videos"] = n_decode / (time.perf_counter() - t0)
    out["ratio"] = max(out["shards_workers0"], out["shards_workers1"]) / out["decode_videos"]
    return out


class StepTimes:
    def __init__(self):
        self.times: list[float] = []

    def on_train_start(self, info): ...
    def on_step(self, step, m): self.times.append(m["perf/step_time_s"])
    def on_skip(self, step, info): ...
    def on_checkpoint(self, path, step): ...
    def on_train_end(self, summary): ...
    def checkpoint_meta(self): return {}


def bench_steps(shards: Path, out_dir: Path, steps: int, tok) -> dict:
    import torch

    from training.data import StreamSpec, make_loader, resolve_urls
    from training.sft import train
    from vtg.config import load_config
    from vtg.model.modeling import load_model_and_tokenizer
    from vtg.model.processing import VisionParams, model_inputs

    warm = 5
    cfg = load_config(REPO / "params.yaml", None, [
        f"train.shards_dir={shards}", f"train.out_dir={out_dir}", f"train.max_steps={steps + warm}",
        f"train.save_every={10**6}", "train.log_every=1", "train.progress=false", "tracking.enabled=false",
        "train.resume=never"])
    rec = StepTimes()
    train(cfg, callbacks=[rec])
    ours = statistics.median(rec.times[warm:])

    # Plain PyTorch: same model, same first batches (already decoded, in memory), torch AdamW, same clipping.
    model, _ = load_model_and_tokenizer("tiny", trainable=True)
    spec = StreamSpec(urls=tuple(resolve_urls(str(shards), "train")), seed=cfg.train.seed,
                      micro_batch_size=cfg.train.micro_batch_size)
    batches = [model_inputs(b) for b in islice(make_loader(spec, tok, VisionParams(), 0, 2), 8)]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, betas=tuple(cfg.train.betas))
    times = []
    for i in range(steps + warm):
        t0 = time.perf_counter()
        loss = model(**batches[i % len(batches)]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    plain = statistics.median(times[warm:])
    return {"ours_step_s": ours, "plain_step_s": plain, "ratio": ours / plain,
            "ours_steps_per_s": 1 / ours, "plain_steps_per_s": 1 / plain}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="timed optimizer steps per loop")
    parser.add_argument("--videos", type=int, default=24, help="synthetic source videos")
    parser.add_argument("--examples", type=int, default=200, help="examples timed through each loader")
    parser.add_argument("--json", default=default_json("train"), help="where to write the figures")
    args = parser.parse_args(argv)
    run = Run.start()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging

    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoTokenizer

    from vtg.model.tiny import build_tiny_model

    tok = AutoTokenizer.from_pretrained(build_tiny_model(seed=0))
    result: dict = {"loader": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, (width, height, fps) in SOURCES.items():
            n_videos = args.videos if name == "corpus" else max(2, args.videos // 6)
            videos = make_videos(root, n_videos, width, height, fps)
            shards = write_shards(root, videos, name)
            n_decode = args.examples // 4 if name == "corpus" else max(4, args.examples // 40)
            result["loader"][name] = bench_loader(shards, videos, tok, args.examples, n_decode)
            if name == "corpus":
                steps = result["steps"] = bench_steps(shards, root / "ck", args.steps, tok)
    print(f"step time: ours (DeepSpeed ZeRO-2 loop, streamed shards) {steps['ours_step_s'] * 1000:.1f} ms vs "
          f"plain PyTorch AdamW {steps['plain_step_s'] * 1000:.1f} ms -> {steps['ratio']:.2f}x "
          f"[target <= 1.3x] ({steps['ours_steps_per_s']:.2f} steps/s, batch 16 x {FRAMES} frames {SIZE}px)")
    for name, (width, height, fps) in SOURCES.items():
        r = result["loader"][name]
        print(f"loader ({name} sources {width}x{height} @ {fps:g} fps, 10-30 s): shards {r['shards_workers0']:.0f} "
              f"ex/s in process, {r['shards_workers1']:.0f} ex/s with 1 worker vs decoding the source videos "
              f"{r['decode_videos']:.1f} ex/s -> {r['ratio']:.1f}x [target >= 10x]")
    loader = result["loader"]
    run.write(args.json, "train", ratios={"step_time_vs_plain": steps["ratio"],
                                          **{f"loader_{k}_vs_decode": v["ratio"] for k, v in loader.items()}},
              figures={"steps": args.steps, "videos": args.videos, "examples": args.examples, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
