"""A single trainer picks its own MASTER_PORT (`free_port`: free when asked, not reserved). When another process
takes it before the process group binds it (seen in the suite on two workers: `EADDRINUSE` in the DVC door's
train stage), the trainer picks another instead of failing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = """
import logging, os
logging.basicConfig(level=logging.INFO)
from training.dist import init_distributed
info = init_distributed("fsdp")
print("world", info.world_size, "port", os.environ["MASTER_PORT"])
"""


def test_a_taken_port_is_replaced_for_a_single_process(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env.update(PYTHONPATH=str(REPO), VTG_OWN_MASTER_PORT="1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        world, _, got = r.stdout.split()[1:4]
        assert world == "1" and int(got) != port and "was taken by another process" in r.stderr
        env.pop("VTG_OWN_MASTER_PORT")  # a port the user set is theirs: taken is an error, not replaced
        r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
        assert r.returncode != 0 and "EADDRINUSE" in r.stderr


DS_CODE = """
import os
from training.dist import init_distributed
info = init_distributed("deepspeed")
import deepspeed.comm as dist
print("world", info.world_size, "backend", info.backend, "ds", dist.is_initialized())
"""


def test_deepspeed_comm_starts_without_building_its_unused_shm_op(tmp_path):
    """DeepSpeed's comm backend JIT-builds its shared-memory all-reduce on a fresh machine (57 s of a fresh clone's
    `make run`), an op only `inference_all_reduce` uses. `training.dist` marks it unused: the process group starts
    and nothing is compiled into an empty extension cache (without the mark, `deepspeed_shm_comm` appears there)."""
    cache = tmp_path / "torch_extensions"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=str(REPO), TORCH_EXTENSIONS_DIR=str(cache))
    r = subprocess.run([sys.executable, "-c", DS_CODE], env=env, capture_output=True, text=True, timeout=300,
                       check=False, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1].split() == ["world", "1", "backend", "gloo", "ds", "True"], r.stdout
    built = sorted(p.name for p in cache.iterdir()) if cache.exists() else []
    assert "deepspeed_shm_comm" not in built, built
