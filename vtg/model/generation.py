"""Greedy answers for a batch of queries (what evaluation scores and RL's difficulty filter reads, so both read
the model the same way: prompts from `encode_example`, left padding) and the teacher-forced answer loss
(`answer_losses`: the evaluate stage's `eval_loss` and training's early stop).

`blank=True` replaces every frame with black (the text-only blind baseline) while keeping the frame count and
timestamps.
"""

from __future__ import annotations

import numpy as np
import torch

from vtg.model.processing import VisionParams, answer_text, collate, encode_example, model_inputs
from vtg.queries import QueryExample


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def vision_params(model) -> VisionParams:
    """The processor facts of the checkpoint `model` was loaded from (`VisionParams.from_model`)."""
    return VisionParams.from_model(model)


def frames_of(ex: QueryExample, blank: bool) -> np.ndarray:
    return np.zeros_like(ex.frames) if blank else ex.frames


def encode_queries(tokenizer, examples: list[QueryExample], vision: VisionParams, blank: bool = False) -> list[dict]:
    """The generation prompts evaluation scores (one per query)."""
    return [encode_example(tokenizer, frames_of(ex, blank), ex.timestamps, ex.query, None, vision=vision,
                           key=ex.key) for ex in examples]


@torch.inference_mode()
def greedy_answers(model, tokenizer, examples: list[QueryExample], device, max_new_tokens: int,
             blank: bool = False, temperature: float | None = None) -> list[str]:
    """Greedy answers for one batch (left padding, so every prompt ends where generation starts); with a
    `temperature`, sampled ones instead (pure temperature sampling: no top-k or top-p cut)."""
    encoded = encode_queries(tokenizer, examples, vision_params(model), blank)
    batch = model_inputs(collate(encoded, pad_id(tokenizer), padding_side="left"), device, model.dtype)
    batch.pop("labels", None)
    prompt_len = batch["input_ids"].shape[1]
    sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else
                {"do_sample": False})
    out = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=pad_id(tokenizer), **sampling)
    return tokenizer.batch_decode(out[:, prompt_len:], skip_special_tokens=True)


@torch.inference_mode()
def answer_losses(model, tokenizer, examples: list[QueryExample], device,
                  blank: bool = False) -> tuple[list[float], list[int]]:
    """Per example: (sum of its answer-token losses, its number of answer tokens), for one batch, teacher forced.
    Model inputs are built with training's own `encode_example`/`collate` (same prompt, patchify and timing):
    the evaluate stage's `eval_loss` and training's early stop (training/early_stop.py) both read it."""
    vp = vision_params(model)
    encoded = [encode_example(tokenizer, frames_of(ex, blank), ex.timestamps, ex.query, answer_text(ex.windows),
                              vision=vp, key=ex.key) for ex in examples]
    batch = model_inputs(collate(encoded, pad_id(tokenizer), padding_side="right"), device, model.dtype)
    labels = batch.pop("labels")
    logits = model(**batch).logits.float()
    shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
    mask = shift_labels != -100
    per_token = torch.zeros(mask.shape, dtype=shift_logits.dtype, device=shift_logits.device)
    per_token[mask] = torch.nn.functional.cross_entropy(shift_logits[mask], shift_labels[mask], reduction="none")
    return per_token.sum(dim=1).tolist(), mask.sum(dim=1).tolist()
