"""`python -m evaluation [--checkpoint <dir> --split val|test] [KEY=VALUE ...]`: the evaluate stage, or one checkpoint.

Without `--checkpoint` it runs the evaluate stage (`evaluation.stage`: every SFT and RL checkpoint on val, the
best by `evaluate.select_metric`, then the best on test, with RL also the SFT-vs-RL comparison on test), which is
what `dvc repro` and the flow run.

With `--checkpoint` it is a side command: the result goes to the content-addressed store (`evaluate.store_dir`),
its own MLflow run and, with `--out DIR`, a copy of its report there; the evaluate stage's outputs
(`reports/eval/`), the best pointer, the registry alias and the training run's metrics are never touched (only the
stage moves them).

Runs in its own process (another node than training is fine: it needs only the checkpoint directory and the
shards). Prints the model's metrics next to the blind baselines and the paths of the outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vtg.cli_common import config_arg_parser, resolve_config, run_cli
from vtg.errors import VTGError


def _print_summary(res, copied_to: Path | None = None) -> None:
    s = res.result["summary"]
    names = [k for k in s["model"] if k == "miou" or k.startswith("r1@")]
    rows = [("model", s["model"]), *((f"{k} (blind)", v) for k, v in s["baselines"].items()),
            ("visual gain", s["visual_gain"])]
    print(f"{res.result['checkpoint_name']} (step {res.result['step']}) on {res.result['split']}: "
          f"{s['counts']['scored']} queries, parse failures {s['model']['parse_failure_rate']:.1%}, "
          f"eval loss {s['model']['eval_loss']:.4f}" + (" [reused stored result]" if res.reused else ""))
    print(f"{'':<16}" + "".join(f"{n:>10}" for n in names))
    for label, values in rows:
        print(f"{label:<16}" + "".join(f"{values.get(n, float('nan')):>10.3f}" for n in names))
    print(f"report: {res.report}\noutputs: {copied_to or res.entry_dir}")
    if res.selection.get("best"):
        print(f"best checkpoint: {res.selection['best']} "
              f"(registry version {res.selection.get('registered_version', '-')})")


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(
        "Evaluate one training checkpoint: batched greedy generation on a split's shards, answer parsing, "
        "mIoU and R@1 at IoU thresholds, blind baselines (moment prior, blank frames), an HTML report, an "
        "MLflow run linked to the training run, and the best-checkpoint pointer and registry alias.")
    parser.add_argument("--checkpoint",
                        help="checkpoint step dir, a pointer file (`checkpoints/sft/latest`, `reports/eval/best.json`) "
                             "or a checkpoint root (-> latest). Without it: the whole evaluate stage (every "
                             "checkpoint under train.out_dir and rl.out_dir on val, the best on test)")
    parser.add_argument("--split", choices=["val", "test"], default=None,
                        help="split to evaluate (default: evaluate.split)")
    parser.add_argument("--out", default=None,
                        help="with --checkpoint: also copy the report, predictions and metrics.json into this "
                             "folder (one subfolder per checkpoint and split)")
    parser.add_argument("--all", action="store_true",
                        help="with a checkpoint root: evaluate every complete step checkpoint in it, oldest first "
                             "(stored results are reused), so steps.csv holds the whole curve")
    args = parser.parse_args(argv)
    cfg = resolve_config(args, stage=None if args.checkpoint else "evaluate")  # ad hoc: no stage, no view
    if not args.checkpoint:
        from evaluation.stage import run_stage

        out = run_stage(cfg)
        print(out["summary_markdown"])
        print(f"best checkpoint: {out['best_checkpoint_name']} = {out['best_checkpoint']} "
              f"(registry version {out.get('registered_version') or '-'})")
        return 0
    from evaluation.api import evaluate_checkpoint

    targets = [args.checkpoint]
    if args.all:
        from vtg.checkpoints import list_checkpoints

        targets = list_checkpoints(args.checkpoint)
        if not targets:
            raise VTGError(f"{args.checkpoint}: no complete step checkpoints to evaluate (--all wants a root)")
    for target in targets:
        res = evaluate_checkpoint(target, args.split, cfg, adhoc=True)
        _print_summary(res, publish_adhoc(res, Path(args.out)) if args.out else None)
    print("ad-hoc evaluation: reports/eval, the best pointer, the registry alias and the training run are unchanged "
          "(the evaluate stage, `python -m evaluation` without --checkpoint, moves them)")
    return 0


def publish_adhoc(res, out: Path) -> Path:
    """Copy one ad-hoc result (report, predictions, plots, metrics.json) to `out/<stage>-<step>-<split>/`."""
    from evaluation import store
    from evaluation.api import PUBLISHED, public_metrics
    from vtg.io import write_json_atomic

    dest = out / f"{res.result['checkpoint_name'].replace('/', '-')}-{res.result['split']}"
    store.publish(res.entry_dir, dest, PUBLISHED)
    write_json_atomic(dest / store.RESULT_FILE, public_metrics(res.result))
    return dest


if __name__ == "__main__":
    sys.exit(run_cli(main))
