"""Beam runner profiles: every profile (params.yaml and the infra/beam overlays) builds valid PipelineOptions."""

import logging

import pytest
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
from infra_paths import INFRA, ROOT

from beam_jobs.options import option_args, pipeline_options
from vtg.config import load_config

RUNNER_CLASS = {"direct": "DirectRunner", "dataflow": "DataflowRunner", "flink": "FlinkRunner",
                "spark": "SparkRunner"}
OVERLAYS = {"dataflow": INFRA / "beam" / "dataflow.yaml", "flink": INFRA / "beam" / "flink.yaml",
            "spark": INFRA / "beam" / "spark.yaml"}


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
