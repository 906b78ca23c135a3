"""The vision towers on a CPU: their attention over many short spans in a few calls. `fast_vision(model)` applies it;
the one model loader and the teaching call it.

Every family's vision tower (Qwen2.5-VL's windows and full blocks, Qwen3-VL's and Qwen3.5's frames) attends within
the spans of `cu_seqlens`. With flash-attn the spans go to one varlen kernel; with `sdpa` transformers calls
`scaled_dot_product_attention` once per span, so a micro-batch of 16 tiny videos makes 129 calls per block, each
with its own backward: on a CPU, dispatch, not arithmetic (docs/results.md, issue 40's profile). `varlen_sdpa`
answers the varlen call of the flash branch with one `scaled_dot_product_attention` per distinct span length (the
spans of one length stacked as a batch): the same arithmetic per span, so the same numbers (bit for bit on this
CPU, `tests/vtg/model/test_fast_vision.py`).

`use_varlen_vision(model)` switches a loaded model's vision tower to it when the tower would run `sdpa`; the
language model keeps what was chosen. It is registered under a name transformers' vision towers read as flash
(`is_flash_attention_requested` checks for "flash" in the name: the only way into their varlen branch), and the
name never reaches an export: `save_pretrained` does not write the attention choice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["VARLEN_SDPA", "fast_vision", "use_varlen_vision", "varlen_sdpa"]

VARLEN_SDPA = "vtg_varlen_sdpa_flash_compatible"
"""The registered name: "flash" in it routes the vision towers to their varlen branch (see the module docstring)."""


def varlen_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask=None,
                scaling: float | None = None, dropout: float = 0.0, cu_seq_lens_q: torch.Tensor | None = None,
                cu_seq_lens_k: torch.Tensor | None = None, is_causal: bool = False, **kwargs):
    """Attention within each span of `cu_seq_lens_q` for `query`/`key`/`value` [1, heads, tokens, head_dim];
    returns ([1, tokens, heads, head_dim], None) as transformers' attention functions do. Without spans (or with a
    mask) it is transformers' own sdpa function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None or attention_mask is not None or query.shape[0] != 1 or (
            cu_seq_lens_k is not None and not torch.equal(cu_seq_lens_k, cu_seq_lens_q)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    _, heads, tokens, dim = query.shape
    lengths = (cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).tolist()
    if key.shape[1] != heads:  # grouped keys: one per query head, as sdpa_attention_forward does
        key, value = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (key, value))

    def attend(q, k, v):  # [n, heads, L, dim] each
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=is_causal)

    if len(set(lengths)) == 1:  # every span one length (square frames): a reshape, no copy of indices
        n, span = len(lengths), lengths[0]
        q, k, v = (t[0].view(heads, n, span, dim).transpose(0, 1) for t in (query, key, value))
        return attend(q, k, v).transpose(1, 2).reshape(1, tokens, heads, dim), None
    starts = cu_seq_lens_q[:-1].tolist()
    outs, order = [], []
    for span in sorted(set(lengths)):
        first = torch.tensor([s for s, n in zip(starts, lengths) if n == span], device=query.device)
        idx = (first[:, None] + torch.arange(span, device=query.device)).reshape(-1)
        q, k, v = (t[0].index_select(1, idx).view(heads, -1, span, dim).transpose(0, 1)
                   for t in (query, key, value))
        outs.append(attend(q, k, v).transpose(1, 2).reshape(-1, heads, dim))
        order.append(idx)
    inverse = torch.empty(tokens, dtype=torch.long, device=query.device)
    cat = torch.cat(order)
    inverse[cat] = torch.arange(tokens, device=query.device)
    return torch.cat(outs).index_select(0, inverse).unsqueeze(0), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_SDPA, varlen_sdpa)


def use_varlen_vision(model) -> bool:
    """Switch `model`'s vision tower (if it has one running sdpa) to `varlen_sdpa`; True when switched. The
    language model's attention is untouched. Call after loading, before training or generating."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)
    if vision is None or getattr(vision, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    model.set_attn_implementation({"vision_config": VARLEN_SDPA})
    return vision._attn_implementation == VARLEN_SDPA


def fast_vision(model) -> None:
    """The module's speed-up on a freshly loaded model (before LoRA adapters or an engine wrap it): the same
    numbers. (The patch embedding as a matrix product instead of oneDNN's Conv3d was measured 1.2x per tiny step,
    but changes the last bits, so the default's trajectory: not adopted without a three-seed check, docs/results.md.)"""
    use_varlen_vision(model)
