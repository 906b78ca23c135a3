"""A stage sees only what it declares (issue 36 item 3): each stage CLI runs with the view of the config that its
dvc.yaml record declares (`vtg.config.view`), so a field a stage reads can never go unwatched by the two doors.

The real stages run under their views in the front-door tests (`dvc repro` and `make run` on the real stages at a
tiny scale: tests/flows/test_front_doors.py, tests/flows/test_make_run.py): a stage that read an undeclared field
would fail there with the error tested here. The fields that stages read without declaring before this change
are now declared (their change reruns the stage) or no longer read (`evaluate.select_metric` in RL).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from vtg import stages
from vtg.config import config_hash, load_config
from vtg.config.view import UndeclaredConfig, declared_view, unguarded

REPO = Path(__file__).resolve().parents[1]

READ_UNDECLARED_BEFORE = {
    # stage: fields it read without declaring them (found by running every stage under its view)
    "annotate": ["train.teach.steps", "evaluate.forgetting.num_frames", "evaluate.forgetting.frame_size"],
    "preprocess": ["ingest.sources"],
    "train": ["evaluate.forgetting.num_frames", "evaluate.forgetting.frame_size", "ingest.max_query_tokens",
              "preprocess.num_frames", "preprocess.frame_fps", "preprocess.frame_mode", "preprocess.max_window_s",
              "preprocess.frame_size"],
    "rl": ["evaluate.max_new_tokens", "engine.strategy", "engine.precision", "engine.deterministic",
           "engine.offload_optimizer", "engine.offload_param", "train.shards_dir", "train.data.split"],
    "evaluate": ["ingest.sources"],
}
"""What each stage read outside its declared params before issue 36, and now declares."""

CHANGED = {"train.teach.steps": 7, "evaluate.forgetting.num_frames": 4, "evaluate.forgetting.frame_size": 32,
           "ingest.sources": [{"id": "other", "licence": "CC0-1.0", "origin": "a test", "roots": ["elsewhere"]}],
           "ingest.max_query_tokens": 33, "preprocess.num_frames": 4, "preprocess.frame_fps": 3.0,
           "preprocess.frame_mode": "family", "preprocess.max_window_s": 9.0, "preprocess.frame_size": 48,
           "evaluate.max_new_tokens": 9, "engine.strategy": "fsdp", "engine.precision": "bf16",
           "engine.deterministic": True, "engine.offload_optimizer": True, "engine.offload_param": True,
           "train.shards_dir": "data/other", "train.data.split": "val", "evaluate.select_metric": "miou"}


ALSO = {"engine.offload_param": ["train.zero_stage=3", "rl.zero_stage=3"]}
"""Overrides a change needs to validate (parameter offload is ZeRO-3's, for SFT and RL alike)."""


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _override(key: str, value) -> str:
    import json

    return f"{key}={json.dumps(value)}"


def test_a_view_refuses_an_undeclared_read_in_one_line_naming_dvc_yaml():
    cfg = load_config(REPO / "params.yaml")
    view = declared_view(cfg, "rl", ("rl", "orchestration.rl", "evaluate.max_new_tokens"))
    assert view.rl.lr == cfg.rl.lr and view.orchestration.rl is True and view.evaluate.max_new_tokens == 16
    assert view.evaluate.out_dir == cfg.evaluate.out_dir  # NOT_OUTPUT: a path cannot change an output
    assert view.tracking.tracking_uri == cfg.tracking.tracking_uri  # where results are logged
    for dotted in ("evaluate.select_metric", "evaluate.forgetting.min_for_selection", "train.lr", "corpus.seed"):
        with pytest.raises(UndeclaredConfig) as e:
            _get(view, dotted)
        msg = str(e.value)
        assert f"the rl stage read {dotted}," in msg and "dvc.yaml" in msg and "\n" not in msg
    # the same config otherwise: hashes, dumps, a pickle (Beam and loader workers) and the plain config behind it
    assert config_hash(view) == config_hash(cfg) and view.model_dump() == cfg.model_dump()
    assert type(pickle.loads(pickle.dumps(view.train))) is type(cfg.train)
    assert unguarded(view).evaluate.select_metric == cfg.evaluate.select_metric
    copy = view.model_copy(update={"rl": view.rl})
    with pytest.raises(UndeclaredConfig):
        _get(copy, "train.lr")


@pytest.mark.parametrize("name", sorted(stages.load_graph(REPO)))
def test_every_stage_reads_its_declared_params_and_only_those(name: str):
    """Every field a stage declares is readable under its view; a field of a section it declares nothing of is
    refused (unless NOT_OUTPUT)."""
    cfg = load_config(REPO / "params.yaml")
    st = stages.stage(name, REPO)
    view, declared = stages.stage_view(name, cfg, REPO)
    assert declared == st.params
    for dotted in st.params:
        assert _get(view, dotted) == _get(cfg, dotted)
    untouched = [s for s in ("corpus", "ingest", "annotate", "preprocess", "engine", "train", "rl", "evaluate")
                 if not any(p == s or p.startswith(s + ".") for p in st.params)]
    for section in untouched:
        output_fields = [f for f, info in type(getattr(cfg, section)).model_fields.items()
                         if not (isinstance(info.json_schema_extra, dict)
                                 and info.json_schema_extra.get("vtg_output") == "none")
                         and not hasattr(getattr(cfg, section).__dict__[f], "model_fields")]
        with pytest.raises(UndeclaredConfig):
            _get(view, f"{section}.{output_fields[0]}")


@pytest.mark.parametrize(("name", "field"), [(s, f) for s, fs in READ_UNDECLARED_BEFORE.items() for f in fs])
def test_a_field_a_stage_read_without_declaring_now_reruns_it(name: str, field: str):
    """What both doors compare (`vtg.stages.status` for the flow, the params DVC records in dvc.lock): the
    stage's declared params in the resolved config. Changing the field changes them, so the stage reruns."""
    st = stages.stage(name, REPO)
    before = load_config(REPO / "params.yaml")
    after = load_config(REPO / "params.yaml", None, [_override(field, CHANGED[field]), *ALSO.get(field, [])])
    assert _get(after, field) != _get(before, field)
    assert stages._current_views(before, st.params) != stages._current_views(after, st.params), (name, field)
    _get(stages.stage_view(name, after, REPO)[0], field)  # and it reads it under its view


def test_rl_no_longer_reads_the_selection_settings_the_select_stage_declares_them():
    """`evaluate.select_metric` changed RL's start without rerunning it; RL now reads the select stage's pointer
    (a dep), and the select stage declares the evaluation settings."""
    cfg = load_config(REPO / "params.yaml")
    rl = stages.stage("rl", REPO)
    select = stages.stage("select", REPO)
    view, _ = stages.stage_view("rl", cfg, REPO)
    for field in ("evaluate.select_metric", "evaluate.forgetting.min_for_selection"):
        with pytest.raises(UndeclaredConfig):
            _get(view, field)
    assert "evaluate" in select.params and "reports/select/start.json" in rl.deps
    assert "reports/select/start.json" in select.outs and "evaluation" not in rl.deps
    changed = load_config(REPO / "params.yaml", None, ["evaluate.select_metric=miou"])
    assert stages._current_views(cfg, select.params) != stages._current_views(changed, select.params)
    assert stages._current_views(cfg, rl.params) == stages._current_views(changed, rl.params)


def test_every_stage_cli_runs_under_its_view():
    """Each stage's module (dvc.yaml `cmd`) resolves its view: its --dry-run says what the stage reads."""
    for name, st in stages.load_graph(REPO).items():
        module = stages.stage_module(name, load_config(REPO / "params.yaml"), REPO)
        r = subprocess.run([sys.executable, "-m", module, "--dry-run"], cwd=REPO, capture_output=True, text=True,
                           timeout=120, check=False)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        assert f"# the {name} stage reads only: {', '.join(st.params)} (dvc.yaml)" in r.stdout, (name, r.stdout[-500:])


def test_the_engine_section_reruns_and_rekeys_both_training_stages():
    """`engine` (strategy, precision, determinism, offload) is what SFT and RL share: both declare it, so a change
    reruns both through both doors, and both run keys cover it (a checkpoint of another engine is not resumed);
    a run-length change still resumes."""
    from training.rl.grpo import rl_hash
    from training.sft import train_hash

    before = load_config(REPO / "params.yaml")
    after = load_config(REPO / "params.yaml", None, ["engine.precision=bf16"])
    for name in ("train", "rl"):
        st = stages.stage(name, REPO)
        assert "engine" in st.params
        assert stages._current_views(before, st.params) != stages._current_views(after, st.params), name
        assert stages.stage_view(name, after, REPO)[0].engine.precision == "bf16"
    assert train_hash(before) != train_hash(after) and rl_hash(before, "p") != rl_hash(after, "p")
    longer = load_config(REPO / "params.yaml", None, ["train.max_steps=7", "rl.max_steps=7"])
    assert train_hash(before) == train_hash(longer) and rl_hash(before, "p") == rl_hash(longer, "p")
