"""Ingest annotation files into canonical records (one per video and query).

Reads ingest.annotations (files, or directories of *.txt/*.json/*.jsonl): Charades-STA txt, QVHighlights
jsonl, ActivityNet Captions json or native jsonl (ingest.format, `auto` by extension and content), finds each
video by id under ingest.video_root, and writes ingest.out (records), ingest.dead_letter (every rejected item
with file, line and reason) and ingest.summary (counts; inputs = records + dead letters).

examples:
  python -m ingest                                    # the synthetic corpus (params.yaml)
  python -m ingest "ingest.annotations=[charades_sta_test.txt]" ingest.video_root=/data/Charades_v1
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ingest import ingest
from ingest.validate import QueryLimit
from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.stages import stage_outputs


def summarize(summary: dict) -> Table:
    table = Table(title="ingest")
    for col in ("source", "file", "format", "inputs", "records", "dead letters", "clipped"):
        table.add_column(col, justify="right" if col not in ("source", "file", "format") else "left",
                         overflow="fold" if col == "file" else "ellipsis")
    for f in summary["files"]:
        table.add_row(f["source"], f["file"], f["format"], str(f["inputs"]), str(f["records"]),
                      str(f["dead_letters"]), str(f["clipped"]))
    table.add_row("total", "", "", str(summary["inputs"]), str(summary["records"]), str(summary["dead_letters"]),
                  str(summary["clipped"]), style="bold")
    table.caption = (f"{summary['videos']} videos; dead letters by reason: "
                     + (", ".join(f"{k} {v}" for k, v in summary["by_reason"].items()) or "none")
                     + f"; {summary['seconds']:.1f} s; records by source (licence): "
                     + ", ".join(f"{k} ({v['licence']}) {v['records']}" for k, v in summary["sources"].items()))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m ingest"
    args = parser.parse_args(argv)
    cfg = resolve_config(args, stage="ingest")
    icfg = stage_outputs("ingest", cfg)
    limit = QueryLimit.for_base(cfg.train.model.base, icfg.max_query_tokens)
    summary = ingest(icfg, progress=True, query_limit=limit, require_records=True)
    Console().print(summarize(summary))
    print(f"records -> {icfg.out}; dead letters -> {icfg.dead_letter}; summary -> {icfg.summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
