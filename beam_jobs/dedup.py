"""MinHash near-duplicate detection: shingles, signatures, LSH band keys, Jaccard verification, clusters.

Videos are shingled by pairs of per-frame perceptual codes (an LSH of the coarse colour layout) sampled at a
fixed rate of *source time*, so a re-encode, resize, brightness shift or small trim keeps most shingles;
queries by word n-grams. Band keys
(docs/environment.md: `(i, bytes(hv[i*r:(i+1)*r].byteswap().data))`) reproduce `datasketch.MinHashLSH` candidates
and are grouped by a Beam GroupByKey, so no process ever holds an index of the whole data set. Candidate pairs
are verified by exact Jaccard of their shingle sets; clusters (connected components of verified pairs) keep the
member with the smallest rank key as canonical.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence

import cv2
import numpy as np
from datasketch import MinHash


def frame_codes(thumbs: np.ndarray, projections: int, width: float, seed: int, grid: int = 4) -> np.ndarray:
    """(n, projections) integer codes per frame: a p-stable LSH of the frame's coarse colour layout.

    The grid x grid x 3 cell means, less their overall mean (so a brightness shift cancels), are projected on
    fixed random directions and quantized into buckets of `width` at random offsets: a re-encode or resize
    moves a projection by much less than a bucket, so most codes survive; different content lands elsewhere."""
    rng = np.random.default_rng(seed)
    dim = grid * grid * 3
    a = rng.normal(size=(projections, dim)) / np.sqrt(dim)
    b = rng.uniform(0, width, projections)
    x = np.stack([cv2.resize(t.astype(np.float32), (grid, grid), interpolation=cv2.INTER_AREA).ravel()
                  for t in thumbs])
    x -= x.mean(axis=1, keepdims=True)
    return np.floor((x @ a.T + b) / width).astype(np.int64)


def video_shingles(thumbs: np.ndarray, fps: float, hash_fps: float, lag: int, projections: int = 16,
                   width: float = 8.0, seed: int = 0) -> list[int]:
    """Sorted distinct 64-bit shingles (projection j, code now, code `lag` samples later), sampled every
    1/hash_fps seconds of source time: independent of the frame rate and of a trim (it is a set)."""
    n = len(thumbs)
    idx = sorted({min(n - 1, round(k * fps / hash_fps)) for k in range(int(n / fps * hash_fps) + 1)})
    codes = frame_codes(thumbs[idx], projections, width, seed)
    grams = set()
    for t in range(max(1, len(codes) - lag)):
        later = codes[t + lag] if t + lag < len(codes) else codes[t]
        grams.update((j, int(codes[t, j]), int(later[j])) for j in range(projections))
    return sorted(_h64(repr(g)) for g in grams)


_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def query_shingles(text: str, n: int) -> list[int]:
    w = words(text)
    grams = {tuple(w[i:i + n]) for i in range(max(1, len(w) - n + 1))} if w else {("",)}
    return sorted(_h64(" ".join(g)) for g in grams)


def _h64(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=8)
def _empty_minhash(num_perm: int, seed: int) -> MinHash:
    return MinHash(num_perm=num_perm, seed=seed)


def signatures(shingle_sets: Sequence[Sequence[int]], num_perm: int, seed: int) -> list[np.ndarray]:
    """MinHash hash values per shingle set: what datasketch `MinHash.bulk` computes (a copy of one initialised
    MinHash per set), with the initialised MinHash kept between calls, so one set at a time costs no more."""
    base = _empty_minhash(num_perm, seed)
    out = []
    for shingles in shingle_sets:
        m = base.copy()
        m.update_batch([s.to_bytes(8, "big") for s in shingles])
        out.append(m.hashvalues)
    return out


def band_keys(hashvalues: np.ndarray, bands: int) -> list[tuple[int, bytes]]:
    """LSH band keys; two items share a key iff `MinHashLSH` would make them candidates."""
    r = len(hashvalues) // bands
    return [(i, bytes(hashvalues[i * r:(i + 1) * r].byteswap().data)) for i in range(bands)]


def pack(shingles: Sequence[int]) -> bytes:
    """Shingles (unsigned 64-bit) as one bytes blob: Beam's coder copies bytes in one go, while it pickles every
    int >= 2^63 on its own (half of them; once per band key, that was most of the job's coding time)."""
    return np.asarray(shingles, np.uint64).tobytes()


def unpack(blob: bytes) -> list[int]:
    return np.frombuffer(blob, np.uint64).tolist()


def jaccard(a: Iterable[int], b: Iterable[int]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa or sb else 1.0


def candidate_pairs(ids: Iterable[str]) -> list[tuple[str, str]]:
    """All unordered pairs of distinct ids in one LSH bucket, each as (smaller, larger)."""
    ids = sorted(set(ids))
    return [(a, b) for i, a in enumerate(ids) for b in ids[i + 1:]]


def resolve_clusters(edges: Iterable[tuple[str, str]], rank: dict[str, tuple]) -> dict[str, str]:
    """Connected components of verified edges -> {member: canonical}; canonical = smallest rank key (then id).
    Only members of non-trivial clusters appear. Order of `edges` does not matter."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[str]] = {}
    for x in list(parent):
        groups.setdefault(find(x), []).append(x)
    out = {}
    for members in groups.values():
        canon = min(members, key=lambda m: (rank.get(m, ()), m))
        out.update({m: canon for m in members})
    return out
