"""Fixtures for the training tests: each family's tiny model and tiny fixture shards honouring the shard contract
(the cached tiny model on disk, `tiny_model_dir`, and its tokenizer are in tests/conftest.py: tests/vtg/model uses
them too)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[2] / ".cache" / "torch_extensions"))

from support.train_fixtures import write_fixture_shards


@pytest.fixture(scope="module")
def tiny():
    """Each family's tiny model (trainable, fp32, seed 0) and tokenizer, loaded once per module: `tiny("qwen3_vl")`."""
    import torch

    from vtg.model.modeling import load_model_and_tokenizer

    cache: dict = {}

    def get(family: str):
        if family not in cache:
            torch.manual_seed(0)
            cache[family] = load_model_and_tokenizer("tiny" if family == "qwen2_5_vl" else f"tiny-{family}",
                                                     dtype=torch.float32, trainable=True)
        return cache[family]

    return get


@pytest.fixture(scope="session")
def shards_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    write_fixture_shards(root, n_train=24, n_val=6, shards_per_split=2)
    return root


@pytest.fixture(scope="session")
def clock_project(tmp_path_factory) -> dict:
    """Issue 35: a variable-frame-rate video and a late-starting constant-rate one with known presentation times,
    through the real ingest and preprocess (`support.clock_fixtures.build_project`, ~10 s)."""
    from support.clock_fixtures import build_project

    return build_project(tmp_path_factory.mktemp("clock"))
