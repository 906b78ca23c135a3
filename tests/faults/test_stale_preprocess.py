"""Issue 15 failure 4: the preprocess cache trusted a stale manifest. Here in a real git + DVC repository with the
stage graph's shape (preprocess writes `data/shards` with its manifest; train depends on it and persists its
checkpoints): after a shard is removed, or all of them (what a killed preprocess leaves: it clears the old shards
first and writes the manifest last, so the old manifest stays), `vtg.stages.status` (what the flow asks) and
`dvc status` both see preprocess and train as not done, training's shard check names the missing shards, and
`dvc repro` reruns preprocess (never `Cached`) without deleting a checkpoint. (The flow's own rerun after a
kill -9 is in test_kill9.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from beam_jobs.preprocess import _clear_outputs
from vtg import stages
from vtg.config import load_config
from vtg.shards import MANIFEST, verify_shards

pytestmark = pytest.mark.slow  # git + DVC: three `dvc repro`s
REPO = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).with_name("dvc"))
MAKE_SHARDS = """
import json, tarfile
from pathlib import Path
from vtg.io import file_digest
from vtg.shards import MANIFEST, SHARD_CONTRACT, data_version_of
from vtg.testing.shards import write_synthetic_shards

root = Path("data/shards")
write_synthetic_shards(root, n_train=4, n_val=2, shards_per_split=2, num_frames=2)
shards = []
for p in sorted(root.glob("*/shard-*.tar")):
    with tarfile.open(p) as t:
        n = sum(m.name.endswith(".json") for m in t.getmembers())
    shards.append({"split": p.parent.name, "path": f"{p.parent.name}/{p.name}", "samples": n,
                   "sha256": file_digest(p)})
(root / MANIFEST).write_text(json.dumps({"shards": shards, "data_version": data_version_of(shards),
                                          "shard_contract": SHARD_CONTRACT}))
"""
TRAIN = """
import pathlib, time
out = pathlib.Path("checkpoints")
out.mkdir(exist_ok=True)
(out / f"step-{time.time_ns()}").write_text(pathlib.Path("data/shards/manifest.json").read_text())
"""


def _run(cwd: Path, *cmd: str) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False,
                       env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "make_shards.py").write_text(MAKE_SHARDS)
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "preprocess": {"cmd": "python make_shards.py", "deps": ["make_shards.py"], "params": ["preprocess"],
                       "outs": ["data/shards"]},
        "train": {"cmd": "python train.py", "deps": ["data/shards", "train.py"], "params": ["train"],
                  "outs": [{"checkpoints": {"persist": True}}]}}}))
    _run(tmp_path, "git", "init", "-q")
    _run(tmp_path, DVC, "init", "-q")
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, DVC, "repro", "-q")
    return tmp_path


def _not_done(cfg) -> dict[str, list[str]]:
    st = {s: stages.status(s, cfg) for s in ("preprocess", "train")}
    return {s: v.reasons for s, v in st.items() if not v.up_to_date}


def test_stale_manifest_is_never_cached_and_checkpoints_stay(project: Path):
    cfg = load_config("params.yaml")
    assert _not_done(cfg) == {}
    [checkpoint] = (project / "checkpoints").iterdir()
    shards = project / "data" / "shards"
    manifest = (shards / MANIFEST).read_text()
    every = {f"{s}/shard-00000{i}.tar" for s in ("train", "val", "test") for i in (0, 1)}
    for damage, missing in (("one shard removed", {"train/shard-000001.tar"}), ("killed preprocess", every)):
        if damage == "one shard removed":
            (shards / "train" / "shard-000001.tar").unlink()
        else:
            _clear_outputs(str(shards))  # what preprocess does first; killed then, the old manifest stays
        assert (shards / MANIFEST).read_text() == manifest  # the manifest alone still says "done"

        not_done = _not_done(cfg)
        assert set(not_done) == {"preprocess", "train"}, damage
        assert any("data/shards" in r for r in not_done["preprocess"]), not_done
        problems = {p.shard for s in ("train", "val", "test") for p in verify_shards(shards, s) if p.kind == "missing"}
        assert problems == missing, damage  # and training stops before step 1 naming them

        # DVC agrees and rebuilds them (here from its run cache: same deps and params, same shards)
        out = _run(project, DVC, "repro")
        assert "Stage 'preprocess' didn't change" not in out, out
        assert "'preprocess' is cached - skipping run, checking out outputs" in out or \
            "Running stage 'preprocess'" in out, out
        assert _not_done(cfg) == {} and not verify_shards(shards, "train")
        assert checkpoint.exists() and checkpoint.read_text() == manifest  # never deleted
