"""`vtg.model.tiny.build_once`, the cache every built model goes through (tiny models, taught bases, shape-true models,
tokenizers): two processes asking for the same build at once get one build. The flow relies on it: the train stage
may start while `training.prepare_base` still teaches the base in the background, and must wait for that teaching,
not repeat it beside it."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

from vtg.model.tiny import build_once


def _slow_build(out: str, log: str, who: str) -> None:
    def build_into(tmp: Path) -> None:
        with open(log, "a") as f:
            f.write(f"{who} builds\n")
        time.sleep(1.5)
        (tmp / "weights.bin").write_text(who)
        (tmp / "marker.json").write_text(json.dumps({"v": 1}))

    build_once(Path(out), "marker.json", {"v": 1}, build_into)


def test_two_processes_asking_at_once_get_one_build(tmp_path):
    out, log = tmp_path / "cache" / "model", tmp_path / "builds.log"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_slow_build, args=(str(out), str(log), who)) for who in ("first", "second")]
    for p in procs:
        p.start()
        time.sleep(0.3)  # the second asks while the first builds
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert log.read_text().splitlines() == ["first builds"]  # the second waited and found the first's build
    assert (out / "weights.bin").read_text() == "first" and json.loads((out / "marker.json").read_text()) == {"v": 1}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".model.") and p.is_dir()]  # no temp left


def test_a_stale_build_is_rebuilt_once(tmp_path):
    out, log = tmp_path / "model", tmp_path / "builds.log"
    out.mkdir()
    (out / "marker.json").write_text(json.dumps({"v": 0}))  # an older recipe's build
    _slow_build(str(out), str(log), "again")
    _slow_build(str(out), str(log), "not again")
    assert log.read_text().splitlines() == ["again builds"] and (out / "weights.bin").read_text() == "again"
