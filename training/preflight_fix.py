"""Pre-flight's fixes: the cheapest change of checkpointing, ZeRO stage, offload and micro-batch under which a
training run fits the GPU, and the most frames whose longest example fits `train.data.max_seq_len`
(`training.preflight` calls them with its plan's figures)."""

from __future__ import annotations

import math

ZERO_LADDER = [(0, False, False), (1, False, False), (2, False, False), (3, False, False), (1, True, False),
                (2, True, False), (3, True, False), (3, True, True)]
"""ZeRO settings from least to most communication / offload."""


def memory_fix(option, gc: bool, current: tuple[int, bool, bool], micro: int, accum: int, limit: float,
                fsdp: bool, budget_seq: int = 0) -> tuple[list[str], object] | None:
    """(overrides, the `option(...)` that fits) for the cheapest change that fits: fewest offloads, then fewest levers (checkpointing < ZeRO stage <
    micro-batch), then the smallest step on each. A smaller micro-batch keeps the global batch (grad_accum); under
    a token budget (`budget_seq`: the longest example's tokens) the budget shrinks with it."""
    stage0, off_opt0, off_param0 = current
    ladder = [current] if fsdp else [z for z in ZERO_LADDER if z[0] >= stage0 and z[1] >= off_opt0
                                     and z[2] >= off_param0]
    per_rank = micro * accum
    micros = [m for m in range(micro, 0, -1) if per_rank % m == 0]
    best = None
    for g in sorted({gc, True}):
        for z in ladder:
            for m in micros:
                o = option(g, *z, m)
                if o.total_b > limit:
                    continue
                levers = [g != gc, z != current, m != micro]
                cost = (int(z[1] and not off_opt0) + int(z[2] and not off_param0), sum(levers),
                        [i for i, changed in enumerate(levers) if changed], ZERO_LADDER.index(z), micro - m)
                if best is None or cost < best[0]:
                    best = (cost, g, z, m, o)
    if best is None:
        return None
    _, g, (stage, off_opt, off_param), m, o = best
    overrides = []
    if g != gc:
        overrides.append("train.model.gradient_checkpointing=true")
    if stage != stage0:
        overrides.append(f"train.zero_stage={stage}")
    if off_opt != off_opt0:
        overrides.append("engine.offload_optimizer=true")
    if off_param != off_param0:
        overrides.append("engine.offload_param=true")
    if m != micro:
        overrides += [f"train.micro_batch_size={m}", f"train.grad_accum={per_rank // m}"]
        if budget_seq:
            overrides.append(f"train.data.token_budget={m * budget_seq}")
    return overrides, o


def fewer_frames(p, top: int, tp: int, max_seq_len: int, count) -> str | None:
    """The most frames below `top` (a multiple of the temporal patch `tp`) whose example (`count(frames)`) fits
    max_seq_len, as an override of the `preprocess` section `p`."""
    for n in range((top - 1) // tp * tp, 0, -tp):
        if count(n).total <= max_seq_len:
            if p.frame_mode == "uniform" and p.frame_fps > 0:
                fps = math.floor(n / p.max_window_s * 1000) / 1000
                return f"preprocess.frame_fps={fps:g}" if fps > 0 else None
            return f"preprocess.num_frames={n}"
    return None
