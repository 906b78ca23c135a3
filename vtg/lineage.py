"""Lineage vocabulary shared by every stage: MLflow tag names, digests, git commit.

The chain a user can walk back: source annotations + videos digest -> shard digest -> preprocess params ->
train run (params, commit) -> checkpoint -> eval metrics. Every stage tags its MLflow run with these keys.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from vtg.io import file_digest, tree_digest

# MLflow tag names (one place, so the lineage CLI can walk them).
TAG_STAGE = "vtg.stage"  # corpus | ingest | preprocess | train | evaluate | pipeline
TAG_GIT_COMMIT = "vtg.git_commit"
TAG_CONFIG_HASH = "vtg.config_hash"
TAG_SOURCE_DIGEST = "vtg.source_digest"  # annotations + videos that went into preprocess
TAG_DATA_VERSION = "vtg.data_version"  # shard digest (see `vtg.io.tree_digest`)
TAG_DATA_SOURCES = "vtg.data_sources"  # sources and licences of the training queries (`vtg.sources.describe`)
TAG_PREFECT_FLOW_RUN = "vtg.prefect_flow_run_id"
TAG_TRAIN_RUN = "vtg.train_run_id"  # on eval runs: the training run they evaluate
TAG_CHECKPOINT = "vtg.checkpoint"  # checkpoint path
TAG_STEP = "vtg.step"
TAG_PARENT_CHECKPOINT = "vtg.parent_checkpoint"  # on RL runs: the SFT checkpoint RL started from

# Set by the orchestrator so that stage processes open their MLflow runs as children of the pipeline run.
ENV_PARENT_RUN_ID = "VTG_MLFLOW_PARENT_RUN_ID"
ENV_PREFECT_FLOW_RUN_ID = "VTG_PREFECT_FLOW_RUN_ID"


def git_commit(cwd: str | Path | None = None) -> str:
    """Current commit (with `-dirty` when the work tree has changes), or `unknown` outside git."""
    env_commit = os.environ.get("VTG_GIT_COMMIT")
    if env_commit:
        return env_commit
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

# Set by the orchestrator for the training process: where the checkpoint hook reports saved checkpoints.
ENV_CHECKPOINT_QUEUE = "VTG_CHECKPOINT_QUEUE"  # jsonl file the embedded evaluator follows
ENV_CHECKPOINT_EVENTS = "VTG_CHECKPOINT_EVENTS"  # "1": also emit Prefect `checkpoint.saved` events
CHECKPOINT_EVENT = "checkpoint.saved"


def source_digest(paths: list[str | Path]) -> str:
    """Digest of the source annotations + videos (files and directories; a missing path counts as `missing`)."""
    h = hashlib.sha256()
    for p in map(Path, paths):
        d = tree_digest(p) if p.is_dir() else file_digest(p) if p.is_file() else "missing"
        h.update(f"{p.as_posix()}\0{d}\n".encode())
    return h.hexdigest()
