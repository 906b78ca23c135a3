"""Typed pipeline configuration: `params.yaml` + experiment overrides + dotted CLI overrides.

Resolution order (later wins): `params.yaml` -> `experiments/<base>.yaml` -> ... -> `experiments/<name>.yaml`
-> `key.path=value` overrides. An experiment file holds only overrides and may name its parent with
`extends: <name>`. Every key remembers the file it came from so that a validation error can say where to fix it.

Defaults and their documentation live once, on the section classes (`vtg/config/*.py`, a docstring per field).
`params.yaml` is rendered from them (`python -m vtg.config --write-params`, see `vtg.config.render`), and
tests/test_config.py checks that the file in the repo matches: change a default there, not in params.yaml.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError, model_validator

from vtg.config._base import Section
from vtg.config.annotate import AnnotateConfig
from vtg.config.benchmark import BenchmarkConfig
from vtg.config.corpus import CorpusConfig
from vtg.config.engine import MOVED as ENGINE_MOVED
from vtg.config.engine import EngineConfig
from vtg.config.evaluate import EvaluateConfig
from vtg.config.ingest import IngestConfig
from vtg.config.orchestration import OrchestrationConfig
from vtg.config.preprocess import PreprocessConfig
from vtg.config.rl import RLConfig
from vtg.config.tracking import TrackingConfig
from vtg.config.train import TrainConfig
from vtg.errors import ConfigError
from vtg.io import load_yaml
from vtg.net import bound_clients
from vtg.util import flatten

__all__ = [
    "AnnotateConfig",
    "BenchmarkConfig",
    "ConfigError",
    "CorpusConfig",
    "EngineConfig",
    "EvaluateConfig",
    "IngestConfig",
    "OrchestrationConfig",
    "PipelineConfig",
    "PreprocessConfig",
    "RLConfig",
    "TrackingConfig",
    "TrainConfig",
    "config_hash",
    "load_config",
    "parse_overrides",
]

CLI_SOURCE = "<command line>"


class PipelineConfig(Section):
    """The whole pipeline's configuration, one section per stage."""

    corpus: CorpusConfig = CorpusConfig()
    """Synthetic corpus (embedded default data set)."""
    ingest: IngestConfig = IngestConfig()
    """Annotation ingest."""
    annotate: AnnotateConfig = AnnotateConfig()
    """Automatic annotation (off by default): proposed, verified auto records for videos without annotations."""
    preprocess: PreprocessConfig = PreprocessConfig()
    """Beam preprocessing."""
    engine: EngineConfig = EngineConfig()
    """What SFT and RL share: the distributed engine, precision, determinism and offload."""
    train: TrainConfig = TrainConfig()
    """DeepSpeed training."""
    rl: RLConfig = RLConfig()
    """GRPO post-training after SFT (temporal-IoU reward)."""
    evaluate: EvaluateConfig = EvaluateConfig()
    """Per-checkpoint evaluation."""
    benchmark: BenchmarkConfig = BenchmarkConfig()
    """The benchmark protocol: whole videos, standard formats, comparable harnesses."""
    tracking: TrackingConfig = TrackingConfig()
    """MLflow tracking."""
    orchestration: OrchestrationConfig = OrchestrationConfig()
    """Prefect and DVC."""

    @model_validator(mode="after")
    def _roots_apart(self) -> PipelineConfig:
        """Each checkpoint root (SFT, RL) is its own: neither inside the other nor holding the evaluation outputs,
        since a superseded run's root is moved aside whole (it would take the other's checkpoints with it)."""
        overlap = output_roots_overlap(self)
        if overlap:
            raise ValueError(overlap)
        return self

    @model_validator(mode="after")
    def _engine_fits(self) -> PipelineConfig:
        """The shared `engine` against each stage's own ZeRO stage (SFT's, and RL's when it runs) and model."""
        problem = engine_mismatch(self)
        if problem:
            raise ValueError(problem)
        return self


MOVED_KEYS = {f"train.{name}": f"engine.{name}" for name in ENGINE_MOVED}
"""Keys that moved (old -> new): giving an old one is an error naming the new one."""


def engine_mismatch(cfg: PipelineConfig) -> str | None:
    """Why `engine` does not fit a stage that trains on it (None: it fits). Offload is DeepSpeed ZeRO's: parameter
    offload needs stage 3, optimizer offload stage >= 1, for SFT (`train.zero_stage`) and, with
    `orchestration.rl` on, for RL too (`rl.zero_stage`: RL trains on the same engine settings)."""
    e = cfg.engine
    zero = {"train.zero_stage": cfg.train.zero_stage}
    if cfg.orchestration.rl:
        zero["rl.zero_stage"] = cfg.rl.zero_stage
    for key, stage in zero.items():
        rl = "; RL trains on the same engine: set it too, or orchestration.rl=false" if key.startswith("rl.") else ""
        if e.offload_param and stage != 3:
            return f"engine.offload_param=true needs {key} 3 (got {key}={stage}{rl})"
        if e.offload_optimizer and stage == 0:
            return f"engine.offload_optimizer=true needs {key} >= 1 (got {key}=0{rl})"
    if cfg.train.model.attn_implementation == "flash_attention_2" and e.precision == "fp32":
        return ("train.model.attn_implementation=flash_attention_2 needs engine.precision bf16 or fp16 "
                "(got engine.precision=fp32; flash-attn has no fp32 kernels)")
    return None


def output_roots_overlap(cfg: PipelineConfig) -> str | None:
    """Why two output roots overlap (a checkpoint root and another stage's output), or None."""
    roots = {"train.out_dir": cfg.train.out_dir, "rl.out_dir": cfg.rl.out_dir}
    others = {**roots, "evaluate.out_dir": cfg.evaluate.out_dir, "evaluate.store_dir": cfg.evaluate.store_dir,
              "evaluate.select_dir": cfg.evaluate.select_dir}
    for key, root in roots.items():
        a = Path(root).resolve()
        for other, path in others.items():
            b = Path(path).resolve()
            if other != key and (a == b or a in b.parents or b in a.parents):
                return (f"{key}={root} and {other}={path} overlap: each checkpoint root needs a folder of its own "
                        "(e.g. checkpoints/sft and checkpoints/rl side by side, evaluations under reports/), since "
                        "a superseded run's root is moved aside whole")
    return None


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = load_yaml(path.read_text(), path) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _merge(dst: dict, src: dict, origin: dict[str, str], source: str, prefix: str = "",
           model: type | None = PipelineConfig) -> None:
    """Merge `src` into `dst`, recording for every leaf key which file set it. A value merges into what is there
    only where the schema has a config section (`train`, `train.model`); every other field is replaced whole by
    what names it, so `preprocess.split_fractions={train: 0.9, test: 0.1}` is those two splits, not the default's
    three with two of them changed."""
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        sub = _section_type(model, key)
        if isinstance(value, dict) and isinstance(dst.get(key), dict) and (sub is not None or model is None):
            _merge(dst[key], value, origin, source, dotted + ".", sub)
        else:
            dst[key] = value
            origin[dotted] = source
            if isinstance(value, dict):
                for leaf in flatten(value, dotted):
                    origin[leaf] = source


def _section_type(model: type | None, key: str) -> type | None:
    """The config section class of field `key` of section `model` (None: not a section, or no schema)."""
    field = getattr(model, "model_fields", {}).get(key) if model is not None else None
    ann = getattr(field, "annotation", None)
    return ann if isinstance(ann, type) and issubclass(ann, Section) else None


def _override_items(items: list[str] | tuple[str, ...]) -> list[tuple[list[str], Any]]:
    """`["train.lr=5e-5"]` -> `[(["train", "lr"], 5e-05)]` (values parsed as YAML scalars)."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"{CLI_SOURCE}: override {item!r} must look like section.key=value")
        try:
            value = load_yaml(raw, f"{CLI_SOURCE}: {key}") if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):
            try:  # YAML 1.1 reads `5e-5` as a string; users mean a number
                value = float(value) if any(c in value for c in ".eE") else int(value)
            except ValueError:
                pass
        out.append((key.strip().split("."), value))
    return out


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`["train.lr=5e-5", "train.model.finetune=lora"]` -> nested dict (values parsed as YAML scalars)."""
    nested: dict[str, Any] = {}
    for (*parents, leaf), value in _override_items(items):
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{CLI_SOURCE}: override {'.'.join([*parents, leaf])!r} conflicts with another "
                                  "override")
        node[leaf] = value
    return nested


def _apply_overrides(merged: dict, items: list[str] | tuple[str, ...], origin: dict[str, str]) -> None:
    """Each `key.path=value` replaces exactly what it names (a whole mapping too: `preprocess.split_fractions=
    {train: 0.9, test: 0.1}` is those two splits); the sections above it keep their other keys."""
    parse_overrides(items)  # the conflict check
    for (*parents, leaf), value in _override_items(items):
        node = merged
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[leaf] = value
        dotted = ".".join([*parents, leaf])
        for key in [k for k in origin if k.startswith(dotted + ".")]:
            del origin[key]
        origin[dotted] = CLI_SOURCE
        if isinstance(value, dict):
            for sub in flatten(value, dotted):
                origin[sub] = CLI_SOURCE


def _experiment_chain(name: str, exp_dir: Path) -> list[Path]:
    chain: list[Path] = []
    seen: set[str] = set()
    current: str | None = name
    while current:
        if current in seen:
            raise ConfigError(f"{exp_dir}: experiment 'extends' cycle through {current!r}")
        seen.add(current)
        path = Path(current) if current.endswith((".yaml", ".yml")) else exp_dir / f"{current}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in exp_dir.glob("*.yaml")) if exp_dir.is_dir() else []
            raise ConfigError(f"{path}: experiment {current!r} not found (known: {', '.join(known) or 'none'})")
        chain.append(path)
        parent = _read_yaml(path).get("extends")
        if parent is not None and not isinstance(parent, str):
            raise ConfigError(f"{path}: 'extends' must be an experiment name, got {parent!r}")
        current = parent
    return list(reversed(chain))


def _format_errors(err: ValidationError, origin: dict[str, str], default_source: str) -> str:
    lines = []
    for e in err.errors():
        dotted = ".".join(str(p) for p in e["loc"])
        source = origin.get(dotted) or default_source
        msg = e["msg"].removeprefix("Value error, ")
        if not dotted:  # a check across sections: its message names the keys (`key=value`), each from its file
            named = sorted({src for key, src in origin.items() if f"{key}=" in msg})
            lines.append(f"{' and '.join(named) or default_source}: {msg}")
            continue
        if e["type"] == "extra_forbidden" and dotted in MOVED_KEYS:
            lines.append(f"{source}: {dotted} moved to {MOVED_KEYS[dotted]}")
            continue
        if e["type"] == "extra_forbidden":
            msg = "unknown key (typo? see `--dry-run` for the valid keys)"
        lines.append(f"{source}: {dotted}: {msg}" + (f" (got {e['input']!r})" if e["type"] != "extra_forbidden"
                                                        and not isinstance(e.get("input"), dict) else ""))
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(
    params: str | Path = "params.yaml",
    experiment: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    experiments_dir: str | Path | None = None,
) -> PipelineConfig:
    """Resolve params.yaml + experiment chain + dotted overrides into a validated `PipelineConfig`."""
    params = Path(params)
    exp_dir = Path(experiments_dir) if experiments_dir else params.parent / "experiments"
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    _merge(merged, _read_yaml(params), origin, str(params))
    if experiment:
        for path in _experiment_chain(experiment, exp_dir):
            data = _read_yaml(path)
            data.pop("extends", None)
            data.pop("description", None)
            _merge(merged, data, origin, str(path))
    _apply_overrides(merged, list(overrides), origin)
    try:
        cfg = PipelineConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, origin, str(params))) from None
    bound_clients(cfg.orchestration.network_timeout_s)  # every network call of this process and its children
    return cfg


def config_hash(cfg: Section, length: int = 12) -> str:
    """Stable hash of a resolved config (or one section of it), for lineage."""
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def dump_yaml(cfg: Section) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
