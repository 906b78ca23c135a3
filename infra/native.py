"""The compose stack's services started natively, without Docker: PostgreSQL (Debian's packages), an S3 endpoint,
the Prefect server on Postgres and the MLflow server on Postgres + S3 artifacts.

    python -m infra.native up      # start everything on free 127.0.0.1 ports, print the env to export, wait
    (Ctrl-C stops and removes it all)

The tests (tests/infra) use the same context managers. The S3 endpoint is MinIO when a `minio` binary is on
PATH, else moto's S3 server (`moto[s3]`, a dev extra): no MinIO package exists in the registries here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vtg.cli_common import run_cli
from vtg.errors import VTGError
from vtg.net import LOOPBACK, free_port

HOST = LOOPBACK


class ServiceError(VTGError):
    """A service could not be started (the message says which, and what to install or look at)."""


def postgres_bin(name: str) -> str:
    """A PostgreSQL server binary: PATH first, then Debian's versioned directory."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    if not candidates:
        raise ServiceError(f"PostgreSQL's `{name}` not found: install it (Debian: apt-get install postgresql)")
    return str(candidates[-1])


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"{url}: process exited with {proc.returncode}; log {log}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError as e:
            if e.code < 500:  # answering: up (a 404 on a probe path is still a live server)
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise ServiceError(f"{url}: not healthy after {timeout:.0f}s; log {log}:\n{_tail(log)}")


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def process(argv: list[str], log: Path, env: dict[str, str] | None = None,
            cwd: str | Path | None = None) -> Iterator[subprocess.Popen]:
    """A child process with its output in `log`, terminated (then killed) on exit."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=cwd, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


@dataclass(frozen=True)
class Postgres:
    port: int
    user: str
    password: str

    def url(self, db: str, driver: str = "postgresql") -> str:
        return f"{driver}://{self.user}:{self.password}@{HOST}:{self.port}/{db}"


def _as_postgres_user() -> list[str]:
    """initdb refuses to run as root: drop to the `postgres` system user when we are root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ServiceError("running as root and no `postgres` user exists to run the server as") from None
    return ["runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres(workdir: Path, databases: tuple[str, ...] = ("prefect", "mlflow"), user: str = "vtg",
             password: str = "vtg-test-password") -> Iterator[Postgres]:
    """A throw-away PostgreSQL cluster (password auth, 127.0.0.1 only) with the given databases."""
    initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
    # Not under `workdir`: the `postgres` user must be able to reach it (pytest's tmp dirs are root-only).
    root = Path(tempfile.mkdtemp(prefix="vtg-pg-"))
    sudo = _as_postgres_user()
    if sudo:
        shutil.chown(root, "postgres")
        root.chmod(0o700)
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    if sudo:
        shutil.chown(pwfile, "postgres")
    data, log, port = root / "data", root / "postgres.log", free_port()
    subprocess.run([*sudo, initdb, "-D", str(data), "-U", user, f"--pwfile={pwfile}", "--auth=scram-sha-256",
                    "-E", "UTF8", "--locale=C"], check=True, capture_output=True)
    opts = f"-p {port} -c listen_addresses={HOST} -k {root} -c fsync=off -c full_page_writes=off"
    start = subprocess.run([*sudo, pg_ctl, "-D", str(data), "-o", opts, "-l", str(log), "-w", "-t", "60", "start"],
                           capture_output=True, text=True, check=False)
    if start.returncode != 0:
        raise ServiceError(f"postgres did not start: {start.stderr.strip()}\n{_tail(log)}")
    pg = Postgres(port, user, password)
    try:
        import psycopg2

        conn = psycopg2.connect(pg.url("postgres"))
        conn.autocommit = True
        with conn.cursor() as cur:
            for db in databases:
                cur.execute(f'CREATE DATABASE "{db}" OWNER "{user}"')
        conn.close()
        yield pg
    finally:
        subprocess.run([*sudo, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class S3:
    endpoint: str
    access_key: str
    secret_key: str
    kind: str

    def env(self) -> dict[str, str]:
        """What boto3, s3fs (DVC), MLflow and WebDataset pipes read to find this endpoint."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": self.endpoint,
                "MLFLOW_S3_ENDPOINT_URL": self.endpoint}

    def client(self):
        from vtg.net import s3_client

        return s3_client(self.endpoint, aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
                         region_name="us-east-1")


@contextlib.contextmanager
def s3_server(workdir: Path, buckets: tuple[str, ...] = ("vtg-mlflow", "vtg-dvc", "vtg-shards"),
              access_key: str = "vtg-minio", secret_key: str = "vtg-minio-secret") -> Iterator[S3]:
    """MinIO if installed, else moto's S3 server; the buckets are created up front (like compose's minio-init)."""
    port, log = free_port(), workdir / "s3.log"
    minio = shutil.which("minio")
    if minio:
        argv = [minio, "server", str(workdir / "minio-data"), "--address", f"{HOST}:{port}", "--quiet"]
        env, kind = {"MINIO_ROOT_USER": access_key, "MINIO_ROOT_PASSWORD": secret_key}, "minio"
        health = f"http://{HOST}:{port}/minio/health/live"
    else:
        moto = str(Path(sys.executable).with_name("moto_server"))  # this environment's, not PATH's first
        if not Path(moto).exists():
            raise ServiceError("no S3 endpoint: install MinIO, or `pip install 'moto[s3]'` (dev extra)")
        argv, env, kind = [moto, "-H", HOST, "-p", str(port)], {}, "moto"
        health = f"http://{HOST}:{port}/moto-api/"
    with process(argv, log, env=env) as proc:
        wait_http(health, proc, log, timeout=60)
        s3 = S3(f"http://{HOST}:{port}", access_key, secret_key, kind)
        client = s3.client()
        for b in buckets:
            client.create_bucket(Bucket=b)
        yield s3


@dataclass
class Server:
    """A started HTTP service: `wait()` blocks until its health URL answers."""

    url: str
    health: str
    proc: subprocess.Popen
    log: Path
    env: dict[str, str]

    def wait(self, timeout: float) -> Server:
        wait_http(self.health, self.proc, self.log, timeout)
        return self


@contextlib.contextmanager
def prefect_server(workdir: Path, pg: Postgres, db: str = "prefect", wait: bool = True) -> Iterator[Server]:
    """`prefect server start` backed by Postgres; `.env` is the client env (PREFECT_API_URL, PREFECT_HOME)."""
    port, log, home = free_port(), workdir / "prefect-server.log", workdir / "prefect-home"
    home.mkdir(exist_ok=True)
    env = {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_DATABASE_CONNECTION_URL": pg.url(db, "postgresql+asyncpg"),
           "PREFECT_SERVER_UI_ENABLED": "false", "PREFECT_API_URL": ""}
    prefect = str(Path(sys.executable).with_name("prefect"))
    with process([prefect, "server", "start", "--host", HOST, "--port", str(port), "--no-ui"], log, env) as proc:
        api = f"http://{HOST}:{port}/api"
        server = Server(api, f"{api}/health", proc, log, {
            "PREFECT_API_URL": api, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
        yield server.wait(180) if wait else server


@contextlib.contextmanager
def mlflow_server(workdir: Path, pg: Postgres, s3: S3, bucket: str = "vtg-mlflow", db: str = "mlflow",
                  wait: bool = True) -> Iterator[Server]:
    """`mlflow server` with the Postgres backend store and proxied S3 artifacts; `.url` is the tracking URI."""
    port, log = free_port(), workdir / "mlflow-server.log"
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    argv = [mlflow, "server", "--backend-store-uri", pg.url(db, "postgresql+psycopg2"), "--artifacts-destination",
            f"s3://{bucket}/artifacts", "--serve-artifacts", "--host", HOST, "--port", str(port), "--workers", "1"]
    with process(argv, log, env=s3.env()) as proc:
        uri = f"http://{HOST}:{port}"
        server = Server(uri, f"{uri}/health", proc, log, {"MLFLOW_TRACKING_URI": uri})
        yield server.wait(180) if wait else server


@contextlib.contextmanager
def stack(workdir: Path) -> Iterator[dict[str, str]]:
    """Everything compose.yaml runs except the workers; yields the env a client or worker needs.
    The two servers start side by side (each runs its database migrations on first start)."""
    with postgres(workdir) as pg, s3_server(workdir) as s3, \
            prefect_server(workdir, pg, wait=False) as prefect, mlflow_server(workdir, pg, s3, wait=False) as mlf:
        prefect.wait(180)
        mlf.wait(180)
        yield {**prefect.env, **s3.env(), **mlf.env, "VTG_POSTGRES_URL": pg.url("postgres"), "VTG_S3_KIND": s3.kind}


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.native", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up"], help="start the services and wait (Ctrl-C stops them)")
    parser.add_argument("--workdir", default=None, help="where data and logs go (default: a temp dir)")
    args = parser.parse_args(argv)
    # `kill <pid>` stops the services too (the default SIGTERM action would orphan them).
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vtg-native-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"starting postgres, s3, prefect server, mlflow server (logs in {workdir}) ...", flush=True)
    with stack(workdir) as env:
        print("# services are up; in another shell:")
        for k, v in env.items():
            print(f"export {k}={v}")
        print("# Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
