"""Batched greedy generation (`vtg.model.generation`) and teacher-forced eval loss on evaluation examples.

Model inputs are built with training's own `encode_example`/`collate` (same prompt, same patchify, same
timing), so evaluation sees exactly what training trained on. `blank=True` replaces every frame with black
(the text-only blind baseline) while keeping the frame count and timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vtg.model.generation import frames_of, greedy_answers, pad_id, vision_params
from vtg.model.processing import answer_text, collate, encode_example, model_inputs
from vtg.queries import QueryExample


@dataclass
class BatchOutput:
    answers: list[str]
    """Raw generated text per example."""
    loss_sum: float
    """Sum of answer-token cross-entropies (teacher forcing)."""
    loss_tokens: int
    losses: list[float]
    """Per example: the sum of its answer-token cross-entropies (their sum is `loss_sum`)."""
    tokens: list[int]
    """Per example: its answer tokens."""


@torch.inference_mode()
def eval_loss(model, tokenizer, examples: list[QueryExample], device,
              blank: bool = False) -> tuple[list[float], list[int]]:
    """Per example: (sum of its answer-token losses, its number of answer tokens), for one batch."""
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


def predict_batch(model, tokenizer, batch: list[QueryExample], device, max_new_tokens: int,
                  blank: bool = False) -> BatchOutput:
    """Greedy answers and the teacher-forced answer loss of one batch."""
    answers = greedy_answers(model, tokenizer, batch, device, max_new_tokens, blank=blank)
    losses, tokens = eval_loss(model, tokenizer, batch, device, blank=blank)
    return BatchOutput(answers, float(sum(losses)), int(sum(tokens)), losses, tokens)
