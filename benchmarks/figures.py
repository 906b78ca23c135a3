"""What every benchmark writes: the ratios it promises (against baselines measured in the same run), its other
figures, and when, at which commit and under what load they were measured.

    run = Run.start()          # before measuring
    ...
    run.write(path, "rl", ratios={...}, figures={...})

`python -m benchmarks.figures [DIR]` prints the JSON files in DIR (default `reports/bench`) as markdown: each run's
date, commit, load average and wall time, then every ratio. `make bench` ends with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from vtg.lineage import git_commit

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = Path("reports") / "bench"
"""Where a benchmark writes `<name>.json` unless given `--json` (git-ignored, like every pipeline report)."""


def default_json(name: str) -> str:
    return str(OUT_DIR / f"{name}.json")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def strict(value):
    """`value` with every NaN or infinity replaced by None (a figure that could not be measured): strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    return value


@dataclass
class Run:
    """One benchmark run's provenance: start date (UTC), commit (`-dirty` with uncommitted changes), CPUs and the
    1/5/15-minute load averages at the start (and, in the JSON, at the end)."""

    date: str
    commit: str
    cpus: int
    load_average_start: list[float]
    t0: float = field(repr=False)

    @classmethod
    def start(cls) -> Run:
        return cls(datetime.now(UTC).isoformat(timespec="seconds"), git_commit(REPO), os.cpu_count() or 1,
                   load_average(), time.perf_counter())

    def info(self) -> dict:
        return {"date": self.date, "commit": self.commit, "cpus": self.cpus,
                "load_average_start": self.load_average_start, "load_average_end": load_average(),
                "wall_s": round(time.perf_counter() - self.t0, 1)}

    def write(self, path: str | Path, benchmark: str, ratios: dict[str, float], figures: dict) -> dict:
        """Writes {benchmark, run, ratios, figures} to `path` and returns it. `ratios`: the promised ratios, flat
        (name -> value; None where one could not be measured)."""
        doc = strict({"benchmark": benchmark, "run": self.info(), "ratios": ratios, "figures": figures})
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"figures written to {path}")
        return doc


def table(docs: list[dict]) -> str:
    """Two markdown tables: each run (date, commit, load average at start and end, wall seconds), then every ratio."""
    runs = ["| benchmark | date (UTC) | commit | load average start / end (1, 5, 15 min) | wall s |",
            "| --- | --- | --- | --- | --- |"]
    ratios = ["| benchmark | ratio | value |", "| --- | --- | --- |"]
    for doc in docs:
        r, name = doc["run"], doc["benchmark"]
        load = " / ".join(" ".join(f"{x:.2f}" for x in r[k]) for k in ("load_average_start", "load_average_end"))
        runs.append(f"| {name} | {r['date']} | {r['commit']} | {load} | {r['wall_s']:.0f} |")
        for k, v in doc["ratios"].items():
            shown = "n/a" if v is None else f"{v:.0%}" if "share" in k else f"{v:.2f}x"
            ratios.append(f"| {name} | {k} | {shown} |")
    return "\n".join(runs) + "\n\n" + "\n".join(ratios)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Every benchmark's ratios from its JSON file, as one markdown table.")
    ap.add_argument("dir", nargs="?", default=str(OUT_DIR))
    args = ap.parse_args(argv)
    paths = sorted(Path(args.dir).glob("*.json"))
    if not paths:
        raise SystemExit(f"no benchmark figures in {args.dir} (run `make bench` first)")
    print(table([json.loads(p.read_text()) for p in paths]))


if __name__ == "__main__":
    main()
