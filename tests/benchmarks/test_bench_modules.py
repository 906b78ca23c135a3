"""The benchmark package itself: runnable as `python -m benchmarks.<name>`, no module shadowing a top-level package
(`benchmarks/corpus.py` once did: `from corpus import build_corpus` imported itself), every module in `make bench`."""

import ast
import re
import subprocess

from support.benchkit import REPO

TOP_LEVEL = {p.parent.name for p in REPO.glob("*/__init__.py")} | {p.stem for p in REPO.glob("*.py")}
BENCHMARKS = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem not in ("__init__", "figures"))


def test_no_benchmark_module_shadows_a_top_level_package():
    assert {"corpus", "ingest", "training", "evaluation", "flows", "beam_jobs", "vtg"} <= TOP_LEVEL
    clash = sorted(set(BENCHMARKS) & TOP_LEVEL)
    assert clash == [], f"benchmarks/{clash[0]}.py would shadow the top-level package {clash[0]!r}"


def test_every_benchmark_has_main_and_a_json_option():
    for name in BENCHMARKS:
        src = (REPO / "benchmarks" / f"{name}.py").read_text()
        tree = ast.parse(src)
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), name
        assert '"--json"' in src and "Run.start()" in src, f"benchmarks/{name}.py writes no figures JSON"


def test_make_bench_runs_every_benchmark_as_a_module():
    r = subprocess.run(["make", "-n", "-o", "setup", "bench"], cwd=REPO, capture_output=True, text=True, check=True)
    ran = re.findall(r" -m benchmarks\.(\w+)", r.stdout)
    assert sorted(set(ran) - {"figures"}) == BENCHMARKS, r.stdout
    assert "benchmarks/" not in r.stdout, "a benchmark run by path puts benchmarks/ first on sys.path"
