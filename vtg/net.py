"""Networking helpers shared by the launchers, the native services and the tests."""

from __future__ import annotations

import functools
import socket
from urllib.parse import urlparse

LOOPBACK = "127.0.0.1"
OWN_PORT = "VTG_OWN_MASTER_PORT"
"""Set when a single process's MASTER_PORT was picked by us (`free_port`: free when asked, not reserved), so that
`training.dist.init_distributed` may pick another when some other process took it first."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` right now (bound to port 0, then released; the caller binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@functools.cache
def _reached(uri: str, timeout_s: float) -> bool:
    """One TCP connect per server and process (a success is remembered; a failure raises and is not)."""
    u = urlparse(uri)
    socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout_s).close()
    return True


def check_tracking_server(uri: str, timeout_s: float = 5.0) -> None:
    """For an http(s) tracking URI, a TCP connect to the server first: MLflow's client retries an unreachable
    server with backoff for minutes before it fails; this says so in one line at once (`VTGError`). Local
    stores (`sqlite:`, file paths) need no server and pass."""
    from vtg.errors import VTGError

    if urlparse(uri).scheme not in ("http", "https"):
        return
    try:
        _reached(uri, timeout_s)
    except OSError as e:
        raise VTGError(f"the MLflow tracking server at {uri} is not reachable ({e.strerror or e}): start it "
                       "(`make serve`, docs/stages.md) or point tracking.tracking_uri at a running one; "
                       "tracking.enabled=false runs without it") from None
