"""Build the deterministic synthetic grounding corpus (the embedded default data set).

Writes under corpus.out_dir: videos/<id>.mp4, annotations/<format>.<ext> (corpus.annotation_format) and
ground_truth.json (schema: `python -c "import corpus; help(corpus)"`). The same config gives
byte-identical files; an out_dir already built from the same config is left as is (use --force).

examples:
  python -m corpus                                    # the default (params.yaml)
  python -m corpus corpus.n_videos=20 corpus.out_dir=/tmp/small corpus.annotation_format=charades
  python -m corpus --scale 4 corpus.out_dir=data/raw/synthetic_x4   # bigger, for benchmarks
"""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from corpus import build_corpus
from vtg.cli_common import config_arg_parser, resolve_config, run_cli


def summarize(gt: dict) -> Table:
    videos = gt["videos"]
    defects = Counter(v["defect"]["kind"] for v in videos)
    kinds = Counter(e["kind"] for v in videos for e in v["events"])
    table = Table(title=f"synthetic corpus ({gt['out_dir']})", show_header=False)
    table.add_row("videos", f"{len(videos)} ({defects['none']} clean)")
    table.add_row("defects", ", ".join(f"{k} {n}" for k, n in sorted(defects.items()) if k != "none") or "none")
    table.add_row("queries", ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    table.add_row("hours of video", f"{sum(v['duration_s'] for v in videos) / 3600:.2f}")
    table.add_row("with dissolve", str(sum(bool(v["gradual_transitions"]) for v in videos)))
    table.add_row("annotation file", f"{gt['annotation_file']} ({gt['annotation_lines']} lines, "
                  f"{len(gt['invalid_annotations'])} invalid, {len(gt['clipped_annotations'])} to clip)")
    if gt.get("skipped"):
        table.add_row("build", "up to date (same config), skipped; --force rebuilds")
    else:
        table.add_row("build", f"{gt['build_seconds']:.1f} s")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m corpus"
    parser.add_argument("--scale", type=float, default=None, help="shorthand for corpus.scale=X")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even if out_dir already holds a corpus built from the same config")
    args = parser.parse_args(argv)
    if args.scale is not None:
        args.overrides = [*args.overrides, f"corpus.scale={args.scale}"]
    cfg = resolve_config(args, stage="corpus")
    gt = build_corpus(cfg.corpus, force=args.force, progress=True)
    Console(stderr=False).print(summarize(gt))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
