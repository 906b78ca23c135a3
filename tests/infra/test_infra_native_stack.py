"""The non-embedded configuration, for real, without Docker (no engine here): PostgreSQL from Debian's packages,
an S3 endpoint (MinIO if installed, else moto's S3 server), the Prefect server on Postgres and the MLflow server
on Postgres + S3 artifacts -- the same services compose.yaml runs, started by infra.native. A real process
worker on the declared `cpu` pool runs a real deployment from infra/prefect/prefect.yaml."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from support.infra_paths import ROOT

from infra import native, objstore

pytestmark = pytest.mark.slow


def _missing_postgres() -> str | None:
    try:
        native.postgres_bin("initdb")
    except native.ServiceError as e:
        return str(e)
    return None


if reason := _missing_postgres():
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with native.stack(tmp_path_factory.mktemp("native")) as env:
        yield env


def run(argv: list[str], env: dict[str, str], timeout: float = 240, cwd=ROOT) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       check=False)
    assert r.returncode == 0, f"$ {' '.join(argv)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def bin_(name: str) -> str:
    return str(ROOT / ".venv" / "bin" / name) if (ROOT / ".venv" / "bin" / name).exists() else \
        str(shutil.which(name) or name)


def prefect_py(code: str, env: dict[str, str]) -> object:
    """Ask the server something through Prefect's client, in a process that sees the stack's env."""
    out = run([sys.executable, "-c", code], env, timeout=120).stdout.strip().splitlines()[-1]
    return json.loads(out)


def test_pools_deployments_and_a_worker_run_against_postgres_backed_prefect_and_mlflow(stack):
    run([sys.executable, "-m", "infra.pools", "apply", "infra/prefect/work-pools.yaml"], stack)
    run([sys.executable, "-m", "infra.pools", "apply", "infra/prefect/work-pools.yaml"], stack)  # idempotent
    run([bin_("prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect/prefect.yaml"], stack,
        timeout=300)
    server = prefect_py(
        "import json; from prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as c:\n"
        "    pools = {p.name: p.type for p in c.read_work_pools()}\n"
        "    deps = {f'{c.read_flow(d.flow_id).name}/{d.name}': [d.work_pool_name, d.work_queue_name]"
        " for d in c.read_deployments()}\n"
        "    queues = sorted(q.name for q in c.read_work_queues(work_pool_name='gpu'))\n"
        "    autos = [a.name for a in c.read_automations()]\n"
        "print(json.dumps({'pools': pools, 'deps': deps, 'gpu_queues': queues, 'automations': autos}))", stack)
    assert {"cpu": "process", "gpu": "process", "gpu-eval": "process",
            "gpu-k8s": "kubernetes"}.items() <= server["pools"].items()
    assert server["deps"]["post-training/default"] == ["gpu", "default"]
    assert server["deps"]["evaluate-checkpoint/on-checkpoint-saved"] == ["gpu-eval", "default"]
    assert server["deps"]["preprocess/cpu"][0] == "cpu" and server["deps"]["infra-smoke/gpu"][0] == "gpu"
    assert {"default", "node-0", "node-1"} <= set(server["gpu_queues"])
    assert any("on-checkpoint-saved" in a for a in server["automations"]), server["automations"]

    run_id = prefect_py("import json; from prefect.deployments import run_deployment\n"
                        "r = run_deployment('infra-smoke/cpu', timeout=0)\n"
                        "print(json.dumps(str(r.id)))", stack)
    t0 = time.monotonic()
    run([bin_("prefect"), "worker", "start", "--pool", "cpu", "--type", "process", "--run-once"], stack,
        timeout=300)
    state = prefect_py("import json, sys; from prefect.client.orchestration import get_client\n"
                       "with get_client(sync_client=True) as c:\n"
                       f"    fr = c.read_flow_run('{run_id}')\n"
                       "print(json.dumps([fr.state.type.value, fr.work_pool_name]))", stack)
    assert state == ["COMPLETED", "cpu"], f"flow run {run_id}: {state} after {time.monotonic() - t0:.0f}s"

    # The flow's MLflow run is in the Postgres backend, and its artifact in the S3 bucket.
    import psycopg2

    with psycopg2.connect(stack["VTG_POSTGRES_URL"].rsplit("/", 1)[0] + "/mlflow") as conn, conn.cursor() as cur:
        cur.execute("SELECT r.run_uuid FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
                    "WHERE e.name = 'vtg-infra-smoke' AND r.status = 'FINISHED'")
        mlflow_runs = [row[0] for row in cur.fetchall()]
    assert len(mlflow_runs) == 1
    with psycopg2.connect(stack["VTG_POSTGRES_URL"].rsplit("/", 1)[0] + "/prefect") as conn, conn.cursor() as cur:
        cur.execute("SELECT state_type FROM flow_run WHERE id = %s", (run_id,))
        assert cur.fetchone()[0] == "COMPLETED"
    keys = [o["Key"] for o in s3(stack).list_objects_v2(Bucket="vtg-mlflow").get("Contents", [])]
    assert any(k.endswith(f"{mlflow_runs[0]}/artifacts/smoke.txt") for k in keys), keys


def s3(stack):
    return native.S3(stack["AWS_ENDPOINT_URL_S3"], stack["AWS_ACCESS_KEY_ID"], stack["AWS_SECRET_ACCESS_KEY"],
                     stack["VTG_S3_KIND"]).client()


def write_tiny_shards(root, n_shards=2, per_shard=3):
    import numpy as np

    from vtg.shards import SHARD_PATTERN, QueryMeta, SampleMeta, encode_jpeg, write_shard

    rng = np.random.default_rng(0)
    for s in range(n_shards):
        samples = []
        for i in range(per_shard):
            meta = SampleMeta(key=f"v{s}{i}.0", video_id=f"v{s}{i}", window_index=0, window_start_s=0.0,
                              window_end_s=4.0, frame_timestamps=[0.0, 2.0], fps=0.5, num_frames=2, split="train",
                              queries=[QueryMeta(text="a red square", windows=[(1.0, 2.0)], annotation_id=f"a{i}")])
            frames = [encode_jpeg(rng.integers(0, 255, (28, 28, 3), dtype=np.uint8)) for _ in range(2)]
            samples.append((meta, frames))
        write_shard(root / "train" / (SHARD_PATTERN % s), samples)


def test_dvc_remote_on_the_s3_endpoint_is_the_source_of_truth_for_the_shards(stack, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = dict(stack)
    dvc = bin_("dvc")
    run(["git", "init", "-q"], env, cwd=repo)
    run([dvc, "init", "-q"], env, cwd=repo)
    write_tiny_shards(repo / "data" / "shards")
    run([dvc, "add", "data/shards"], env, cwd=repo)
    # The exact commands docs/scaling.md gives for the MinIO remote.
    run([dvc, "remote", "add", "-d", "minio", "s3://vtg-dvc/store"], env, cwd=repo)
    run([dvc, "remote", "modify", "minio", "endpointurl", stack["AWS_ENDPOINT_URL_S3"]], env, cwd=repo)
    run([dvc, "push", "-r", "minio"], env, cwd=repo)
    stored = [o["Key"] for o in s3(stack).list_objects_v2(Bucket="vtg-dvc", Prefix="store/").get("Contents", [])]
    assert len(stored) >= 3, stored  # two shards + the directory manifest, content-addressed
    before = {p.name: p.read_bytes() for p in (repo / "data" / "shards" / "train").glob("*.tar")}
    shutil.rmtree(repo / "data" / "shards")
    shutil.rmtree(repo / ".dvc" / "cache")
    run([dvc, "pull", "-r", "minio"], env, cwd=repo)
    after = {p.name: p.read_bytes() for p in (repo / "data" / "shards" / "train").glob("*.tar")}
    assert after == before and len(after) == 2

    # The streaming copy is published under the DVC data version, so its URL names the exact data.
    version = objstore.dvc_hash("data/shards", repo=repo)
    dvc_meta = (repo / "data" / "shards.dvc").read_text()
    assert f"md5: {version}.dir" in dvc_meta
    publish = run([sys.executable, "-m", "infra.objstore", "publish", "data/shards", "s3://vtg-shards/dvc",
                   "--versioned"], {**env, "PYTHONPATH": str(ROOT)}, cwd=repo)
    assert f"s3://vtg-shards/dvc/{version}" in publish.stdout
    listed = run([sys.executable, "-m", "infra.objstore", "urls", f"s3://vtg-shards/dvc/{version}", "train"],
                 {**env, "PYTHONPATH": str(ROOT)}, cwd=repo).stdout.split("\n")
    assert len([u for u in listed if u.startswith("pipe:")]) == 2


def test_shards_stream_from_object_storage_through_the_training_reader_stages(stack, tmp_path, monkeypatch):
    import webdataset as wds

    from vtg.shards import member_key

    for k, v in stack.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(ROOT)
    write_tiny_shards(tmp_path / "shards")
    keys = objstore.publish(tmp_path / "shards", "s3://vtg-shards/shards/v-test")
    assert sorted(keys) == ["shards/v-test/train/shard-000000.tar", "shards/v-test/train/shard-000001.tar"]
    urls = objstore.stream_urls("s3://vtg-shards/shards/v-test", "train")
    assert all(u.startswith("pipe:") for u in urls) and len(urls) == 2

    def samples(sources):
        members = wds.tariterators.tar_file_expander(wds.tariterators.url_opener(sources))
        return [{k: v for k, v in s.items() if not k.startswith("__url")}
                for s in wds.tariterators.group_by_keys(members, keys=member_key)]

    local = samples([{"url": str(p)} for p in sorted((tmp_path / "shards" / "train").glob("*.tar"))])
    streamed = samples([{"url": u} for u in urls])
    assert len(streamed) == 6 and streamed == local


def test_post_training_flow_runs_against_the_services(stack, tmp_path):
    """The real post-training flow (Prefect tasks, MLflow lineage, DVC versioning and push) against the Prefect
    server, the MLflow server and the S3 DVC remote, on the orchestration tests' tiny stand-in stages."""
    from support.flowkit import (
        PY,
        STANDIN_OVERRIDES,
        git,
        make_project,
        project_env,
        set_params,
        shadow_stages,
    )

    project = make_project(tmp_path / "proj")
    shadow_stages(project)
    set_params(project, **{"corpus.n_videos": 10})
    env = {**project_env(project, STANDIN_STEP_S="0.1"), **stack}
    dvc = bin_("dvc")
    run([dvc, "remote", "add", "minio", "s3://vtg-dvc/pipeline"], env, cwd=project)
    run([dvc, "remote", "modify", "minio", "endpointurl", stack["AWS_ENDPOINT_URL_S3"]], env, cwd=project)
    git(project, "add", "-A")
    git(project, "commit", "-qm", "project")
    overrides = [*STANDIN_OVERRIDES, "train.max_steps=4", "orchestration.dvc_remote=minio",
                 f"tracking.tracking_uri={stack['MLFLOW_TRACKING_URI']}", "orchestration.eval_trigger=embedded"]
    run([PY, "-m", "flows", *overrides], env, cwd=project, timeout=400)

    import psycopg2

    base = stack["VTG_POSTGRES_URL"].rsplit("/", 1)[0]
    with psycopg2.connect(base + "/prefect") as conn, conn.cursor() as cur:
        cur.execute("SELECT fr.state_type FROM flow_run fr JOIN flow f ON fr.flow_id = f.id "
                    "WHERE f.name = 'post-training'")
        assert [r[0] for r in cur.fetchall()] == ["COMPLETED"]
    with psycopg2.connect(base + "/mlflow") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
                    "WHERE e.name = 'vtg-posttrain'")
        assert cur.fetchone()[0] >= 3  # pipeline parent + stage runs
    pushed = s3(stack).list_objects_v2(Bucket="vtg-dvc", Prefix="pipeline/").get("KeyCount", 0)
    assert pushed >= 1
