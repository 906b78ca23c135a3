"""What GRPO starts from: the start checkpoint (`rl.init`), its identity, and the pool of train queries after the
difficulty filter."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from vtg import checkpoints as ckpt
from vtg.answer import parse_answer
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.model.generation import greedy_answers
from vtg.queries import ReadStats, iter_examples
from vtg.selection import SELECTION_SPLIT, checkpoint_identity, read_start, start_pointer_path
from vtg.shards import list_shards
from vtg.spans import best_iou

log = logging.getLogger("training.rl")


def start_checkpoint(cfg: PipelineConfig) -> Path:
    """`rl.init`: `best` = the SFT checkpoint the select stage chose on val (`<evaluate.select_dir>/start.json`,
    written by `python -m evaluation.select`: `vtg.selection.read_start`; with a single SFT checkpoint and no
    pointer, that one), `latest`, or a checkpoint directory. RL itself evaluates nothing to choose. The start
    checkpoint's digests are verified: RL must not start from a checkpoint whose files changed after they were
    saved."""
    init, root = cfg.rl.init, Path(cfg.train.out_dir)
    if init not in ("best", ckpt.LATEST):
        path = ckpt.resolve_checkpoint(init)
    else:
        found = ckpt.list_checkpoints(root)
        if not found:
            raise VTGError(f"{root}: no complete SFT checkpoint to start RL from (run `python -m training` first, "
                           "or set rl.init to a checkpoint directory)")
        single = len(found) == 1 and not start_pointer_path(cfg).exists()
        path = found[-1] if init == ckpt.LATEST or single else read_start(cfg, found)
        log.info("RL starts from %s (rl.init=%s%s)", path, init,
                 f", chosen on {SELECTION_SPLIT} by the select stage" if init == "best" and not single else "")
    try:
        ckpt.read_checkpoint_meta(path, verify=True)
    except VTGError as e:
        raise VTGError(f"rl.init={init}: cannot start from {path}: {e}") from None
    return path


def parent_digest(checkpoint: Path) -> str:
    """The start checkpoint's identity (`vtg.selection.checkpoint_identity`)."""
    return checkpoint_identity(checkpoint)


# ---- the query pool -------------------------------------------------------------------------------------------
def load_train_queries(cfg: PipelineConfig) -> list:
    """Every readable query of training's split with its frames (`vtg.queries`: one example per query), from
    training's shards, at most `rl.max_queries`."""
    stats = ReadStats()
    shards_dir, split = cfg.train.shards_dir, cfg.train.data.split
    examples = list(iter_examples(list_shards(shards_dir, split), stats, limit=cfg.rl.max_queries))
    if stats.skipped:
        log.warning("RL: skipped unreadable %s samples: %s", split, dict(stats.skipped))
    if not examples:
        raise VTGError(f"{shards_dir}/{split}: no readable queries for RL")
    return examples


@torch.no_grad()
def greedy_ious(model, tokenizer, examples: list, cfg: PipelineConfig, device) -> list[float]:
    """IoU of the greedy answer to each query (evaluation's decoding: `vtg.model.generation.greedy_answers`)."""
    bs, ious = cfg.evaluate.batch_size, []
    for i in range(0, len(examples), bs):
        batch = examples[i:i + bs]
        answers = greedy_answers(model, tokenizer, batch, device, cfg.evaluate.max_new_tokens)
        ious += [best_iou(parse_answer(a), ex.windows)[0] for a, ex in zip(answers, batch, strict=True)]
    return ious


def difficulty_filter(model, tokenizer, examples: list, cfg: PipelineConfig, device) -> tuple[list[str], dict]:
    """Greedy answers of the start policy on every pool query; keep those whose IoU lies in
    [difficulty_min_iou, difficulty_max_iou]. Returns (kept keys, counts)."""
    r = cfg.rl
    ious = greedy_ious(model, tokenizer, examples, cfg, device)
    kept = [ex.key for ex, iou in zip(examples, ious, strict=True)
            if r.difficulty_min_iou <= iou <= r.difficulty_max_iou]
    counts = {"scored": len(examples), "kept": len(kept),
              "below": sum(iou < r.difficulty_min_iou for iou in ious),
              "above": sum(iou > r.difficulty_max_iou for iou in ious),
              "greedy_iou_mean": float(np.mean(ious)) if ious else float("nan"),
              "band": [r.difficulty_min_iou, r.difficulty_max_iou]}
    log.info("difficulty filter: kept %d of %d train queries with greedy IoU in [%.2f, %.2f] (%d below, %d above; "
             "mean greedy IoU %.3f)", counts["kept"], counts["scored"], r.difficulty_min_iou, r.difficulty_max_iou,
             counts["below"], counts["above"], counts["greedy_iou_mean"])
    if not kept:
        raise VTGError(f"difficulty filter kept none of {len(examples)} train queries (band [{r.difficulty_min_iou}, "
                       f"{r.difficulty_max_iou}]); widen rl.difficulty_min_iou / rl.difficulty_max_iou")
    return kept, counts


def step_queries(pool_size: int, step: int, per_step: int, seed: int) -> list[int]:
    """Pool indices of the queries of `step` (0-based): a fresh seeded permutation per pass over the pool, so
    the order depends only on (seed, step), never on what ran before (exact resume needs no data state)."""
    out = []
    for j in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(j, pool_size)
        perm = np.random.default_rng([seed, epoch]).permutation(pool_size)
        out.append(int(perm[pos]))
    return out
