"""File I/O shared by every stage: atomic JSON writes and content digests (one home, like datatrove's io.py)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml


@contextlib.contextmanager
def exclusive(lock_path: str | Path, on_wait: Callable[[float | None], None] | None = None) -> Iterator[None]:
    """An exclusive `flock` on `lock_path` (created) for the block: processes that share a path take turns. A holder
    that dies releases it (the kernel drops the lock), so a wait lasts at most as long as the holder lives.
    `on_wait(None)` is called when the lock is held by another process and this one starts waiting,
    `on_wait(seconds)` once it has the lock after waiting."""
    Path(lock_path).parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.monotonic()
            if on_wait:
                on_wait(None)
            fcntl.flock(f, fcntl.LOCK_EX)
            if on_wait:
                on_wait(time.monotonic() - t0)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write `data` as JSON (indent 2, sorted keys, trailing newline) to a temp file beside `path`, then
    `os.replace` it there: a reader sees the old file or the new one, never a partial one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def relative_ref(target: str | Path, base_dir: str | Path) -> str:
    """How a file names another path: relative to `base_dir`, the folder of the file that holds the reference
    (POSIX), so that a copied or moved project still resolves it. The one rule for every stored path: pointers,
    an RL checkpoint's parent, stored evaluations (docs/architecture.md, "Portable outputs")."""
    return Path(os.path.relpath(Path(target).resolve(), Path(base_dir).resolve())).as_posix()


def resolve_ref(ref: str | Path, base_dir: str | Path) -> Path:
    """The path a stored reference names: a relative one from `base_dir` (`relative_ref`), an absolute one (files
    written before references were relative) as it is."""
    p = Path(ref)
    return p.resolve() if p.is_absolute() else (Path(base_dir) / p).resolve()


def file_digest(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 (hex) of a file's content, read `chunk` bytes at a time."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: str | Path, pattern: str = "**/*") -> str:
    """sha256 over (relative path, content sha256) of every file under `root`, in sorted order."""
    root = Path(root)
    h = hashlib.sha256()
    for p in sorted(q for q in root.glob(pattern) if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + file_digest(p).encode() + b"\n")
    return h.hexdigest()


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping naming one key twice is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep)


class DuplicateKeyError(ValueError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"key {key!r} appears twice, at lines {first} and {second} (YAML would keep the second "
                         "silently): keep one")
        self.key, self.first, self.second = key, first, second


def load_yaml(text: str, source: str | os.PathLike = "<yaml>") -> Any:
    """The one YAML reader of configuration (params.yaml, experiments, dvc.yaml, dvc.lock): `yaml.safe_load`,
    but a key given twice in one mapping is a `ConfigError` naming both lines, never the last value silently."""
    from vtg.errors import ConfigError

    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except DuplicateKeyError as e:
        raise ConfigError(f"{source}: {e}") from None
