"""Multi-node DeepSpeed: render the hostfile, and build (or run) the launch command for a node.

    python -m infra.multinode hostfile --hosts gpu-0,gpu-1 --slots 8 -o /job/hostfile
    # one command on node 0, which starts every node over ssh (pdsh; passwordless ssh between the nodes):
    python -m infra.multinode launch --hostfile /job/hostfile -- --params params.yaml -e qwen25vl_7b_zero2_8gpu
    # or one command per node, no ssh (one Prefect worker per node, a k8s indexed Job, slurm ...):
    python -m infra.multinode launch --hostfile /job/hostfile --node-rank 1 --master-addr gpu-0 -- -e ...

Everything after `--` goes to the training module (`python -m training`). `--dry-run` prints the command.
"""

from __future__ import annotations

import argparse
import shlex
import string
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vtg.cli_common import run_cli
from vtg.errors import ConfigError

TEMPLATE = Path(__file__).parent / "deepspeed" / "hostfile.template"
DEFAULT_PORT = 29500


def render_hostfile(hosts: Sequence[str], slots: int | Sequence[int], template: Path = TEMPLATE) -> str:
    """The template's comment lines, then its host line once per host (slots: one number, or one per host)."""
    per_host = [slots] * len(hosts) if isinstance(slots, int) else list(slots)
    if not hosts or len(per_host) != len(hosts):
        raise ConfigError(f"hostfile: need at least one host and one slot count per host "
                          f"(got {len(hosts)} hosts, {len(per_host)} slot counts)")
    if any(n < 1 for n in per_host) or any(not h or any(c.isspace() for c in h) for h in hosts):
        raise ConfigError(f"hostfile: hosts must be non-empty names and slots >= 1 (got {hosts}, {per_host})")
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f"hostfile: duplicate host in {list(hosts)}")
    lines = template.read_text().splitlines()
    header = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    if len(body) != 1:
        raise ConfigError(f"{template}: expected exactly one host line template, found {len(body)}")
    line = string.Template(body[0])
    return "\n".join(header + [line.substitute(host=h, slots=n) for h, n in zip(hosts, per_host)]) + "\n"


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def read_hostfile(path: str | Path) -> list[Host]:
    """Parse a hostfile the way DeepSpeed does (comments and blank lines skipped), with clear errors."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: hostfile not found (render one: python -m infra.multinode hostfile ...)")
    hosts = []
    for i, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) != 2 or not parts[1].startswith("slots=") or not parts[1][6:].isdigit():
            raise ConfigError(f"{path}:{i}: expected `<host> slots=<n>`, got {raw!r}")
        hosts.append(Host(parts[0], int(parts[1][6:])))
    if not hosts:
        raise ConfigError(f"{path}: no hosts")
    return hosts


def launch_cmd(hostfile: str | Path, train_args: Sequence[str], module: str = "training",
               node_rank: int | None = None, master_addr: str | None = None, master_port: int = DEFAULT_PORT,
               launcher: str = "pdsh") -> list[str]:
    """The `deepspeed` command line for this node.

    node_rank None: the ssh mode, run on node 0 only (deepspeed starts the others with `launcher`).
    node_rank i: the no-ssh mode, run on every node with its own rank; all must agree on master_addr/port.
    """
    hosts = read_hostfile(hostfile)
    master = master_addr or hosts[0].name
    cmd = [str(Path(sys.executable).with_name("deepspeed")), f"--hostfile={hostfile}", f"--master_addr={master}",
           f"--master_port={master_port}"]
    if node_rank is None:
        cmd += [f"--launcher={launcher}"]
        if len(hosts) == 1:
            cmd += ["--no_ssh_check"]
    else:
        if not 0 <= node_rank < len(hosts):
            raise ConfigError(f"--node-rank {node_rank} out of range: {hostfile} has {len(hosts)} hosts")
        cmd += ["--no_ssh", f"--node_rank={node_rank}"]
    return cmd + ["--module", module, *train_args]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(prog="python -m infra.multinode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    h = sub.add_parser("hostfile", help="render the hostfile template")
    h.add_argument("--hosts", required=True, help="comma-separated host names, node 0 first")
    h.add_argument("--slots", required=True, help="ranks (GPUs) per host: one number, or comma-separated per host")
    h.add_argument("-o", "--output", help="write here instead of stdout")
    lp = sub.add_parser("launch", help="run (or print) this node's deepspeed command; training args after --")
    lp.add_argument("--hostfile", default="/job/hostfile", help="rendered hostfile (default: /job/hostfile)")
    lp.add_argument("--node-rank", type=int, default=None, help="this node's rank: no-ssh mode (one call per node)")
    lp.add_argument("--master-addr", default=None, help="rendezvous host (default: the hostfile's first host)")
    lp.add_argument("--master-port", type=int, default=DEFAULT_PORT, help="rendezvous port")
    lp.add_argument("--module", default="training", help="training module run on every rank")
    lp.add_argument("--launcher", default="pdsh", help="deepspeed's multi-node backend in ssh mode")
    lp.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    args = parser.parse_args(argv)
    if args.action == "hostfile":
        slots_raw = [s.strip() for s in args.slots.split(",")]
        if not all(s.isdigit() for s in slots_raw):
            raise ConfigError(f"--slots must be a number or a comma-separated list of numbers, got {args.slots!r}")
        slots = [int(s) for s in slots_raw]
        text = render_hostfile([h.strip() for h in args.hosts.split(",")], slots[0] if len(slots) == 1 else slots)
        if args.output:
            Path(args.output).write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    cmd = launch_cmd(args.hostfile, train_args, args.module, args.node_rank, args.master_addr, args.master_port,
                     args.launcher)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    return subprocess.call(cmd)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
