"""The real preprocess graph on Beam's portable runner (the job API Flink and Spark are driven through): the same
bytes as DirectRunner."""

from __future__ import annotations

import pytest
from support.runner_parity import SETTINGS, differing, outputs, run_into

from beam_jobs.pipeline import DEAD_LETTER
from vtg.shards import MANIFEST

PORTABLE = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]


@pytest.mark.slow
def test_portable_runner_writes_the_direct_runners_bytes(small_dataset, cfg_factory, tmp_path):
    """The whole job through `preprocess.run` on the PortableRunner with the embedded job server: the graph is
    translated to the portable pipeline proto, submitted through the job API and run by the portable runner, its
    DoFns in an SDK harness over the Fn API (LOOPBACK: the harness lives in this process, reached over gRPC; Beam
    binds those servers on all interfaces, as its DirectRunner does, and no option changes that). Shards,
    manifest, dead letters, filtered and audit logs and the plot equal, byte for byte, those of the shipped
    DirectRunner profile (multi_processing, two workers) on the same records."""
    cfg = cfg_factory(small_dataset, *SETTINGS)
    manifest = run_into(cfg, [], tmp_path / "direct")
    again = run_into(cfg, PORTABLE, tmp_path / "portable")
    # every sample carries the code version: an edit of the stage's code between the runs changes all the shards
    assert again["code_version"] == manifest["code_version"], "the preprocess code changed during the test"
    direct, portable = outputs(tmp_path / "direct"), outputs(tmp_path / "portable")
    assert differing(direct, portable) == []
    # the corpus reached every split and every way out, so the equality covers them
    assert set(manifest["samples_per_split"]) == {"train", "val", "test"} and len(manifest["shards"]) >= 4
    assert {"near_duplicate_video", "duplicate_query"} <= set(manifest["dropped_per_reason"])
    assert manifest["records"]["failed"] > 0 and {MANIFEST, DEAD_LETTER} <= set(portable)
