"""The stage graph (`vtg.stages`): dvc.yaml read once, and "is this stage done?" answered from dvc.lock the same
way for `dvc repro` and the flow, in a real git + DVC repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vtg import stages
from vtg.config import load_config

REPO = Path(__file__).resolve().parents[1]
DVC = str(Path(sys.executable).with_name("dvc"))
STAGE_CMD = ("python -c \"import yaml, pathlib; p = yaml.safe_load(open('params.yaml'))['train']; "
             "pathlib.Path('ckpt').mkdir(exist_ok=True); pathlib.Path('ckpt/lr').write_text(str(p['lr']))\"")


def _run(cwd: Path, *cmd: str) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False,
                       env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "step.py").write_text("x = 1\n")
    (tmp_path / "params.yaml").write_text("train:\n  lr: 0.1\n  progress: true\n")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": {
        "cmd": STAGE_CMD, "deps": ["code"], "params": ["train"], "outs": [{"ckpt": {"persist": True}}]}}}))
    _run(tmp_path, "git", "init", "-q")
    _run(tmp_path, DVC, "init", "-q")
    shutil.copy(REPO / ".dvcignore", tmp_path / ".dvcignore")  # the shipped one
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_shipped_graph_declares_code_deps_and_persistent_checkpoints():
    graph = stages.load_graph(REPO)
    cfg = load_config(REPO / "params.yaml")
    assert list(graph) == ["corpus", "ingest", "annotate", "preprocess", "train", "select", "rl", "evaluate"]
    assert "vtg/answer.py" in graph["train"].code_paths(REPO) and "training" in graph["train"].code_paths(REPO)
    assert graph["preprocess"].code_paths(REPO) == (
        "beam_jobs", "vtg/shards.py", "vtg/records.py", "vtg/sources.py", "vtg/splits.py")
    assert "data/shards" not in graph["train"].code_paths(REPO)
    assert graph["train"].persist == (cfg.train.out_dir,) == ("checkpoints/sft",)
    assert graph["rl"].persist == (cfg.rl.out_dir,) == ("checkpoints/rl",)
    assert graph["rl"].cmd == f"python -m {stages.stage_module('rl', cfg, REPO)}" == "python -m training.rl"
    assert cfg.train.out_dir in graph["rl"].deps and graph["rl"].params[:2] == ("rl", "orchestration.rl")
    assert "reports/select/start.json" in graph["rl"].deps and "reports/select/start.json" in graph["select"].outs
    assert {"reports/rl/steps.csv", "reports/rl/summary.json"} <= set(graph["rl"].outs)
    assert {cfg.train.out_dir, cfg.rl.out_dir} <= set(graph["evaluate"].deps)
    assert "reports/eval/best.json" in graph["evaluate"].outs
    assert {"orchestration.rl", "evaluate"} <= set(graph["evaluate"].params)
    outs = [o for st in graph.values() for o in st.outs]  # no output inside another stage's output
    assert not [(a, b) for a in outs for b in outs if a != b and Path(b).is_relative_to(a)]
    made = set()  # every dep is an earlier stage's output or is in the repository (a renamed module breaks repro)
    for name, st in graph.items():
        assert [d for d in st.deps if not any(Path(d).is_relative_to(o) for o in made) and not (REPO / d).exists()
                ] == [], name
        made |= set(st.outs)
    for name, st in graph.items():  # every params entry is a config section or a dotted config field
        for key in st.params:
            node = cfg
            for part in key.split("."):
                assert part in type(node).model_fields, (name, key)
                node = getattr(node, part)


def test_code_digest_follows_the_code_deps(repo: Path):
    before = stages.code_digest("train", repo)
    (repo / "code" / "step.py").write_text("x = 2\n")
    assert stages.code_digest("train", repo) != before


def test_status_agrees_with_dvc_and_ignores_only_fields_that_do_not_change_the_output(repo: Path):
    cfg = load_config("params.yaml")
    assert "not in dvc.lock" in str(stages.status("train", cfg))
    _run(repo, DVC, "repro", "-q")
    assert stages.status("train", cfg).up_to_date
    assert stages.status("train", load_config("params.yaml", None, ["train.progress=false"])).up_to_date
    changed = stages.status("train", load_config("params.yaml", None, ["train.lr=0.5"]))
    assert not changed.up_to_date and "param train.lr changed" in changed.reasons
    (repo / "code" / "step.py").write_text("x = 2\n")
    st = stages.status("train", cfg)
    assert not st.up_to_date and any("code" in r for r in st.reasons)
    _run(repo, DVC, "repro", "-q")
    (repo / "ckpt" / "lr").write_text("tampered")
    st = stages.status("train", cfg)
    assert not st.up_to_date and any("outs ckpt" in r for r in st.reasons)


def test_bytecode_a_process_writes_into_a_code_dep_changes_nothing(repo: Path):
    """Python writes `__pycache__/*.pyc` beside every module a process imports (make's targets let it: Makefile), so
    a stage's code deps gain files after other stages ran; the shipped .dvcignore keeps them out of the deps."""
    cfg = load_config("params.yaml")
    _run(repo, DVC, "repro", "-q")
    digest = stages.code_digest("train", repo)
    (repo / "code" / "__pycache__").mkdir()
    (repo / "code" / "__pycache__" / "step.cpython-311.pyc").write_bytes(b"\x00bytecode")
    (repo / "code" / "stray.pyc").write_bytes(b"\x00")
    assert stages.status("train", cfg).up_to_date and stages.code_digest("train", repo) == digest
    assert "up to date" in _run(repo, DVC, "status")


def test_record_writes_the_params_the_outputs_were_made_from(repo: Path):
    override = load_config("params.yaml", None, ["train.lr=0.5"])
    (repo / "ckpt").mkdir()
    (repo / "ckpt" / "lr").write_text("0.5")
    stages.record("train", override)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["train"]
    assert lock["params"]["params.yaml"]["train"]["lr"] == 0.5 and lock["outs"][0]["path"] == "ckpt"
    assert stages.status("train", override).up_to_date  # the same override: done
    assert not stages.status("train", load_config("params.yaml")).up_to_date
    assert "train" in _run(repo, DVC, "status", "train")  # DVC agrees: params.yaml says otherwise
    _run(repo, DVC, "repro", "-q")  # rebuilt from params.yaml
    assert (repo / "ckpt" / "lr").read_text() == "0.1" and stages.status("train", load_config("params.yaml")).up_to_date
    # a field that does not change the output: the flow records params.yaml's value, so `dvc status` stays clean
    quiet = load_config("params.yaml", None, ["train.progress=false"])
    (repo / "params.yaml").write_text("train:\n  lr: 0.1\n  progress: false\n")
    assert stages.status("train", quiet).up_to_date and stages.sync_params("train", quiet)
    assert "up to date" in _run(repo, DVC, "status").lower() or _run(repo, DVC, "status").strip() == ""


def test_a_dotted_param_is_one_field_compared_and_recorded_like_a_section(repo: Path):
    (repo / "params.yaml").write_text("train:\n  lr: 0.1\norchestration:\n  rl: true\n  task_retries: 2\n")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": {
        "cmd": STAGE_CMD, "deps": ["code"], "params": ["train", "orchestration.rl"], "outs": ["ckpt"]}}}))
    _run(repo, DVC, "repro", "-q")
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["train"]["params"]["params.yaml"]
    assert lock["orchestration.rl"] is True and "orchestration" not in lock  # DVC records the dotted key itself
    assert stages.status("train", load_config("params.yaml")).up_to_date
    # another field of the same section is not the stage's param
    assert stages.status("train", load_config("params.yaml", None, ["orchestration.task_retries=0"])).up_to_date
    off = load_config("params.yaml", None, ["orchestration.rl=false"])
    st = stages.status("train", off)
    assert not st.up_to_date and st.reasons == ["param orchestration.rl changed"]
    stages.record("train", off)  # the flow ran with the override: the lock says what ran
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["train"]["params"]["params.yaml"]
    assert lock["orchestration.rl"] is False and lock["train"]["lr"] == 0.1
    assert stages.status("train", off).up_to_date and not stages.status("train", load_config("params.yaml")).up_to_date
    assert "orchestration.rl" in _run(repo, DVC, "status", "train")  # DVC reads the same lock entry
    assert not stages.sync_params("train", off)  # already what ran: nothing to rewrite
