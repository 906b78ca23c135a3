"""Declared data sources for tests that ingest files of their own (`ingest.sources`, `vtg.sources`).

Ingest refuses an annotation file under no declared root, so a test that writes annotations and videos under a
temp folder declares that folder as a source, the way a user declares a dataset."""

from __future__ import annotations

import json
from pathlib import Path


def declared(*roots: str | Path, id: str = "test-set", licence: str = "CC0-1.0") -> list[dict]:
    """`ingest.sources` with one source holding `roots`."""
    return [{"id": id, "licence": licence, "origin": "written by the test", "roots": [str(r) for r in roots]}]


def declared_arg(*roots: str | Path, **kw) -> str:
    """The same as a command-line override (`ingest.sources=[...]`, JSON being YAML)."""
    return "ingest.sources=" + json.dumps(declared(*roots, **kw))
