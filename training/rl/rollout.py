"""Rollouts: G sampled answers per query through the model's own `generate`, and the teacher-forced log-probs
of exactly those tokens for the update.

The prompts are built by the same `encode_example` as SFT and evaluation (same patchify, same prompt, same
timing). Two traps, both measured (docs/environment.md): the generation config has no `top_k`, and transformers'
default of 50 would truncate sampling, so `top_k=0` is passed explicitly; and sampling over the whole
vocabulary can emit `<|video_pad|>` and the other vision special tokens (then teacher forcing fails: video
tokens no longer match the video features), so they are suppressed in `generate` and masked in the
teacher-forced logits, which keeps the two distributions the same.

Each query's video is encoded once per pass, not once per answer: the G rows of a group hold the same encoded
prompt, and both `sample` and `teacher_forced_logits` (given the model) batch the distinct videos only and share
their features among the rows (`vtg.model.shared_vision`; exact, gradients included).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vtg.model.generation import pad_id
from vtg.model.processing import VisionParams, collate, encode_example, model_inputs
from vtg.model.rope_time import extend_positions
from vtg.model.shared_vision import shared_video_features
from vtg.queries import QueryExample


@dataclass
class Rollout:
    encoded: list[dict]
    """Per sequence (queries x G, grouped): the prompt's encoded inputs (1-D tensors, as `encode_example`)."""
    completions: torch.Tensor
    """(N, T) sampled token ids (pad after the end)."""
    mask: torch.Tensor
    """(N, T) 1 on each answer's tokens through its first end token."""
    texts: list[str]
    """Decoded answers (special tokens dropped)."""


def vision_token_ids(config) -> list[int]:
    """Ids the policy must never sample: the video/image placeholders and the vision start/end markers."""
    names = ("video_token_id", "image_token_id", "vision_start_token_id", "vision_end_token_id")
    ids = {getattr(config, n, None) for n in names}
    return sorted(i for i in ids if isinstance(i, int))


def end_token_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    ids.add(tokenizer.eos_token_id)
    return sorted(i for i in ids if i is not None)


def encode_prompts(tokenizer, examples: list[QueryExample], group_size: int, vision: VisionParams) -> list[dict]:
    """Each query's generation prompt, repeated `group_size` times (rows grouped by query)."""
    out = []
    for ex in examples:
        enc = encode_example(tokenizer, ex.frames, ex.timestamps, ex.query, None, vision=vision, key=ex.key)
        out.extend([enc] * group_size)
    return out


@torch.no_grad()
def sample(model, tokenizer, encoded: list[dict], *, temperature: float, top_p: float, max_new_tokens: int,
           device, dtype, synced: bool = False) -> Rollout:
    """Sample one answer per prompt row (torch's global RNG: seeded, saved in checkpoints). `synced`: keep every
    rank generating until all are done (ZeRO-3 gathers parameters in collectives every forward, so ranks whose
    answers end sooner must keep stepping; transformers' `synced_gpus`)."""
    collated = collate(encoded, pad_id(tokenizer), padding_side="left", share_videos=True)
    batch = model_inputs(collated, device, dtype)
    batch.pop("labels", None)
    prompt_len = batch["input_ids"].shape[1]
    ends = end_token_ids(model, tokenizer)
    was_training = model.training
    model.eval()
    try:
        with shared_video_features(model, collated["video_share"]):
            out = model.generate(**batch, do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                 max_new_tokens=max_new_tokens, pad_token_id=pad_id(tokenizer), eos_token_id=ends,
                                 suppress_tokens=vision_token_ids(model.config), use_cache=True, synced_gpus=synced)
    finally:
        model.train(was_training)
    completions = out[:, prompt_len:]
    mask = completion_mask(completions, ends)
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    return Rollout(encoded, completions, mask, texts)


def completion_mask(completions: torch.Tensor, end_ids: list[int]) -> torch.Tensor:
    """1 on every token up to and including the first end token of each row (all of a row with none)."""
    is_end = torch.zeros_like(completions, dtype=torch.bool)
    for e in end_ids:
        is_end |= completions == e
    # tokens strictly after the first end: a cumulative count of ends seen before this position is > 0
    before = torch.cumsum(is_end.long(), dim=1) - is_end.long()
    return (before == 0).long()


def teacher_forced_logits(forward, tokenizer, rollout: Rollout, rows: slice | list[int], device, dtype,
                          temperature: float, masked_ids: list[int], model: torch.nn.Module | None = None
                          ) -> torch.Tensor:
    """Logits (len(rows), T, V) that predicted each sampled token, tempered and with `masked_ids` at -inf:
    the distribution the tokens were sampled from. `forward(inputs)` runs the model (the engine's `outputs`).
    `model`: the model `forward` runs; given, each distinct video of `rows` is encoded once and its features
    shared by its rows (a group split over two micro-batches: once in each); None: every row encodes its own."""
    idx = list(range(len(rollout.encoded)))[rows] if isinstance(rows, slice) else list(rows)
    collated = collate([rollout.encoded[i] for i in idx], pad_id(tokenizer), padding_side="left",
                       share_videos=model is not None)
    batch = model_inputs(collated, device, dtype)
    batch.pop("labels", None)
    comp, cmask = rollout.completions[idx].to(device), rollout.mask[idx].to(device)
    batch["input_ids"] = torch.cat([batch["input_ids"], comp], dim=1)
    batch["attention_mask"] = torch.cat([batch["attention_mask"], cmask.to(batch["attention_mask"].dtype)], dim=1)
    if "mm_token_type_ids" in batch:
        mm = batch["mm_token_type_ids"]
        batch["mm_token_type_ids"] = torch.cat([mm, mm.new_zeros(comp.shape)], dim=1)
    if "position_ids" in batch:  # the sampled tokens at the positions `generate` gave them
        batch["position_ids"] = extend_positions(batch["position_ids"], comp.shape[1])
    steps = comp.shape[1]
    batch["logits_to_keep"] = steps + 1  # only the positions that predict the answer (vocabularies are large)
    with shared_video_features(model, collated.get("video_share")):  # no share (model None): a no-op
        logits = forward(batch).logits[:, :-1].float() / temperature
    if masked_ids:
        logits[..., masked_ids] = float("-inf")
    return logits


def padding_slots(rollout: Rollout, chunks: list[slice]) -> dict[str, float]:
    """Token slots and the real tokens among them, in the rollout's prompt prefill (every row left-padded to the
    longest prompt) and in the update's teacher-forced micro-batches (`chunks`: each padded to its longest prompt,
    plus the completions' width). Rows of one group share a prompt, so a micro-batch inside a group pads only its
    completions."""
    prompts = [len(e["input_ids"]) for e in rollout.encoded]
    answers = rollout.mask.sum(dim=1).tolist()
    width = rollout.completions.shape[1]
    update_slots = update_real = 0
    for rows in chunks:
        p, a = prompts[rows], answers[rows]
        update_slots += len(p) * (max(p) + width)
        update_real += sum(p) + sum(a)
    return {"prefill_slots": float(len(prompts) * max(prompts)), "prefill_real": float(sum(prompts)),
            "update_slots": float(update_slots), "update_real": float(update_real)}
