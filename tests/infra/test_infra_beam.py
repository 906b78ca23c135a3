"""Beam runner profiles: every profile (params.yaml and the infra/beam overlays) builds valid PipelineOptions; the
Dask profile submits to the cluster infra/beam/dask-cluster.yaml declares, whose commands start one here."""

import logging
import os
import sys
from urllib.parse import urlparse

import psutil
import pytest
import yaml
from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    SparkRunnerOptions,
    StandardOptions,
    WorkerOptions,
)
from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
from apache_beam.runners import create_runner
from support.dask_clients import close_dask_clients
from support.infra_paths import INFRA, ROOT

from beam_jobs.options import option_args, pipeline_options
from vtg.config import load_config
from vtg.net import LOOPBACK, free_port

RUNNER_CLASS = {"direct": "DirectRunner", "dataflow": "DataflowRunner", "flink": "FlinkRunner",
                "spark": "SparkRunner"}
OVERLAYS = {"dataflow": INFRA / "beam" / "dataflow.yaml", "flink": INFRA / "beam" / "flink.yaml",
            "spark": INFRA / "beam" / "spark.yaml", "dask": INFRA / "beam" / "dask.yaml"}
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
DASK_CLUSTER = INFRA / "beam" / "dask-cluster.yaml"


def build(runner: str, overlay: bool, caplog) -> PipelineOptions:
    cfg = load_config(ROOT / "params.yaml", str(OVERLAYS[runner]) if overlay else None,
                      [] if overlay else [f"preprocess.runner={runner}"])
    assert cfg.preprocess.runner == runner
    with caplog.at_level(logging.WARNING):
        options = pipeline_options(cfg)
        options.get_all_options()  # parses every flag; unknown ones are logged as "Discarding unparseable args"
    assert "unparseable" not in caplog.text and "invalid" not in caplog.text, caplog.text
    return options


@pytest.mark.parametrize("runner", sorted(RUNNER_CLASS))
def test_params_profiles_switch_runner_with_one_key(runner, caplog):
    options = build(runner, overlay=False, caplog=caplog)
    assert options.view_as(StandardOptions).runner == RUNNER_CLASS[runner]
    assert PipelineOptionsValidator(options, create_runner(RUNNER_CLASS[runner])).validate() == []


def test_dataflow_overlay_is_complete_for_the_service(caplog):
    options = build("dataflow", overlay=True, caplog=caplog)
    gcp = options.view_as(GoogleCloudOptions)
    assert gcp.project and gcp.region and gcp.temp_location.startswith("gs://")
    assert gcp.staging_location.startswith("gs://")
    assert options.view_as(WorkerOptions).sdk_container_image.endswith("vtg-beam-worker:0.1.0")
    assert PipelineOptionsValidator(options, create_runner("DataflowRunner")).validate() == []
    # The validator is real: it rejects a Dataflow profile without a GCS temp location.
    broken = PipelineOptions([a for a in option_args(load_config(ROOT / "params.yaml", str(OVERLAYS["dataflow"])))
                              if not a.startswith(("--temp_location", "--staging_location"))]
                             + ["--temp_location=/tmp/local"])
    assert PipelineOptionsValidator(broken, create_runner("DataflowRunner")).validate()


@pytest.mark.parametrize("runner,options_cls,master_field", [
    ("flink", FlinkRunnerOptions, "flink_master"), ("spark", SparkRunnerOptions, "spark_master_url")])
def test_portable_overlays_run_the_sdk_harness_in_the_worker_image(runner, options_cls, master_field, caplog):
    options = build(runner, overlay=True, caplog=caplog)
    assert getattr(options.view_as(options_cls), master_field)
    portable = options.view_as(PortableOptions)
    assert portable.environment_type == "DOCKER"
    assert portable.environment_config.endswith("vtg-beam-worker:0.1.0")
    assert PipelineOptionsValidator(options, create_runner(RUNNER_CLASS[runner])).validate() == []


@pytest.mark.slow
def test_flink_profile_runs_on_the_portable_job_api_embedded(tmp_path):
    """The Flink/Spark profiles submit through Beam's portable job API. Here no cluster or job-server jar can
    exist, so the same options run against the embedded portable job service (only the endpoint and the
    harness environment swapped): the pipeline goes through job submission, staging and the Fn API for real."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    args = [a for a in option_args(load_config(ROOT / "params.yaml", str(OVERLAYS["flink"])))
            if not a.startswith(("--runner", "--environment_type", "--environment_config", "--s3_endpoint_url",
                                 "--temp_location"))]
    options = PipelineOptions(args + ["--runner=PortableRunner", "--job_endpoint=embed",
                                      "--environment_type=LOOPBACK"])
    with beam.Pipeline(options=options) as p:
        counts = (p | beam.Create(["a", "b", "a", "c", "a"]) | beam.Map(lambda w: (w, 1))
                  | beam.CombinePerKey(sum))
        assert_that(counts, equal_to([("a", 3), ("b", 1), ("c", 1)]))


def dask_profile(address: str | None = None) -> list[str]:
    """The overlay's `dask` runner profile, its scheduler address swapped when one is given."""
    args = load_config(ROOT / "params.yaml", str(OVERLAYS["dask"])).preprocess.runner_profiles["dask"]
    if address is None:
        return list(args)
    return [a for a in args if not a.startswith("--dask_client_address=")] + [f"--dask_client_address={address}"]


def dask_cluster() -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(DASK_CLUSTER.read_text())}


def test_dask_overlay_submits_to_the_cluster_manifest(caplog):
    from apache_beam.runners.dask.dask_runner import DaskOptions  # registers the --dask_* options

    options = PipelineOptions(dask_profile())
    with caplog.at_level(logging.WARNING):
        dask = options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)
    assert "unparseable" not in caplog.text, caplog.text
    assert options.view_as(StandardOptions).runner == DASK_RUNNER
    assert PipelineOptionsValidator(options, create_runner(DASK_RUNNER)).validate() == []
    docs = dask_cluster()
    service = docs[("Service", "dask-scheduler")]
    meta, port = service["metadata"], service["spec"]["ports"][0]
    assert dask["address"] == f"tcp://{meta['name']}.{meta['namespace']}.svc.cluster.local:{port['port']}"
    scheduler = docs[("Deployment", "dask-scheduler")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": port["targetPort"], "containerPort": port["port"]} in scheduler["ports"]
    assert scheduler["command"][:2] == ["dask", "scheduler"] and str(port["port"]) in scheduler["command"]
    pod = docs[("Deployment", "dask-worker")]["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    assert worker["command"][:3] == ["dask", "worker", dask["address"]]
    assert worker["command"][worker["command"].index("--nthreads") + 1] == "1"
    # the same worker image as the portable profiles' SDK harness
    image = PipelineOptions(option_args(load_config(ROOT / "params.yaml", str(OVERLAYS["flink"])))).view_as(
        PortableOptions).environment_config
    assert scheduler["image"] == worker["image"] == image
    # every worker mounts the shared volume the overlay reads and writes (no s3:// on Dask workers)
    (mount,) = worker["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claim = docs[("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    pp = load_config(ROOT / "params.yaml", str(OVERLAYS["dask"])).preprocess
    assert pp.records.startswith(mount["mountPath"] + "/") and pp.out_dir.startswith(mount["mountPath"] + "/")


@pytest.mark.slow
def test_dask_manifest_commands_start_the_cluster_the_profile_runs_on(tmp_path):
    """The manifest's scheduler command and two replicas of its worker command, started here on 127.0.0.1 (free
    ports, the scheduler's address swapped in), form a cluster the `dask` profile runs a pipeline on (its
    address swapped). Every process is stopped at the end, also on failure. The workers import only what is
    installed (not this test module): the steps are lambdas over the project's own functions."""
    import apache_beam as beam
    from distributed import Client

    from beam_jobs.sink import write_text
    from infra.native import process

    docs = dask_cluster()
    scheduler = docs[("Deployment", "dask-scheduler")]["spec"]["template"]["spec"]["containers"][0]["command"]
    worker = docs[("Deployment", "dask-worker")]["spec"]["template"]["spec"]["containers"][0]["command"]
    dask_cli = os.path.join(os.path.dirname(sys.executable), "dask")
    address = f"tcp://{LOOPBACK}:{free_port()}"
    local = ["--host", LOOPBACK, "--dashboard-address", f"{LOOPBACK}:0"]
    worker = [dask_cli, "worker", address, *worker[3:], *local]  # the manifest's scheduler URL is positional
    with (process([dask_cli, *scheduler[1:], *local, "--port", address.rsplit(":", 1)[1]],
                  tmp_path / "scheduler.log") as sched,
          process(worker, tmp_path / "worker-0.log") as w0, process(worker, tmp_path / "worker-1.log") as w1):
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            assert {urlparse(w).hostname for w in client.scheduler_info()["workers"]} == {LOOPBACK}
        out = tmp_path / "counts.txt"
        try:
            p = beam.Pipeline(options=PipelineOptions(dask_profile(address)))
            (p | beam.Create(["a", "b", "a", "c", "a"]) | beam.Map(lambda w: (w, 1)) | beam.CombinePerKey(sum)
             | beam.CombineGlobally(beam.combiners.ToListCombineFn()).without_defaults()
             | beam.Map(lambda counts, path: write_text(path, repr(sorted(counts))), str(out)))
            p.run().wait_until_finish()
        finally:
            close_dask_clients()
        assert out.read_text() == repr([("a", 3), ("b", 1), ("c", 1)])
        group = [sched.pid, w0.pid, w1.pid]
    left = [q.pid for q in psutil.process_iter() if _alive_in(q, group)]
    assert not left, f"processes left by the Dask cluster: {left}"


def _alive_in(proc: psutil.Process, sessions: list[int]) -> bool:
    """`proc` runs in one of these sessions (a zombie has ended: only its exit status is left to collect)."""
    try:
        return os.getsid(proc.pid) in sessions and proc.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False
