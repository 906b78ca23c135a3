"""Launching `ws2_jobs_entry.py` under torchrun at world size 2 for the engine tests (test_fsdp_ws2.py,
test_zero3_offload.py): run to the end, or SIGKILL launcher and ranks at a point in the log; every process a
test starts is gone when the helper returns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from support.train_fixtures import REPO_ROOT

from vtg import checkpoints as ckpt

HERE = Path(__file__).resolve().parent
ENTRY = HERE / "ws2_jobs_entry.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TIMEOUT = 600


def env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(HERE)]), OMP_NUM_THREADS="1",
                DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process under it, by pid (torchrun's ranks live in their own sessions)."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for p in (proc, *children):
        try:
            p.send_signal(signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    proc.wait(timeout=60)
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, f"still running after SIGKILL: {[p.pid for p in alive]}"


class Launch:
    """One torchrun launch of `ws2_jobs_entry.py` over `jobs`; its reports in `<root>/<name>/`."""

    def __init__(self, root: Path, name: str, jobs: list[dict]):
        self.dir = root / name
        self.dir.mkdir(parents=True)
        (self.dir / "jobs.json").write_text(json.dumps(jobs))
        self.log = self.dir / "log"
        with self.log.open("w") as f:
            self.proc = subprocess.Popen([TORCHRUN, "--standalone", "--nproc_per_node=2", str(ENTRY),
                                          str(self.dir / "jobs.json"), str(self.dir)],
                                         cwd=REPO_ROOT, env=env(), stdout=f, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text()

    def finish(self) -> Launch:
        try:
            self.proc.wait(timeout=TIMEOUT)
        finally:
            if self.proc.poll() is None:
                kill_tree(self.proc)
        assert self.proc.returncode == 0, self.text()[-4000:]
        return self

    def kill_when(self, *lines: str) -> None:
        """SIGKILL launcher and ranks once every one of `lines` is in the log (fails if the run ends first)."""
        try:
            deadline = time.monotonic() + TIMEOUT
            while not all(line in self.text() for line in lines):
                assert self.proc.poll() is None, f"ended (rc {self.proc.returncode}):\n{self.text()[-3000:]}"
                assert time.monotonic() < deadline, "timed out before the kill point"
                time.sleep(0.2)
        finally:
            if self.proc.poll() is None:
                kill_tree(self.proc)
        assert self.proc.returncode == -signal.SIGKILL

    def report(self, job: str) -> list[dict]:
        return [json.loads((self.dir / f"{job}.rank{r}.json").read_text()) for r in (0, 1)]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    hf = ckpt.export_dir(ckpt.resolve_checkpoint(out))
    name = "adapter_model.safetensors" if (hf / "adapter_config.json").is_file() else "model.safetensors"
    return load_file(hf / name)


