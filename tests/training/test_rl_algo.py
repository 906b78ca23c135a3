"""GRPO's arithmetic (training.rl.algo): reward edge cases, group advantages, KL estimator, clipped loss."""

from __future__ import annotations

import math

import pytest
import torch

from training.rl import algo


@pytest.mark.parametrize("text, windows, expected", [
    ("3.0 - 5.0 seconds", [(3.0, 5.0)], 1.0),  # exact
    ("4.0 - 6.0 seconds", [(3.0, 5.0)], 1 / 3),  # partial overlap: 1 s of 3 s
    ("the answer is 3.0 - 5.0 seconds. also 0 - 1", [(3.0, 5.0)], 1.0),  # the earliest span counts
    ("5.0 - 3.0 seconds", [(3.0, 5.0)], 0.0),  # inverted as written: 0 (evaluation would swap it)
    ("4.0 - 4.0 seconds", [(3.0, 5.0)], 0.0),  # empty span
    ("no idea", [(3.0, 5.0)], 0.0),  # unparsable
    ("", [(3.0, 5.0)], 0.0),
    ("9.0 - 10.0 seconds", [(3.0, 5.0)], 0.0),  # disjoint
    ("1.0 - 2.0 seconds", [(3.0, 5.0), (1.0, 2.0)], 1.0),  # multi-GT: the best-matching window
    ("1.5 - 4.0 seconds", [(3.0, 5.0), (1.0, 2.0)], 1 / 3.5),  # vs [3, 5]: 1 / 3.5; vs [1, 2]: 0.5 / 3
])
def test_span_reward_edge_cases(text, windows, expected):
    reward, iou, _ = algo.span_reward(text, windows)
    assert reward == pytest.approx(expected)
    assert iou == pytest.approx(expected)


def test_format_reward_only_for_a_well_formed_span():
    assert algo.span_reward("9.0 - 10.0 seconds", [(3.0, 5.0)], format_reward=0.1)[0] == pytest.approx(0.1)
    assert algo.span_reward("5.0 - 3.0 seconds", [(3.0, 5.0)], format_reward=0.1)[0] == 0.0
    assert algo.span_reward("nothing", [(3.0, 5.0)], format_reward=0.1) == (0.0, 0.0, False)
    assert algo.span_reward("5.0 - 3.0 seconds", [(3.0, 5.0)])[2] is True  # parsed (counted as a parse), paid 0


def test_equal_rewards_in_a_group_give_exactly_zero_advantage():
    rewards = torch.tensor([0.7, 0.7, 0.7, 0.7, 0.0, 1.0, 0.5, 0.5])
    adv, flat = algo.group_advantages(rewards, 4)
    assert flat == 1
    assert torch.equal(adv[:4], torch.zeros(4))
    assert adv[4:].sum().item() == pytest.approx(0.0, abs=1e-6)  # centred
    assert adv[4:].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)  # std-normalised
    adv_c, _ = algo.group_advantages(rewards, 4, scale=False)
    assert adv_c[4:].tolist() == pytest.approx([-0.5, 0.5, 0.0, 0.0])
    with pytest.raises(ValueError):
        algo.group_advantages(rewards, 3)


def test_k3_kl_is_nonnegative_and_zero_for_identical_policies():
    g = torch.Generator().manual_seed(0)
    logits_p, logits_q = torch.randn(4, 6, 11, generator=g), torch.randn(4, 6, 11, generator=g)
    tokens = torch.randint(0, 11, (4, 6), generator=g)
    lp, lq = algo.token_logprobs(logits_p, tokens), algo.token_logprobs(logits_q, tokens)
    kl = algo.k3_kl(lp, lq)
    assert (kl >= 0).all() and kl.sum() > 0
    assert torch.equal(algo.k3_kl(lp, lp), torch.zeros_like(lp))
    # an unbiased estimator: its mean over samples from p approaches KL(p || q)
    p, q = torch.softmax(logits_p[0, 0], -1), torch.softmax(logits_q[0, 0], -1)
    exact = float((p * (p.log() - q.log())).sum())
    draws = torch.multinomial(p, 200_000, replacement=True, generator=g)
    est = algo.k3_kl(p.log()[draws], q.log()[draws]).mean().item()
    assert est == pytest.approx(exact, rel=0.05)


def test_entropy_handles_masked_tokens():
    logits = torch.zeros(1, 1, 4)
    assert algo.token_entropy(logits).item() == pytest.approx(math.log(4))
    logits[..., 2:] = float("-inf")  # two tokens masked: uniform over the other two
    assert algo.token_entropy(logits).item() == pytest.approx(math.log(2))


def test_policy_loss_clips_and_reduces_per_sequence():
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.5]]))  # ratio 2 on one token: clipped at 1.2 for A > 0
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, clip_frac = algo.policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # seq 0: -(min(2, 1.2) + 1) / 2 = -1.1; seq 1: -(-1 * 1) / 1 = 1; mean = -0.05
    assert loss.item() == pytest.approx(-0.05)
    assert clip_frac.item() == pytest.approx(1 / 3)
    # on-policy (old = logp): the gradient is the plain policy gradient  -A * grad logp, nothing clipped
    lp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    loss, clip_frac = algo.policy_loss(lp, lp.detach(), torch.tensor([2.0]), torch.ones(1, 2), 0.2)
    loss.backward()
    assert clip_frac.item() == 0.0
    assert lp.grad[0].tolist() == pytest.approx([-1.0, -1.0])  # d/dlogp of -mean(ratio * A) = -A / 2


def test_step_queries_depend_only_on_seed_and_step():
    from training.rl.grpo import step_queries

    a = [step_queries(10, s, 4, 7) for s in range(10)]
    assert a == [step_queries(10, s, 4, 7) for s in range(10)]
    first_pass = [*a[0], *a[1], *a[2][:2]]  # 10 queries: one full pass over the pool
    assert sorted(first_pass) == list(range(10))
    assert a != [step_queries(10, s, 4, 8) for s in range(10)]
