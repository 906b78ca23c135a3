"""Failure class 6 (issue 39): configuration is a contract. Every YAML reader of configuration refuses a key
given twice (both line numbers), an override replaces what it names, split fractions sum to 1, and a run asked
to stop before where its checkpoint already is refuses instead of reporting the longer model as done. Without
training; the paths: params.yaml, an experiment file, dvc.yaml, dvc.lock, a CLI override's value, the pools file."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ckptkit import fake_checkpoint, roots_config

from training.lifecycle import resume_source
from vtg import checkpoints as ckpt
from vtg.config import load_config
from vtg.errors import ConfigError, VTGError

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---- duplicate keys, on every reader -------------------------------------------------------------------------
def _params_dup(tmp_path: Path) -> None:
    load_config(_write(tmp_path / "params.yaml", "train:\n  lr: 0.1\n  seed: 1\n  lr: 0.5\n"))


def _experiment_dup(tmp_path: Path) -> None:
    _write(tmp_path / "experiments" / "e.yaml", "train:\n  lr: 0.1\n  lr: 0.5\n")
    load_config(_write(tmp_path / "params.yaml", "train:\n  seed: 1\n"), "e")


def _section_dup(tmp_path: Path) -> None:  # a whole section twice: the first one's keys would vanish
    load_config(_write(tmp_path / "params.yaml", "train:\n  lr: 0.1\ncorpus:\n  seed: 3\ntrain:\n  seed: 2\n"))


def _override_dup(tmp_path: Path) -> None:
    load_config(_write(tmp_path / "params.yaml", "train:\n  seed: 1\n"),
                overrides=["preprocess.split_fractions={train: 0.5, train: 0.5}"])


def _dvc_yaml_dup(tmp_path: Path) -> None:
    from vtg import stages

    _write(tmp_path / "dvc.yaml", "stages:\n  a:\n    cmd: x\n    cmd: y\n")
    stages.load_graph(tmp_path)


def _dvc_lock_dup(tmp_path: Path) -> None:
    from vtg import stages

    _write(tmp_path / "dvc.lock", "schema: '2.0'\nstages:\n  a: {}\n  a: {}\n")
    stages._read_lock(tmp_path)


def _pools_dup(tmp_path: Path) -> None:
    from infra.pools import load_pools

    load_pools(_write(tmp_path / "pools.yaml", "pools:\n  a:\n    type: process\n    type: docker\n"))


READERS = {"params.yaml": _params_dup, "experiment": _experiment_dup, "section": _section_dup,
           "override": _override_dup, "dvc.yaml": _dvc_yaml_dup, "dvc.lock": _dvc_lock_dup, "pools": _pools_dup}
LINES = {"params.yaml": (2, 4), "experiment": (2, 3), "section": (1, 5), "override": (1, 1), "dvc.yaml": (3, 4),
         "dvc.lock": (3, 4), "pools": (3, 4)}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path, reader):
    with pytest.raises(ConfigError) as e:
        READERS[reader](tmp_path)
    first, second = LINES[reader]
    assert f"lines {first} and {second}" in str(e.value) and "appears twice" in str(e.value)
    assert "\n" not in str(e.value)


# ---- an override replaces what it names ----------------------------------------------------------------------
def test_a_mapping_override_replaces_the_mapping():
    # merged into the default, val 0.2 would have been kept (and the sum 1.2 silently normalised)
    with pytest.raises(ConfigError, match=r"no share to val"):
        load_config(REPO / "params.yaml", None, ["preprocess.split_fractions={train: 0.9, test: 0.1}"])
    cfg = load_config(REPO / "params.yaml", None, ["preprocess.split_fractions={train: 0.8, val: 0.1, test: 0.1}"])
    assert cfg.preprocess.split_fractions == {"train": 0.8, "val": 0.1, "test": 0.1}


def test_an_experiment_file_replaces_a_mapping_field_and_merges_sections(tmp_path):
    _write(tmp_path / "experiments" / "e.yaml", "preprocess:\n  split_fractions: {train: 0.8, val: 0.2}\n"
                                                "train:\n  lr: 0.5\n")
    _write(tmp_path / "experiments" / "f.yaml", "preprocess:\n  split_fractions: {train: 0.7, val: 0.2, test: 0.1}\n"
                                                "train:\n  lr: 0.5\n")
    params = _write(tmp_path / "params.yaml", (REPO / "params.yaml").read_text())
    with pytest.raises(ConfigError, match=r"no share to test"):  # test 0.2 not merged in from params.yaml
        load_config(params, "e")
    cfg = load_config(params, "f")
    assert cfg.preprocess.split_fractions == {"train": 0.7, "val": 0.2, "test": 0.1}
    assert cfg.train.lr == 0.5 and cfg.train.seed == load_config(REPO / "params.yaml").train.seed  # merged


def test_a_dotted_override_inside_a_mapping_replaces_only_that_entry():
    default = load_config(REPO / "params.yaml").preprocess.runner_profiles
    cfg = load_config(REPO / "params.yaml", None, ["preprocess.runner_profiles.dataflow=[--project=p]"])
    assert cfg.preprocess.runner_profiles["dataflow"] == ["--project=p"]
    assert {k: v for k, v in cfg.preprocess.runner_profiles.items() if k != "dataflow"} == \
        {k: v for k, v in default.items() if k != "dataflow"}


@pytest.mark.parametrize("fractions", ["{train: 0.9, val: 0.2, test: 0.1}", "{train: 0.5, val: 0.2, test: 0.1}"])
def test_split_fractions_must_sum_to_one(fractions):
    with pytest.raises(ConfigError, match=r"split_fractions .* sum to 1\.2|sum to 0\.8"):
        load_config(REPO / "params.yaml", None, [f"preprocess.split_fractions={fractions}"])


# ---- a run asked to stop before where it is ------------------------------------------------------------------
def _cfg(tmp_path: Path, *overrides: str):
    return roots_config(tmp_path, *overrides)


def _checkpoint(root: Path, step: int, **meta) -> Path:
    return fake_checkpoint(root, step, **meta)


@pytest.mark.parametrize("section", ["train", "rl"])
@pytest.mark.parametrize("how", ["auto", "explicit"])
def test_max_steps_below_the_checkpoint_refuses_and_keeps_it(tmp_path, section, how):
    step = _checkpoint(tmp_path / ("sft" if section == "train" else "rl"), 30)
    extra = [f"{section}.resume={step}"] if how == "explicit" else []
    cfg = _cfg(tmp_path, f"{section}.max_steps=20", *extra)
    with pytest.raises(VTGError) as e:
        resume_source(cfg, section, f"{section}_hash", "k1", "d1")
    msg = str(e.value)
    assert f"{section}.max_steps=20 is below" in msg and "step 30" in msg and "\n" not in msg
    assert step.is_dir() and ckpt.is_complete(step, verify=True)  # kept, not moved


@pytest.mark.parametrize("fractions", ["{train: 1.0}", "{train: 0.8, val: 0.2, test: 0.0}"])
def test_every_split_a_stage_reads_needs_a_share(fractions):
    with pytest.raises(ConfigError, match=r"no share to"):
        load_config(REPO / "params.yaml", None, [f"preprocess.split_fractions={fractions}"])


def test_max_steps_at_the_checkpoint_is_done_not_an_error(tmp_path):
    step = _checkpoint(tmp_path / "sft", 30)
    assert resume_source(_cfg(tmp_path, "train.max_steps=30"), "train", "train_hash", "k1", "d1") == step
