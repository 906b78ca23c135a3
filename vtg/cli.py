"""`vtg <command> ...`: one front door to every stage CLI (each is also `python -m <module>`)."""

from __future__ import annotations

import runpy
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("flows", "run the whole pipeline (Prefect flow; ephemeral API unless PREFECT_API_URL is set)"),
    "config": ("vtg.config", "print the resolved configuration and its hash"),
    "corpus": ("corpus", "build the synthetic grounding corpus"),
    "ingest": ("ingest", "annotations -> canonical records (+ dead letters)"),
    "annotate": ("annotate", "automatic annotation: proposed, verified auto records (off by default: pass-through)"),
    "preprocess": ("beam_jobs.preprocess", "Beam job: records + videos -> WebDataset shards"),
    "train": ("training", "DeepSpeed training (single process; use the deepspeed launcher for more ranks)"),
    "plan": ("training.plan", "memory planner: per-GPU memory by ZeRO stage"),
    "preflight": ("training.preflight", "does the experiment's longest example fit, in tokens and GPU memory?"),
    "evaluate": ("evaluation", "the evaluate stage (every checkpoint on val, the best on test), or one checkpoint"),
    "lineage": ("flows.lineage", "print the lineage chain of a model version, eval run or checkpoint"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return f"usage: vtg <command> [--help] [args...]\n\ncommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), end="")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}\n\n{_usage()}", file=sys.stderr, end="")
        return 2
    sys.argv = [f"vtg {name}", *rest]
    try:
        runpy.run_module(COMMANDS[name][0], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
