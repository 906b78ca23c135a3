"""`vtg <command> ...`: one front door to every stage CLI (each is also `python -m <module>`) and the tools.

The stage commands are read from dvc.yaml (the one declaration of a stage: its `cmd` is `python -m <module>`),
so the launcher, the flow and `dvc repro` run the same module for a stage; the tools are listed here.
"""

from __future__ import annotations

import runpy
import sys

STAGE_HELP = {
    "corpus": "build the synthetic grounding corpus",
    "ingest": "annotations -> canonical records (+ dead letters)",
    "annotate": "automatic annotation: proposed, verified auto records (off by default: pass-through)",
    "preprocess": "Beam job: records + videos -> WebDataset shards",
    "train": "SFT (single process; use the deepspeed launcher or torchrun for more ranks)",
    "select": "the SFT checkpoint best on val, which RL starts from (rl.init: best)",
    "rl": "GRPO from the selected SFT checkpoint (temporal-IoU reward)",
    "evaluate": "the evaluate stage (every checkpoint on val, the best on test), or one checkpoint",
}
"""One line per stage for `vtg --help` (a stage without one shows its dvc.yaml command)."""

TOOLS: dict[str, tuple[str, str]] = {
    "run": ("flows", "run the whole pipeline (Prefect flow; ephemeral API unless PREFECT_API_URL is set)"),
    "config": ("vtg.config", "print the resolved configuration and its hash"),
    "plan": ("training.plan", "memory planner: per-GPU memory by ZeRO stage"),
    "preflight": ("training.preflight", "does the experiment's longest example fit, in tokens and GPU memory?"),
    "benchmark": ("evaluation.benchmark", "score a checkpoint on whole videos under a benchmark profile"),
    "lineage": ("flows.lineage", "print the lineage chain of a model version, eval run or checkpoint"),
}


def stage_commands() -> dict[str, tuple[str, str]]:
    """{stage: (module, help)} from dvc.yaml's `cmd: python -m <module>` entries (none without a dvc.yaml)."""
    from vtg.errors import VTGError
    from vtg.stages import load_graph

    try:
        graph = load_graph()
    except VTGError:
        return {}
    out = {}
    for name, st in graph.items():
        words = st.cmd.split()
        if words[:2] == ["python", "-m"] and len(words) >= 3:
            out[name] = (words[2], STAGE_HELP.get(name, st.cmd))
    return out


def commands() -> dict[str, tuple[str, str]]:
    return {**stage_commands(), **TOOLS}


def _usage(cmds: dict[str, tuple[str, str]]) -> str:
    width = max(map(len, cmds))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in cmds.items())
    return f"usage: vtg <command> [--help] [args...]\n\ncommands (stages from dvc.yaml, then tools):\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmds = commands()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(cmds), end="")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in cmds:
        print(f"error: unknown command {name!r}\n\n{_usage(cmds)}", file=sys.stderr, end="")
        return 2
    sys.argv = [f"vtg {name}", *rest]
    try:
        runpy.run_module(cmds[name][0], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
