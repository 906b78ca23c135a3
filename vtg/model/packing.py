"""Packing: several examples in one row of a micro-batch, exact.

Padding to the longest example wastes compute where lengths vary (a 10 s clip beside a 3 min one under the families'
fps policy). Packing lays the examples of a micro-batch end to end in rows of `capacity` tokens instead:

    examples  ->  first-fit-decreasing rows  ->  input_ids / labels / mm_token_type_ids  (rows x capacity)
                                                  pixels and grids in the order their video tokens appear (row-major)
              ->  position_ids (4, rows, capacity), computed in the training process by the model's own
                  `get_rope_index` for each example alone: row 0 the text positions (restarting at 0 per example),
                  rows 1-3 the family's rope positions (temporal / height / width, with Qwen2.5-VL's time scaling)
              ->  the model's forward with `attention_mask=None`: transformers reads the restarts of row 0 as packed
                  sequences (`masking_utils.find_packed_sequence_indices`) and builds a block-diagonal causal mask for
                  sdpa/eager, or varlen `cu_seqlens` for flash-attn. No token attends across examples.

Why it is exact: each example gets the positions it would get alone, attends only to itself, and the loss is the
mean over the same label tokens (an example's first label is a prompt token, IGNORE_INDEX, so the token before it in
the row predicts nothing). `tests/training/test_packing.py` checks loss and gradients against the padded batch.

Rows (`training.batching.packed_batches` chooses them): examples are taken from the stream until they hold
`length_groups` x `token_budget` tokens, placed first-fit-decreasing in rows, and the rows cut into micro-batches of
`token_budget` tokens, in a shuffled order. With flash-attn a row is the whole micro-batch (its varlen kernel skips
the cross-example blocks). With sdpa or eager the masked blocks are still computed (a row costs its length squared
in attention), so rows are as long as the pool's longest example, or `pack_length` if longer: a row costs no more
attention than a padded row of that example, and short examples fill the rest.

Not for linear-attention layers (Qwen3.5's Gated DeltaNet): their torch kernels carry state across the row and ignore
the sequence boundaries, so packing is refused there (`check_packable`); use length-grouped token-budget batches.
"""

from __future__ import annotations

import torch

from vtg.errors import VTGError
from vtg.model.processing import IGNORE_INDEX

PACKED = "pack_segments"
"""Batch key of a packed batch: one (row, start, length) per example, in example order."""


def first_fit_rows(lengths: list[int], capacity: int, max_items: int = 0) -> list[list[int]]:
    """Indices of `lengths` placed in rows of `capacity` tokens (and at most `max_items` each, 0: any), first fit in
    decreasing length (ties by index: deterministic). An example longer than `capacity` gets a row of its own."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        for r, room in enumerate(free):
            if n <= room and not (max_items and len(rows[r]) >= max_items):
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(max(capacity, n) - n)
    return rows


def pack_rows(examples: list[dict]) -> list[list[int]]:
    """The rows a batcher chose (`training.batching.packed_batches` marks each example's `pack_row`), in example order;
    examples without a mark share one row."""
    rows: dict = {}
    for i, e in enumerate(examples):
        rows.setdefault(e.get("pack_row", 0), []).append(i)
    return list(rows.values())


def pack(examples: list[dict], pad_token_id: int, rows: list[list[int]] | None = None) -> dict:
    """Encoded examples (`vtg.model.processing.encode_example`) -> a packed batch (module doc), in `rows` (lists of
    example indices; by default `pack_rows`). `attention_mask` marks real tokens (for counting; the model gets none),
    `pack_segments` where each example lies."""
    lengths = [len(e["input_ids"]) for e in examples]
    for e in examples:
        if int(e["labels"][0]) != IGNORE_INDEX:
            raise ValueError(f"example {e.get('key', '?')!r} starts with a label token: packing it after another "
                             "example would make that example predict it")
    rows = pack_rows(examples) if rows is None else rows
    width = max(sum(lengths[i] for i in row) for row in rows)
    fill = {"input_ids": pad_token_id, "attention_mask": 0, "labels": IGNORE_INDEX, "mm_token_type_ids": 0}
    batch: dict = {name: torch.full((len(rows), width), value, dtype=examples[0][name].dtype)
                   for name, value in fill.items()}
    segments: list[tuple[int, int, int] | None] = [None] * len(examples)
    order = []  # examples in the order their video tokens appear in the flattened rows
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = lengths[i]
            for name in fill:
                batch[name][r, at:at + n] = examples[i][name]
            segments[i] = (r, at, n)
            order.append(i)
            at += n
    batch["pixel_values_videos"] = torch.cat([examples[i]["pixel_values_videos"] for i in order])
    batch["video_grid_thw"] = torch.cat([examples[i]["video_grid_thw"] for i in order])
    if all("second_per_grid_ts" in e for e in examples):
        batch["second_per_grid_ts"] = torch.cat([examples[i]["second_per_grid_ts"] for i in order])
    if all("position_ids" in e for e in examples):  # Qwen2.5-VL's native timing: each example's own ids
        batch["example_positions"] = [examples[i]["position_ids"] for i in order]
    batch["video_rows"] = torch.tensor([len(examples[i]["video_grid_thw"]) for i in order])
    batch[PACKED] = [segments[i] for i in order]
    batch["keys"] = [examples[i].get("key", "") for i in order]
    return batch


def rope_owner(model: torch.nn.Module) -> torch.nn.Module:
    """The module that holds the family's `get_rope_index` (the inner `*VLModel`), through peft and engine wrappers."""
    for m in model.modules():
        if callable(getattr(m, "get_rope_index", None)) and hasattr(m, "language_model"):
            return m
    raise VTGError(f"{type(model).__name__} has no get_rope_index: packing needs a Qwen-VL family model")


def check_packable(model: torch.nn.Module) -> None:
    """Refuse packing for a model whose text layers are not all attention (module doc; the pre-flight refuses it by
    family before, `vtg.model.families.Family.packable`; this reads the loaded checkpoint's own config)."""
    cfg = getattr(model, "config", None)
    text = getattr(cfg, "text_config", cfg)
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds - {"full_attention", "sliding_attention"}:
        raise VTGError(f"train.data.packing=true: {type(model).__name__} has {sorted(kinds - {'full_attention'})} "
                       "layers, whose kernels here carry state across a packed row (they ignore sequence boundaries), "
                       "so packing would not be exact; set train.data.packing=false and use train.data.token_budget "
                       "with train.data.length_groups instead")
    rope_owner(model)


def packed_position_ids(owner: torch.nn.Module, batch: dict) -> torch.Tensor:
    """(4, rows, width) positions of a packed batch: each example's own (`encode_example`'s `position_ids`, where its
    family's timing is computed there: Qwen2.5-VL native, `vtg.model.rope_time`), else from the model's
    `get_rope_index` on it alone (row 0: text positions 0..n-1); the padding at a row's end is a sequence of its own
    (0, 1, ...)."""
    ids, types = batch["input_ids"], batch["mm_token_type_ids"]
    rows, width = ids.shape
    pos = torch.arange(width, dtype=ids.dtype).expand(4, rows, width).clone()
    ends = torch.zeros(rows, dtype=torch.long)
    grid, spg, counts = batch["video_grid_thw"], batch.get("second_per_grid_ts"), batch["video_rows"].tolist()
    own = batch.get("example_positions")
    g = 0
    for e, ((r, at, n), k) in enumerate(zip(batch[PACKED], counts, strict=True)):
        if own is not None:
            rope = own[e]
        else:
            extra = {} if spg is None else {"second_per_grid_ts": spg[g:g + k]}
            rope = owner.get_rope_index(ids[r:r + 1, at:at + n], mm_token_type_ids=types[r:r + 1, at:at + n],
                                        video_grid_thw=grid[g:g + k], attention_mask=None, **extra)[0][:, 0]
        pos[0, r, at:at + n] = torch.arange(n, dtype=ids.dtype)
        pos[1:, r, at:at + n] = rope.to(ids.dtype)
        ends[r] = max(int(ends[r]), at + n)
        g += k
    for r in range(rows):  # the tail: positions restart, so it is its own (ignored) sequence
        tail = width - int(ends[r])
        pos[:, r, int(ends[r]):] = torch.arange(tail, dtype=ids.dtype)
    return pos


def packed_inputs(owner: torch.nn.Module, batch: dict, inputs: dict) -> dict:
    """`vtg.model.processing.model_inputs` of a packed batch made ready for the forward: the positions added, the
    attention mask dropped (the packed mask comes from the positions' restarts)."""
    device = inputs["input_ids"].device
    out = {k: v for k, v in inputs.items() if k != "attention_mask"}
    out["position_ids"] = packed_position_ids(owner, batch).to(device)
    out["use_cache"] = False  # transformers reads packed positions only without a cache
    return out


def is_packed(batch: dict) -> bool:
    return PACKED in batch
