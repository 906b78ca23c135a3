"""Content keys: what a finished step's output depends on, by content (never by run id or call arguments).

A task's cache key is the hash of its `content` argument, built here from the digests of its input files,
the hash of the config section that shapes it, and a digest of the stage's code. A retried or repeated flow run
whose step has the same content key reuses the persisted result instead of running the stage again.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext
from prefect.utilities.hashing import hash_objects

from vtg.config import PipelineConfig, config_hash
from vtg.lineage import file_digest, tree_digest


def code_digest(module: str) -> str:
    """Digest of a stage's code: every .py file of its top-level package (or the module file)."""
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or spec.origin is None:
        return "missing"
    origin = Path(spec.origin)
    if origin.name == "__init__.py":
        return tree_digest(origin.parent, "**/*.py")[:16]
    return file_digest(origin)[:16]


def paths_digest(paths: list[str | Path]) -> str:
    """Digest of files and directories (missing paths count as `missing`, so they differ from present ones)."""
    h = hashlib.sha256()
    for p in map(Path, paths):
        d = tree_digest(p) if p.is_dir() else file_digest(p) if p.is_file() else "missing"
        h.update(f"{p.as_posix()}\0{d}\n".encode())
    return h.hexdigest()


def source_digest(cfg: PipelineConfig) -> str:
    """The source annotations + videos that go into preprocessing."""
    return paths_digest([*cfg.ingest.annotations, cfg.ingest.video_root])


def shard_digest(cfg: PipelineConfig) -> str:
    """The data version: every file under the shard root (tars, manifest, dead letters)."""
    return tree_digest(cfg.preprocess.out_dir)


@dataclass(frozen=True)
class StageContent:
    """Everything a stage's output depends on; its hash is the task's cache key."""

    stage: str
    config: str  # hash of the config section(s) that shape the output
    inputs: str  # digest of the input files
    code: str  # digest of the stage's code

    def key(self) -> str:
        return hash_objects(self.stage, self.config, self.inputs, self.code) or ""


def stage_content(cfg: PipelineConfig, stage: str, inputs_digest: str = "", *sections: Any) -> StageContent:
    module = getattr(cfg.orchestration.stages, stage)
    return StageContent(stage, "/".join(config_hash(s) for s in sections), inputs_digest, code_digest(module))


@dataclass
class ContentKey(CachePolicy):
    """Cache policy: the key is the hash of the task's `content` argument (a `StageContent`), nothing else."""

    def compute_key(self, task_ctx: TaskRunContext, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        content = inputs.get("content")
        return f"vtg-{content.stage}-{content.key()}" if isinstance(content, StageContent) else None


CONTENT_KEY = ContentKey()
