"""Stand-in for `python -m evaluation --checkpoint DIR [--split S]`."""

from standin_stages import parse
from standin_stages.evaluation import evaluate_checkpoint

args, cfg = parse("evaluate-cli", extra=["--checkpoint", "--split"])
print(evaluate_checkpoint(args.checkpoint, args.split or cfg.evaluate.split, cfg))
