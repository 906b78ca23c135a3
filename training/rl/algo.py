"""GRPO's arithmetic as pure tensor functions: reward, group advantages, clipped surrogate, k3 KL, entropy.

Shapes: N = queries x group size sequences (grouped contiguously: the G answers of query i are rows
i*G .. i*G+G-1), T completion tokens, V vocabulary. `mask` is 1 on a completion's tokens (through its first
end-of-turn token) and 0 on padding after it.

References: GRPO (Shao et al. 2024, DeepSeekMath) for group-normalised advantages and the k3 KL estimator
(Schulman 2020, "Approximating KL divergence"); the clipped ratio objective is PPO's (Schulman et al. 2017);
`scale_rewards=False` is Dr. GRPO's centring without the std (Liu et al. 2025).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vtg.answer import read_span
from vtg.spans import best_iou

Span = tuple[float, float]


def span_reward(text: str, windows: Sequence[Span], format_reward: float = 0.0) -> tuple[float, float, bool]:
    """(reward, IoU, parsed) of one sampled answer.

    The reward is the temporal IoU of the parsed span with the best-matching ground-truth window, the metric
    R@1 thresholds. An answer with no readable span, or whose span is inverted (end < start as written) or
    empty, scores 0; `format_reward` is added only for a well-formed span. (Evaluation's `parse_answer` swaps
    a reversed pair; RL reads the span as written, `vtg.answer.read_span`, so that inverting is never paid.)
    """
    span = read_span(text)
    if span is None:
        return 0.0, 0.0, False
    if span[1] <= span[0]:
        return 0.0, 0.0, True
    iou, _ = best_iou(span, list(windows))
    return iou + format_reward, iou, True


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True,
                     eps: float = 1e-6) -> tuple[torch.Tensor, int]:
    """(advantage per sequence, number of groups whose rewards are all equal).

    Each reward minus its group's mean, divided by the group's std when `scale` (population std, + eps). A group
    whose answers all score the same carries no signal: its advantages are exactly 0.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.double().view(-1, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, unbiased=False, keepdim=True)
    flat = (r.max(dim=1).values - r.min(dim=1).values) == 0
    adv = centred / (std + eps) if scale else centred
    adv[flat] = 0.0
    return adv.view(-1).to(rewards.dtype), int(flat.sum())


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) per position: logits (N, T, V), tokens (N, T) -> (N, T)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's distribution, (N, T, V) -> (N, T) (masked -inf logits contribute 0)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    return -(p * torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))).sum(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) on tokens sampled from the policy:
    exp(ref - logp) - (ref - logp) - 1, which is >= 0 everywhere and exactly 0 where the two agree."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's own tokens, then over sequences (every answer weighs the same, GRPO's form)."""
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.mean()


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(clipped surrogate loss, fraction of tokens whose ratio was clipped).

    ratio = exp(logp - old_logp) per token; loss = -min(ratio * A, clamp(ratio, 1 - eps, 1 + eps) * A), averaged
    per sequence then over sequences. With one update per rollout old_logp is logp detached: ratio 1, the
    gradient is the plain policy gradient, and nothing is clipped.
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1).to(logp.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask)
    was_clipped = ((ratio < 1 - clip_eps) | (ratio > 1 + clip_eps)).float()
    clip_frac = (was_clipped * mask).sum() / mask.sum().clamp(min=1)
    return loss, clip_frac.detach()
