"""Contracts have one home: stages meet only through the shared core (`vtg`), the checkpoint layout is spelled
only in `vtg/checkpoints.py`, the checkpoint roots (`checkpoints/sft`, `checkpoints/rl`) only in the config, and
the best checkpoint is chosen in one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("vtg", "corpus", "ingest", "annotate", "beam_jobs", "training", "evaluation", "flows", "infra", "benchmarks")
LAYOUT_NAMES = {"meta.json", "hf", "latest", "engine", "best.json"}
LAYOUT_PATTERN = re.compile(r"^(rank-|step-|\.tmp-step)")
ROOT_PATTERN = re.compile(r"^(\./)?checkpoints(/|$)")


def _modules(*packages: str):
    for pkg in packages:
        for path in sorted((REPO / pkg).rglob("*.py")):
            yield path, ast.parse(path.read_text(), filename=str(path))


def _imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_evaluation_and_flows_import_nothing_from_training():
    bad = [f"{p.relative_to(REPO)}: {m}" for p, tree in _modules("evaluation", "flows", "vtg")
           for m in _imported(tree) if m == "training" or m.startswith("training.")]
    assert bad == [], "contracts shared with training belong in the core (vtg):\n" + "\n".join(bad)


PUBLIC_APIS = {"training": {"evaluation.api"}}
"""The one crossing between stages: RL picks its start checkpoint through evaluation's public API (what the
evaluate stage scores, stored results reused), not with a second evaluator. Never the other way round."""


def test_stage_packages_do_not_import_each_other():
    stages = {"corpus", "ingest", "annotate", "beam_jobs", "training", "evaluation"}
    bad = [f"{p.relative_to(REPO)}: {m}" for pkg in stages for p, tree in _modules(pkg)
           for m in _imported(tree) if m.split(".")[0] in stages - {pkg} and m not in PUBLIC_APIS.get(pkg, set())]
    assert bad == [], "\n".join(bad)


def test_no_private_names_cross_modules():
    """A name with a leading underscore stays in its module: a stage that borrows another module's private
    helpers has copied a lifecycle instead of sharing it."""
    bad = []
    for path, tree in _modules(*PACKAGES):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] in PACKAGES:
                bad += [f"{path.relative_to(REPO)}: from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == [], "\n".join(bad)


def test_checkpoint_layout_is_spelled_only_in_the_checkpoint_module():
    """A layout name that is also a config section's (`engine`: the checkpoint's engine state, and the section the
    training stages share) may key a mapping of sections (a run key's view, MLflow params); anywhere else it is
    the layout."""
    from vtg.config import PipelineConfig

    sections = LAYOUT_NAMES & set(PipelineConfig.model_fields)
    found = []
    for path, tree in _modules(*PACKAGES):
        if path == REPO / "vtg" / "checkpoints.py":
            continue
        keys = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys
                if isinstance(k, ast.Constant) and k.value in sections}
        for node in ast.walk(tree):
            parts = node.values if isinstance(node, ast.JoinedStr) else [node]
            for v in parts:
                if id(v) in keys:
                    continue
                if isinstance(v, ast.Constant) and isinstance(v.value, str) and (
                        v.value in LAYOUT_NAMES or LAYOUT_PATTERN.match(v.value)):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {v.value!r}")
    assert found == [], "use vtg.checkpoints (paths, pointers, meta) instead of:\n" + "\n".join(found)


def _string_constants(tree: ast.AST):
    for node in ast.walk(tree):
        for v in node.values if isinstance(node, ast.JoinedStr) else [node]:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                yield node.lineno, v.value


def test_checkpoint_roots_are_config_values_spelled_only_in_the_config():
    """`train.out_dir` and `rl.out_dir` (dvc.yaml outs `checkpoints/sft`, `checkpoints/rl`): code reads them from
    the config, so moving a root is one edit (and `python -m vtg.config --write-params`)."""
    found = [f"{p.relative_to(REPO)}:{line}: {value!r}" for p, tree in _modules(*PACKAGES)
             if REPO / "vtg" / "config" not in p.parents
             for line, value in _string_constants(tree) if ROOT_PATTERN.match(value)]
    assert found == [], "read train.out_dir / rl.out_dir instead of:\n" + "\n".join(found)


def test_one_pick_best():
    defs = [f"{p.relative_to(REPO)}" for p, tree in _modules(*PACKAGES) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name == "pick_best"]
    assert defs == ["vtg/selection.py"]  # the rule evaluation and RL (start checkpoint) share


QUEUE_NAMES = ("checkpoint_evals.jsonl", "checkpoint_queue-")


def test_checkpoint_evaluation_queue_names_are_spelled_only_in_the_queue_module():
    """The per-checkpoint evaluation queue and its results index (their file names, line format, match key) have
    one home, `vtg/eval_queue.py`: training (retention keeps pending checkpoints) and flows (hook, evaluator,
    wait) import it."""
    found = [f"{p.relative_to(REPO)}:{line}: {value!r}" for p, tree in _modules(*PACKAGES)
             if p != REPO / "vtg" / "eval_queue.py"
             for line, value in _string_constants(tree) if any(name in value for name in QUEUE_NAMES)]
    assert found == [], "use vtg.eval_queue (queue_path, results_path) instead of:\n" + "\n".join(found)


MODEL_CLASS = re.compile(r"(ForConditionalGeneration|VLConfig|_VL\w*Config|DecoderLayer|VisionBlock)$")


def test_model_classes_are_named_only_by_the_family_module():
    """Every model-specific class name (model, config, layer classes) lives in `vtg/model/families/`: the rest
    asks `family_of(config)`, so that adding a family is one module (issue 22, issue 36)."""
    home = REPO / "vtg" / "model" / "families"
    bad = []
    for path, tree in _modules(*PACKAGES):
        if path.is_relative_to(home):
            continue
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom) else
                     [node.attr] if isinstance(node, ast.Attribute) else
                     [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else [])
            bad += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names
                    if MODEL_CLASS.search(n) and " " not in n]
    assert bad == [], "name model classes through vtg.model.families:\n" + "\n".join(bad)


FAMILY_NAME = re.compile(r"^(qwen2_5_vl|qwen3_vl|qwen3_5)$")


def test_family_names_are_spelled_only_in_the_family_modules():
    """A family's name as a string (`"qwen3_vl"`) appears only under vtg/model/families/: everything else reaches
    a family through its registry (`family_named`, `DEFAULT`, `QWEN3_VL.name`), so a family's facts cannot be
    keyed by name strings in other files again (issue 36)."""
    home = REPO / "vtg" / "model" / "families"
    bad = [f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}" for path, tree in _modules(*PACKAGES)
           if not path.is_relative_to(home) for node in ast.walk(tree)
           if isinstance(node, ast.Constant) and isinstance(node.value, str) and FAMILY_NAME.match(node.value)]
    assert bad == [], "name families through vtg.model.families:\n" + "\n".join(bad)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (every import statement, lazy ones too; a module and its own
    package ancestors do not count), as ../shared/tools/import_cycles.py reads them."""
    mods = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    tops = {m.split(".")[0] for m in mods}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for n in names:
                if n.split(".")[0] not in tops:
                    continue
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != m and not m.startswith(n + ".") and not n.startswith(m + "."):
                    graph[m].add(n)
    return graph


def test_no_import_cycle_anywhere():
    """No two project modules import each other, directly or around a circle, lazy imports included (issue 36:
    three circles were opened; this keeps them at zero)."""
    graph = _import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert len(graph) > 150 and cycles == [], "import cycles:\n" + "\n".join(" ".join(c) for c in cycles)


def test_training_imports_nothing_from_evaluation():
    """Training gets what it needs of evaluation handed in (early stop's evaluator) or as a file (RL's start:
    the select stage's pointer), never by import (issue 36)."""
    graph = _import_graph()
    bad = sorted(f"{m} -> {n}" for m, deps in graph.items() if m.split(".")[0] == "training"
                 for n in deps if n.split(".")[0] == "evaluation")
    assert bad == [], "\n".join(bad)
