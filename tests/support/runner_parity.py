"""What the runner tests share: the fixture corpus's settings, a run moved aside, its outputs as bytes, and the
samples of its shards read back (a uniquely named module: tests/ has several conftest.py files)."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from beam_jobs import preprocess
from vtg.config import PipelineConfig
from vtg.shards import SampleMeta, member_key

SETTINGS = ("preprocess.max_window_s=6", "preprocess.samples_per_shard=1",
            "preprocess.split_fractions={train: 0.25, val: 0.2, test: 0.55}")
"""On `small_dataset`: five samples over all three splits, one per shard (so two shards in a split: their order
matters), near-duplicate and duplicate-query drops, dead letters."""
IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def run_into(cfg: PipelineConfig, beam_argv: list[str], dest: Path) -> dict:
    """`preprocess.run` (the CLI's and the flow's entry) with these Beam options; its whole `out_dir` is then
    moved to `dest`, so the next run starts from nothing. Returns the manifest."""
    manifest = preprocess.run(cfg, beam_argv, show=False)
    shutil.move(cfg.preprocess.out_dir, dest)
    return manifest


def outputs(root: Path) -> dict[str, bytes]:
    """Every file under `root` (shards, manifest, logs, plot) by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def differing(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    """Paths whose bytes differ or that only one side has (a readable assertion, not two byte dumps)."""
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def shard_samples(root: Path, manifest: dict) -> list[tuple[str, tuple[SampleMeta, list[bytes]]]]:
    """The (split, (meta, jpegs)) samples of a run's shards: what its Assemble step handed to WriteShards."""
    out = []
    for shard in manifest["shards"]:
        members: dict[str, dict[str, bytes]] = {}
        with tarfile.open(root / shard["path"]) as tar:
            for m in tar.getmembers():
                key, ext = member_key(m.name)
                members.setdefault(key, {})[ext] = tar.extractfile(m).read()
        for parts in members.values():
            meta = SampleMeta.model_validate_json(parts.pop("json"))
            out.append((shard["split"], (meta, [parts[name] for name in sorted(parts)])))
    return out
