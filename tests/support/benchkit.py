"""Running a benchmark the way `make bench` does (`python -m benchmarks.<name>` from the repository root) at tiny
sizes, and reading back what it promises: its JSON with every ratio finite, and the run's date, commit and load."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, tmp_path: Path, *args: str, timeout: float = 600) -> dict:
    """`python -m benchmarks.<name> *args --json <tmp>` in a subprocess (temp files under `tmp_path`); the JSON."""
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "TMPDIR": str(tmp_path),
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))}
    r = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args, "--json", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, f"benchmarks.{name} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return json.loads(out.read_text())


def finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def assert_promises(doc: dict, name: str, ratios: list[str]) -> None:
    """The benchmark's name, the run's provenance, and each promised ratio present as a finite number."""
    assert doc["benchmark"] == name
    run = doc["run"]
    assert run["date"] and run["commit"], run
    assert all(finite(x) for x in run["load_average_start"] + run["load_average_end"]), run
    assert len(run["load_average_start"]) == 3 and finite(run["wall_s"]), run
    missing = sorted(set(ratios) - set(doc["ratios"]))
    assert missing == [], f"promised ratios missing: {missing} (got {sorted(doc['ratios'])})"
    bad = {k: doc["ratios"][k] for k in ratios if not finite(doc["ratios"][k]) or doc["ratios"][k] <= 0}
    assert bad == {}, f"ratios not measured: {bad}"
