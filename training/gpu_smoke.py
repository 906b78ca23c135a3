"""`python -m training.gpu_smoke`: one real bf16 training step of a small Qwen2.5-VL on the GPU.

Uses flash_attention_2 when flash-attn is installed and the dtype is bf16 (else sdpa; one log line says why),
16 frames of 224x224 through our own patchify and chat template, torch AdamW. Prints the attention in use, step time
(after one warm-up step) and peak GPU memory. Without a CUDA GPU it says so and exits 0 (CI never needs one).
`--device cpu --dtype fp32` runs the same step on the CPU (used by the test suite).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np
import torch

SMALL_TEXT = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8,
                  "num_key_value_heads": 4,
                  "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 8, 8]}}
SMALL_VISION = {"depth": 4, "hidden_size": 256, "intermediate_size": 688, "num_heads": 4, "fullatt_block_indexes": [3],
                    "out_hidden_size": 512}


def small_model(attn: str, dtype: torch.dtype, device: str):
    from transformers import AutoTokenizer

    from vtg.model.families import model_cls_of
    from vtg.model.tiny import build_tiny_model, tiny_config

    tok = AutoTokenizer.from_pretrained(build_tiny_model(seed=0))
    config = tiny_config(tok, text=SMALL_TEXT, vision=SMALL_VISION)
    torch.manual_seed(0)
    model = model_cls_of(config)._from_config(config, attn_implementation=attn, dtype=dtype)
    return model.to(device).train(), tok


def smoke(device: str, dtype_name: str, frames: int, size: int, batch: int) -> dict:
    from vtg.model.modeling import choose_attn_implementation, torch_dtype
    from vtg.model.processing import collate, encode_example, model_inputs

    dtype = torch_dtype(dtype_name)
    attn = choose_attn_implementation("auto", device, dtype)
    model, tok = small_model(attn, dtype, device)
    rng = np.random.default_rng(0)
    examples = [encode_example(tok, rng.integers(0, 256, (frames, size, size, 3), dtype=np.uint8),
                               [i * 0.5 for i in range(frames)], "the red circle moves left", "2.0 - 5.5 seconds")
                for _ in range(batch)]
    inputs = model_inputs(collate(examples, tok.pad_token_id), device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(2):  # the first step warms up kernels and the allocator
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    return {"attn": attn, "dtype": dtype_name, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "tokens": int(inputs["attention_mask"].sum()), "loss": loss.item(), "step_s": times[-1],
            "peak_mem_gb": peak}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.gpu_smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=224, help="frame side in pixels (multiple of 28)")
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU here: GPU smoke test skipped (nothing to check on this machine)")
        return 0
    r = smoke(args.device, args.dtype, args.frames, args.size, args.batch)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"gpu smoke on {name}: {r['params_m']:.1f}M params, {r['dtype']}, attention {r['attn']}, "
          f"{args.batch} x {r['tokens'] // args.batch} tokens, loss {r['loss']:.3f}, "
          f"step {r['step_s'] * 1000:.1f} ms, peak memory {r['peak_mem_gb']:.2f} GiB")
    return 0 if np.isfinite(r["loss"]) else 1


if __name__ == "__main__":
    sys.exit(main())
