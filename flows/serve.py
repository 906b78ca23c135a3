"""`python -m flows.serve` (what `make serve` runs): the real services on one machine, all on 127.0.0.1.

Starts a Prefect server, an MLflow tracking server (SQLite store from `tracking.tracking_uri`, artifacts under
`tracking.artifacts_dir`) and the served deployments (`python -m flows.deployments`), then waits. Runs started
with `prefect deployment run 'post-training/default'` log to the MLflow server; Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from flows.deployments import add_rl_flag
from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.errors import VTGError

HOST = "127.0.0.1"


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise VTGError(f"service for {url} exited with code {proc.returncode} before it became healthy")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise VTGError(f"{url} not healthy after {timeout:.0f}s")


def service_env(prefect_port: int, poll_s: float) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": f"http://{HOST}:{prefect_port}/api",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_RUNNER_POLL_FREQUENCY": str(max(1, int(poll_s))),
            "PYTHONUNBUFFERED": "1"}


def start_prefect(port: int, log_dir: Path) -> subprocess.Popen:
    exe = str(Path(sys.executable).with_name("prefect"))
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": f"http://{HOST}:{port}/api"}
    env.pop("PREFECT_API_URL", None)
    return subprocess.Popen([exe, "server", "start", "--host", HOST, "--port", str(port)], env=env,
                            stdout=(log_dir / "prefect-server.log").open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def start_mlflow(backend: str, artifacts: str, port: int, log_dir: Path) -> subprocess.Popen:
    exe = str(Path(sys.executable).with_name("mlflow"))
    return subprocess.Popen([exe, "server", "--host", HOST, "--port", str(port), "--backend-store-uri", backend,
                             "--artifacts-destination", artifacts, "--workers", "1"],
                            stdout=(log_dir / "mlflow-server.log").open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each service's process group (servers fork workers), then SIGKILL what is left after 15 s."""
    for p in reversed(procs):
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # each service was started in its own session, so its group id is its pid
    except ProcessLookupError:
        pass


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser("Bring up a Prefect server, an MLflow server and the served deployments on 127.0.0.1.")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--prefect-port", type=int, default=None, help="default: orchestration.prefect_port")
    parser.add_argument("--mlflow-port", type=int, default=None, help="default: tracking.server_port")
    parser.add_argument("--no-mlflow", action="store_true", help="do not start an MLflow server (log to the URI)")
    parser.add_argument("--log-dir", default=".serve", help="service logs (default: %(default)s)")
    add_rl_flag(parser)
    args = parser.parse_args(argv)
    cfg = resolve_config(args)
    pport = args.prefect_port or cfg.orchestration.prefect_port
    mport = args.mlflow_port or cfg.tracking.server_port
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    overrides = list(args.overrides)
    procs: list[subprocess.Popen] = []
    for sig in (signal.SIGINT, signal.SIGTERM):  # also when started in the background (SIGINT ignored there)
        signal.signal(sig, _interrupt)
    try:
        procs.append(start_prefect(pport, log_dir))
        mlflow_url = None
        if not args.no_mlflow and cfg.tracking.enabled:
            procs.append(start_mlflow(cfg.tracking.tracking_uri, cfg.tracking.artifacts_dir, mport, log_dir))
            mlflow_url = f"http://{HOST}:{mport}"
            overrides.append(f"tracking.tracking_uri={mlflow_url}")
        wait_http(f"http://{HOST}:{pport}/api/health", 180, procs[0])
        if mlflow_url:
            wait_http(f"{mlflow_url}/health", 180, procs[1])
        config_args = ["--params", args.params] + (["--experiment", args.experiment] if args.experiment else [])
        if args.rl is not None:
            config_args.append("--rl" if args.rl else "--no-rl")
        procs.append(subprocess.Popen([sys.executable, "-m", "flows.deployments", *config_args, *overrides],
                                      env=service_env(pport, cfg.orchestration.serve_poll_s),
                                      start_new_session=True))
        print("\n".join([
            f"Prefect UI : http://{HOST}:{pport}   (logs: {log_dir}/)",
            f"MLflow UI  : {mlflow_url or cfg.tracking.tracking_uri}",
            (f"Run it     : PREFECT_API_URL=http://{HOST}:{pport}/api .venv/bin/prefect deployment run "
             f"'{cfg.orchestration.flow_name}/{cfg.orchestration.deployment_name}'"),
            "Stop       : Ctrl-C"]), flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        dead = next(p for p in procs if p.poll() is not None)
        raise VTGError(f"a service exited (code {dead.returncode}): {' '.join(map(str, dead.args[:4]))}; "
                       f"see {log_dir}/")
    except KeyboardInterrupt:
        return 0
    finally:
        stop_all(procs)


if __name__ == "__main__":
    sys.exit(run_cli(_main))
