"""Stage command lines and a subprocess runner that streams their logs live.

Every stage is a plain CLI (`python -m <module> --params P [-e E] [key=value ...]`); the flow, DVC and the
benchmarks all start the same command lines from here, so there is one place that knows how a stage is launched.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.gpus import visible_gpu_count
from vtg.net import OWN_PORT, free_port
from vtg.stages import stage_module

log = logging.getLogger(__name__)
DEEPSPEED_HOSTFILE = "/job/hostfile"  # where the deepspeed launcher looks for a hostfile by default (multi-node)
STOP_GRACE_S = 5.0
"""Seconds a stopped child group gets between SIGTERM and SIGKILL."""

# ---- process hygiene ------------------------------------------------------------------------------------------
# Every process the flow starts (stage processes, the embedded evaluator) runs in its own process group, is
# registered here, and is stopped with its whole group (SIGTERM, then SIGKILL after a grace period) when it is
# done, on error, and on SIGINT/SIGTERM of the flow (`flows.__main__`). On Linux each child also gets the
# parent-death signal, so a flow killed outright (SIGKILL) takes its children with it.
_children: dict[int, subprocess.Popen] = {}
_children_lock = threading.Lock()
PR_SET_PDEATHSIG = 1


def preexec_die_with_parent(parent: int):
    """A `preexec_fn`: SIGTERM this child when the process that started it dies (Linux prctl; a no-op
    elsewhere). Runs between fork and exec: only async-signal-safe work."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        libc = None

    def preexec() -> None:
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec if sys.platform.startswith("linux") else None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """From now on the kernel sends `sig` to this process when its parent dies (Linux prctl; a no-op elsewhere).
    For a `spawn`ed child that may catch SIGTERM: the embedded evaluator runs Prefect flows, whose engine catches
    SIGTERM and then retries reporting the crash to the API server of the flow that just died, for minutes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:
        pass


def spawn(argv: list[str], nice: int = 0, **kwargs) -> subprocess.Popen:
    """Start a child of the flow in its own process group, registered for `stop_children`; `nice` > 0 lowers its
    scheduling priority (and its children's: Beam's workers)."""
    die = preexec_die_with_parent(os.getpid())

    def preexec() -> None:
        if die is not None:
            die()
        if nice:
            os.nice(nice)

    proc = subprocess.Popen(argv, process_group=0, preexec_fn=preexec if (die or nice) else None, **kwargs)  # noqa: PLW1509
    with _children_lock:
        _children[proc.pid] = proc
    return proc


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def stop_process(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int | None:
    """Stop a `spawn`ed child and everything in its process group: SIGTERM, then SIGKILL after `grace_s`."""
    stop_all([proc], grace_s)
    return proc.returncode


def stop_all(procs: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    groups = [p.pid for p in procs]
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)  # grandchildren (launcher ranks, data workers) of an exited leader
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        with _children_lock:
            _children.pop(p.pid, None)


def stop_children(grace_s: float = STOP_GRACE_S) -> int:
    """Stop every child the flow started that is still registered; returns how many there were."""
    with _children_lock:  # exited ones were reaped: their pid (= group id) may belong to someone else by now
        procs = [p for p in _children.values() if p.poll() is None]
        _children.clear()
        _children.update({p.pid: p for p in procs})
    if procs:
        log.info("stopping %d child process group(s): %s", len(procs), ", ".join(str(p.pid) for p in procs))
        stop_all(procs, grace_s)
    return len(procs)


@dataclass(frozen=True)
class ConfigArgs:
    """How the run's configuration was given: passed unchanged to every stage CLI."""

    params: str = "params.yaml"
    experiment: str | None = None
    overrides: tuple[str, ...] = ()

    def argv(self, extra_overrides: Sequence[str] = ()) -> list[str]:
        out = ["--params", self.params]
        if self.experiment:
            out += ["--experiment", self.experiment]
        return out + list(self.overrides) + list(extra_overrides)


class StageFailed(VTGError):
    """A stage process exited non-zero; the message carries its last log lines."""


@dataclass
class StageResult:
    name: str
    argv: list[str]
    returncode: int
    seconds: float
    tail: list[str] = field(default_factory=list)


def module_cmd(module: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", module, *args]


def train_cmd(cfg: PipelineConfig, args: Sequence[str],
              gpus: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The training command line and extra env, by `orchestration.train_launcher`.

    `gpus`: the only devices training may use (CUDA_VISIBLE_DEVICES entries, one per rank), when evaluation holds
    another GPU of the node (flows/placement.py): CUDA_VISIBLE_DEVICES for `python`/`torchrun`, `--include`
    for `deepspeed` (which replaces CUDA_VISIBLE_DEVICES with its own). With DeepSpeed's hostfile (multi-node),
    `--num_gpus` keeps the first `train.num_gpus` slots of each node, and the placement leaves the last one free."""
    return launch_cmd(cfg, stage_module("train", cfg), cfg.train.num_gpus, "train.num_gpus", args, gpus)


def rl_cmd(cfg: PipelineConfig, args: Sequence[str],
           gpus: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The rl stage's command line and extra env: launched like training, with `rl.num_gpus` ranks (one rank:
    `python -m training.rl`, the dvc.yaml cmd); `gpus` as for `train_cmd` (the first `rl.num_gpus` of them)."""
    ranks = cfg.rl.num_gpus
    if gpus is not None and len(gpus) > ranks:
        gpus = list(gpus)[:ranks]
    return launch_cmd(cfg, stage_module("rl", cfg), ranks, "rl.num_gpus", args, gpus)


def launch_cmd(cfg: PipelineConfig, module: str, ranks: int, what: str, args: Sequence[str],
               gpus: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """`module` with `ranks` processes by `orchestration.train_launcher` (see `train_cmd`)."""
    launcher = cfg.orchestration.train_launcher
    if launcher == "auto":
        launcher = "python" if ranks == 1 else ("deepspeed" if _has_cuda() else "torchrun")
    if gpus is not None and len(gpus) != ranks:
        raise VTGError(f"{what.split('.')[0]} has {ranks} rank(s) ({what}) but was given GPUs {list(gpus)}")
    visible = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}
    port = str(free_port())
    if launcher == "python":
        env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               OWN_PORT: "1"}  # picked here, not reserved: the trainer may replace it (training.dist)
        return module_cmd(module, args), {**env, **visible}
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                "-m", module, *args], visible  # --standalone: torchrun binds a free port itself, no race
    deepspeed = Path(sys.executable).with_name("deepspeed")
    where = (f"--include=localhost:{','.join(gpus)}" if gpus and not Path(DEEPSPEED_HOSTFILE).is_file()
             else f"--num_gpus={ranks}")
    return [str(deepspeed), where, f"--master_port={port}", "--module", module, *args], {}


def _has_cuda() -> bool:
    return visible_gpu_count() > 0


def _lines(stream) -> Iterator[str]:
    """Lines as they arrive, split at `\n` and at `\r` too (progress bars repaint with `\r` only)."""
    buf = b""
    while chunk := stream.read(8192):
        buf += chunk
        *done, buf = re.split(rb"\r\n|\r|\n", buf)
        yield from (d.decode(errors="replace") for d in done)
    if buf:
        yield buf.decode(errors="replace")


_BAR = re.compile(r"^(?P<label>[^|]*?)\s*(?P<pct>\d+)%\|")


def _repeated_progress(line: str, last: dict[str, str]) -> bool:
    """A progress-bar line whose percentage did not change since the last one shown (piped bars repaint often)."""
    m = _BAR.match(line)
    if not m:
        return False
    if last.get(m["label"]) == m["pct"]:
        return True
    last[m["label"]] = m["pct"]
    return False


YIELD_NICE = 10
"""Niceness of the data stages started while a critical background step runs (`BackgroundStage(critical=True)`):
the flow's next stage waits for that step, not for them, so they take the CPU it leaves (on two cores the base's
teaching had ~2/3 of a core beside preprocess's two Beam workers, and the train stage waited for it)."""
_critical: list[BackgroundStage] = []


def yield_nice() -> int:
    """`YIELD_NICE` while a critical background step runs, else 0: the niceness a data stage starts with."""
    return YIELD_NICE if any(s.proc.poll() is None for s in _critical) else 0


class BackgroundStage:
    """A stage CLI running beside the flow's next steps (its output to `log_path`): `wait()` joins it and returns
    its exit code, `stop()` ends it (the flow failed or was interrupted). Like every child it dies with the flow
    (`spawn`). `critical`: the flow will wait for it, so the data stages started while it runs yield to it
    (`yield_nice`)."""

    def __init__(self, name: str, argv: list[str], log_path: str | Path, env: dict[str, str] | None = None,
                 critical: bool = False):
        self.name, self.log_path, self.t0 = name, Path(log_path), time.perf_counter()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as out:
            self.proc = spawn(argv, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        if critical:
            _critical.append(self)
        log.info("[%s] started in the background (log: %s): $ %s", name, self.log_path, " ".join(argv))

    def wait(self) -> int:
        rc = self.proc.wait()
        stop_process(self.proc)  # stray group members
        self._forget()
        log.info("[%s] exited with code %d after %.0f s (log: %s)", self.name, rc, time.perf_counter() - self.t0,
                 self.log_path)
        return rc

    def stop(self) -> None:
        stop_process(self.proc)
        self._forget()

    def _forget(self) -> None:
        if self in _critical:
            _critical.remove(self)


def run_stage(name: str, argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None,
              on_line: Callable[[str], None] | None = None, tail_lines: int = 30, nice: int = 0) -> StageResult:
    """Run one stage process, streaming every output line as it comes; raise StageFailed on a non-zero exit.
    `nice` > 0: at a lower scheduling priority (`yield_nice`)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    emit = on_line or (lambda line: log.info("[%s] %s", name, line))
    tail: list[str] = []
    t0 = time.perf_counter()
    log.info("[%s] $ %s%s", name, " ".join(argv),
             f"  (nice {nice}: yields to {', '.join(s.name for s in _critical)})" if nice and _critical else "")
    with spawn(argv, nice=nice, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
               bufsize=0) as proc:
        assert proc.stdout is not None
        try:
            last_bar: dict[str, str] = {}
            for line in _lines(proc.stdout):
                if not line.strip() or _repeated_progress(line, last_bar):
                    continue
                emit(line)
                tail = (tail + [line])[-tail_lines:]
            rc = proc.wait()
        finally:
            stop_process(proc)  # on error/interrupt: the stage; after a normal exit: stray group members
    result = StageResult(name, argv, rc, time.perf_counter() - t0, tail)
    if rc != 0:
        said = next((line.strip() for line in reversed(tail) if line.strip()), "no output")
        last = "\n  ".join(tail[-8:])
        raise StageFailed(f"stage {name!r} exited with code {rc} after {result.seconds:.1f}s: {said}\n"
                          f"  last lines:\n  {last}")
    return result
