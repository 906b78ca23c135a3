"""`python -m training.merge`: interpolate a fine-tuned checkpoint's weights with its base's (WiSE-FT, Wortsman et
al. 2022): theta = (1 - alpha) x base + alpha x fine-tuned, parameter by parameter.

alpha 1 is the checkpoint itself, 0 its base; in between, the model usually keeps more of what the base knew
(general tasks) for a part of the fine-tuned gain. The result is a checkpoint like any other (an HF export, the
source's config.json, a meta.json whose `merged_from` names the source checkpoint, its base and alpha), written
beside the source's root as `<root>-merged-a<alpha>/step-NNNNNN/`, so `python -m evaluation --checkpoint` scores it
with its own harness card and retention. It has no engine state:
training cannot resume from it. A LoRA checkpoint is merged into its base first (the interpolation then scales its
update); a QLoRA one into its base's 4-bit weights dequantised (what it trained against), so `--alpha 1` turns a
QLoRA export into a plain full-precision one. The base is the source's `base_path` (meta.json): a local export,
such as the taught tiny base.

    python -m training.merge --checkpoint checkpoints/sft/step-001500 --alpha 0.5
    python -m evaluation --checkpoint checkpoints/sft-merged-a0.5/step-001500 --split test
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

import torch

from vtg import checkpoints as ckpt
from vtg.cli_common import run_cli
from vtg.errors import VTGError
from vtg.model.modeling import load_model_and_tokenizer
from vtg.model.processing import save_processor_config

log = logging.getLogger("training.merge")

MERGED_KEY = "merged_from"
"""meta.json key of a merged checkpoint: {checkpoint (relative to the new one), base, alpha}."""


def merged_root(checkpoint: Path, alpha: float) -> Path:
    """Where the merge of `checkpoint` at `alpha` goes: beside its root, `<root>-merged-a<alpha>`."""
    return checkpoint.parent.parent / f"{checkpoint.parent.name}-merged-a{alpha:g}"


def interpolate(base: dict[str, torch.Tensor], tuned: dict[str, torch.Tensor], alpha: float) -> dict:
    """(1 - alpha) x base + alpha x tuned for every floating tensor (others, e.g. integer buffers, from `tuned`);
    the two must hold the same names and shapes."""
    if base.keys() != tuned.keys():
        only = sorted(base.keys() ^ tuned.keys())
        raise VTGError(f"the base and the checkpoint hold different parameters (e.g. {only[0]}): not the same "
                       "architecture, nothing to interpolate")
    out = {}
    for name, t in tuned.items():
        b = base[name]
        if b.shape != t.shape:
            raise VTGError(f"{name}: shape {tuple(b.shape)} in the base, {tuple(t.shape)} in the checkpoint")
        out[name] = torch.lerp(b.to(t.dtype), t, alpha) if t.is_floating_point() else t
    return out


def merge(checkpoint: str | Path, alpha: float, out_root: str | Path | None = None) -> Path:
    """Write the interpolated checkpoint and return its step directory."""
    if not 0.0 <= alpha <= 1.0:
        raise VTGError(f"--alpha {alpha}: must be in [0, 1] (1: the checkpoint, 0: its base)")
    src = ckpt.resolve_checkpoint(checkpoint)
    meta = ckpt.read_checkpoint_meta(src, verify=True)
    base_path = meta.get("base_path")
    if not base_path or not Path(base_path).is_dir():
        raise VTGError(f"{src}: its base ({base_path}) is not a local export; interpolation needs the base's "
                       "weights on disk")
    root = Path(out_root) if out_root else merged_root(src, alpha)
    step = int(meta["step"])
    final = root / ckpt.step_dir_name(step)
    if ckpt.is_complete(final):  # never overwritten: the same merge again is a no-op, another one is refused
        done = ckpt.read_checkpoint_meta(final).get(MERGED_KEY) or {}
        if done.get("alpha") == alpha and ckpt.parent_checkpoint(final, {"parent_checkpoint": done.get(
                "checkpoint")}) == src.resolve():
            log.info("%s is this merge already", final)
            return final
        raise VTGError(f"{final} exists and is not the merge of {src} at alpha {alpha:g}: nothing written "
                       "(choose another --out)")
    # a QLoRA export's base comes back as the 4-bit weights it trained against, dequantised (`dequantize`)
    tuned, tokenizer = load_model_and_tokenizer(ckpt.export_dir(src), device="cpu", dtype=torch.float32,
                                                dequantize=True)
    if hasattr(tuned, "merge_and_unload"):  # a LoRA export: its update folded into the base first
        tuned = tuned.merge_and_unload()
    base, _ = load_model_and_tokenizer(base_path, device="cpu", dtype=torch.float32)
    tuned.load_state_dict(interpolate(base.state_dict(), tuned.state_dict(), alpha))
    tmp = ckpt.temp_dir_for(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tuned.save_pretrained(ckpt.export_dir(tmp), safe_serialization=True)
    tokenizer.save_pretrained(ckpt.export_dir(tmp))
    save_processor_config(tuned, ckpt.export_dir(tmp))
    keep = {k: meta[k] for k in meta if k not in (ckpt.FILES_KEY, "step", "created_at", "mlflow_run_id")}
    if meta.get("parent_checkpoint"):  # an RL source's parent, relative to the new folder
        keep["parent_checkpoint"] = ckpt.parent_ref(final, ckpt.parent_checkpoint(src, meta))
    new_meta = {**keep, "mlflow_run_id": None,
                MERGED_KEY: {"checkpoint": ckpt.parent_ref(final, src),
                             "base": str(base_path), "alpha": alpha}}
    final = ckpt.finalize(root, step, new_meta, ckpt.read_config(src) or {}, keep_last=1_000_000)
    log.info("%s = %g x %s + %g x its base %s", final, alpha, src, 1 - alpha, base_path)
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.merge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True,
                        help="a checkpoint step dir, a pointer (latest, best.json) or a root (-> its latest)")
    parser.add_argument("--alpha", type=float, required=True,
                        help="weight of the checkpoint (1: itself, 0: its base); WiSE-FT's usual range 0.3-0.7")
    parser.add_argument("--out", default=None, help="checkpoint root to write into (default: beside the source's "
                        "root, <root>-merged-a<alpha>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(merge(args.checkpoint, args.alpha, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
