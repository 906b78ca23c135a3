"""Networking helpers shared by the launchers, the native services and the tests."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

LOOPBACK = "127.0.0.1"
NETWORK_TIMEOUT_S = 10.0
"""The default of `orchestration.network_timeout_s`: connect and read timeout of every network call."""
OWN_PORT = "VTG_OWN_MASTER_PORT"
"""Set when a single process's MASTER_PORT was picked by us (`free_port`: free when asked, not reserved), so that
`training.dist.init_distributed` may pick another when some other process took it first."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` right now (bound to port 0, then released; the caller binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_tracking_server(uri: str, timeout_s: float | None = None) -> None:
    """For an http(s) tracking URI, one bounded request to the server first (`check_http_service`): MLflow's client
    retries an unreachable or silent server with backoff for minutes before it fails; this says so in one line at
    once (`VTGError`). Local stores (`sqlite:`, file paths) need no server and pass. A success is remembered per
    process."""
    if urlparse(uri).scheme not in ("http", "https") or uri in _REACHED:
        return
    check_http_service(uri, "MLflow tracking server", "tracking.tracking_uri (`make serve` starts one; "
                       "tracking.enabled=false runs without it)", "/health", timeout_s)
    _REACHED.add(uri)


_REACHED: set[str] = set()


# ---- bounded waits: every network call has a connect and a read timeout ---------------------------------------
TIMEOUT_SETTING = "orchestration.network_timeout_s"
TIMEOUT_ENV = "VTG_NETWORK_TIMEOUT_S"


def network_timeout() -> float:
    """The connect and read timeout of this process's network calls: `orchestration.network_timeout_s` as the
    command's config gave it (`bound_clients`, inherited by the processes it starts), else the default."""
    import os

    try:
        return float(os.environ.get(TIMEOUT_ENV) or NETWORK_TIMEOUT_S)
    except ValueError:
        return NETWORK_TIMEOUT_S


def bound_clients(timeout_s: float = NETWORK_TIMEOUT_S) -> None:
    """Called by `vtg.config.load_config` with the resolved `orchestration.network_timeout_s`: record the timeout
    for this process and its children, and give the clients that read theirs from the environment (MLflow's REST client,
    Prefect's) a bounded wait and few retries, unless the user set them already."""
    import os

    os.environ[TIMEOUT_ENV] = f"{timeout_s:g}"
    t = str(max(1, round(timeout_s)))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", t)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("PREFECT_API_REQUEST_TIMEOUT", t)


def check_http_service(url: str, what: str, url_setting: str, health: str = "/health",
                       timeout_s: float | None = None) -> None:
    """One bounded request to an http(s) service before a client that could wait for minutes talks to it: a
    TCP connect and `GET <health>`, each within `timeout_s`. Any HTTP answer passes (the client reports what
    is wrong with it); no connection, or a server that accepts and never answers, is one `VTGError` naming the
    endpoint and the settings to check."""
    import http.client

    from vtg.errors import VTGError

    u = urlparse(url)
    if u.scheme not in ("http", "https"):
        return
    timeout_s = timeout_s or network_timeout()
    port = u.port or (443 if u.scheme == "https" else 80)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, port, timeout=timeout_s)
    path = (u.path.rstrip("/") + health) if health.startswith("/") else health
    try:
        conn.request("GET", path or "/")
        conn.getresponse().read(0)
    except TimeoutError:
        raise VTGError(f"the {what} at {url} accepted the connection but sent no answer within {timeout_s:g} s "
                       f"({TIMEOUT_SETTING}): is that address the {what}? check {url_setting}") from None
    except OSError as e:
        raise VTGError(f"the {what} at {url} is not reachable ({e.strerror or e}): start it or point {url_setting} "
                       "at a running one") from None
    finally:
        conn.close()


def check_prefect_api(url: str | None = None) -> None:
    """The Prefect API named by PREFECT_API_URL answers within the timeout (`GET <api>/health`), before Prefect's
    client (60 s per request, retried) talks to it."""
    import os

    url = url or os.environ.get("PREFECT_API_URL")
    if url:
        check_http_service(url, "Prefect API", "PREFECT_API_URL (`make serve` starts a server)", "/health")


def s3_client(endpoint: str | None = None, timeout_s: float | None = None, **kw):
    """The one boto3 S3 client constructor: connect and read timeouts and two attempts, not botocore's 60 s
    reads retried with backoff."""
    import boto3
    from botocore.config import Config

    timeout_s = timeout_s or network_timeout()
    config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 2, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint or None, config=config, **kw)
