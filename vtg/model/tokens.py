"""Which tokenizer counts a model's tokens before training, and how a query is counted: one home for pre-flight
(`training.preflight`) and ingest's query-length limit (`ingest.max_query_tokens`), so that a query ingest lets
in is never longer than the longest query pre-flight budgeted for (docs/faults.md, "Input hygiene").

The tokenizer is the model's own when it is here without a download: `tiny`, a local export, a `shape-true:`
spec (its tokenizer), or a hub id in the local Hugging Face cache. A Qwen2.5-VL or Qwen3-VL hub id never
downloaded gets its real tokenizer rebuilt offline (`vtg.model.qwen_tokenizer`: the counts are exact); so does a
Qwen3.5 one (exact up to its reconstructed chat template). Otherwise (an unknown id) the local tiny tokenizer
stands in, with
Qwen's default system turn: an upper bound on the text, since its 392-token byte-level BPE splits English words
far finer than Qwen's vocabularies.
"""

from __future__ import annotations

import functools
from pathlib import Path

QWEN_SYSTEM_PROMPT = "You are a helpful assistant."
"""The system turn Qwen2.5-VL's chat template adds when a conversation has none (training sends none)."""
REAL_NOTE = "counted with the family's real tokenizer, rebuilt offline (vtg/model/qwen_tokenizer.py)"
STAND_IN_NOTE = ("text counted with the local tiny tokenizer plus Qwen's default system turn: an upper bound, the "
                 "tiny BPE splits words far finer than Qwen's")


def own_tokenizer(base: str):
    """The tokenizer of `train.model.base` when it is on this machine (see the module doc), else None."""
    from vtg.model.tiny import tiny_family, tiny_tokenizer

    if (family := tiny_family(base)) is not None:
        return tiny_tokenizer(family)  # no model build, no torch (ingest counts with it)
    from transformers import AutoTokenizer

    from vtg.model import shape_true
    from vtg.model.modeling import resolve_base

    if shape_true.is_spec(base):
        kw = shape_true.parse_spec(base)
        return shape_true.shape_true_config(kw["base"], kw.get("text_layers", 1), kw.get("vision_blocks", 1),
                                            kw.get("vocab"))[1]
    path = Path(resolve_base(base))
    if (path / "config.json").is_file():
        return AutoTokenizer.from_pretrained(path)
    try:
        return AutoTokenizer.from_pretrained(base, local_files_only=True)  # a hub id in the local cache
    except (OSError, ValueError):  # not cached (or not a hub id): the caller stands in
        return None


@functools.cache
def counting_tokenizer(base: str) -> tuple[object, str, str | None]:
    """(tokenizer, note, system prompt to add) that pre-flight and ingest count `base`'s text with."""
    tokenizer = own_tokenizer(base)
    if tokenizer is not None:
        return tokenizer, "counted with the model's own tokenizer", None
    from transformers import AutoTokenizer

    from vtg.model import qwen_tokenizer, shape_true

    facts = shape_true.arch_facts(base)
    if facts is not None and shape_true.facts_family(facts) in qwen_tokenizer.TOKENIZERS:
        return shape_true.real_tokenizer(facts), REAL_NOTE, None

    from vtg.model.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(seed=0)), STAND_IN_NOTE, QWEN_SYSTEM_PROMPT

