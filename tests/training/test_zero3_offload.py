"""ZeRO-3 with parameter offload (`train.zero_stage=3`, `engine.offload_param=true`; the DeepSpeed config from
`training.ds_config`) on the tiny rung at world size 2 under torchrun on CPU (gloo), issue 37 item 6.

What DeepSpeed does here, read in its 0.19 source and checked below: with `offload_param` its ZeRO-3 optimizer
keeps each rank's parameter partition in a flat host buffer (`param_groups_fp16_flat_cpu_memory`) instead of the
accelerator-side `lp_param_buffer`, and gathers layers from it for each forward and backward. On the CPU
accelerator host and device memory are the same, so the path runs but saves nothing, and `pin_memory` is a no-op
there (the generated config asks for it only on GPUs). NVMe offload (`device: nvme`) would need DeepSpeed's
async_io op, which is not buildable here (no libaio); the config never generates it.

One launch trains a straight run to step 4, a run that checkpoints step 2 and stops, and that run resumed (a new
engine loading the checkpoint, in the same processes): losses and final weights bit-equal to the straight run's.
"""

from __future__ import annotations

import pytest
import torch
from ws2_launch import Launch, final_weights

COMMON = ["train.micro_batch_size=4", "train.max_steps=4", "train.save_every=2", "train.log_every=1",
          "train.progress=false", "train.data.num_workers=0", "train.data.shuffle_buffer=16",
          "train.data.sanity_examples=4", "tracking.enabled=false", "train.guards.min_steps=1000",
          "train.teach.steps=0", "evaluate.forgetting.suite=", "train.num_gpus=2", "train.zero_stage=3",
          "engine.offload_param=true", "orchestration.rl=false"]


@pytest.mark.slow
def test_zero3_param_offload_trains_and_resumes_bit_exact(shards_dir, tmp_path):
    """Measured: ~45 s (one launch; 2 cores shared with other work)."""
    def job(name: str, out: str, **kw) -> dict:
        return {"name": name, "overrides": [f"train.shards_dir={shards_dir}", f"train.out_dir={tmp_path / out}",
                                            *COMMON], **kw}

    launch = Launch(tmp_path, "zero3_offload", [job("straight", "a"), job("first", "b", stop_after=2),
                                                job("resumed", "b")]).finish()
    for rank_report in launch.report("straight"):
        e = rank_report["engine"]
        assert e["zero_config"]["stage"] == 3
        assert e["zero_config"]["offload_param"] == {"device": "cpu", "pin_memory": False}
        assert e["offload_param"] and not e["offload_param_pin_memory"]  # DeepSpeed took the offload path
        assert e["offload_flat_buffer_numel"] >= e["local_numel"] > 0 and not e["lp_param_buffer"]
        assert e["partition_devices"] == ["cpu"] and e["gathered_now"] == 0  # only partitions between steps
        assert 0.45 < e["local_numel"] / e["global_numel"] < 0.55  # each rank holds half
    straight = launch.report("straight")[0]["summary"]
    assert straight["step"] == 4 and straight["skipped_batches"] == 0
    losses = straight["losses"]
    assert all(0 < x < 20 for x in losses) and losses[-1] < losses[0]
    assert launch.report("first")[0]["summary"]["step"] == 2
    assert f"resumed from {tmp_path / 'b' / 'step-000002'} (step 2" in launch.text()
    assert launch.report("resumed")[0]["summary"]["losses"] == losses
    got, want = final_weights(tmp_path / "b"), final_weights(tmp_path / "a")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
