"""Issue 21 case 7 (portable outputs): stored evaluations and an RL checkpoint's meta.json held absolute paths, so
a copied project's evaluate stage pointed `best.json` and the registry alias at the ORIGINAL project's checkpoints
(silently), and a moved project could not finish the stage ("no evaluated checkpoint exists any more" with every
checkpoint present). Every stored path is now relative to the folder of the file that holds it
(`vtg.io.relative_ref`: pointers, meta.json's `parent_checkpoint`, the store's results, the RL summary).

The project here is what the evaluate stage sees in a real one: relative paths from the project folder (the
params.yaml defaults), SFT and RL checkpoints, MLflow in a SQLite file inside the project."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.eval_fixtures import make_checkpoint, write_fixture_shards

from vtg import checkpoints

pytestmark = pytest.mark.slow  # 3 tiny checkpoints on val and test, then twice reused: ~40 s


def _cfg():
    """The params.yaml defaults' relative paths (cwd = the project). The MLflow URI is the project's own, made
    absolute only because MLflow keeps one store per URI in a process, and this test runs two projects in one."""
    from vtg.config import PipelineConfig

    return PipelineConfig.model_validate({
        "evaluate": {"shards_dir": "data/shards", "batch_size": 6, "max_new_tokens": 12, "device": "cpu",
                     "report_samples": 2, "baselines": []},
        "corpus": {"out_dir": "data/corpus"}, "tracking": {"tracking_uri": f"sqlite:///{Path.cwd() / 'mlflow.db'}"}})


def _project(root: Path) -> Path:
    write_fixture_shards(root / "data/shards")
    sft = [make_checkpoint(root / "checkpoints/sft", step, root / "data/shards", 0) for step in (2, 4)]
    rl_root = root / "checkpoints/rl"
    make_checkpoint(rl_root, 1, root / "data/shards", 0, extra_meta={
        "stage": "rl", "parent_step": 4,
        "parent_checkpoint": checkpoints.parent_ref(rl_root / checkpoints.step_dir_name(1), sft[1])})
    return root


def _registered_checkpoint(project: Path) -> Path:
    from mlflow import MlflowClient

    from vtg.lineage import TAG_CHECKPOINT

    uri = f"sqlite:///{project / 'mlflow.db'}"
    c = MlflowClient(uri, registry_uri=uri)
    cfg = _cfg()
    return Path(c.get_model_version_by_alias(cfg.tracking.registered_model, cfg.evaluate.registry_alias)
                .tags[TAG_CHECKPOINT])


def test_a_copied_then_moved_project_evaluates_its_own_checkpoints(tmp_path: Path, monkeypatch):
    from evaluation.stage import run_stage
    from training.lifecycle import lineage_parents

    a = _project(tmp_path / "a")
    monkeypatch.chdir(a)
    first = run_stage(_cfg())
    assert not any(v["reused"] for v in first["val"]) and len(first["val"]) == 3
    best = first["best_checkpoint_name"]  # every metric ties (untrained): the RL one, as the later stage
    stored = [json.loads(p.read_text()) for p in (a / "reports/eval_runs").glob("*/*/metrics.json")]
    assert stored and not any(Path(r["checkpoint"]).is_absolute() for r in stored)  # relative to the entry
    rl_meta = json.loads((a / "checkpoints/rl/step-000001/meta.json").read_text())
    assert rl_meta["parent_checkpoint"] == "../../sft/step-000004"

    # A copy, with the original still there: everything it names is its own, and nothing is evaluated again.
    b = tmp_path / "b"
    shutil.copytree(a, b)
    monkeypatch.chdir(b)
    second = run_stage(_cfg())
    assert all(v["reused"] for v in second["val"]) and second["test"]["reused"]
    assert checkpoints.read_pointer(b / "reports/eval/best.json")["path"] == b / "checkpoints" / best
    assert Path(second["best_checkpoint"]).resolve() == b / "checkpoints" / best
    assert _registered_checkpoint(b) == b / "checkpoints" / best  # a new version at the copy
    assert _registered_checkpoint(a) == a / "checkpoints" / best  # the original's registry untouched
    assert second["comparison"]["sft"]["checkpoint"] == "sft/step-000004"  # the RL parent, found in the copy
    assert lineage_parents(_cfg()) == [b / "checkpoints/sft/step-000004"]  # retention protects the copy's parent
    assert json.loads((b / "reports/eval/metrics.json").read_text()) == json.loads(
        (a / "reports/eval/metrics.json").read_text())

    # The original gone (the project was moved): the stage still finishes, on stored results.
    shutil.rmtree(a)
    third = run_stage(_cfg())
    assert all(v["reused"] for v in third["val"]) and third["best_checkpoint_name"] == best
    assert checkpoints.read_pointer(b / "reports/eval/best.json")["path"] == b / "checkpoints" / best


def test_paths_written_before_they_were_relative_still_read(tmp_path: Path):
    """Stores and metas from older runs hold absolute paths: they are read as they are."""
    from evaluation import store

    ck = make_checkpoint(tmp_path / "sft", 2, write_fixture_shards(tmp_path / "shards"), 0)
    rl = make_checkpoint(tmp_path / "rl", 1, tmp_path / "shards", 0,
                         extra_meta={"stage": "rl", "parent_checkpoint": str(ck), "parent_step": 2})
    assert checkpoints.parent_checkpoint(rl) == ck
    entry = tmp_path / "store/val/sft-step-000002-abc"
    entry.mkdir(parents=True)
    (entry / store.RESULT_FILE).write_text(json.dumps({"checkpoint": str(ck), "lineage": str(ck.parent)}))
    assert store.load_result(entry) == {"checkpoint": str(ck), "lineage": str(ck.parent)}
    store.save_result(entry, {"checkpoint": str(ck), "lineage": "0123abcd", "parent_checkpoint": None})
    assert json.loads((entry / store.RESULT_FILE).read_text())["checkpoint"] == "../../../sft/step-000002"
    assert store.load_result(entry)["checkpoint"] == str(ck) and store.load_result(entry)["lineage"] == "0123abcd"
