"""The evaluation store: one directory per (checkpoint content, split, settings, eval data), written atomically.

`<store_dir>/<split>/<checkpoint name>-<key[:16]>/` holds metrics.json (written last: its presence marks a
complete evaluation), predictions.jsonl and the report. A second evaluation of the same checkpoint content
finds it by key and reuses it. The step curve (`steps.csv`) is rebuilt from the store, never appended, so
concurrent evaluations of different checkpoints cannot corrupt it.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from evaluation.registry import DEFAULT_STAGE, checkpoint_label, checkpoint_stage, order_key
from vtg.io import exclusive, relative_ref, resolve_ref, write_json_atomic
from vtg.records import read_jsonl, write_jsonl

RESULT_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.jsonl"
PATH_FIELDS = ("checkpoint", "parent_checkpoint")
"""The fields of a stored result that name a path (`save_result`/`load_result` keep them portable)."""


def eval_key(checkpoint_digest: str, split: str, settings_hash: str, data_digest: str) -> str:
    blob = json.dumps([checkpoint_digest, split, settings_hash, data_digest])
    return hashlib.sha256(blob.encode()).hexdigest()


def entry_dir(store_dir: str | Path, split: str, checkpoint_name: str, key: str) -> Path:
    """`<store>/<split>/<name>-<key[:16]>`; a stage-qualified name (`rl/step-000100`) becomes `rl-step-000100`."""
    return Path(store_dir) / split / f"{checkpoint_name.replace('/', '-')}-{key[:16]}"


def find(store_dir: str | Path, split: str, key: str) -> Path | None:
    """The complete entry with this key, or None."""
    for p in (Path(store_dir) / split).glob(f"*-{key[:16]}"):
        result = p / RESULT_FILE
        if result.is_file() and json.loads(result.read_text()).get("key") == key:
            return p
    return None


def _is_path(lineage) -> bool:
    """A lineage is a training run id, or (tracking off) the path of a checkpoint root: the paths have a '/'."""
    return isinstance(lineage, str) and "/" in lineage


def save_result(entry: Path, result: dict) -> None:
    """metrics.json of an entry (written last: marks it complete). The paths in it (`PATH_FIELDS`, a path
    lineage) are stored relative to the entry's folder, so that a copied or moved project's store names its own
    checkpoints (`vtg.io.relative_ref`); `load_result` reads them back absolute."""
    stored = {**result, **{k: relative_ref(result[k], entry) for k in PATH_FIELDS if result.get(k)}}
    if _is_path(result.get("lineage")):
        stored["lineage"] = relative_ref(result["lineage"], entry)
    write_json_atomic(entry / RESULT_FILE, stored)


def load_result(entry: Path) -> dict:
    """An entry's result with its paths absolute (relative ones from the entry's folder; absolute ones, stored
    before paths were relative, as they are)."""
    r = json.loads((Path(entry) / RESULT_FILE).read_text())
    r.update({k: str(resolve_ref(r[k], entry)) for k in PATH_FIELDS if r.get(k)})
    if _is_path(r.get("lineage")):
        r["lineage"] = str(resolve_ref(r["lineage"], entry))
    return r


def load_predictions(entry: Path) -> list[dict]:
    return list(read_jsonl(entry / PREDICTIONS_FILE))


def save_predictions(entry: Path, predictions: Sequence[dict]) -> None:
    entry.mkdir(parents=True, exist_ok=True)
    tmp = entry / f".{PREDICTIONS_FILE}.tmp"
    write_jsonl(tmp, predictions)
    os.replace(tmp, entry / PREDICTIONS_FILE)


def history(store_dir: str | Path, split: str, lineage: str, settings_hash: str) -> list[dict]:
    """Results of every evaluated checkpoint of the same lineage (training run, with the RL runs started from
    it) and settings, SFT steps first, then RL steps (`registry.order_key`); the newest result per checkpoint."""
    out: dict[tuple, dict] = {}
    for f in sorted((Path(store_dir) / split).glob(f"*/{RESULT_FILE}"), key=lambda p: p.stat().st_mtime):
        r = load_result(f.parent)
        if r.get("lineage") == lineage and r.get("settings_hash") == settings_hash:
            out[order_key(r)] = r
    return [out[k] for k in sorted(out)]


def step_rows(results: Sequence[dict], metrics: Sequence[str], select: str) -> list[dict]:
    """One flat row per checkpoint (steps.csv), SFT then RL: `step` is the checkpoint's own step, `stage` says
    whose, and `curve_step` puts every stage on one axis (an RL step counts from the last SFT step listed), so
    a curve never mixes an RL step with the SFT step of the same number."""
    results = sorted(results, key=order_key)
    offset = max((r["step"] for r in results if checkpoint_stage(r) == DEFAULT_STAGE), default=0)
    rows = []
    for r in results:
        s = r["summary"]
        stage = checkpoint_stage(r)
        row = {"step": r["step"], "stage": stage, "curve_step": r["step"] + (0 if stage == DEFAULT_STAGE else offset),
               "checkpoint": checkpoint_label(r)}
        row.update({m: s["model"][m] for m in metrics})
        row["parse_failure_rate"] = s["model"].get("parse_failure_rate", 0.0)
        row["eval_loss"] = s["model"].get("eval_loss", float("nan"))
        for task, t in ((s.get("forgetting") or {}).get("tasks") or {}).items():
            row[f"retention_{task}"] = t["retention"] if t.get("retention") is not None else float("nan")
        row.update({f"{name}_{select}": b[select] for name, b in s["baselines"].items() if select in b})
        rows.append(row)
    return rows


def write_steps_csv(path: Path, rows: Sequence[dict]) -> None:
    """Metric vs training step (DVC `plots`: x=curve_step, so that RL steps follow SFT's)."""
    fields = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields or ["step"])
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    os.replace(tmp, path)


def publish(entry: Path, out_dir: Path, names: Sequence[str]) -> None:
    """Copy an entry's files into the stage's fixed output folder (what DVC tracks)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (entry / name).is_file():
            tmp = out_dir / f".{name}.tmp"
            shutil.copyfile(entry / name, tmp)
            os.replace(tmp, out_dir / name)


@contextlib.contextmanager
def locked(store_dir: str | Path, name: str = "") -> Iterator[None]:
    """An exclusive file lock in the store: without `name` it serializes the best-checkpoint decision and the
    output refresh; with a key as `name`, two concurrent evaluations of the same checkpoint (a trigger that
    fires twice) run one after the other, and the second reuses the first's result."""
    with exclusive(Path(store_dir) / f".lock{'-' + name[:16] if name else ''}"):
        yield
