"""A taught tiny base: the random-init tiny model first taught a general task (`vtg.general_tasks` suite), so that
the embedded default has something to forget (seed 000: forgetting).

A real checkpoint arrives knowing general tasks; the tiny model knows nothing, so without this step a forgetting
measurement on the embedded default would read 0 / 0. `taught_base(base, suite, ...)` trains the base on the
suite's items (every parameter, AdamW, teacher-forced answer tokens, the same prompt and frame handling as
grounding: `vtg.model.processing.encode_example`) and returns the export directory. Like the tiny models it is
built once into a cache keyed by everything that decides its weights (the base's build, the suite's bytes, the
settings), atomically, so the train stage and the evaluator (which scores the base for retention) find the same
directory, and a second call costs nothing. Deterministic for a given seed on one machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np

from vtg.io import file_digest

log = logging.getLogger(__name__)

TEACH_VERSION = "3"  # 2: several tasks in balanced batches (`draw`); 3: the encoding recorded (query position, time)
MARKER = "teach_build.json"


def _key(base: Path, suite: Path, settings: dict) -> str:
    base_marker = next((p.read_text() for p in sorted(base.glob("*_build.json"))), str(base.resolve()))
    blob = json.dumps([TEACH_VERSION, base_marker, file_digest(suite), settings], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def taught_dir(base: str | Path, suite: str | Path, settings: dict) -> Path:
    """Where the taught base of (base, suite, settings) lives (beside the tiny models' cache)."""
    from vtg.model.tiny import default_cache_dir

    base = Path(base)
    return default_cache_dir().parent / "taught_bases" / f"{base.name}-taught-{_key(base, Path(suite), settings)}"


def taught_base(base: str | Path, suite: str | Path, *, steps: int, lr: float, batch_size: int, num_frames: int,
                frame_size: int, seed: int = 0, query_position: str = "after", timestamps: str = "native") -> Path:
    """The export of `base` taught the items of `suite` for `steps` AdamW steps (built once, then cached), its
    questions encoded with `query_position` and `timestamps`, which the export records: the base is then asked
    (retention) the way it was taught, and the way every checkpoint trained from it with the same settings is."""
    from vtg.model.tiny import build_once

    settings = {"steps": steps, "lr": lr, "batch_size": batch_size, "num_frames": num_frames,
                "frame_size": frame_size, "seed": seed, "query_position": query_position, "timestamps": timestamps}
    out = taught_dir(base, suite, settings)
    marker = {"version": TEACH_VERSION, "base": Path(base).name, "suite_sha256": file_digest(suite), **settings}
    return build_once(out, MARKER, marker, lambda tmp: _teach_into(tmp, Path(base), Path(suite), settings, marker))


def teach_if_tiny(cfg, name: str, base: str) -> str:
    """`base` (the resolved path of the base named `name`) taught `train.teach.suite` when `name` is a tiny base
    (built once and cached: every rank, and the annotate stage's annotator, find the same directory); any other
    base, or no suite, unchanged."""
    from vtg.config.train import taught_suite
    from vtg.model.tiny import tiny_family

    t, frames = cfg.train.teach, cfg.evaluate.forgetting
    if taught_suite(t, name) is None:
        if tiny_family(name) and t.suite and t.steps:
            log.warning("train.teach.suite %s does not exist: the tiny base is not taught a general task, so "
                        "forgetting has nothing to measure (build the corpus first, or set train.teach.suite=)",
                        t.suite)
        return base
    return str(taught_base(base, t.suite, steps=t.steps, lr=t.lr, batch_size=t.batch_size,
                           num_frames=frames.num_frames, frame_size=frames.frame_size, seed=t.seed,
                           query_position=cfg.train.data.query_position, timestamps=cfg.train.data.timestamps))


def fit(model, tokenizer, batch, *, steps: int, lr: float) -> list[float]:
    """Teach `model` (every parameter) for `steps` AdamW steps on `batch(step)` (encoded examples, labels on the
    answer tokens), lr warmed up linearly over the first tenth, gradients clipped at 1. Returns the losses. The one
    teaching loop: a taught tiny base (here) and the annotate stage's taught annotator (`annotate.model`)."""
    import torch

    from vtg.model.processing import collate, model_inputs

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def prepare(step: int) -> dict:
        return model_inputs(collate(batch(step), pad))  # with the labels: the answer tokens only

    class Steps(torch.utils.data.IterableDataset):
        def __iter__(self):
            return (prepare(step) for step in range(steps))

    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98))
    # the batches are encoded by a forked worker process ahead of the steps (a fifth of a tiny step's time; drawn in
    # the same order from the same generator state, so the same numbers): on two cores the other core does it
    ahead = torch.utils.data.DataLoader(Steps(), batch_size=None, num_workers=1 if steps > 1 else 0,
                                        prefetch_factor=4 if steps > 1 else None, multiprocessing_context="fork")
    return [_fit_step(model, optim, inputs, step, steps, lr) for step, inputs in enumerate(ahead)]


def _fit_step(model, optim, inputs: dict, step: int, steps: int, lr: float) -> float:
    """One AdamW step of `fit`; returns its loss."""
    import torch

    for group in optim.param_groups:
        group["lr"] = lr * min(1.0, (step + 1) / max(1, steps // 10))  # linear warmup over a tenth
    loss = model(**inputs).loss
    optim.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    return loss.item()


def _teach_into(tmp: Path, base: Path, suite: Path, s: dict, marker: dict) -> None:
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from vtg.general_tasks import answer_text, prompt_text, read_suite, suite_frames
    from vtg.model.fast_vision import fast_vision
    from vtg.model.processing import QUERY_POSITION_KEY, TIMESTAMPS_KEY, VisionParams, encode_example
    from vtg.model.processor_facts import save_processor_config

    t0 = time.perf_counter()
    items = read_suite(suite)
    clips = suite_frames(items, s["num_frames"], s["frame_size"])  # aligned with items
    torch.manual_seed(s["seed"])
    model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
    fast_vision(model)  # the same numbers, fewer calls
    tokenizer = AutoTokenizer.from_pretrained(base)
    # taught (and recorded, so asked) as SFT will encode: a prompt order the base never saw reads as forgetting
    tokenizer.init_kwargs[QUERY_POSITION_KEY] = s["query_position"]
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = s["timestamps"]
    vision = VisionParams.from_model(model)
    rng = np.random.default_rng(s["seed"])
    by_task: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        by_task.setdefault(item.task, []).append(i)

    def draw() -> list[int]:
        """A batch's items: with one task, `batch_size` of them at random; with several, an equal share of the
        batch from each task (the first tasks take the remainder), so a task with fewer items is not taught less."""
        if len(by_task) == 1:
            return list(rng.choice(len(items), size=min(s["batch_size"], len(items)), replace=False))
        out, share = [], divmod(s["batch_size"], len(by_task))
        for k, ids in enumerate(by_task.values()):
            n = min(share[0] + (k < share[1]), len(ids))
            out += [ids[j] for j in rng.choice(len(ids), size=n, replace=False)]
        return out

    def batch(step: int) -> list[dict]:
        out = []
        for i in draw():
            item, (frames, times) = items[i], clips[i]
            out.append(encode_example(tokenizer, frames, times, prompt_text(item), answer_text(item), vision=vision,
                                      key=item.id))
        return out

    losses = fit(model, tokenizer, batch, steps=s["steps"], lr=s["lr"])
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    save_processor_config(model, tmp)
    log.info("taught the base %s on %d general-task items in %d steps (loss %.3f -> %.3f, %.0f s)", base.name,
             len(items), s["steps"], np.mean(losses[:10]), np.mean(losses[-10:]), time.perf_counter() - t0)
    (tmp / "teach_report.json").write_text(json.dumps(
        {"items": len(items), "clips": len(clips), "first10_loss": float(np.mean(losses[:10])),
         "last10_loss": float(np.mean(losses[-10:])), "seconds": time.perf_counter() - t0}, indent=1) + "\n")
    (tmp / MARKER).write_text(json.dumps(marker) + "\n")
