"""`python -m flows [--params P] [-e EXPERIMENT] [key=value ...]`: the whole pipeline on the embedded default.

This is what `make run` calls. It runs the `post-training` flow on Prefect's ephemeral API (no server needed;
set PREFECT_API_URL to run against a server instead), then prints where to look.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.errors import VTGError

# The ephemeral API migrates a fresh database on first use; on 2 busy cores that can exceed Prefect's 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
EXIT_WITHIN_S = 8.0
"""After SIGINT/SIGTERM the flow process is gone within this many seconds, children and API server included."""
CHILD_GRACE_S = 3.0
_server_processes: list[subprocess.Popen] = []  # the ephemeral API server(s) this process started


def _stop_prefect_server() -> None:
    """Kill the ephemeral API server this process started (if any), without waiting for its shutdown."""
    for proc in _server_processes:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


class _PrefectServerSubprocess:
    """`subprocess` as Prefect's ephemeral-server module sees it: its uvicorn process starts in its own process
    group (a terminal's Ctrl-C reaches the flow only, which reports the interrupted run to a live API and then
    stops the server) and gets the parent-death signal (it dies with a killed flow). The processes it starts are
    kept in `_server_processes` (`_stop_prefect_server` kills them)."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs):
        from flows.stages import preexec_die_with_parent

        kwargs.setdefault("process_group", 0)
        kwargs.setdefault("preexec_fn", preexec_die_with_parent(os.getpid()))
        proc = subprocess.Popen(*args, **kwargs)
        _server_processes.append(proc)
        return proc


def _guard_prefect_server() -> None:
    if os.environ.get("PREFECT_API_URL"):
        return  # a real server: not ours to start or stop
    from prefect.server.api import server

    server.subprocess = _PrefectServerSubprocess()


class _Shutdown:
    """SIGINT/SIGTERM: stop every child group (SIGTERM, SIGKILL after a grace period), then unwind with
    KeyboardInterrupt so Prefect records the run as interrupted; whatever is still running `EXIT_WITHIN_S` after
    the signal (or at a second signal) is killed and the process exits."""

    def __init__(self) -> None:
        self.since: float | None = None

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.handle)

    def handle(self, signum, frame) -> None:
        from flows.stages import stop_children

        if self.since is not None:
            self.hard_exit(signum)
        self.since = time.monotonic()
        print(f"{signal.Signals(signum).name}: stopping the flow's processes", file=sys.stderr, flush=True)
        threading.Thread(target=self.deadline, args=(signum,), daemon=True).start()
        stop_children(CHILD_GRACE_S)
        raise KeyboardInterrupt

    def deadline(self, signum: int) -> None:
        time.sleep(EXIT_WITHIN_S)
        self.hard_exit(signum)

    @staticmethod
    def hard_exit(signum: int) -> None:
        from flows.stages import stop_children

        try:
            stop_children(0.5)
            _stop_prefect_server()
        finally:
            print("interrupted (forced exit)", file=sys.stderr, flush=True)
            os._exit(128 + signum)


def _main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(
        "Run the post-training pipeline: corpus -> ingest -> Beam preprocess -> DVC-versioned shards -> "
        "DeepSpeed SFT -> GRPO (rl; orchestration.rl=false skips it), every checkpoint evaluated concurrently -> "
        "held-out evaluation of the best -> report.")
    args = parser.parse_args(argv)
    resolve_config(args)  # validate (and --dry-run) before Prefect starts
    from flows.stages import stop_children

    _Shutdown().install()
    _guard_prefect_server()
    from flows.pipeline import post_training

    try:
        state = post_training(params=args.params, experiment=args.experiment, overrides=list(args.overrides),
                              return_state=True)
    finally:
        stop_children()  # nothing the flow started outlives it (exit, error or interrupt)
    if not state.is_completed():
        run_id = state.state_details.flow_run_id
        entry = f"{Path(__file__).with_name('pipeline.py')}:post_training"
        first = (state.message or state.name).splitlines()[0]
        raise VTGError(f"post-training flow run {run_id} {state.name.lower()}: {first}\n"
                       f"  finished steps are kept; after fixing, retry it: prefect flow-run retry {run_id} "
                       f"--entrypoint {entry}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(_main))
