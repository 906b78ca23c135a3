"""Work pools, deployments (Prefect's own loaders), Kubernetes manifests and the DeepSpeed hostfile template."""

import io
import json
import re

import pytest
import yaml
from support.infra_paths import INFRA, ROOT

from infra import multinode, pools
from vtg.errors import ConfigError

PREFECT_YAML = INFRA / "prefect" / "prefect.yaml"
POOLS_YAML = INFRA / "prefect" / "work-pools.yaml"


@pytest.fixture(scope="module")
def deploy_configs():
    from prefect.cli.deploy._config import _load_deploy_configs_and_actions
    from rich.console import Console

    out = io.StringIO()
    configs, actions = _load_deploy_configs_and_actions(PREFECT_YAML, console=Console(file=out))
    assert out.getvalue() == "", f"Prefect's loader complained: {out.getvalue()}"
    return configs, actions


def test_prefect_yaml_validates_with_prefects_model():
    from prefect.cli.deploy._models import PrefectYamlModel

    model = PrefectYamlModel.model_validate(yaml.safe_load(PREFECT_YAML.read_text()))
    assert model.pull is None, "no pull section: workers run where `prefect deploy` ran (/app in the images)"
    names = [(d.entrypoint, d.name) for d in model.deployments]
    assert len(set(names)) == len(names)


def test_every_deployment_entrypoint_loads_as_a_flow(deploy_configs, monkeypatch):
    from prefect.flows import load_flow_from_entrypoint

    monkeypatch.chdir(ROOT)
    seen = set()
    for d in deploy_configs[0]:
        flow = load_flow_from_entrypoint(d["entrypoint"])
        assert (flow.name, d["name"]) not in seen, f"duplicate deployment {flow.name}/{d['name']}"
        seen.add((flow.name, d["name"]))
        params = set(flow.parameters.properties)
        assert set(d.get("parameters", {})) <= params, f"{d['name']}: unknown parameters for {flow.name}"
    assert {("post-training", "default"), ("evaluate-checkpoint", "on-checkpoint-saved"),
            ("preprocess", "cpu"), ("infra-smoke", "cpu"), ("infra-smoke", "gpu")} <= seen


def test_deployments_land_on_declared_pools_and_queues(deploy_configs):
    declared = {s.name: s for s in pools.load_pools(POOLS_YAML)}
    by_name = {}
    for d in deploy_configs[0]:
        pool, queue = d["work_pool"]["name"], d["work_pool"].get("work_queue_name") or "default"
        assert pool in declared, f"{d['name']}: pool {pool!r} not in work-pools.yaml"
        assert queue in declared[pool].queues, f"{d['name']}: queue {queue!r} not declared in pool {pool!r}"
        by_name[(d["entrypoint"], d["name"])] = (pool, queue)
    assert by_name[("flows/pipeline.py:post_training", "default")][0] == "gpu"
    assert by_name[("flows/evaluation.py:evaluate_checkpoint", "on-checkpoint-saved")] == ("gpu-eval", "default")
    assert by_name[("infra/stage_flows.py:preprocess", "cpu")][0] == "cpu"
    for rank in range(len(declared["gpu"].queues) - 1):  # one queue per node besides `default`
        assert by_name[("infra/stage_flows.py:train_node", f"node-{rank}")] == ("gpu", f"node-{rank}")


def _polled_pool(command: list[str]) -> str | None:
    return command[command.index("--pool") + 1] if "--pool" in command else None


def test_checkpoint_evaluation_lands_on_gpu_workers_that_training_does_not_use(deploy_configs):
    """The `checkpoint.saved` trigger's runs go to a GPU pool of their own (greedy 3B/7B generation on CPUs is no
    option; the pipeline run holds the gpu pool's only slot while it waits for them), and every worker that polls
    that pool, in compose and on Kubernetes, gets one GPU of its own and sees the checkpoints and the reports."""
    declared = {s.name: s for s in pools.load_pools(POOLS_YAML)}
    (ev,) = [d for d in deploy_configs[0] if d["name"] == "on-checkpoint-saved"]
    (pipe,) = [d for d in deploy_configs[0] if d["entrypoint"] == "flows/pipeline.py:post_training"]
    pool, pipeline_pool = ev["work_pool"]["name"], pipe["work_pool"]["name"]
    assert pool not in ("cpu", pipeline_pool) and declared[pool].type == "process"
    assert declared[pipeline_pool].concurrency_limit == 1, "one pipeline run per GPU node"
    assert not any(q == "eval" for s in declared.values() if s.name != pool for q in s.queues), \
        "no evaluation queue left on another pool"

    compose = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]
    (worker,) = [svc for svc in compose.values() if _polled_pool(svc.get("command") or []) == pool]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"] and len(device["device_ids"]) == 1
    assert worker["command"][worker["command"].index("--limit") + 1] == "1", "one evaluation at a time per GPU"
    assert worker.get("profiles") and "gpu" not in worker["profiles"], \
        "its own profile: `--profile gpu` on one host must not hand it a training GPU"
    assert worker["image"].startswith("vtg-gpu:")
    (trainer,) = [svc for svc in compose.values() if _polled_pool(svc.get("command") or []) == pipeline_pool]
    shared = {"checkpoints:/app/checkpoints", "reports:/app/reports"}
    assert shared <= set(worker["volumes"]) and shared <= set(trainer["volumes"])

    docs = list(yaml.safe_load_all((INFRA / "k8s" / "gpu-worker.yaml").read_text()))
    pods = {_polled_pool(c["command"]): (d["spec"]["template"]["spec"], c) for d in docs
            if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]}
    assert {pool, pipeline_pool} <= set(pods)
    pod, container = pods[pool]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["command"][container["command"].index("--limit") + 1] == "1"
    assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])

    def mounts(p, c):
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in p["volumes"]
                  if "persistentVolumeClaim" in v}
        return {(m["mountPath"], claims[m["name"]]) for m in c["volumeMounts"] if m["name"] in claims}

    assert mounts(pod, container) == mounts(*pods[pipeline_pool])
    assert {path for path, _ in mounts(pod, container)} == {"/app/checkpoints", "/app/reports"}


def test_evaluation_trigger_validates_and_matches_the_checkpoint_event(deploy_configs):
    from prefect.cli.deploy._triggers import _initialize_deployment_triggers

    from vtg import lineage

    (d,) = [d for d in deploy_configs[0] if d["name"] == "on-checkpoint-saved"]
    (trigger,) = _initialize_deployment_triggers(d["name"], [dict(t) for t in d["triggers"]])
    assert lineage.CHECKPOINT_EVENT in trigger.expect
    assert set(trigger.parameters) >= {"checkpoint_dir", "step"}
    # The payload keys the trigger reads are the ones training's hook sends.
    from flows.events import checkpoint_payload

    payload = checkpoint_payload("/tmp/x/step-000001", 1)
    for value in trigger.parameters.values():
        (key,) = re.findall(r"event\.payload\.(\w+)", value)
        assert key in payload


def test_work_pools_resolve_and_templates_pass_prefects_validation():
    from prefect.server.schemas.actions import validate_base_job_template

    specs = {s.name: s for s in pools.load_pools(POOLS_YAML)}
    assert {"cpu", "gpu", "gpu-eval", "gpu-k8s"} <= set(specs)
    for spec in specs.values():
        validate_base_job_template(spec.base_job_template)
    cpu_env = specs["cpu"].base_job_template["variables"]["properties"]["env"]["default"]
    assert cpu_env["OMP_NUM_THREADS"] == "1"
    assert {"node-0", "node-1"} <= set(specs["gpu"].queues)
    k8s = specs["gpu-k8s"].base_job_template
    pod = k8s["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "{{ gpus }}" and pod["nodeSelector"] == "{{ node_selector }}"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


def test_pool_declaration_errors_are_one_clear_line(tmp_path):
    bad = tmp_path / "pools.yaml"
    bad.write_text("pools:\n  cpu:\n    type: process\n    job_variables: {envv: {}}\n")
    with pytest.raises(ConfigError, match=r"job variable 'envv' is not in the base job template"):
        pools.load_pools(bad)
    bad.write_text("pools:\n  k:\n    type: kubernetes\n")
    with pytest.raises(ConfigError, match="base_job_template"):
        pools.load_pools(bad)


def test_k8s_manifests_parse_and_put_the_worker_on_gpu_nodes():
    docs = list(yaml.safe_load_all((INFRA / "k8s" / "gpu-worker.yaml").read_text()))
    kinds: dict[str, list[dict]] = {}
    for d in docs:
        kinds.setdefault(d["kind"], []).append(d)
    assert {"Namespace", "Secret", "PersistentVolumeClaim", "ServiceAccount", "Deployment"} <= set(kinds)
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"]
    declared_claims = {d["metadata"]["name"] for d in kinds["PersistentVolumeClaim"]}
    polled = set()
    for deployment in kinds["Deployment"]:
        pod = deployment["spec"]["template"]["spec"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= \
            deployment["spec"]["template"]["metadata"]["labels"].items()
        (container,) = pod["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
        assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
        polled.add(container["command"][container["command"].index("--pool") + 1])
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        assert claims == declared_claims
    assert polled == {"gpu", "gpu-eval"}
    values = yaml.safe_load((INFRA / "k8s" / "prefect-worker-values.yaml").read_text())
    declared = {s.name: s for s in pools.load_pools(POOLS_YAML)}
    assert values["worker"]["config"]["workPool"] in declared
    assert declared[values["worker"]["config"]["workPool"]].type == values["worker"]["config"]["type"]
    template = json.loads((INFRA / "k8s" / "gpu-job-template.json").read_text())
    assert template["variables"]["properties"]["service_account_name"]["default"] == \
        values["serviceAccount"]["name"]


def test_hostfile_renders_and_deepspeed_parses_it(tmp_path):
    from deepspeed.launcher.runner import _parse_hostfile

    text = multinode.render_hostfile(["gpu-0", "gpu-1", "gpu-2"], [8, 8, 4])
    assert _parse_hostfile(text.splitlines()) == {"gpu-0": 8, "gpu-1": 8, "gpu-2": 4}
    path = tmp_path / "hostfile"
    path.write_text(text)
    assert [(h.name, h.slots) for h in multinode.read_hostfile(path)] == [("gpu-0", 8), ("gpu-1", 8), ("gpu-2", 4)]
    with pytest.raises(ConfigError, match="duplicate host"):
        multinode.render_hostfile(["a", "a"], 1)
    with pytest.raises(ConfigError, match="one slot count per host"):
        multinode.render_hostfile(["a", "b"], [1])
    path.write_text("gpu-0 slots=eight\n")
    with pytest.raises(ConfigError, match=r"hostfile:1: expected `<host> slots=<n>`"):
        multinode.read_hostfile(path)


def test_launch_commands_parse_with_deepspeeds_own_argument_parser(tmp_path):
    from deepspeed.launcher.runner import parse_args

    hostfile = tmp_path / "hostfile"
    hostfile.write_text(multinode.render_hostfile(["gpu-0", "gpu-1"], 8))
    train = ["--params", "params.yaml", "-e", "qwen25vl_7b_zero2_8gpu"]
    ssh = parse_args(multinode.launch_cmd(hostfile, train)[1:])
    assert (ssh.hostfile, ssh.master_addr, ssh.launcher, ssh.module) == (str(hostfile), "gpu-0", "pdsh", True)
    assert (ssh.user_script, ssh.user_args) == ("training", train)
    node1 = parse_args(multinode.launch_cmd(hostfile, train, node_rank=1, master_port=29555)[1:])
    assert (node1.no_ssh, node1.node_rank, node1.master_port, node1.master_addr) == (True, 1, 29555, "gpu-0")
    with pytest.raises(ConfigError, match="out of range"):
        multinode.launch_cmd(hostfile, train, node_rank=2)
