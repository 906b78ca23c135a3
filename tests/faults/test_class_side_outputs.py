"""Failure class 2 (issue 39): side commands never write what a stage owns. The README's benchmark ingest command
(`python -m ingest ... ingest.out=data/benchmark/records.jsonl`) left `ingest.dead_letter` and `ingest.summary` at
their defaults and emptied the training ingest's dead letters; a second benchmark run on other records, or of
another checkpoint at the same step, overwrote the first's results; `ingest.annotations=[]` rewrote the records
file empty before its error. The mechanism: `vtg.stages.side_outputs` (a stage CLI whose primary output is not the
stage's declared out writes its other outputs beside that output, never over any stage's outs; the flow reads
them from the same function), results keyed by what they were computed from, and nothing written before the
command knows it succeeds. Each CLI runs here in a project whose every dvc.yaml out exists (a sentinel), and
no sentinel may change unless the CLI is that stage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vtg.stages import SIDE_OUTPUTS, load_graph

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """dvc.yaml and params.yaml of the repo; every declared out that is a file holds a sentinel."""
    for f in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / f, tmp_path / f)
    for st in load_graph(tmp_path).values():
        for out in st.outs:
            p = tmp_path / out
            if p.suffix:  # a file out
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(f"sentinel of {st.name}: {out}\n")
    videos = tmp_path / "bench_videos"
    videos.mkdir()
    (videos / "v1.mp4").write_bytes(b"stand-in")
    return tmp_path


def _sentinels(root: Path) -> dict[str, str]:
    return {o: (root / o).read_text() for st in load_graph(root).values() for o in st.outs
            if (root / o).is_file()}


def _run(project: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "VTG_TINY_CACHE": str(REPO / ".cache" / "tiny_models")}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


SOURCES = "ingest.sources=[{id: bench, licence: CC-BY-4.0, origin: test, roots: [.]}]"


def _native(project: Path, rows: list[dict]) -> Path:
    ann = project / "bench_ann.jsonl"
    ann.write_text("".join(json.dumps({"query": "a person opens a door", "windows": [[0.5, 1.5]],
                                       "duration_s": 5.0, **r}) + "\n" for r in rows))
    return ann


def test_the_readme_benchmark_ingest_leaves_the_ingest_stage_outs_alone(project):
    before = _sentinels(project)
    ann = _native(project, [{"video_id": "v1", "annotation_id": "a"}, {"video_id": "gone", "annotation_id": "b"}])
    r = _run(project, "ingest", f"ingest.annotations=[{ann.name}]", "ingest.video_root=bench_videos",
             "ingest.out=data/benchmark/records.jsonl", SOURCES)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _sentinels(project) == before
    side = project / "data" / "benchmark"
    assert len((side / "records.jsonl").read_text().splitlines()) == 1
    assert json.loads((side / "records.dead_letter.jsonl").read_text())["annotation_id"] == "b"
    assert json.loads((side / "records.summary.json").read_text())["records"] == 1


@pytest.mark.parametrize("args", [["ingest.annotations=[]"],  # a configuration error, before any work
                                  ["ingest.annotations=[bench_ann.jsonl]", "ingest.video_root=bench_videos",
                                   SOURCES]])  # nothing usable: refused after reading, before writing
def test_a_failing_ingest_truncates_nothing(project, args):
    _native(project, [{"video_id": "gone", "annotation_id": "b"}])
    before = _sentinels(project)
    r = _run(project, "ingest", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert _sentinels(project) == before  # the stage's own records, dead letters and summary too
    if len(args) > 1:
        (failed,) = (project / "data" / "interim").glob("ingest-failed-*")
        assert json.loads((failed / "ingest_dead_letter.jsonl").read_text())["annotation_id"] == "b"
        assert str(failed) in r.stderr or failed.name in r.stderr


def test_annotate_as_a_side_command_leaves_the_annotate_stage_outs_alone(project):
    records = project / "side" / "records.jsonl"
    records.parent.mkdir()
    records.write_text("")
    before = _sentinels(project)
    r = _run(project, "annotate", f"annotate.records={records}", "annotate.out=side/annotated.jsonl")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _sentinels(project) == before
    assert (project / "side" / "annotated.summary.json").is_file()


def test_the_stage_itself_still_writes_its_outs(project):
    """The rule moves nothing for the stage: the flow and `dvc repro` write the declared outs."""
    from vtg.config import load_config
    from vtg.stages import stage_outputs

    cfg = load_config(project / "params.yaml")
    cwd = Path.cwd()
    os.chdir(project)
    try:
        for name in SIDE_OUTPUTS:
            assert stage_outputs(name, cfg) == getattr(cfg, name)
    finally:
        os.chdir(cwd)


def test_benchmark_results_are_keyed_by_their_inputs(tmp_path):
    from evaluation.benchmark import _out_dir
    from vtg.config import load_config

    cfg = load_config(REPO / "params.yaml", None, [f"benchmark.out_dir={tmp_path}"])

    def result(records: str, records_digest: str, meta: str) -> dict:
        return {"checkpoint": "sft/step-000100", "profile": "full_video",
                "inputs": {"records": records, "records_digest": records_digest, "checkpoint_meta_digest": meta}}

    first = _out_dir(result("data/benchmark/records.jsonl", "r1", "m1"), cfg)
    assert first == _out_dir(result("data/benchmark/records.jsonl", "r1", "m1"), cfg)  # a rerun: the same place
    assert first != _out_dir(result("data/benchmark/records.jsonl", "r2", "m1"), cfg)  # other records
    assert first != _out_dir(result("data/benchmark/records.jsonl", "r1", "m2"), cfg)  # another run's step 100
    assert _out_dir(result("other.jsonl", "r1", "m1"), cfg).name.startswith("sft-step-000100-full_video-other-")


def test_every_stage_cli_with_several_outputs_uses_the_rule():
    """A stage whose declared outs are not all under its primary output folder lists itself in SIDE_OUTPUTS, and
    its CLI runs with `stage_outputs` (corpus, preprocess and train write one folder; evaluate has no side
    command that writes its outs: `python -m evaluation --checkpoint` writes to the store and `--out`; select writes
its two files into `evaluate.select_dir` and has no side command)."""
    graph = load_graph(REPO)
    for name in SIDE_OUTPUTS:
        pkg = {"rl": "training/rl"}.get(name, name)
        assert f'stage_outputs("{name}"' in (REPO / pkg / "__main__.py").read_text(), name
    several = {n for n, st in graph.items() if len(st.outs) > 1}
    for name in several - set(SIDE_OUTPUTS):  # every out in the one folder the stage's CLI is told to write
        assert len({Path(o).parent for o in graph[name].outs}) == 1, name
    assert several - set(SIDE_OUTPUTS) == {"select", "evaluate"}  # evaluate.select_dir / out_dir hold all of theirs
