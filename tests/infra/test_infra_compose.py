"""infra/compose.yaml and infra/.env.example: parsed and cross-checked without a Docker engine."""

import re
import shutil
import subprocess

import pytest
import yaml
from support.infra_paths import INFRA, ROOT

COMPOSE = INFRA / "compose.yaml"
ENV_EXAMPLE = INFRA / ".env.example"
VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")


def env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: {line!r} is not KEY=VALUE"
            out[key] = value
    return out


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name, op, default = m.group(1), m.group(2), m.group(3)
        if name in env and (env[name] or op != ":-"):
            return env[name]
        if op in ("-", ":-"):
            return default
        raise KeyError(name)
    return VAR.sub(sub, text).replace("$$", "$")


def test_every_variable_is_in_env_example_and_every_key_is_used():
    text = COMPOSE.read_text()
    used = {m.group(1) for m in VAR.finditer(text) if m.group(2) not in ("-", ":-")}
    keys = set(env_example())
    assert used - keys == set(), f"compose reads variables missing from .env.example: {sorted(used - keys)}"
    assert keys - {m.group(1) for m in VAR.finditer(text)} == set(), "stale keys in .env.example"


def test_env_file_is_ignored_and_example_has_no_real_secrets():
    assert ".env" in (INFRA / ".gitignore").read_text().split()
    check = subprocess.run(["git", "check-ignore", "-q", "infra/.env"], cwd=ROOT, check=False)
    assert check.returncode == 0, "infra/.env must be git-ignored"
    for key, value in env_example().items():
        if "PASSWORD" in key:
            assert value.startswith("change-me"), f"{key} in .env.example must be a placeholder"


def test_interpolated_file_is_valid_yaml_and_ports_bind_to_localhost(compose):
    env = env_example()
    assert env["BIND_ADDR"] == "127.0.0.1"
    resolved = yaml.safe_load(interpolate(COMPOSE.read_text(), env))
    published = 0
    for name, svc in resolved["services"].items():
        for port in svc.get("ports", []):
            host, host_port, container_port = str(port).split(":")
            assert host == "127.0.0.1", f"{name}: port {port} not bound to localhost"
            assert host_port.isdigit() and container_port.isdigit(), f"{name}: bad port {port}"
            published += 1
    assert published >= 5  # postgres, minio api + console, prefect, mlflow


def test_references_resolve(compose):
    services, volumes = compose["services"], set(compose["volumes"])
    assert {"postgres", "minio", "prefect-server", "mlflow", "worker-cpu", "worker-gpu"} <= set(services)
    used_volumes = set()
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        for dep, spec in (deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps)):
            assert dep in services, f"{name} depends on undefined service {dep!r}"
            assert spec.get("condition", "service_started") in {
                "service_started", "service_healthy", "service_completed_successfully"}
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy: it has no healthcheck"
            assert "gpu" not in services[dep].get("profiles", []) or "gpu" in svc.get("profiles", []), \
                f"{name} depends on the gpu-profile-only {dep}"
        for mount in svc.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith((".", "/")):
                assert (INFRA / source).exists(), f"{name}: bind mount source {source} does not exist"
            else:
                assert source in volumes, f"{name}: volume {source!r} is not declared under top-level volumes"
                used_volumes.add(source)
        for env_file in [svc["env_file"]] if isinstance(svc.get("env_file"), str) else svc.get("env_file", []):
            assert (INFRA / env_file).exists()
    assert volumes - used_volumes == set(), f"declared but unused volumes: {volumes - used_volumes}"


def test_long_running_services_have_healthchecks_and_one_shots_exit(compose):
    for name, svc in compose["services"].items():
        if svc.get("restart") == "no":
            assert name.endswith("-init"), f"{name}: only *-init one-shots may skip restart"
        else:
            assert "healthcheck" in svc, f"{name} has no healthcheck"
            assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")


def test_builds_use_existing_dockerfiles_and_pinned_images(compose):
    for name, svc in compose["services"].items():
        if "build" in svc:
            context = (INFRA / svc["build"]["context"]).resolve()
            assert context == ROOT, f"{name}: build context must be the repo root (pyproject lives there)"
            assert (context / svc["build"]["dockerfile"]).is_file()
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: image {image!r} is not pinned"


def test_gpu_worker_reserves_nvidia_devices_and_sits_in_the_gpu_profile(compose):
    gpu = compose["services"]["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "--pool" in gpu["command"] and gpu["command"][gpu["command"].index("--pool") + 1] == "gpu"
    cpu = compose["services"]["worker-cpu"]
    assert cpu["command"][cpu["command"].index("--pool") + 1] == "cpu"
    assert "profiles" not in cpu, "the CPU services must come up without --profile"


def test_services_are_wired_to_postgres_and_minio(compose):
    s = compose["services"]
    assert s["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"].startswith(
        "postgresql+asyncpg://")
    mlflow_cmd = " ".join(s["mlflow"]["command"])
    assert "--backend-store-uri=postgresql+psycopg2://" in mlflow_cmd
    assert "--artifacts-destination=s3://${MLFLOW_BUCKET}" in mlflow_cmd
    assert s["mlflow"]["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    init_cmd = " ".join(s["minio-init"]["command"])
    assert "mc mb" in init_cmd and "${DVC_BUCKET}" in s["minio-init"]["environment"]["BUCKETS"]
    for worker in ("worker-cpu", "worker-gpu"):
        env = s[worker]["environment"]
        assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["VTG_DVC_REMOTE_URL"].startswith("s3://")


@pytest.mark.skipif(not shutil.which("docker")
                    or subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0,
                    reason="no `docker compose` plugin on this machine: validated by the tests above instead")
def test_docker_compose_config_accepts_the_file():
    r = subprocess.run(["docker", "compose", "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE), "--profile", "gpu",
                        "config", "-q"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
