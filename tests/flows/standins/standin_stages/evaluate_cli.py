"""Stand-in for `python -m evaluation [--checkpoint DIR --split S]`: one checkpoint, or the evaluate stage (every
SFT and RL checkpoint on val, the best by r1@0.7 -> best.json, the best on test -> metrics.json)."""

from pathlib import Path

from standin_stages import parse, write_json
from standin_stages.evaluation import evaluate_checkpoint, publish
from vtg import checkpoints

args, cfg = parse("evaluate-cli", extra=["--checkpoint", "--split"])
if args.checkpoint:
    print(evaluate_checkpoint(args.checkpoint, args.split or cfg.evaluate.split, cfg))
else:
    roots = [cfg.train.out_dir] + ([cfg.rl.out_dir] if cfg.orchestration.rl else [])  # as evaluation.stage
    found = [c for root in roots for c in checkpoints.list_checkpoints(root)]
    val = [(evaluate_checkpoint(str(c), "val", cfg), c) for c in found]
    best_result, best = max(val, key=lambda rc: (rc[0]["metrics"]["r1@0.7"], rc[0]["metrics"]["miou"], rc[0]["step"]))
    out = Path(cfg.evaluate.out_dir)
    checkpoints.write_pointer(out / checkpoints.BEST_POINTER, best, step=best_result["step"])
    test = evaluate_checkpoint(str(best), "test", cfg)
    publish(cfg, test)
    write_json(out / "metrics.json", {"checkpoint": best.name, "step": test["step"], "split": "test",
                                      "model": test["metrics"]})
    (out / "summary.md").write_text(f"## Held-out test metrics of the best checkpoint (`{best.name}`)\n")
    print(f"best {best} test {test['metrics']}")
