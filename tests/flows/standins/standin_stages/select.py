"""Stand-in for `python -m evaluation.select`: RL's start is the newest SFT checkpoint, written as the select
stage's pointer (`vtg.selection.START_POINTER`, with the checkpoint's identity) and candidates file."""

from standin_stages import parse, write_json
from vtg import checkpoints
from vtg.selection import CANDIDATES, checkpoint_identity, start_pointer_path

args, cfg = parse("select")
latest = checkpoints.latest_checkpoint(cfg.train.out_dir)
pointer = start_pointer_path(cfg)
checkpoints.write_pointer(pointer, latest, step=checkpoints.read_checkpoint_meta(latest)["step"],
                          identity=checkpoint_identity(latest))
write_json(pointer.with_name(CANDIDATES), {"chosen": f"sft/{latest.name}", "candidates": []})
print(f"RL starts from {latest}")
