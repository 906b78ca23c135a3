"""Batched greedy generation and teacher-forced eval loss on evaluation examples.

Model inputs are built with training's own `encode_example`/`collate` (same prompt, same patchify, same
timing), so evaluation sees exactly what training trained on. `blank=True` replaces every frame with black
(the text-only blind baseline) while keeping the frame count and timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from evaluation.data import EvalExample
from vtg.model.processing import VisionParams, answer_text, collate, encode_example, model_inputs


@dataclass
class BatchOutput:
    answers: list[str]
    """Raw generated text per example."""
    loss_sum: float
    """Sum of answer-token cross-entropies (teacher forcing)."""
    loss_tokens: int


def _frames(ex: EvalExample, blank: bool) -> np.ndarray:
    return np.zeros_like(ex.frames) if blank else ex.frames


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _vision_params(model) -> VisionParams:
    config = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
    return VisionParams.from_model_config(config)


@torch.inference_mode()
def eval_loss(model, tokenizer, examples: list[EvalExample], device, blank: bool = False) -> tuple[float, int]:
    """(sum of answer-token losses, number of answer tokens) for one batch."""
    vp = _vision_params(model)
    encoded = [encode_example(tokenizer, _frames(ex, blank), ex.timestamps, ex.query, answer_text(ex.windows),
                              vision=vp, key=ex.key) for ex in examples]
    batch = model_inputs(collate(encoded, _pad_id(tokenizer), padding_side="right"), device, model.dtype)
    labels = batch.pop("labels")
    logits = model(**batch).logits.float()
    shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
    mask = shift_labels != -100
    loss = torch.nn.functional.cross_entropy(shift_logits[mask], shift_labels[mask], reduction="sum")
    return float(loss), int(mask.sum())


@torch.inference_mode()
def generate(model, tokenizer, examples: list[EvalExample], device, max_new_tokens: int,
             blank: bool = False) -> list[str]:
    """Greedy answers for one batch (left padding, so every prompt ends where generation starts)."""
    vp = _vision_params(model)
    encoded = [encode_example(tokenizer, _frames(ex, blank), ex.timestamps, ex.query, None, vision=vp,
                              key=ex.key) for ex in examples]
    batch = model_inputs(collate(encoded, _pad_id(tokenizer), padding_side="left"), device, model.dtype)
    batch.pop("labels", None)
    prompt_len = batch["input_ids"].shape[1]
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=_pad_id(tokenizer))
    return tokenizer.batch_decode(out[:, prompt_len:], skip_special_tokens=True)


def predict_batch(model, tokenizer, batch: list[EvalExample], device, max_new_tokens: int,
                  blank: bool = False) -> BatchOutput:
    """Greedy answers and the teacher-forced answer loss of one batch."""
    answers = generate(model, tokenizer, batch, device, max_new_tokens, blank=blank)
    loss_sum, n = eval_loss(model, tokenizer, batch, device, blank=blank)
    return BatchOutput(answers, loss_sum, n)
