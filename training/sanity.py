"""Checks before step 1 that fail fast with one clear message instead of a silently wasted run."""

from __future__ import annotations

import logging
from pathlib import Path

from vtg.errors import VTGError
from vtg.model.processing import IGNORE_INDEX

log = logging.getLogger(__name__)


class SanityError(VTGError):
    """A pre-training check failed."""


def check_shards_manifest(shards_dir, split: str) -> None:
    """The split's shards agree with the manifest preprocess wrote (`vtg.shards.verify_shards`): a listed shard
    missing, an unlisted one, or one whose size/sha256 differs stops the run before step 1 with one line naming
    the shard. Without a manifest (hand-made shards) a warning, and training goes on. An explicit list of shard
    paths/URLs is not checked (no shard root to find a manifest in)."""
    from vtg.shards import MANIFEST, read_manifest, verify_shards

    if not isinstance(shards_dir, (str, Path)) or "://" in str(shards_dir):
        return
    root = Path(shards_dir)
    manifest = read_manifest(root)
    if manifest is None:
        log.warning("no %s in %s: the %s shards cannot be checked (hand-made shards?); training on what is there",
                    MANIFEST, root, split)
        return
    problems = verify_shards(root, split, manifest)
    if problems:
        more = f" (+{len(problems) - 1} more: {', '.join(p.shard for p in problems[1:4])}" + (
            ", ..." if len(problems) > 4 else "") + ")" if len(problems) > 1 else ""
        raise SanityError(f"shard {problems[0]} in {root}{more}; the shards do not match {root / MANIFEST}: "
                          "re-run preprocess (python -m beam_jobs.preprocess) or restore them with "
                          "`dvc checkout` (DVC-versioned shards)")


def check_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise SanityError("the tokenizer has no chat template (the model export must ship one: "
                          "tokenizer_config.json / chat_template.jinja)")
    for name in ("eos_token_id", "pad_token_id"):
        if getattr(tokenizer, name, None) is None:
            raise SanityError(f"the tokenizer has no {name.removesuffix('_id')} token")


def check_examples(examples: list[dict], errors: list[tuple[str, str]], tokenizer, vision_token_ids: set[int],
                   max_seq_len: int) -> None:
    """Every example has a non-empty answer mask, no vision/pad tokens in its labels, and fits max_seq_len."""
    too_long = [w for r, w in errors if "max_length" in r]
    if too_long:
        raise SanityError(f"{len(too_long)} of the first examples exceed train.data.max_seq_len={max_seq_len} "
                          f"(first: {too_long[0]}); their answers would be truncated: raise max_seq_len")
    if not examples:
        raise SanityError("no decodable training examples in the first shards" +
                          (f" (first error: {errors[0][0]} at {errors[0][1]})" if errors else ""))
    banned = set(vision_token_ids) | {tokenizer.pad_token_id}
    for ex in examples:
        labels = ex["labels"]
        answer = labels[labels != IGNORE_INDEX]
        if answer.numel() == 0:
            raise SanityError(f"{ex['key']}: empty answer mask (no label tokens): nothing would be learned")
        if bad := sorted(set(answer.tolist()) & banned):
            raise SanityError(f"{ex['key']}: labels contain vision/pad token ids {bad}")
        if len(ex["input_ids"]) > max_seq_len:
            raise SanityError(f"{ex['key']}: {len(ex['input_ids'])} tokens > max_seq_len {max_seq_len}")
        if labels[-1].item() != tokenizer.eos_token_id:
            raise SanityError(f"{ex['key']}: the answer does not end with the eos token (truncated?)")


def check_model(model, finetune: str, freeze_vision: bool, trainable: int, total: int) -> None:
    if not model.training:
        raise SanityError("model is not in train mode")
    if trainable == 0:
        raise SanityError("no trainable parameters")
    if finetune == "lora" and trainable > 0.5 * total:
        raise SanityError(f"LoRA run trains {trainable}/{total} parameters: adapters were not applied")
    if finetune == "full" and not freeze_vision and trainable != total:
        raise SanityError(f"full fine-tuning trains only {trainable}/{total} parameters")
    if finetune == "full" and freeze_vision and trainable >= total:
        raise SanityError("freeze_vision is set but the vision tower is trainable")


def check_data_version(data_version: str | None) -> None:
    if not data_version:
        raise SanityError("no data version for the shards (cannot record lineage)")
