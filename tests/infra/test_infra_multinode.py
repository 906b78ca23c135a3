"""Multi-node DeepSpeed launch, for real on one machine: two "nodes" from a rendered hostfile, each started with
its own `python -m infra.multinode launch --node-rank i` (the one-worker-per-node path, no ssh), rendezvous over
127.0.0.1 and a gloo all-reduce across both. Only the hosts being distinct machines is missing."""

import json
import os
import subprocess
import sys

import pytest
from support.infra_paths import ROOT

from vtg.net import free_port

pytestmark = pytest.mark.slow

PROBE = '''
import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
out = sys.argv[sys.argv.index("--out") + 1]
with open(f"{out}.rank{dist.get_rank()}.json", "w") as f:
    json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
               "local_rank": int(os.environ["LOCAL_RANK"]), "args": sys.argv[1:]}, f)
dist.destroy_process_group()
'''


def test_two_nodes_from_a_rendered_hostfile_rendezvous_and_all_reduce(tmp_path):
    (tmp_path / "ddp_probe.py").write_text(PROBE)
    hostfile = tmp_path / "hostfile"
    subprocess.run([sys.executable, "-m", "infra.multinode", "hostfile", "--hosts", "node-a,node-b", "--slots", "1",
                    "-o", str(hostfile)], cwd=ROOT, check=True)
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "DS_ACCELERATOR": "cpu",
           "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen([sys.executable, "-m", "infra.multinode", "launch", "--hostfile", str(hostfile),
                               "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port,
                               "--module", "ddp_probe", "--", "--out", str(tmp_path / "res")],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    try:
        logs = [n.communicate(timeout=240)[0] for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(log[-2000:] for log in logs)
    results = [json.loads((tmp_path / f"res.rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world"], r["sum"], r["local_rank"]) for r in results] == [(0, 2, 3.0, 0), (1, 2, 3.0, 0)]
    assert all(r["args"] == ["--local_rank=0", "--out", str(tmp_path / "res")] for r in results)
