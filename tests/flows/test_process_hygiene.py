"""Process hygiene: nothing the flow starts outlives it (SIGKILL, SIGINT), each child runs in its own process
group and dies with its parent, and one trainer per checkpoint folder (the folder lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from support.flowkit import PY, STANDIN_OVERRIDES, make_project, project_env
from support.killkit import wait_until

from vtg.checkpoint_lock import LOCK_FILE, CheckpointLock, lock_checkpoint_root
from vtg.errors import VTGError

REPO = Path(__file__).resolve().parents[2]


def processes_in(workdir: Path) -> dict[int, str]:
    """pid -> cmdline of every live process (not this one) whose cwd or command line is in `workdir`."""
    found, me, root = {}, os.getpid(), str(workdir.resolve())
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie is gone; only its parent has not reaped it yet
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(d / "cwd")
        except (OSError, IndexError):
            continue
        if cwd == root or cwd.startswith(root + "/") or root in cmd:
            found[int(d.name)] = cmd
    return found


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---- children die with their parent -------------------------------------------------------------------------

PARENT = textwrap.dedent("""
    import sys, time
    from flows.stages import spawn
    child = spawn([sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.pid, flush=True)
    time.sleep(120)
""")


def test_spawned_child_has_its_own_group_and_dies_with_its_parent(tmp_path: Path):
    parent = subprocess.Popen([PY, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert os.getpgid(child) == child != os.getpgid(parent.pid)
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not Path(f"/proc/{child}").exists() or
                          Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 5), \
            "the child outlived its SIGKILLed parent"
    finally:
        _kill_all([parent.pid, child])


def test_stop_children_ends_the_whole_group(tmp_path: Path):
    from flows.stages import spawn, stop_children

    # a child that ignores SIGTERM and has a grandchild in its group: both gone after the grace period
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); print(g.pid, flush=True); "
            "time.sleep(120)")
    proc = spawn([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(proc.stdout.readline())
    t0 = time.monotonic()
    assert stop_children(grace_s=1.0) == 1
    assert time.monotonic() - t0 < 5
    assert proc.returncode == -signal.SIGKILL
    assert wait_until(lambda: not Path(f"/proc/{grandchild}").exists() or
                      Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 3)


def test_evaluator_follow_loop_ends_when_its_parent_is_gone(tmp_path: Path):
    from flows.evaluation import follow

    queue = tmp_path / "queue.jsonl"
    queue.write_text('{"checkpoint_dir": "a", "step": 2}\n')
    t0 = time.monotonic()
    items = list(follow(queue, poll_s=0.05, parent=os.getppid() + 1_000_000))  # a parent that is not ours
    assert items == [] and time.monotonic() - t0 < 2


# ---- one trainer per checkpoint folder ----------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from vtg.checkpoint_lock import lock_checkpoint_root
    lock = lock_checkpoint_root(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")


def test_second_trainer_on_a_locked_folder_fails_fast_naming_the_holder(tmp_path: Path):
    out = tmp_path / "ck"
    holder = subprocess.Popen([PY, "-c", HOLDER, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(VTGError, match=rf"in use by another trainer \(pid {holder.pid} holds .*\.lock\)"):
            lock_checkpoint_root(out)
        assert time.monotonic() - t0 < 1
        holder.kill()  # the kernel drops the lock of a dead holder: the folder is free again
        holder.wait()
        with lock_checkpoint_root(out):
            assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
        assert not (out / LOCK_FILE).exists()
    finally:
        _kill_all([holder.pid])


def test_a_released_lock_removes_only_the_empty_folders_it_made(tmp_path: Path):
    """A run refused after the lock (no shards, a bad setting) leaves no empty `checkpoints/sft` nor `checkpoints/`
    behind; a folder that existed, or one that got content, stays."""
    CheckpointLock(tmp_path / "checkpoints" / "sft").acquire().release()
    assert list(tmp_path.iterdir()) == []
    lock = CheckpointLock(tmp_path / "a" / "b" / "ck").acquire()
    (tmp_path / "a" / "kept.txt").write_text("x")  # a user's file beside the run
    lock.release()
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["a", "a/kept.txt"]
    (tmp_path / "ck").mkdir()
    CheckpointLock(tmp_path / "ck").acquire().release()
    assert (tmp_path / "ck").is_dir()  # it was there before


def test_a_lock_that_cannot_be_taken_removes_the_folders_it_made(tmp_path: Path, monkeypatch):
    """The lock file cannot be written (a full disk: ENOSPC, stood in for by os.open failing): one-line error, and
    the folders made for it go too."""
    import errno

    from vtg import checkpoint_lock

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    (tmp_path / "kept").mkdir()
    monkeypatch.setattr(checkpoint_lock.os, "open", no_space)
    with pytest.raises(VTGError, match="cannot lock .*no space left"):
        CheckpointLock(tmp_path / "checkpoints" / "sft").acquire()
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]


def test_lock_follows_a_root_moved_aside(tmp_path: Path):
    out = tmp_path / "ck"
    lock = CheckpointLock(out).acquire()
    os.replace(out, tmp_path / "ck-superseded")  # what resume does to checkpoints of another trajectory
    lock.refresh()
    assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(VTGError, match="in use by another trainer"):
        CheckpointLock(out).acquire()
    lock.release()
    CheckpointLock(out).acquire().release()


# ---- the whole flow ------------------------------------------------------------------------------------------

def _start_flow(project: Path, *extra: str) -> subprocess.Popen:
    """`python -m flows` as a terminal's foreground job: a process group of its own (Ctrl-C signals the group)."""
    env = project_env(project, STANDIN_STEP_S="1.0")
    log = (project / "flow.log").open("w")
    return subprocess.Popen([PY, "-m", "flows", *STANDIN_OVERRIDES, "train.max_steps=200", "tracking.enabled=false",
                             *extra], cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_for_training_and_evaluator(project: Path, flow: subprocess.Popen) -> dict[int, str]:
    def ready():
        procs = processes_in(project)
        return (any("standin_stages.train" in c for c in procs.values())
                and any("flows.evaluation" in c for c in procs.values()))

    ok = wait_until(lambda: ready() or flow.poll() is not None, 300, step=0.5)
    log = (project / "flow.log").read_text()
    assert ok and flow.poll() is None, f"training never started:\n{log[-4000:]}"
    return processes_in(project)


@pytest.mark.slow
def test_sigkill_of_the_flow_leaves_no_process_behind(tmp_path: Path):
    project = make_project(tmp_path / "proj", with_dvc=False)
    flow = _start_flow(project)
    try:
        running = _wait_for_training_and_evaluator(project, flow)
        assert any("uvicorn" in c for c in running.values()), running  # the ephemeral Prefect API server
        flow.kill()
        flow.wait()
        assert wait_until(lambda: not processes_in(project), 10), f"still running: {processes_in(project)}"
    finally:
        flow.kill()
        _kill_all(processes_in(project))


@pytest.mark.slow
def test_sigint_ends_the_flow_within_10s_and_leaves_nothing(tmp_path: Path):
    project = make_project(tmp_path / "proj", with_dvc=False)
    flow = _start_flow(project)
    try:
        _wait_for_training_and_evaluator(project, flow)
        t0 = time.monotonic()
        os.killpg(flow.pid, signal.SIGINT)  # Ctrl-C in a terminal: SIGINT to the foreground process group
        try:
            rc = flow.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the flow was still running 10 s after SIGINT:\n{(project / 'flow.log').read_text()[-3000:]}")
        took = time.monotonic() - t0
        assert rc != 0 and took < 10
        assert wait_until(lambda: not processes_in(project), 2), f"still running: {processes_in(project)}"
    finally:
        flow.kill()
        _kill_all(processes_in(project))
