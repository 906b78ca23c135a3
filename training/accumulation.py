"""Gradient accumulation that equals the big batch: the loss of an optimizer step is the mean over every label token
the step trains on, across its micro-batches and ranks.

The model's loss (transformers' causal-LM loss) is the mean over one micro-batch's label tokens. Averaging N such
means, as an engine does when it divides each micro-batch's loss by grad_accum, weighs a label token of a micro-batch
with few of them more than one of a micro-batch with many, so N accumulated micro-batches do not give the update of
one batch N times larger, whose loss is the mean over all its label tokens. (The bug class transformers' Trainer fixed
in October 2024, PR #34191, by normalising by `num_items_in_batch`, the label tokens of the whole accumulation window.)
Here answers differ in length ("4.5 - 12.0 seconds", "0.0 - 3.5 seconds") and packing varies the examples per
micro-batch, so the counts differ.

The choice, per token over the window and over the ranks: before the window, the loop counts its label tokens
(`window_tokens`: all ranks, divided by the world size, since the engines average the ranks' gradients); each
micro-batch then backpropagates `window_share` (its mean loss x its label tokens / that count) and the engine adds
the micro-batches instead of averaging them (`backward(loss, window_share=True)`). The step's gradient is then the
gradient of the mean over all its label tokens, as in one batch that holds them all
(tests/training/test_accumulation.py, both engines, padded and packed). Each label token weighs the same, so a long
answer weighs more than a short one, exactly as in the big batch; per-example weighting would be another objective.

A micro-batch the stability guard skips (`training.guards`) is replaced by the stream's next one, weighed by the count
made before the window began (the skipped batch's backward never ran, so nothing can be taken back): a skip leaves
the step's weights off by the difference in label tokens between the two batches.
"""

from __future__ import annotations

import torch

from training.dist import all_reduce_sum
from vtg.model.processing import IGNORE_INDEX


def label_tokens(batch: dict) -> int:
    """Label tokens the causal-LM loss counts in a collated or packed micro-batch: those predicted from a previous
    token (the loss shifts labels by one; a packed example starts with a prompt token, so none crosses examples)."""
    return int((batch["labels"][..., 1:] != IGNORE_INDEX).sum())


def window_tokens(batches: list[dict], device: torch.device) -> float:
    """The window's label tokens on every rank, summed over ranks and divided by the world size: the count each
    rank's `window_share` divides by (every rank calls this)."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    [total] = all_reduce_sum([float(sum(label_tokens(b) for b in batches))], device)
    return total / world


def window_share(loss: torch.Tensor, batch: dict, tokens: float) -> torch.Tensor:
    """A micro-batch's part of the window's per-token loss: its mean loss x its label tokens / `tokens`."""
    return loss * (label_tokens(batch) / max(tokens, 1.0))
