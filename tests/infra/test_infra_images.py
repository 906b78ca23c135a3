"""infra/docker: every image builds from files that exist, from pinned bases, with the pinned dependency set."""

import fnmatch
import re
import tomllib

import pytest
from support.infra_paths import INFRA, ROOT

DOCKERFILES = sorted((INFRA / "docker").glob("*.Dockerfile"))
CONSTRAINTS = INFRA / "docker" / "constraints.txt"


def instructions(path):
    """(INSTRUCTION, args) pairs with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def arg_defaults(instrs):
    return dict(re.match(r"([A-Za-z_]+)=?(.*)", a).groups() for w, a in instrs if w == "ARG")


def dockerignore_allows(dockerfile, rel: str) -> bool:
    rules = [ln.strip() for ln in dockerfile.with_name(dockerfile.name + ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    allowed = True
    for rule in rules:
        negate, pattern = rule.startswith("!"), rule.lstrip("!")
        if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(rel, pattern.rstrip("/*")):
            allowed = negate
    return allowed


def test_there_are_cpu_gpu_and_beam_worker_images():
    assert {p.name for p in DOCKERFILES} >= {"cpu.Dockerfile", "gpu.Dockerfile", "beam-worker.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_from_is_pinned(dockerfile):
    instrs = instructions(dockerfile)
    args = arg_defaults(instrs)
    froms = [a for w, a in instrs if w == "FROM"]
    assert froms
    for ref in froms:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref.split()[0])
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and re.search(r"\d", tag), f"{dockerfile.name}: {image} not pinned"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_copy_source_exists_and_is_in_the_build_context(dockerfile):
    copies = [a for w, a in instructions(dockerfile) if w == "COPY"]
    assert copies
    for spec in copies:
        parts = [p for p in spec.split() if not p.startswith("--")]
        assert "--from" not in spec
        for src in parts[:-1]:
            assert (ROOT / src).exists(), f"{dockerfile.name}: COPY {src} does not exist"
            assert dockerignore_allows(dockerfile, src.rstrip("/")), f"{dockerfile.name}: {src} is .dockerignored"
    assert not dockerignore_allows(dockerfile, ".venv") and not dockerignore_allows(dockerfile, "infra/.env")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_pip_installs_are_pinned(dockerfile):
    for word, args in instructions(dockerfile):
        if word != "RUN":
            continue
        for cmd in re.split(r"&&|;", args):
            if "pip install" not in cmd:
                continue
            specs = [t.strip("\"'") for t in cmd.split("pip install", 1)[1].split()
                     if not t.startswith(("-", "$", "/")) and "://" not in t]
            constrained = "-c /tmp/constraints.txt" in cmd
            for spec in specs:
                if spec in ("then", "fi"):
                    continue
                if spec in (".", ".[infra]"):  # the project: its dependencies come from the constraints, or none
                    assert constrained or "--no-deps" in cmd, f"{dockerfile.name}: project installed unpinned"
                    continue
                assert "==" in spec or constrained or spec.startswith("flash-attn"), \
                    f"{dockerfile.name}: `{spec}` is neither pinned nor constrained"


def test_constraints_pin_every_project_dependency():
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not name==version"
            pins[re.sub(r"[-_.]+", "-", name.lower())] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["infra"]
    for dep in deps:
        name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", dep).group(0).lower())
        assert name in pins, f"{dep} is not pinned in infra/docker/constraints.txt (python -m infra.lock)"
    assert pins["torch"] == "2.13.0", "torch must be pinned without a local label (+cpu/+cu128 both satisfy it)"
