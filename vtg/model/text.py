"""User text as token ids: the one rule for how a query enters a prompt (plain text: the text of a special token
stays text), shared by the prompt builder (`vtg.model.processing.encode_prompt`), ingest's query-length check and
the pre-flight. No model code here, so that anything may import it."""

from __future__ import annotations


def query_ids(tokenizer, query: str) -> list[int]:
    """A query's token ids as the prompt holds them: plain text, a special token's text included as text
    (`vtg.model.processing.encode_prompt`)."""
    return tokenizer(query, add_special_tokens=False, split_special_tokens=True)["input_ids"] if query else []
