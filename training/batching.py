"""Cutting a stream of examples into micro-batches: fixed size or under a token budget, length-grouped, or packed
end to end in rows (`train.data.packing`, vtg/model/packing.py), and the padding a list of batches carries. Every
batcher is deterministic given its stream and rng, so a resume that skips the batches it consumed is exact."""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice

from vtg.errors import VTGError
from vtg.model.packing import first_fit_rows, pack_rows


def token_budget_batches(examples: Iterator[dict], max_batch: int, token_budget: int) -> Iterator[list[dict]]:
    """Greedy batches of at most `max_batch` examples whose padded size (n x longest) fits `token_budget`.

    `token_budget=0` means fixed-size batches of `max_batch`. A single example over the budget forms its own batch.
    """
    batch: list[dict] = []
    longest = 0
    for ex in examples:
        new_longest = max(longest, ex["n_tokens"])
        over = token_budget > 0 and batch and new_longest * (len(batch) + 1) > token_budget
        if batch and (len(batch) >= max_batch or over):
            yield batch
            batch, new_longest = [], ex["n_tokens"]
        batch.append(ex)
        longest = new_longest
    if batch:
        yield batch


def length_grouped_batches(examples: Iterator[dict], max_batch: int, token_budget: int, groups: int,
                           rng: random.Random) -> Iterator[list[dict]]:
    """Batches of examples of similar length: take `groups` x `max_batch` examples (already shuffled), sort them by
    token count (ties by key: deterministic), cut them into batches as `token_budget_batches` does, and yield those
    batches in an order drawn from `rng`. So few pad tokens and still a random order of batches; the same stream and
    seed give the same batches (exact resume by skipping batches). `groups=0`: `token_budget_batches` as is."""
    if groups <= 0:
        yield from token_budget_batches(examples, max_batch, token_budget)
        return
    it = iter(examples)
    while pool := list(islice(it, groups * max_batch)):
        pool.sort(key=lambda ex: (ex["n_tokens"], ex["key"]))
        batches = list(token_budget_batches(iter(pool), max_batch, token_budget))
        rng.shuffle(batches)
        yield from batches


def packed_batches(examples: Iterator[dict], max_batch: int, token_budget: int, groups: int, pack_length: int,
                   one_row: bool, rng: random.Random) -> Iterator[list[dict]]:
    """Micro-batches of packed rows (`train.data.packing`; vtg/model/packing.py) of at most `max_batch` examples and
    `token_budget` tokens: take examples (already shuffled) until they hold `groups` micro-batches' worth (tokens or
    examples), place them first-fit-decreasing in rows, and cut the rows into micro-batches, yielded in an order drawn
    from `rng` (`groups=0`: one micro-batch's worth at a time, in stream order). With `one_row` a micro-batch is one
    row (flash-attn); else rows are as long as the pool's longest example (or `pack_length` if longer) and a
    micro-batch holds `token_budget // row length` of them. Each example is marked with its row (`pack_row`).
    Deterministic: the same stream and seed give the same micro-batches (exact resume by skipping batches)."""
    if token_budget <= 0:
        raise VTGError("train.data.packing=true needs train.data.token_budget > 0 (the tokens one micro-batch packs)")
    it = iter(examples)
    pools = max(1, groups)
    carry: list[dict] = []
    while True:
        pool, total, ended = list(carry), sum(ex["n_tokens"] for ex in carry), True
        for ex in it:
            pool.append(ex)
            total += ex["n_tokens"]
            if total >= pools * token_budget or len(pool) >= pools * max_batch:
                ended = False
                break
        if not pool:
            return
        lengths = [ex["n_tokens"] for ex in pool]
        if one_row:
            chunks = [[row] for row in first_fit_rows(lengths, token_budget, max_batch)]
        else:
            capacity = max(pack_length, max(lengths))
            per, chunks = max(1, token_budget // capacity), []
            for row in first_fit_rows(lengths, capacity):
                if not chunks or len(chunks[-1]) >= per or sum(map(len, chunks[-1])) + len(row) > max_batch:
                    chunks.append([])
                chunks[-1].append(row)
        # The pool's last micro-batch is mostly a remainder: unless the stream ended, its examples (those not carried
        # before: none waits twice) start the next pool instead of padding a small batch.
        last = [pool[i] for row in chunks[-1] for i in row]
        carry = []
        if not ended and len(chunks) > 1 and sum(ex["n_tokens"] for ex in last) < token_budget / 2 \
                and not any(ex.get("carried") for ex in last):
            chunks.pop()
            carry = [{**ex, "carried": True} for ex in last]
        batches = [[{**pool[i], "pack_row": r} for r, row in enumerate(chunk) for i in row] for chunk in chunks]
        if groups > 0:
            rng.shuffle(batches)
        yield from batches


def padding_fraction(batches: Iterator[list[dict]]) -> tuple[float, int]:
    """(share of a stream's token slots that are padding, real tokens) for raw batches with `n_tokens`: padded to
    the longest, or packed in the rows `packed_batches` marked (`pack_row`), each as long as the longest row."""
    real = padded = 0
    for b in batches:
        lengths = [ex["n_tokens"] for ex in b]
        real += sum(lengths)
        if "pack_row" in b[0]:
            rows = pack_rows(b)
            padded += len(rows) * max(sum(lengths[i] for i in row) for row in rows)
        else:
            padded += max(lengths) * len(lengths)
    return (1 - real / padded if padded else 0.0), real


