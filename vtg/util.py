"""Small data helpers shared by every stage."""

from __future__ import annotations

from typing import Any


def flatten(d: dict, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Nested dicts as one level of `sep`-joined keys (`{"a": {"b": 1}}` -> `{"a.b": 1}`), leaves untouched.

    `prefix` (when given) is joined to every key with `sep`: `flatten({"lr": 1}, "train")` -> `{"train.lr": 1}`.
    An empty nested dict contributes no key."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key, sep))
        else:
            out[key] = v
    return out


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display), imported at the first plot: 1-2 s of import
    that a process which only scores or trains never pays (every evaluation process imports the report module)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
