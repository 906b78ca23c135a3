"""Leak-free partitioning: a split is a pure function of the partition key (video or duplicate cluster). The one
home of the rule: preprocess assigns splits with it, the annotate stage keeps its teaching and withheld videos in
train with it.

The key is hashed to a point in [0, 1) and the splits own consecutive intervals in a fixed order, so adding
videos never moves old ones, and every member of a near-duplicate cluster shares the canonical member's key.
"""

from __future__ import annotations

import hashlib

SPLIT_ORDER = ("train", "val", "test")


def stable_fraction(key: str) -> float:
    """A stable hash of `key` in [0, 1)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def split_of(partition_key: str, fractions: dict[str, float]) -> str:
    names = [s for s in SPLIT_ORDER if s in fractions] + sorted(set(fractions) - set(SPLIT_ORDER))
    total = sum(fractions[s] for s in names)
    x = stable_fraction("split:" + partition_key) * total
    acc = 0.0
    for name in names:
        acc += fractions[name]
        if x < acc:
            return name
    return names[-1]
