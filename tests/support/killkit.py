"""Start a stage as a terminal would (its own process group), SIGKILL it, and find what it left running."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def start(cmd: list[str], log: Path, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """The command in a new session (process group id = its pid), output to `log`."""
    with log.open("w") as f:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _stat(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> dict[int, str]:
    """pid -> command line of every live process in process group `pgid` (zombies, already dead, left out)."""
    found = {}
    for d in Path("/proc").iterdir():
        st = _stat(d.name) if d.name.isdigit() else None
        if st and st[0] != "Z" and int(st[2]) == pgid:
            try:
                found[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return found


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every live process below `pid` (whatever group or session it moved to)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        st = _stat(d.name) if d.name.isdigit() else None
        if st and st[0] != "Z":
            children.setdefault(int(st[1]), []).append(int(d.name))
    out, todo = {}, list(children.get(pid, []))
    while todo:
        p = todo.pop()
        try:
            out[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        todo += children.get(p, [])
    return out


def wait_until(cond: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def wait_for_log(proc: subprocess.Popen, log: Path, text: str, timeout: float = 300) -> None:
    """Until `text` is in the log; fails if the process ends first."""
    def seen() -> bool:
        assert proc.poll() is None, f"exited ({proc.returncode}) before {text!r}:\n{log.read_text()[-3000:]}"
        return text in log.read_text()
    assert wait_until(seen, timeout, 0.02), f"no {text!r} after {timeout} s:\n{log.read_text()[-3000:]}"


def sigkill(proc: subprocess.Popen, group: bool) -> dict[int, str]:
    """SIGKILL the process (group=False: the process alone, as the OOM killer does; its children must go by
    themselves) or its whole process group; reap it. Returns the processes of its group alive right before."""
    before = group_members(proc.pid)
    if group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return before


def left_behind(pgid: int, timeout: float) -> dict[int, str]:
    """What of the group is still alive after `timeout` s (empty: all gone)."""
    wait_until(lambda: not group_members(pgid), timeout, 0.1)
    return group_members(pgid)


def cleanup(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
