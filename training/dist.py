"""Process-group setup for every launcher (deepspeed, torchrun, a plain single process) and seeding."""

from __future__ import annotations

import logging
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as torch_dist

from vtg.net import OWN_PORT, free_port

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
UNUSED_DS_OPS = ("deepspeed_shm_comm",)
"""DeepSpeed JIT ops never built: the CPU shared-memory all-reduce serves only `inference_all_reduce`
(deepspeed/comm/torch.py), which training never calls (its all-reduces go through torch.distributed), and building
it cost 57 s of a fresh clone's `make run` (issue 40)."""


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def prepare_env() -> None:
    """Defaults a CPU run needs (docs/environment.md): one thread per rank, a project-local extension cache, and the
    rank variables a single process lacks (else DeepSpeed looks for mpi4py)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".cache" / "torch_extensions"))
    use_env_ninja()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:
        if not os.environ.get("MASTER_PORT"):
            os.environ[OWN_PORT] = "1"  # ours to replace if another process takes it first (init_distributed)
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT") or str(free_port()))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))


def use_env_ninja() -> None:
    """Put this environment's `ninja` first on PATH, so that every process builds DeepSpeed's JIT ops with the same
    one. Two ninja versions (the venv's 1.13 wheel, a system 1.11) record a build under different command hashes, so
    each one rebuilds what the other built: ~60 s per switch on 2 cores (docs/environment.md)."""
    bindir = Path(sys.executable).parent
    path = os.environ.get("PATH", "").split(os.pathsep)
    if (bindir / "ninja").exists() and (not path or path[0] != str(bindir)):
        os.environ["PATH"] = os.pathsep.join([str(bindir), *path])


def init_distributed(strategy: str = "deepspeed") -> DistInfo:
    """Initialise (once) the default process group: nccl on GPUs, gloo on CPU."""
    prepare_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    for attempt in range(5):
        if torch_dist.is_initialized():
            break
        try:
            if strategy == "deepspeed":
                import deepspeed
                import deepspeed.ops

                for name in UNUSED_DS_OPS:  # read by the comm backend before it builds the op (build_shm_op)
                    deepspeed.ops.__compatible_ops__[name] = False
                deepspeed.init_distributed(dist_backend=backend, verbose=False)
            else:
                torch_dist.init_process_group(backend=backend)
        except Exception as e:  # only a port taken between free_port() and the bind is retried
            alone = os.environ.get("WORLD_SIZE") == "1" and os.environ.get(OWN_PORT)
            if "EADDRINUSE" not in str(e) or not alone or attempt == 4:
                raise
            log.info("MASTER_PORT %s was taken by another process before it was bound; trying another",
                     os.environ["MASTER_PORT"])
            os.environ["MASTER_PORT"] = str(free_port())
    return DistInfo(torch_dist.get_rank(), torch_dist.get_world_size(), local_rank, device, backend)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


CUBLAS_WORKSPACE = ":4096:8"


def set_determinism(enabled: bool) -> None:
    """`engine.deterministic`, on every rank before the model is built: cuBLAS gets a fixed workspace (read when
    its handle is created, so before the first matmul), torch picks deterministic kernels (an op without one
    warns instead of failing), cuDNN deterministic and no benchmark autotuning. Off resets torch's switch (a
    previous in-process run may have set it); an explicit CUBLAS_WORKSPACE_CONFIG is kept."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    torch.backends.cudnn.deterministic = enabled


def rng_state() -> dict:
    """Every RNG's state in forms that need no pickle: python and numpy as JSON-able lists/numbers, torch and
    CUDA as tensors (saved apart, loaded with `torch.load(weights_only=True)`)."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(words), gauss], "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned (also takes the pickled forms of older checkpoints)."""
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def all_reduce_max(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
    return float(t.item())


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        torch_dist.all_reduce(t)
    return t.tolist()


def all_gather_objects(obj) -> list:
    """Every rank's `obj` (picklable), in rank order, on every rank; [obj] in a single process."""
    if not (torch_dist.is_initialized() and torch_dist.get_world_size() > 1):
        return [obj]
    out = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        torch_dist.barrier()


def broadcast(obj, dist: DistInfo):
    """Rank 0's `obj` on every rank (a no-op at world size 1)."""
    if dist.world_size == 1:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]
