"""Failure class 5 (issue 39): every wait is bounded. A server that accepts TCP connections and never answers hung
`flows.lineage` and training with no output (the connect check passed, the request never returned). Every network
call now goes through vtg/net.py: a bounded request to the MLflow tracking server and the Prefect API before their
clients (which retry for minutes) talk to them, boto3 clients with connect and read timeouts, and MLflow's and
Prefect's own timeouts from `orchestration.network_timeout_s`. Each path below meets a socket that accepts and
never answers, and ends in one line naming the endpoint and the setting, within a few timeouts."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vtg.config import load_config
from vtg.errors import VTGError
from vtg.net import LOOPBACK, TIMEOUT_SETTING, check_prefect_api, check_tracking_server, s3_client

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 2.0
BOUND = 4 * TIMEOUT + 10  # a few timeouts (two attempts for boto3) and a process start, never minutes


@pytest.fixture
def silent_url():
    """http://127.0.0.1:<port>: accepts every connection, reads nothing, answers nothing; stopped at the end."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((LOOPBACK, 0))
    srv.listen(16)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://{LOOPBACK}:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    srv.close()


def _cfg(tmp_path: Path, url: str):
    return load_config(REPO / "params.yaml", None, [f"tracking.tracking_uri={url}",
                                                    f"orchestration.network_timeout_s={TIMEOUT}",
                                                    f"train.out_dir={tmp_path / 'sft'}",
                                                    f"rl.out_dir={tmp_path / 'rl'}",
                                                    f"evaluate.out_dir={tmp_path / 'eval'}"])


def _one_line(e: pytest.ExceptionInfo, url: str, setting: str) -> None:
    msg = str(e.value)
    assert url in msg and setting in msg and TIMEOUT_SETTING in msg and "\n" not in msg, msg


# ---- in-process paths --------------------------------------------------------------------------------------
def _mlflow_training(cfg):
    from training.callbacks.mlflow_cb import MLflowCallback

    MLflowCallback(cfg).on_train_start({})


def _mlflow_evaluation(cfg):
    from evaluation import tracking

    tracking.client(cfg.tracking)


def _mlflow_flows(cfg):
    from flows import tracking

    tracking.client(cfg)


def _mlflow_check(cfg):
    check_tracking_server(cfg.tracking.tracking_uri)


@pytest.mark.parametrize("path", [_mlflow_training, _mlflow_evaluation, _mlflow_flows, _mlflow_check],
                         ids=lambda f: f.__name__)
def test_a_silent_tracking_server_is_one_line_on_every_mlflow_path(tmp_path, silent_url, path):
    cfg = _cfg(tmp_path, silent_url)
    t0 = time.monotonic()
    with pytest.raises(VTGError) as e:
        path(cfg)
    assert time.monotonic() - t0 < BOUND
    _one_line(e, silent_url, "tracking.tracking_uri")


def _prefect_eval_mode(cfg):
    from flows.evaluator import eval_mode

    eval_mode(cfg)


def _prefect_check(cfg):
    check_prefect_api()


@pytest.mark.parametrize("path", [_prefect_eval_mode, _prefect_check], ids=lambda f: f.__name__)
def test_a_silent_prefect_api_is_one_line(tmp_path, silent_url, monkeypatch, path):
    cfg = _cfg(tmp_path, "sqlite:///x.db")
    monkeypatch.setenv("PREFECT_API_URL", f"{silent_url}/api")
    t0 = time.monotonic()
    with pytest.raises(VTGError) as e:
        path(cfg)
    assert time.monotonic() - t0 < BOUND
    _one_line(e, silent_url, "PREFECT_API_URL")


def test_the_object_store_client_times_out(silent_url, monkeypatch):
    from botocore.exceptions import ReadTimeoutError

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    t0 = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        s3_client(silent_url, timeout_s=TIMEOUT, region_name="us-east-1").list_buckets()
    assert time.monotonic() - t0 < BOUND


# ---- the CLIs, as a user runs them ---------------------------------------------------------------------------
def _run(args: list[str], env: dict, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
                       check=False)
    return r, time.monotonic() - t0


def test_lineage_against_a_silent_server_is_one_line(tmp_path, silent_url):
    params = tmp_path / "params.yaml"
    params.write_text(f"orchestration:\n  network_timeout_s: {TIMEOUT}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r, took = _run(["-m", "flows.lineage", "0123456789abcdef0123456789abcdef", "--params", str(params),
                    "--tracking-uri", silent_url], env, tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert silent_url in line and TIMEOUT_SETTING in line and took < BOUND + 20


def test_the_object_store_cli_against_a_silent_endpoint_is_one_line(tmp_path, silent_url):
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ENDPOINT_URL_S3": silent_url, "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1", "VTG_NETWORK_TIMEOUT_S": str(TIMEOUT)}
    r, took = _run(["-m", "infra.objstore", "cat", "s3://bucket/key"], env, tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert "object store" in line and TIMEOUT_SETTING in line and took < BOUND + 20


# ---- the enumeration: no network client outside the mechanism ------------------------------------------------
CLIENTS = re.compile(r"mlflow\.set_tracking_uri\(|MlflowClient\(|get_client\(|boto3\.client\(|urlopen\(")
GUARDS = re.compile(r"check_tracking_server|check_prefect_api|s3_client|timeout=")


def test_every_file_that_opens_a_network_client_goes_through_the_mechanism():
    unguarded = []
    for d in ("vtg", "flows", "training", "evaluation", "infra", "annotate", "ingest", "beam_jobs", "corpus"):
        for f in (REPO / d).rglob("*.py"):
            text = f.read_text()
            if CLIENTS.search(text) and not GUARDS.search(text):
                unguarded.append(str(f.relative_to(REPO)))
    assert unguarded == []
