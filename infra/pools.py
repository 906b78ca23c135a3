"""Work pools as code: create or update the pools declared in `infra/prefect/work-pools.yaml`.

    python -m infra.pools show  infra/prefect/work-pools.yaml    # print the resolved base job templates
    python -m infra.pools apply infra/prefect/work-pools.yaml    # create/update pools and queues (PREFECT_API_URL)

A pool's base job template is the worker type's default (process) or a JSON file next to the declarations
(kubernetes), with `job_variables` written in as the variables' defaults. Applying twice changes nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vtg.cli_common import run_cli
from vtg.errors import ConfigError
from vtg.io import load_yaml


@dataclass
class PoolSpec:
    name: str
    type: str
    description: str = ""
    concurrency_limit: int | None = None
    base_job_template: dict[str, Any] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)


def default_template(pool_type: str) -> dict[str, Any]:
    if pool_type == "process":
        from prefect.workers.process import ProcessWorker

        return ProcessWorker.get_default_base_job_template()
    raise ConfigError(f"pool type {pool_type!r} has no built-in template here: give `base_job_template: FILE`")


def with_defaults(template: dict[str, Any], job_variables: dict[str, Any], where: str) -> dict[str, Any]:
    """Write `job_variables` into the template's variable defaults (unknown names are an error)."""
    out = copy.deepcopy(template)
    props = out.get("variables", {}).get("properties", {})
    for key, value in job_variables.items():
        if key not in props:
            raise ConfigError(f"{where}: job variable {key!r} is not in the base job template "
                              f"(known: {', '.join(sorted(props))})")
        props[key]["default"] = value
    return out


def load_pools(path: str | Path) -> list[PoolSpec]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: work pool declarations not found")
    data = load_yaml(path.read_text(), path) or {}
    pools = data.get("pools")
    if not isinstance(pools, dict) or not pools:
        raise ConfigError(f"{path}: expected a non-empty `pools:` mapping")
    specs = []
    for name, raw in pools.items():
        where = f"{path}: pools.{name}"
        unknown = set(raw) - {"type", "description", "concurrency_limit", "base_job_template", "queues",
                              "job_variables"}
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
        ptype = raw.get("type") or "process"
        if tmpl := raw.get("base_job_template"):
            tmpl_path = (path.parent / tmpl).resolve()
            if not tmpl_path.is_file():
                raise ConfigError(f"{where}: base_job_template {tmpl_path} not found")
            template = json.loads(tmpl_path.read_text())
        else:
            template = default_template(ptype)
        template = with_defaults(template, raw.get("job_variables") or {}, where)
        specs.append(PoolSpec(name, ptype, raw.get("description", ""), raw.get("concurrency_limit"),
                              template, raw.get("queues") or {}))
    return specs


def apply(specs: list[PoolSpec]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkQueueUpdate
    from prefect.exceptions import ObjectAlreadyExists

    from vtg.net import check_prefect_api

    check_prefect_api()
    with get_client(sync_client=True) as client:
        for spec in specs:
            client.create_work_pool(
                WorkPoolCreate(name=spec.name, type=spec.type, description=spec.description,
                               concurrency_limit=spec.concurrency_limit, base_job_template=spec.base_job_template),
                overwrite=True)
            for queue, opts in spec.queues.items():
                try:
                    client.create_work_queue(name=queue, work_pool_name=spec.name, **opts)
                except ObjectAlreadyExists:
                    existing = client.read_work_queue_by_name(queue, work_pool_name=spec.name)
                    client.update_work_queue(existing.id, **WorkQueueUpdate(**opts).model_dump(exclude_unset=True))
            print(f"work pool {spec.name!r} ({spec.type}): queues {', '.join(spec.queues) or 'default'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.pools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["show", "apply"], help="print the resolved pools, or apply them")
    parser.add_argument("file", nargs="?", default="infra/prefect/work-pools.yaml", help="pool declarations")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    specs = load_pools(args.file)
    if args.action == "show":
        print(json.dumps({s.name: s.__dict__ for s in specs}, indent=2))
    else:
        apply(specs)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
