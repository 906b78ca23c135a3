"""The embedded evaluator must die with its flow even inside a Prefect flow run, whose engine catches SIGTERM (the
parent-death signal `spawn` arranges) and then retries the dead flow's API server: found by the kill -9 suite
(`test_kill9.py`, flow killed while the evaluator evaluated a checkpoint: still running 20 s later). The
evaluator now asks for SIGKILL on parent death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.killkit import wait_until

REPO = Path(__file__).resolve().parents[2]
# a child of the flow that catches SIGTERM, as Prefect's engine does during a flow run
CHILD = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: print("SIGTERM caught: retrying the API server...", flush=True))
    if sys.argv[1] == "sigkill":
        from flows.stages import die_with_parent
        die_with_parent()
    print("ready", flush=True)
    time.sleep(120)
""")
PARENT = textwrap.dedent("""
    import sys, time
    from flows.stages import spawn
    child = spawn([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    print(child.pid, flush=True)
    time.sleep(120)
""")


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("death_signal", ["sigterm", "sigkill"])
def test_a_child_that_catches_sigterm_dies_with_its_parent_only_with_sigkill(death_signal):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, death_signal], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "ready"
        parent.kill()
        parent.wait()
        died = wait_until(lambda: _gone(child), 5)
        assert died == (death_signal == "sigkill")  # with spawn's SIGTERM alone it outlives its parent
    finally:
        for pid in (parent.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_evaluator_asks_for_sigkill_before_it_follows_the_queue(tmp_path, monkeypatch):
    from flows import evaluation

    calls = []
    monkeypatch.setattr(evaluation, "die_with_parent", lambda sig: calls.append(("die_with_parent", sig)))
    monkeypatch.setattr(evaluation, "follow", lambda queue: calls.append(("follow", queue)) or iter(()))
    assert evaluation._main(["--queue", str(tmp_path / "q.jsonl")]) == 0
    assert calls == [("die_with_parent", signal.SIGKILL), ("follow", tmp_path / "q.jsonl")]
