"""Bootstrap intervals, paired intervals of differences, the harness card rule and the overfitting signal."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.intervals import aligned_ious, bootstrap, format_ci, format_delta, mean_and_ratio, paired
from vtg.harness import HarnessMismatch, differences, require_comparable
from vtg.selection import overfit_signal, pick_best

T = (0.3, 0.5, 0.7)


def test_interval_brackets_the_metric_and_narrows_with_more_queries():
    rng = np.random.default_rng(1)
    small, large = rng.uniform(0, 1, 100).tolist(), rng.uniform(0, 1, 1600).tolist()
    ci_small, ci_large = bootstrap(small, T), bootstrap(large, T)
    for ious, ci in ((small, ci_small), (large, ci_large)):
        assert ci["miou"][0] < np.mean(ious) < ci["miou"][1]
        assert ci["r1@0.5"][0] < np.mean(np.asarray(ious) >= 0.5) < ci["r1@0.5"][1]
    width = {n: ci["r1@0.5"][1] - ci["r1@0.5"][0] for n, ci in (("small", ci_small), ("large", ci_large))}
    assert 3 < width["small"] / width["large"] < 5  # ~ sqrt(16) = 4
    assert bootstrap([1.0] * 50, T)["r1@0.7"] == [1.0, 1.0]
    assert bootstrap([], T) == {} and bootstrap([0.5], T, resamples=0) == {}
    assert bootstrap(small, T) == ci_small, "the resampling seed is fixed: same scores, same interval"


def test_the_95_percent_interval_covers_the_true_recall_about_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    p, n, trials = 0.6, 400, 200
    covered = 0
    for _ in range(trials):
        ious = (rng.random(n) < p).astype(float).tolist()  # IoU 1 with probability p: R@1 estimates p
        lo, hi = bootstrap(ious, (0.5,), resamples=400)["r1@0.5"]
        covered += lo <= p <= hi
    assert 0.89 <= covered / trials <= 0.99


def test_paired_interval_of_a_difference_is_tighter_than_the_separate_ones_and_sees_a_small_gain():
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 1, 400)
    better = np.clip(base + 0.03 + rng.normal(0, 0.02, 400), 0, 1)  # the same queries, each a bit better
    d = paired(base.tolist(), better.tolist(), T)
    assert d["miou"]["delta"] == pytest.approx(better.mean() - base.mean())
    assert d["miou"]["excludes_zero"] and d["miou"]["ci"][0] > 0
    separate = bootstrap(base.tolist(), T)["miou"], bootstrap(better.tolist(), T)["miou"]
    assert separate[0][1] > separate[1][0], "unpaired intervals overlap: they could not tell the gain"
    same = paired(base.tolist(), base.tolist(), T)
    assert same["r1@0.5"] == {"delta": 0.0, "ci": [0.0, 0.0], "excludes_zero": False}
    with pytest.raises(ValueError, match="same queries"):
        paired([0.1, 0.2], [0.3], T)


def test_aligned_ious_pairs_by_key_and_refuses_different_queries():
    a = [{"key": "v1#0", "iou": 0.1}, {"key": "v2#0", "iou": 0.2}]
    b = [{"key": "v2#0", "iou": 0.5}, {"key": "v1#0", "iou": 0.4}]
    assert aligned_ious(a, b) == ([0.1, 0.2], [0.4, 0.5])
    with pytest.raises(ValueError, match="different queries"):
        aligned_ious(a, [{"key": "v3#0", "iou": 0.5}, {"key": "v1#0", "iou": 0.4}])
    assert format_ci(0.5, [0.4, 0.6]) == "0.500 [0.400, 0.600]"
    assert format_delta({"delta": 0.02, "ci": [-0.01, 0.05]}) == "+0.020 [-0.010, +0.050]"


CARD = {"protocol": "windowed", "frames": {"per_query": {"min": 16, "max": 16}},
        "prompt": {"text": "a", "digest": "x"}, "decoding": {"max_new_tokens": 16}}


def _result(step: int, card: dict | None, r1: float = 0.5, loss: float = 1.0, train_loss: float = 1.0) -> dict:
    summary = {"model": {"r1@0.5": r1, "miou": r1, "eval_loss": loss}}
    if card is not None:
        summary["harness"] = card
    return {"checkpoint": f"/c/step-{step:06d}", "step": step, "stage": "sft", "split": "val",
            "summary": summary, "train_loss": train_loss}


def test_card_differences_name_the_fields_and_ranking_refuses_them():
    other = {**CARD, "frames": {"per_query": {"min": 32, "max": 32}}, "prompt": {"text": "b", "digest": "x"}}
    assert differences(CARD, other) == ["frames.per_query.max: 16 vs 32", "frames.per_query.min: 16 vs 32"]
    assert differences(CARD, {**CARD, "prompt": {"text": "changed", "digest": "x"}}) == []  # the digest decides
    with pytest.raises(HarnessMismatch, match=r"sft/step-000001.*frames\.per_query\.max: 16 vs 32"):
        pick_best([_result(0, CARD), _result(1, other)], "r1@0.5")
    with pytest.raises(HarnessMismatch, match="no harness card"):
        require_comparable([("a", CARD), ("b", None)])
    require_comparable([("a", None), ("b", None)])  # results stored before cards: nothing to compare
    assert pick_best([_result(0, CARD, r1=0.6), _result(1, CARD, r1=0.4)], "r1@0.5")["step"] == 0
    assert pick_best([_result(0, CARD, loss=0.9), _result(1, CARD, loss=0.7)], "eval_loss")["step"] == 1


def test_overfit_signal_needs_k_rising_val_losses_while_the_train_loss_falls():
    val = [1.0, 0.8, 0.7, 0.75, 0.8, 0.9]
    train = [1.0, 0.8, 0.6, 0.5, 0.4, 0.3]
    runs = [_result(100 * (i + 1), CARD, loss=v, train_loss=t) for i, (v, t) in enumerate(zip(val, train))]
    signal = overfit_signal(runs, 3)
    assert signal["steps"] == [300, 400, 500, 600] and signal["step"] == 600
    assert signal["lowest_eval_loss_step"] == 300 and "rose at 3 consecutive" in signal["message"]
    assert overfit_signal(runs[:5], 3) is None  # only two rises so far
    assert overfit_signal(runs[:5], 2)["step"] == 500
    flat_train = [_result(r["step"], CARD, loss=r["summary"]["model"]["eval_loss"], train_loss=1.0) for r in runs]
    assert overfit_signal(flat_train, 3) is None  # both rising: not overfitting, diverging
    dip = [*runs[:4], _result(500, CARD, loss=0.74, train_loss=0.4), runs[5]]
    assert overfit_signal(dip, 3) is None


def test_intervals_of_a_rate_and_of_a_ratio_of_sums():
    rng = np.random.default_rng(5)
    failed = (rng.random(300) < 0.1).astype(float).tolist()
    losses, tokens = rng.uniform(1, 3, 300).tolist(), rng.integers(5, 15, 300).tolist()
    ci = mean_and_ratio({"rate": (failed, None), "loss": (losses, tokens), "none": ([], None)})
    assert set(ci) == {"rate", "loss"}
    assert ci["rate"][0] < np.mean(failed) < ci["rate"][1]
    assert ci["loss"][0] < sum(losses) / sum(tokens) < ci["loss"][1]
