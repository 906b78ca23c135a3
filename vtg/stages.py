"""The stage graph: `dvc.yaml` is the one declaration of each stage's command, dependencies (data and code),
params sections and outputs; this module reads it for everyone else.

Both front doors agree on "is this stage done?" because both ask dvc.lock:
- `dvc repro` compares the lock with the workspace (deps, params, outs) itself;
- the flow calls `status(stage, cfg)`: DVC's own comparison for deps and outs, and the recorded params against
  the *resolved* config's output-changing fields (`vtg.config.output_view`), so an experiment or an override the
  flow ran with counts, and a field marked `NOT_OUTPUT` (progress bars, worker counts) does not. After running a
  stage the flow calls `record(stage, cfg)`: `dvc commit` (the lock and the DVC cache, as `dvc repro` leaves them),
  then the params the outputs were really made from. So `make run` then `dvc repro` runs nothing, `dvc repro`
  then `make run` skips every stage, and a run with overrides leaves dvc.lock saying so (`dvc status` shows the
  params as changed until `dvc repro` rebuilds from params.yaml).
The code a stage depends on is the code deps listed here (`code_paths`); preprocess's code version hashes them.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from vtg.config._base import MARK
from vtg.config.keys import output_view
from vtg.errors import VTGError
from vtg.io import load_yaml

log = logging.getLogger(__name__)

DVC_FILE = "dvc.yaml"
LOCK_FILE = "dvc.lock"
PARAMS_FILE = "params.yaml"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stage:
    name: str
    cmd: str
    deps: tuple[str, ...]
    params: tuple[str, ...]
    """Params the stage reads: config sections (top-level keys of params.yaml, `train`) or dotted paths to a
    nested section or one field (`orchestration.rl`), as DVC records them in dvc.lock."""
    outs: tuple[str, ...]
    """Every output path: outs, metrics and plots."""
    persist: tuple[str, ...] = ()
    """Outputs DVC keeps before rerunning the stage (a training run resumes from its checkpoints)."""

    def code_paths(self, root: str | Path = PACKAGE_ROOT) -> tuple[str, ...]:
        """Deps that are code: a `.py` file or a folder holding Python files."""
        root = Path(root)
        return tuple(d for d in self.deps if d.endswith(".py") or (root / d).is_dir() and any((root / d).glob("*.py")))


@dataclass
class StageStatus:
    stage: str
    up_to_date: bool
    reasons: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "up to date (dvc.lock)" if self.up_to_date else "; ".join(self.reasons)


def _paths(entries: list) -> tuple[list[str], list[str]]:
    paths, persist = [], []
    for e in entries or []:
        if isinstance(e, dict):
            (path, opts), = e.items()
            paths.append(path)
            if (opts or {}).get("persist"):
                persist.append(path)
        else:
            paths.append(e)
    return paths, persist


def find_dvc_yaml(root: str | Path | None = None) -> Path:
    """dvc.yaml of the project at `root` (default: the working directory, else the package's checkout)."""
    for base in ([Path(root)] if root else [Path.cwd(), PACKAGE_ROOT]):
        if (base / DVC_FILE).is_file():
            return base / DVC_FILE
    raise VTGError(f"no {DVC_FILE} in {root or Path.cwd()}: the stage graph is declared there")


@cache
def _load(path: Path, mtime: float) -> dict[str, Stage]:
    data = load_yaml(path.read_text(), path) or {}
    graph = {}
    for name, s in (data.get("stages") or {}).items():
        outs, persist = _paths(s.get("outs"))
        outs += _paths(s.get("metrics"))[0] + _paths(s.get("plots"))[0]
        params = tuple(p for p in s.get("params") or [] if isinstance(p, str))
        graph[name] = Stage(name, s["cmd"], tuple(_paths(s.get("deps"))[0]), params, tuple(outs), tuple(persist))
    return graph


def load_graph(root: str | Path | None = None) -> dict[str, Stage]:
    path = find_dvc_yaml(root).resolve()
    return _load(path, path.stat().st_mtime)


def stage(name: str, root: str | Path | None = None) -> Stage:
    graph = load_graph(root)
    if name not in graph:
        raise VTGError(f"{find_dvc_yaml(root)}: no stage {name!r} (stages: {', '.join(graph)})")
    return graph[name]


def code_digest(name: str, root: str | Path | None = None) -> str:
    """Digest of a stage's code deps (every .py file under them), as listed in dvc.yaml."""
    base = find_dvc_yaml(root).parent
    h = hashlib.sha256()
    for dep in stage(name, root).code_paths(base):
        p = base / dep
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            if "__pycache__" not in f.parts:
                h.update(f.relative_to(base).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


# ---- "is it done?" --------------------------------------------------------------------------------------------
def is_dvc_repo(root: str | Path = ".") -> bool:
    return (Path(root) / ".dvc").is_dir() and (Path(root) / DVC_FILE).is_file()


def _read_lock(root: Path) -> dict:
    path = root / LOCK_FILE
    return (load_yaml(path.read_text(), path) or {}) if path.is_file() else {}


def _owner(cfg, key: str) -> tuple[BaseModel, str]:
    """(the config object holding the last part of `key`, that part): `train` -> (cfg, "train"),
    `orchestration.rl` -> (cfg.orchestration, "rl")."""
    *parents, leaf = key.split(".")
    owner = cfg
    for part in parents:
        owner = getattr(owner, part)
    if leaf not in type(owner).model_fields:
        raise VTGError(f"{DVC_FILE}: param {key!r} is not a config field")
    return owner, leaf


def _view_of(owner: BaseModel, leaf: str) -> Any:
    """The output view of one entry: a section's `output_view`, a field's JSON value, None for a `NOT_OUTPUT`
    field (it never counts)."""
    value = getattr(owner, leaf)
    if isinstance(value, BaseModel):
        return output_view(value)
    extra = type(owner).model_fields[leaf].json_schema_extra
    if isinstance(extra, dict) and extra.get(MARK) == "none":
        return None
    return _field_json(owner, leaf)


def _field_json(owner: BaseModel, leaf: str) -> Any:
    return owner.__pydantic_serializer__.to_python(owner, mode="json", include={leaf})[leaf]


def _current_views(cfg, names: tuple[str, ...]) -> dict[str, Any]:
    """`output_view` of each of the stage's params entries in the resolved config."""
    return {name: _view_of(*_owner(cfg, name)) for name in names}


def _section_views(sections: dict[str, Any], cfg, names: tuple[str, ...]) -> dict[str, Any]:
    """`output_view` of each params entry (a section or a dotted field), from raw values validated into cfg's
    classes (a recorded value that no longer validates reads as None: changed)."""
    out = {}
    for name in names:
        owner, leaf = _owner(cfg, name)
        raw = sections.get(name)
        try:
            if isinstance(getattr(owner, leaf), BaseModel):
                out[name] = output_view(type(getattr(owner, leaf)).model_validate(raw or {}))
            else:
                probe = owner.model_copy()
                setattr(probe, leaf, raw)  # validated (validate_assignment)
                out[name] = _view_of(probe, leaf)
        except ValueError:
            out[name] = None  # recorded params no longer validate: treat as changed
    return out


def _raw(data: dict, key: str) -> Any:
    """params.yaml's value at a section or dotted key (None when absent)."""
    node: Any = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _dumped(cfg, key: str) -> Any:
    """The resolved config's value at a params entry, as params.yaml would hold it."""
    owner, leaf = _owner(cfg, key)
    value = getattr(owner, leaf)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else _field_json(owner, leaf)


def _diff(a: Any, b: Any, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{prefix}.{k}")]
    return [] if a == b else [prefix]


def _dvc_changes(root: Path, name: str) -> list[str]:
    """DVC's own verdict on the stage's deps and outs (params are compared by `status` itself)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        report = repo.status(targets=[name]).get(name, [])
    reasons = []
    for item in report:
        if isinstance(item, str):
            reasons.append(item)
            continue
        for kind, changes in item.items():
            for path, what in changes.items():
                if kind == "changed deps" and path == PARAMS_FILE:
                    continue
                reasons.append(f"{kind.removeprefix('changed ')} {path} {what}")
    return reasons


def status(name: str, cfg, root: str | Path = ".") -> StageStatus:
    """Whether the stage's outputs in `root` were made from these deps and this config (per dvc.lock)."""
    root = Path(root)
    if not is_dvc_repo(root):
        return StageStatus(name, False, ["not a DVC repository: nothing records what is done"])
    entry = (_read_lock(root).get("stages") or {}).get(name)
    if not entry:
        return StageStatus(name, False, [f"not in {LOCK_FILE} yet"])
    st = stage(name, root)
    missing = [o for o in st.outs if not (root / o).exists()]
    if missing:
        return StageStatus(name, False, [f"output missing: {', '.join(missing)}"])
    recorded = _section_views((entry.get("params") or {}).get(PARAMS_FILE) or {}, cfg, st.params)
    now = _current_views(cfg, st.params)
    reasons = [f"param {k} changed" for k in _diff(recorded, now, "")] if recorded != now else []
    reasons = [r.replace("param .", "param ") for r in reasons] + _dvc_changes(root, name)
    return StageStatus(name, not reasons, reasons)


def record(name: str, cfg, root: str | Path = ".") -> None:
    """`dvc commit` the stage (lock + cache), then record the params its outputs were really made from."""
    root = Path(root)
    if not is_dvc_repo(root):
        return
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:  # in this process (`status` has imported DVC already): `dvc commit`'s CLI spent ~2 s a stage starting up
        with Repo(str(root)) as repo:
            repo.commit(name, force=True)
    except DvcException as e:
        raise VTGError(f"dvc commit {name} failed: {e}") from e
    sync_params(name, cfg, root)


def sync_params(name: str, cfg, root: str | Path = ".") -> bool:
    """Make the lock's params for `name` say what its outputs were made from: params.yaml's sections when they
    agree with `cfg` on every output-changing field, else `cfg`'s resolved sections. Returns True if rewritten."""
    root = Path(root)
    lock = _read_lock(root)
    entry = (lock.get("stages") or {}).get(name)
    if not entry:
        return False
    st = stage(name, root)
    params_yaml = load_yaml((root / PARAMS_FILE).read_text(), root / PARAMS_FILE) or {}
    from_file = {s: _raw(params_yaml, s) for s in st.params}
    same = _section_views(from_file, cfg, st.params) == _current_views(cfg, st.params)
    want = from_file if same else {s: _dumped(cfg, s) for s in st.params}
    recorded = (entry.get("params") or {}).get(PARAMS_FILE)
    if recorded == want:
        return False
    entry.setdefault("params", {})[PARAMS_FILE] = want
    tmp = root / f".{LOCK_FILE}.tmp"
    tmp.write_text(yaml.safe_dump(lock, sort_keys=False))
    tmp.replace(root / LOCK_FILE)
    if not same:
        log.warning("dvc.lock records %s's params as run (they differ from %s); `dvc status` shows them as "
                    "changed until `dvc repro` rebuilds from %s", name, PARAMS_FILE, PARAMS_FILE)
    return True


def stage_module(name: str, cfg, root: str | Path | None = None) -> str:
    """The module that runs stage `name`: `orchestration.stages.<name>` when set, else the one of its dvc.yaml
    `cmd` (`python -m <module>`)."""
    override = getattr(cfg.orchestration.stages, name, "")
    if override:
        return override
    words = stage(name, root).cmd.split()
    if words[:2] != ["python", "-m"] or len(words) < 3:
        raise VTGError(f"{find_dvc_yaml(root)}: stage {name!r} cmd {stage(name, root).cmd!r} is not "
                       "`python -m <module>`; set orchestration.stages." + name)
    return words[2]


def stage_view(name: str, cfg, root: str | Path | None = None):
    """(the view of `cfg` the stage `name` runs with, its declared params): `vtg.config.view.declared_view` over
    the stage's `params` in dvc.yaml. Without a stage graph (a project of the user's own) the plain config, None."""
    from vtg.config.view import declared_view

    try:
        st = stage(name, root)
    except VTGError:
        return cfg, None
    return declared_view(cfg, name, st.params), st.params


# ---- side commands -------------------------------------------------------------------------------------------
def side_outputs(name: str, section, primary: str, others: tuple[str, ...], root: str | Path | None = None):
    """A stage CLI writes the stage's declared outs only when it is that stage: when its primary output (`primary`,
    a field of the config `section`) is not one of the stage's outs in dvc.yaml, it is a side command (the
    benchmark's `python -m ingest ... ingest.out=data/benchmark/records.jsonl`), and each of its other outputs
    (`others`) still at a path any stage declares moves beside the primary output: `<primary stem>.<field><ext>`.
    Returns the section to run with (the same one for the stage itself). The one rule for every stage CLI."""
    try:
        graph = load_graph(root)
    except VTGError:
        return section  # no stage graph here (a project of the user's own): nothing to protect
    base = find_dvc_yaml(root).parent.resolve()

    def norm(p: str | Path) -> Path:
        p = Path(p)
        return (p if p.is_absolute() else Path.cwd() / p).resolve()

    if name not in graph or norm(getattr(section, primary)) in {norm(base / o) for o in graph[name].outs}:
        return section
    declared = {norm(base / o) for st in graph.values() for o in st.outs}
    first = norm(getattr(section, primary))
    moved = {}
    for key in others:
        p = norm(getattr(section, key))
        if p in declared or any(d in p.parents or p in d.parents for d in declared):
            moved[key] = str(first.with_name(f"{first.stem}.{key}{Path(getattr(section, key)).suffix}"))
    if moved:
        log.info("%s writes %s=%s, not the stage's output: a side command, so its %s go beside it (%s), not over "
                 "the %s stage's outs", name, primary, getattr(section, primary), ", ".join(moved),
                 ", ".join(moved.values()), name)
    return section.model_copy(update=moved)


SIDE_OUTPUTS = {"ingest": ("out", ("dead_letter", "summary")),
                "annotate": ("out", ("proposals", "withheld", "summary")),
                "rl": ("out_dir", ("report_dir",))}
"""Per stage whose CLI writes several files: its primary output field and the others (`side_outputs`)."""


def stage_outputs(name: str, cfg):
    """The stage section `cfg.<name>` as the stage's CLI runs it (`side_outputs`): what the CLI writes and what
    the flow reads back are the same paths."""
    primary, others = SIDE_OUTPUTS[name]
    return side_outputs(name, getattr(cfg, name), primary, others)
