"""Failure class 4 (issue 39), the docs half: every command block in README.md and docs/ says whether it runs here,
and the ones that can run are run, as written, at the tiny scale. Each ```bash block is preceded by a marker:

    <!-- commands: tiny -->                      run by this test, as written, in a tiny project
    <!-- commands: covered: tests/<file> ... --> run by the named test (that file must exist)
    <!-- commands: no: <reason> -->             cannot run on this machine (a GPU, a cluster, a failed run's id)

The README's two benchmark commands once scored every query 0.000 with rc 0 (only the ingest command carried
`ingest.sources`, and the benchmark counted "source not declared" as an unreadable video): now the benchmark
resolves every record's file before any work (an undeclared source is one line, rc 2), and the block is run
here, so it cannot drift from what works."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- commands: (tiny|covered: (tests/[^ ;,]+).*|no: .+) -->")


def blocks() -> list[tuple[str, int, str, str]]:
    """(file, line, marker or '', block text) of every ```bash block."""
    out = []
    for doc in DOCS:
        lines = doc.read_text().split("\n")
        for i, line in enumerate(lines):
            if line.startswith("```bash"):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                marker = lines[i - 1] if i and lines[i - 1].startswith("<!-- commands:") else ""
                out.append((doc.relative_to(REPO).as_posix(), i + 1, marker, "\n".join(lines[i + 1:end])))
    return out


def test_every_command_block_says_whether_it_runs_here():
    unmarked, missing = [], []
    for doc, line, marker, _ in blocks():
        m = MARKER.fullmatch(marker)
        if not m:
            unmarked.append(f"{doc}:{line}")
        elif m.group(2) and not (REPO / m.group(2)).is_file():
            missing.append(f"{doc}:{line} names {m.group(2)}")
    assert not unmarked and not missing, (unmarked, missing)


def _tiny_project(tmp_path: Path) -> Path:
    """A project with the repo's params, experiments and stage graph; a Charades-STA test file over three short
    videos in `Charades_v1_480/`; `reports/eval/best.json` naming a checkpoint of the tiny model."""
    from support.videokit import write_video

    from training.dist import rng_state
    from training.lifecycle import write_rank_state
    from vtg import checkpoints as ckpt
    from vtg.model.tiny import build_tiny_model

    p = tmp_path / "project"
    p.mkdir()
    for f in ("params.yaml", "dvc.yaml"):
        shutil.copy(REPO / f, p / f)
    shutil.copytree(REPO / "experiments", p / "experiments")
    videos = p / "Charades_v1_480"
    videos.mkdir()
    lines = []
    for i, vid in enumerate(("AO8RW", "Y6R7T", "KX5LM")):
        write_video(videos / f"{vid}.mp4", 24, fps=8.0, size=(64, 48), seed=i)
        lines.append(f"{vid} 0.5 2.0##a person opens a door {i}.")
    (p / "charades_sta_test.txt").write_text("\n".join(lines) + "\n")
    root = p / "checkpoints" / "sft"
    tmp = ckpt.temp_dir_for(root, 1)
    shutil.copytree(build_tiny_model(seed=0), ckpt.export_dir(tmp))
    ckpt.engine_dir(tmp).mkdir()
    write_rank_state(tmp, 0, {"run": {"step": 1}, "guard": {}, "rng": rng_state(), "num_workers": 0})
    step = ckpt.finalize(root, 1, {"data_version": "d", "git_commit": "c", "mlflow_run_id": None, "config_hash": "h",
                                   "finetune": "full", "base": "tiny", "world_size": 1}, {}, keep_last=3)
    ckpt.write_pointer(p / "reports" / "eval" / ckpt.BEST_POINTER, step)
    return p


def _run_block(project: Path, text: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "VTG_TINY_CACHE": str(REPO / ".cache" / "tiny_models"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=project, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


TINY = [b for b in blocks() if b[2] == "<!-- commands: tiny -->"]


@pytest.mark.slow
@pytest.mark.parametrize("block", TINY, ids=[f"{b[0]}:{b[1]}" for b in TINY])
def test_the_runnable_blocks_run_as_written(tmp_path, block):
    doc, line, _, text = block
    project = _tiny_project(tmp_path)
    r = _run_block(project, text)
    assert r.returncode == 0, f"{doc}:{line}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    if "evaluation.benchmark" in text:
        results = sorted((project / "reports" / "benchmark").glob("*/metrics.json"))
        assert len(results) == text.count("python -m evaluation.benchmark")  # one folder per profile, none lost
        import json

        for path in results:
            res = json.loads(path.read_text())
            assert res["summary"]["counts"] == {"records": 3, "scored": 3, "video_errors": 0}, path


def test_the_benchmark_without_the_source_is_one_line_before_any_work(tmp_path):
    """What the README's second command did without `"$SRC"`: every query scored 0.000, rc 0."""
    project = _tiny_project(tmp_path)
    src = ('SRC="ingest.sources=[{id: charades-sta, licence: LicenseRef-Charades-NonCommercial, origin: x, '
           'roots: [.]}]"\n')
    r = _run_block(project, src + 'python -m ingest ingest.annotations=[charades_sta_test.txt] '
                   'ingest.video_root=Charades_v1_480 ingest.out=data/benchmark/records.jsonl "$SRC"\n'
                   'python -m evaluation.benchmark --checkpoint reports/eval/best.json')
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (err,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert "charades-sta" in err and "ingest.sources" in err
    assert not (project / "reports" / "benchmark").exists()  # nothing scored, nothing written
