"""Automatic annotation: a model proposes (query, window) pairs for videos without annotations, a grounding model
verifies each, and the accepted ones join the records preprocess reads as an `auto:<annotator digest>` source.

Off by default (`annotate.enabled: false`): the stage then copies ingest's records to annotate.out unchanged. On,
it annotates annotate.videos (videos without annotations, under a declared source's roots) and, to measure the
annotator on labelled data, the train-split videos whose annotations annotate.hide_fraction withholds. Writes
annotate.out (records for preprocess), annotate.proposals (every proposal and its verdict), annotate.withheld and
annotate.summary (counts that reconcile; precision against the withheld truth). Auto records never reach val or
test (preprocess filters them `auto_label_not_train`); SFT mixes them by train.data.auto_share.

examples:
  python -m annotate                                          # params.yaml (a pass-through by default)
  python -m annotate annotate.enabled=true annotate.hide_fraction=0.8     # the low-label measurement
  python -m annotate annotate.enabled=true "annotate.videos=[data/raw/unlabelled]" \\
      annotate.proposer=/models/Qwen3-VL-8B-Instruct annotate.verifier=checkpoints/sft/step-001500/hf
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from annotate.run import run
from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.stages import stage_outputs


def summarize(summary: dict) -> Table:
    table = Table(title="annotate" + ("" if summary["enabled"] else " (off: records passed through)"))
    for col in ("records in", "withheld", "passed", "proposals", "accepted", "rejected", "records out"):
        table.add_column(col, justify="right")
    table.add_row(*(str(summary[k]) for k in ("records_in", "withheld", "passed", "proposals", "accepted",
                                                "rejected", "records_out")))
    if summary["enabled"]:
        p = summary.get("precision") or {}
        table.caption = (f"source {summary['annotator']['source']}; rejected by reason: "
                         + (", ".join(f"{k} {v}" for k, v in summary["rejected_by_reason"].items()) or "none")
                         + (f"; precision vs withheld truth (IoU >= 0.5) {p['window_iou_0.5']}, recall "
                            f"{p['recall_iou_0.5']}" if p else "") + f"; {summary['seconds']} s")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m annotate"
    args = parser.parse_args(argv)
    cfg = resolve_config(args, stage="annotate")
    cfg = cfg.model_copy(update={"annotate": stage_outputs("annotate", cfg)})
    summary = run(cfg, progress=cfg.annotate.progress)
    Console().print(summarize(summary))
    a = cfg.annotate
    print(f"records -> {a.out}; proposals -> {a.proposals}; withheld -> {a.withheld}; summary -> {a.summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
