"""The annotator's models: teaching a tiny base dense captioning and grounding (the embedded default's stand-in for
a large VLM), proposing captions (greedy and sampled), re-localising a proposed query, and the weights digest an
`auto:<digest>` source is named by.

Every model is loaded through the shared loader (`vtg.model.modeling.load_model_and_tokenizer`) and every prompt is
built by `vtg.model.processing.encode_example`, so the annotator reads frames and time exactly as training and
evaluation do, whatever the family.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from annotate.captions import CAPTION_PROMPT, caption_text
from vtg.errors import VTGError
from vtg.io import file_digest

log = logging.getLogger(__name__)

ANNOTATOR_VERSION = "1"
MARKER = "annotator_build.json"
QUERY_POSITION = "before"
"""Where a taught annotator's prompts put the text (the grounding recipe's default, `train.data.query_position`)."""


@dataclass
class Clip:
    """A whole video as the annotator sees it."""

    video_id: str
    frames: np.ndarray
    timestamps: list[float]
    duration_s: float


def weights_digest(path: str | Path) -> str:
    """12 hex digits over the checkpoint's weight files and config (names and contents): what an `auto:` source id
    names, so two annotators with other weights never share a source."""
    root = Path(model_dir(path))
    files = sorted(p for pattern in ("*.safetensors", "*.bin", "config.json", "adapter_config.json")
                   for p in root.glob(pattern))
    if not files:
        raise VTGError(f"{path}: no weights (*.safetensors, *.bin) to name the annotator by: give a local "
                       "checkpoint directory (a hub id must be downloaded first)")
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}:{file_digest(p)}\n".encode())
    return h.hexdigest()[:12]


def _teach_key(base: Path, data: list, settings: dict) -> str:
    base_marker = next((p.read_text() for p in sorted(base.glob("*_build.json"))), str(base.resolve()))
    blob = json.dumps([ANNOTATOR_VERSION, base_marker, data, settings], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def taught_annotator(base: str, clips: Sequence[Clip], events: dict[str, list[tuple[str, tuple[float, float]]]],
                     *, steps: int, lr: float, batch_size: int, seed: int) -> Path:
    """`base` taught dense captioning (one example per clip: all its events) and grounding (one per event) on the
    labelled clips, half of each batch each; built once into a cache keyed by the base, the teaching data and the
    settings (like the tiny models), so a rerun costs nothing."""
    from vtg.model.modeling import resolve_base
    from vtg.model.tiny import build_once, default_cache_dir

    base_dir = Path(resolve_base(base))
    data = [[c.video_id, c.timestamps, list(c.frames.shape), events[c.video_id]] for c in clips]
    data_digest = hashlib.sha256(json.dumps(data).encode()
                                 + b"".join(hashlib.sha256(c.frames.tobytes()).digest() for c in clips)).hexdigest()
    settings = {"steps": steps, "lr": lr, "batch_size": batch_size, "seed": seed}
    out = default_cache_dir().parent / "annotators" / f"{base_dir.name}-{_teach_key(base_dir, [data_digest], settings)}"
    marker = {"version": ANNOTATOR_VERSION, "base": base_dir.name, "data_sha256": data_digest, **settings}
    return build_once(out, MARKER, marker, lambda tmp: _teach_into(tmp, base_dir, clips, events, settings, marker))


def _teach_into(tmp: Path, base: Path, clips: Sequence[Clip], events: dict, s: dict, marker: dict) -> None:
    import torch

    from vtg.answer import format_answer
    from vtg.model.modeling import load_model_and_tokenizer
    from vtg.model.processing import QUERY_POSITION_KEY, VisionParams, encode_example
    from vtg.model.processor_facts import save_processor_config
    from vtg.model.teach import fit

    if not clips:
        raise VTGError("annotate: no labelled train video to teach the annotator on (annotate.hide_fraction 1.0, "
                       "or no train video of at most annotate.max_duration_s): keep some labels, or give "
                       "annotate.proposer and annotate.verifier checkpoints")
    t0 = time.perf_counter()
    torch.manual_seed(s["seed"])
    model, tokenizer = load_model_and_tokenizer(base, dtype=torch.float32, trainable=True)
    model.config.use_cache = False
    tokenizer.init_kwargs[QUERY_POSITION_KEY] = QUERY_POSITION
    vision = VisionParams.from_model(model)
    captions = [(c, caption_text(events[c.video_id])) for c in clips]
    grounding = [(c, q, format_answer(*w)) for c in clips for q, w in events[c.video_id]]
    rng = np.random.default_rng(s["seed"])
    half = max(1, s["batch_size"] // 2)

    def batch(step: int) -> list[dict]:
        out = []
        for i in rng.choice(len(captions), size=min(half, len(captions)), replace=False):
            c, text = captions[i]
            out.append(encode_example(tokenizer, c.frames, c.timestamps, CAPTION_PROMPT, text, vision=vision,
                                      key=c.video_id))
        for i in rng.choice(len(grounding), size=min(s["batch_size"] - half, len(grounding)), replace=False):
            c, q, answer = grounding[i]
            out.append(encode_example(tokenizer, c.frames, c.timestamps, q, answer, vision=vision, key=c.video_id))
        return out

    losses = fit(model, tokenizer, batch, steps=s["steps"], lr=s["lr"])
    model.config.use_cache = True
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    save_processor_config(model, tmp)
    report = {"clips": len(captions), "events": len(grounding), "first10_loss": float(np.mean(losses[:10])),
              "last10_loss": float(np.mean(losses[-10:])), "seconds": round(time.perf_counter() - t0, 1)}
    log.info("taught the annotator on %d clips (%d events) in %d steps: loss %.3f -> %.3f, %.0f s", len(captions),
             len(grounding), s["steps"], report["first10_loss"], report["last10_loss"], report["seconds"])
    (tmp / "annotator_report.json").write_text(json.dumps(report, indent=1) + "\n")
    (tmp / MARKER).write_text(json.dumps(marker) + "\n")


def model_dir(path: str | Path) -> str:
    """The weights to load for `annotate.proposer`/`verifier`: a training checkpoint (a step dir, a pointer such as
    `checkpoints/sft/latest` or `reports/eval/best.json`, or a root) -> its Hugging Face export; an export, a
    local model or a hub id as it is."""
    from vtg import checkpoints

    p = Path(path)
    if not p.exists():
        return str(path)
    ckpt = checkpoints.resolve_checkpoint(p)
    export = checkpoints.export_dir(ckpt)
    return str(export if export.is_dir() else ckpt)


def load(path: str | Path, device: str = "cpu"):
    """(model, tokenizer) for inference through the shared loader (fp32 on the CPU, bf16 on a GPU); an export keeps
    the query position and time encoding it was trained with (its tokenizer config says)."""
    from vtg.model.modeling import load_model_and_tokenizer

    return load_model_and_tokenizer(model_dir(path), device=device)


def _generate(model, tokenizer, clips: Sequence[Clip], prompts: Sequence[str], max_new_tokens: int,
              temperature: float | None) -> list[str]:
    """Answers to `prompts` on `clips` through the generation evaluation and RL use (`greedy_answers`)."""
    from vtg.model.generation import greedy_answers
    from vtg.queries import QueryExample

    examples = [QueryExample(key=c.video_id, query=p, windows=[], duration_s=c.duration_s, source="",
                             frames=c.frames, timestamps=c.timestamps) for c, p in zip(clips, prompts, strict=True)]
    return greedy_answers(model, tokenizer, examples, model.device, max_new_tokens, temperature=temperature)


def captionings(model, tokenizer, clips: Sequence[Clip], *, samples: int, temperature: float, max_new_tokens: int,
                seed: int) -> tuple[list[str], list[list[str]]]:
    """(greedy captioning per clip, `samples` sampled captionings per clip). Sampling is seeded per batch, so the
    same clips in the same batches give the same text."""
    import torch

    greedy = _generate(model, tokenizer, clips, [CAPTION_PROMPT] * len(clips), max_new_tokens, None)
    sampled: list[list[str]] = [[] for _ in clips]
    if samples:
        torch.manual_seed(seed)
        rows = [i for i in range(len(clips)) for _ in range(samples)]
        texts = _generate(model, tokenizer, [clips[i] for i in rows], [CAPTION_PROMPT] * len(rows), max_new_tokens,
                          temperature)
        for i, t in zip(rows, texts, strict=True):
            sampled[i].append(t)
    return greedy, sampled


def ground(model, tokenizer, clips: Sequence[Clip], queries: Sequence[str], max_new_tokens: int = 24) -> list[str]:
    """The verifier's greedy answer for each (clip, query): the grounding prompt training and evaluation use."""
    return _generate(model, tokenizer, clips, queries, max_new_tokens, None)
