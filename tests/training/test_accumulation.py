"""Accumulation equals the big batch (issue 37): N accumulated micro-batches give the update of one batch N times
larger, with the real engines (`training.engine.build_engine`: DeepSpeed ZeRO-2 on CPU/gloo and FSDP2, world size 1),
the tiny Qwen2.5-VL, and micro-batches as the training stream makes them (`training.data.ShardStream`, padded or
packed), each step's losses normalised as the SFT loop does (`training.accumulation`).

The micro-batches hold different numbers of label tokens (answers differ in length), so the old normalisation (the
engine averaging the micro-batches' per-token means) gives another gradient than the big batch: the test shows that
too, so it fails if the loop falls back to it."""

import copy

import pytest
import torch

from training import accumulation
from training.data import ShardStream, StreamSpec, resolve_urls
from training.engine import EngineSettings, build_engine
from training.sft import micro_inputs
from vtg.model.packing import rope_owner
from vtg.model.processing import VisionParams

MICRO, ACCUM = 2, 3
PACK_LENGTH = 128
RTOL, ATOL = 1e-4, 1e-6
"""fp32: the big batch and the accumulated window sum the same terms in another order."""


@pytest.fixture(scope="module")
def base(tiny):
    from training.dist import init_distributed

    init_distributed("deepspeed")  # one gloo group for both engines (in-process, as tests/training/test_train_loop.py)
    model, tokenizer = tiny("qwen2_5_vl")
    return model, tokenizer


def stream_batches(shards_dir, tokenizer, model, micro: int, count: int, packing: bool) -> list[dict]:
    """The first `count` micro-batches of `micro` examples that training's stream yields (the shuffle does not depend
    on `micro` and batches are cut in stream order; packed ones under a budget that never binds, so `micro` examples
    each, in rows of `PACK_LENGTH` tokens that hold two of the fixture's ~50-token examples)."""
    spec = StreamSpec(urls=tuple(resolve_urls(str(shards_dir), "train")), seed=0, resampled=True,
                      shuffle_buffer=16, micro_batch_size=micro, packing=packing,
                      token_budget=10**6 if packing else 0, pack_length=PACK_LENGTH)
    it = iter(ShardStream(spec, tokenizer, VisionParams.from_model(model)))
    return [next(it) for _ in range(count)]


def settings(strategy: str, grad_accum: int, micro: int) -> EngineSettings:
    return EngineSettings(lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0, grad_clip=0.0, warmup_ratio=0.0,
                          min_lr_ratio=1.0, max_steps=10, micro_batch_size=micro, grad_accum=grad_accum, zero_stage=2,
                          offload_optimizer=False, offload_param=False, precision="fp32", strategy=strategy)


def full_grads(engine, strategy: str) -> dict[str, torch.Tensor]:
    """Every trainable parameter's accumulated gradient, before the optimizer step (DeepSpeed's own accessor for
    ZeRO's partitioned fp32 gradients; FSDP2's DTensor gradients gathered)."""
    if strategy == "deepspeed":
        from deepspeed.utils import safe_get_full_grad

        return {n: safe_get_full_grad(p).detach().clone().float() for n, p in engine.module.named_parameters()
                if p.requires_grad}
    return {n: p.grad.full_tensor().detach().clone() for n, p in engine.module.named_parameters()
            if p.grad is not None}


def one_step(model, strategy: str, batches: list[dict], micro: int, per_token: bool = True):
    """One optimizer step over `batches` (one accumulation window): (gradients before the step, parameters after).
    `per_token=False`: the old normalisation (each micro-batch's mean loss, the engine dividing by grad_accum)."""
    model = copy.deepcopy(model)
    engine = build_engine(model, settings(strategy, len(batches), micro), world_size=1)
    rope = rope_owner(engine.module)
    tokens = accumulation.window_tokens(batches, torch.device("cpu"))
    grads = None
    for i, batch in enumerate(batches):
        loss = engine.forward(micro_inputs(batch, rope, torch.device("cpu"), None))
        if per_token:
            engine.backward(accumulation.window_share(loss, batch, tokens), window_share=True)
        else:
            engine.backward(loss)
        if i == len(batches) - 1:
            grads = full_grads(engine, strategy)
        assert engine.step() == (i == len(batches) - 1)
    params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
              for n, p in engine.module.named_parameters()}
    return grads, params


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = torch.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in a))
    return float(num / torch.sqrt(sum((b[k] ** 2).sum() for k in b)))


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("strategy", ["deepspeed", "fsdp"])
def test_accumulated_window_equals_the_big_batch(base, shards_dir, strategy, packing):
    model, tokenizer = base
    micro = stream_batches(shards_dir, tokenizer, model, MICRO, ACCUM, packing)
    [big] = stream_batches(shards_dir, tokenizer, model, MICRO * ACCUM, 1, packing)
    assert sorted(k for b in micro for k in b["keys"]) == sorted(big["keys"])  # the same examples
    counts = [accumulation.label_tokens(b) for b in micro]
    assert len(set(counts)) > 1, counts  # unequal label tokens per micro-batch: the case that tells them apart
    if packing:  # several examples per row: the packed path proper (positions restart, no attention mask)
        assert all(len(b["pack_segments"]) > len(b["input_ids"]) for b in [*micro, big])

    g_big, p_big = one_step(model, strategy, [big], MICRO * ACCUM)
    g_acc, p_acc = one_step(model, strategy, micro, MICRO)
    assert max_rel_diff(g_acc, g_big) < RTOL
    for name, p in p_big.items():
        torch.testing.assert_close(p_acc[name], p, rtol=RTOL, atol=ATOL, msg=lambda m, n=name: f"{n}: {m}")

    # the old normalisation (mean of per-micro-batch means) is another gradient: this test would catch a return to it
    g_old, _ = one_step(model, strategy, micro, MICRO, per_token=False)
    assert max_rel_diff(g_old, g_big) > 100 * RTOL


def test_sft_loop_accumulates_per_token(shards_dir, tmp_path):
    """The SFT loop itself (`training.sft.train`, DeepSpeed, packed): micro-batches of 2 accumulated over 3 give the
    weights and the logged loss of one step on micro-batches of 6."""
    from safetensors.torch import load_file
    from support.train_fixtures import train_config

    from training.sft import train
    from vtg.checkpoints import export_dir, resolve_checkpoint

    common = ("train.max_steps=1", "train.save_every=1", "train.data.packing=true", "train.data.token_budget=100000",
              f"train.data.pack_length={PACK_LENGTH}")
    runs = {}
    for name, micro, accum in (("big", MICRO * ACCUM, 1), ("accumulated", MICRO, ACCUM)):
        summary = train(train_config(shards_dir, tmp_path / name, f"train.micro_batch_size={micro}",
                                     f"train.grad_accum={accum}", *common))
        weights = load_file(export_dir(resolve_checkpoint(tmp_path / name)) / "model.safetensors")
        runs[name] = summary, weights
    (big, w_big), (acc, w_acc) = runs["big"], runs["accumulated"]
    assert big["samples_seen"] == acc["samples_seen"] == MICRO * ACCUM
    assert acc["losses"][0] == pytest.approx(big["losses"][0], rel=1e-6)  # the loss over all label tokens
    # AdamW's first step is lr * g / (|g| + eps): where a gradient is as small as eps, fp32 rounding of g moves the
    # update by a few 1e-6 (lr 3e-3 here); the old normalisation moves such weights by up to 2 * lr
    for name, w in w_big.items():
        torch.testing.assert_close(w_acc[name], w, rtol=RTOL, atol=2e-5, msg=lambda m, n=name: f"{n}: {m}")
