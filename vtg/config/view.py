"""A stage sees only what it declares: the view of a resolved config that a stage's entry point runs with.

dvc.yaml's record of a stage names the config it reads under `params` (sections such as `train`, or dotted
fields such as `orchestration.rl`); both front doors rerun the stage when one of them changes (`vtg.stages`). A
stage that read anything else could go stale: its output would depend on a value no door watches. So each stage
CLI runs with `declared_view(cfg, stage, params)`: the same `PipelineConfig`, in which reading an undeclared field
is an `UndeclaredConfig` error naming dvc.yaml. Always readable: fields marked `NOT_OUTPUT` (paths, worker counts,
progress: they cannot change an output, `vtg.config._base`) and the `tracking` section (where results are logged).

The view is the real config (same classes by `isinstance`, same `model_dump`, same hashes, picklable as the plain
config): only attribute reads of undeclared fields are refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from vtg.config._base import MARK
from vtg.errors import VTGError

AMBIENT = ("tracking",)
"""Sections every stage may read without declaring them: where results are logged, never what a stage writes."""


class UndeclaredConfig(VTGError):
    """A stage read a config field its dvc.yaml record does not declare."""


def _covered(dotted: str, declared: frozenset[str]) -> bool:
    parts = dotted.split(".")
    return any(".".join(parts[:i]) in declared for i in range(1, len(parts) + 1))


def _rebuild(cls: type[BaseModel], values: dict[str, Any], fields_set: set[str]) -> BaseModel:
    return cls.model_construct(_fields_set=fields_set, **values)


_CLASSES: dict[tuple, type] = {}


def _guarded_class(cls: type[BaseModel], blocked: frozenset[str], prefix: str, stage: str) -> type:
    key = (cls, blocked, prefix, stage)
    if key in _CLASSES:
        return _CLASSES[key]

    def __getattribute__(self, name: str):
        if name in blocked:
            raise UndeclaredConfig(
                f"the {stage} stage read {prefix}{name}, which its record in dvc.yaml does not declare under "
                f"params: add `{prefix}{name}` there (then a change reruns {stage} through both doors) or stop "
                "reading it")
        return object.__getattribute__(self, name)

    def __reduce_ex__(self, protocol: int):  # pickles as the plain section (Beam and loader workers)
        values = {k: v for k, v in object.__getattribute__(self, "__dict__").items()}
        return _rebuild, (cls, values, set(object.__getattribute__(self, "__pydantic_fields_set__")))

    guarded = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__reduce_ex__": __reduce_ex__,
                                          "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    _CLASSES[key] = guarded
    return guarded


def _guard(obj: BaseModel, prefix: str, declared: frozenset[str], stage: str) -> BaseModel:
    cls = type(obj)
    fields = obj.__dict__
    values: dict[str, Any] = {}
    blocked: set[str] = set()
    for name, info in cls.model_fields.items():
        dotted = prefix + name
        extra = info.json_schema_extra
        value = fields[name]
        if (_covered(dotted, declared) or dotted in AMBIENT
                or (isinstance(extra, dict) and extra.get(MARK) == "none")):
            values[name] = value
        elif isinstance(value, BaseModel):  # a section not declared whole: its fields one by one
            values[name] = _guard(value, dotted + ".", declared, stage)
        else:
            values[name] = value
            blocked.add(name)
    if not blocked and all(values[n] is fields[n] for n in values):
        return obj
    return _guarded_class(cls, frozenset(blocked), prefix, stage).model_construct(
        _fields_set=set(obj.model_fields_set), **values)


def declared_view(cfg: BaseModel, stage: str, params: tuple[str, ...] | list[str]) -> BaseModel:
    """`cfg` as the stage `stage` may read it: its declared `params` (dvc.yaml), `NOT_OUTPUT` fields and the
    `AMBIENT` sections; any other field read raises `UndeclaredConfig`."""
    return _guard(cfg, "", frozenset(params), stage)


def unguarded(cfg: BaseModel) -> BaseModel:
    """The plain config behind a view (itself when it is none). For the one reader that must see every stage's
    names on purpose: the protection set (`training.lifecycle.namers`: retention and move-aside never take a
    checkpoint another stage names), which decides what is kept, never what a stage computes."""
    values = {k: unguarded(v) if isinstance(v, BaseModel) else v for k, v in cfg.__dict__.items()}
    plain = type(cfg)
    while plain in _CLASSES.values():
        plain = plain.__mro__[1]
    if plain is type(cfg) and all(values[k] is cfg.__dict__[k] for k in values):
        return cfg
    return plain.model_construct(_fields_set=set(cfg.model_fields_set), **values)


def is_view(cfg: BaseModel) -> bool:
    """Whether `cfg` (or a section in it) is a declared view rather than the plain config."""
    return type(cfg) in _CLASSES.values() or any(
        isinstance(v, BaseModel) and is_view(v) for v in cfg.__dict__.values())
