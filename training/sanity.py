"""Checks before step 1 that fail fast with one clear message instead of a silently wasted run."""

from __future__ import annotations

import logging
from pathlib import Path

from vtg.errors import VTGError
from vtg.model.families import DEFAULT
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
    """The tokenizer renders prompts (a chat template), ends answers (eos) and pads batches (pad)."""
    if not getattr(tokenizer, "chat_template", None):
        raise SanityError("the tokenizer has no chat template (the model export must ship one: "
                          "tokenizer_config.json / chat_template.jinja)")
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise SanityError("the tokenizer has no eos token: every answer is trained to end with it and generation "
                          "stops at it; set `eos_token` in the export's tokenizer_config.json (the Qwen families': "
                          f"{DEFAULT.tokenizer.eos_token})")
    if getattr(tokenizer, "pad_token_id", None) is None:
        raise SanityError("the tokenizer has no pad token: batches are padded with it; set `pad_token` in the "
                          "export's tokenizer_config.json to a token other than eos (the Qwen families': "
                          f"{DEFAULT.tokenizer.pad_token})")


def check_vocabulary(tokenizer, model) -> None:
    """Every token id the tokenizer can produce has a row in the model's embedding: a special token named in
    tokenizer_config.json that is not in the vocabulary (`</s>` on a Qwen export) is added past the end, and would
    index outside the embedding at the first answer."""
    rows = model.get_input_embeddings().num_embeddings
    for name in ("eos_token", "pad_token"):
        token, token_id = getattr(tokenizer, name, None), getattr(tokenizer, f"{name}_id", None)
        if token_id is not None and token_id >= rows:
            raise SanityError(f"the tokenizer's {name.removesuffix('_token')} token {token!r} has id {token_id}, but the "
                              f"model's embedding has {rows} rows: it is not one of the model's tokens (added past "
                              f"the vocabulary); set `{name}` in the export's tokenizer_config.json to a token the "
                              f"model has (the Qwen families': {getattr(DEFAULT.tokenizer, name)})")
    if len(tokenizer) > rows:
        raise SanityError(f"the tokenizer has {len(tokenizer)} tokens, the model's embedding {rows} rows: ids past "
                          f"{rows - 1} would index outside it; use the tokenizer exported with this model")


def check_examples(examples: list[dict], errors: list[tuple[str, str]], tokenizer, vision_token_ids: set[int],
                   max_seq_len: int) -> None:
    """The first examples decode within max_seq_len (the encoder refuses a longer one, `errors` says so), and each
    teaches an answer: a non-empty answer mask, no vision/pad token in its labels, the eos last."""
    too_long = [w for r, w in errors if "max_length" in r]
    if too_long:
        raise SanityError(f"{len(too_long)} of the first examples exceed train.data.max_seq_len={max_seq_len} "
                          f"(first: {too_long[0]}); their answers would be truncated: raise max_seq_len")
    if not examples:
        raise SanityError("no decodable training examples in the first shards" +
                          (f" (first error: {errors[0][0]} at {errors[0][1]})" if errors else "") +
                          ": every one was skipped, nothing would train; fix what the error names (broken or "
                          "hand-written shards: re-run preprocess, python -m beam_jobs.preprocess)")
    banned = set(vision_token_ids) | {tokenizer.pad_token_id}
    for ex in examples:
        labels = ex["labels"]
        answer = labels[labels != IGNORE_INDEX]
        if answer.numel() == 0:
            raise SanityError(f"{ex['key']}: empty answer mask (no label tokens): nothing would be learned from it "
                              "(encoded as a prompt, without its answer?)")
        if bad := sorted(set(answer.tolist()) & banned):
            raise SanityError(f"{ex['key']}: labels contain vision/pad token ids {bad}"
                              f"{_banned_eos(tokenizer, bad)}")
        if labels[-1].item() != tokenizer.eos_token_id:
            raise SanityError(f"{ex['key']}: the answer does not end with the eos token {tokenizer.eos_token!r} "
                              f"(id {tokenizer.eos_token_id}, last label {labels[-1].item()}): the model would not "
                              "learn to stop; the tokenizer does not turn the eos text after an answer into its id "
                              "(its entry in tokenizer.json's added_tokens: `single_word`, `lstrip` or `rstrip` "
                              "set?), or the example was cut")


def _banned_eos(tokenizer, bad: list[int]) -> str:
    """Why the labels hold a vision/pad id and what to do, when it is the eos that every answer ends with."""
    eos = tokenizer.eos_token_id
    if eos not in bad:
        return " (the answer text holds special tokens)"
    if eos == tokenizer.pad_token_id:
        return (f": the tokenizer's pad token is its eos token {tokenizer.eos_token!r}, so an answer's end cannot be "
                "told from padding (a collator that masks padding never teaches the model to stop); set `pad_token` "
                "in the export's tokenizer_config.json to a token other than eos (the Qwen families': "
                f"{DEFAULT.tokenizer.pad_token})")
    return (f": the tokenizer's eos token {tokenizer.eos_token!r} is a vision token; set `eos_token` in the "
            f"export's tokenizer_config.json to the end of a turn (the Qwen families': {DEFAULT.tokenizer.eos_token})")


VISION_TOWER = "visual"
"""The vision tower's module name in every family (what `train.model.freeze_vision` freezes)."""


def check_model(model, finetune: str, freeze_vision: bool, trainable: int, total: int) -> None:
    """The model trains what `train.model` asks: in train mode, something trainable, adapters a minority of the
    weights, full fine-tuning every weight (but the vision tower with `freeze_vision`, and then not it)."""
    if not model.training:
        raise SanityError("the model is in eval mode before step 1 (dropout and other training behaviour off): "
                          "the loader must return it in train mode (load_model_and_tokenizer with trainable=True)")
    if trainable == 0:
        raise SanityError(f"no trainable parameters (all {total:,} frozen): nothing would train (a model loaded "
                          "for evaluation? load_model_and_tokenizer with trainable=True)")
    if finetune != "full" and trainable > 0.5 * total:
        if not hasattr(model, "peft_config"):
            raise SanityError(f"train.model.finetune={finetune} trains {trainable:,}/{total:,} parameters: the "
                              "adapters were not applied")
        raise SanityError(f"train.model.finetune={finetune} trains {trainable:,}/{total:,} parameters "
                          f"({trainable / total:.0%}): the adapters outweigh the model they adapt; lower "
                          "train.model.lora_r or set train.model.finetune=full")
    if finetune == "full":
        _check_full(model, freeze_vision, trainable, total)


def _check_full(model, freeze_vision: bool, trainable: int, total: int) -> None:
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    in_tower = {n for n in frozen if VISION_TOWER in n.split(".")}
    if freeze_vision and not in_tower:
        raise SanityError(f"train.model.freeze_vision=true, but the vision tower trains: no parameter under a "
                          f"`{VISION_TOWER}` module is frozen (apply_finetune_mode freezes `model.{VISION_TOWER}`; "
                          "is this family's tower elsewhere?); set train.model.freeze_vision=false or teach "
                          "apply_finetune_mode where this family's tower is")
    if wrong := [n for n in frozen if not (freeze_vision and n in in_tower)]:
        why = (": train.model.base is a LoRA adapter export, its base loads frozen; merge it into full weights "
               "first (python -m training.merge --checkpoint <its checkpoint> --alpha 1) and train from the merge"
               if hasattr(model, "peft_config") else "")
        raise SanityError(f"train.model.finetune=full trains only {trainable:,}/{total:,} parameters "
                          f"({len(wrong)} tensors frozen, e.g. {wrong[0]}){why}")
