"""Batched greedy generation and teacher-forced eval loss on evaluation examples (both `vtg.model.generation`,
which training's early stop shares). `blank=True` replaces every frame with black (the text-only blind baseline)
while keeping the frame count and timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass

from vtg.model.generation import answer_losses, greedy_answers
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


def predict_batch(model, tokenizer, batch: list[QueryExample], device, max_new_tokens: int,
                  blank: bool = False) -> BatchOutput:
    """Greedy answers and the teacher-forced answer loss of one batch."""
    answers = greedy_answers(model, tokenizer, batch, device, max_new_tokens, blank=blank)
    losses, tokens = answer_losses(model, tokenizer, batch, device, blank=blank)
    return BatchOutput(answers, float(sum(losses)), int(sum(tokens)), losses, tokens)
