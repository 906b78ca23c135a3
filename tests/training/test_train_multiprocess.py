"""World size 2 on CPU (gloo) under torchrun: ZeRO-2, disjoint data, an all-reduced skip, checkpoint per rank,
and an exact resume at world size 2 (losses and exported weights bit-equal to the uninterrupted run)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.train_fixtures import REPO_ROOT

from vtg.checkpoints import engine_dir, export_dir, read_checkpoint_meta, resolve_checkpoint


def _losses(summary: Path) -> list[float]:
    return [float(line.split(",")[1]) for line in summary.with_name(f"{summary.stem}_loss.csv").read_text()
            .splitlines()[1:]]


@pytest.mark.slow
def test_world_size_2_torchrun(shards_dir, tmp_path):
    """The straight 12-step run (rank 1's 3rd batch NaN: an all-reduced skip), then a second run resumed from its
    step-6 checkpoint (`train.resume=<step-000006>`, the state a `--stop-after 6` run leaves) into another root:
    steps 7-12 and the step-12 export are bit-equal to the straight run's."""
    from safetensors.torch import load_file

    env = dict(os.environ, PYTHONPATH=f"{REPO_ROOT}:{REPO_ROOT / 'tests' / 'training'}", OMP_NUM_THREADS="1")
    common = [f"train.shards_dir={shards_dir}", "train.micro_batch_size=4", "train.max_steps=12",
              "train.save_every=6", "train.log_every=1", "train.progress=false", "train.data.num_workers=0",
              "train.data.shuffle_buffer=16", "tracking.enabled=false"]

    def run(out: Path, summary: Path, *extra: str, nan_call: str = "3") -> subprocess.CompletedProcess:
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2",
               str(REPO_ROOT / "tests" / "training" / "ws2_entry.py"), "--summary", str(summary),
               f"train.out_dir={out}", *common, *extra]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=dict(env, VTG_TEST_NAN_CALL=nan_call), capture_output=True,
                              text=True, timeout=400, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    out, summary = tmp_path / "ck", tmp_path / "summary.json"
    proc = run(out, summary)
    s = json.loads(summary.read_text())
    assert s["step"] == 12 and s["skipped_batches"] == 1  # rank 0 skipped too: the verdict was all-reduced
    losses = _losses(summary)
    assert len(losses) == 12 and sum(losses[-3:]) < 0.8 * sum(losses[:3])
    assert "rank 1 step 2: skipped batch (nonfinite_loss" in proc.stderr
    assert "effective batch 8 = micro 4 x accum 1 x world 2" in proc.stderr
    meta = read_checkpoint_meta(out / "latest")
    assert meta["world_size"] == 2 and meta["step"] == 12
    assert {p.name for p in engine_dir(resolve_checkpoint(out)).glob("rank-*.pt")} == {"rank-0.pt", "rank-1.pt"}

    # exact resume at world size 2: no NaN injected in the resumed process (the skip lies before step 6; the
    # guard's and data position's state come from the checkpoint)
    step6 = out / "step-000006"
    out2, summary2 = tmp_path / "ck2", tmp_path / "resumed.json"
    proc2 = run(out2, summary2, f"train.resume={step6}", nan_call="0")
    assert f"resumed from {step6} (step 6" in proc2.stderr
    s2 = json.loads(summary2.read_text())
    assert s2["step"] == 12 and s2["skipped_batches"] == 1 and s2["samples_seen"] == s["samples_seen"]
    resumed = _losses(summary2)
    assert resumed == losses  # steps 1-6 restored from the checkpoint, 7-12 recomputed: bit for bit
    a = load_file(export_dir(out / "step-000012") / "model.safetensors")
    b = load_file(export_dir(out2 / "step-000012") / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
