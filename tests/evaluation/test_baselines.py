import pytest

from evaluation.baselines import fit_prior, prior_prediction
from evaluation.scoring import aggregate, score_answers, visual_gain


def test_prior_finds_the_dominant_normalized_span():
    # Three of four moments cover the second quarter of their window (at different durations).
    moments = [(10.0, [(2.5, 5.0)]), (20.0, [(5.0, 10.0)]), (40.0, [(10.0, 20.0)]), (10.0, [(8.0, 10.0)])]
    span, fit = fit_prior(moments, select_threshold=0.7, grid=4)
    assert span == pytest.approx((0.25, 0.5))
    assert fit["train_score"] == pytest.approx(0.75) and fit["train_queries"] == 4
    assert prior_prediction(span, 16.0) == pytest.approx((4.0, 8.0))


def test_prior_scores_best_matching_window_and_uses_miou_without_threshold():
    moments = [(10.0, [(0.0, 1.0), (5.0, 10.0)])]
    span, fit = fit_prior(moments, select_threshold=None, grid=10)
    assert span == pytest.approx((0.5, 1.0)) and fit["train_miou"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        fit_prior([], 0.5)


def test_scoring_and_visual_gain():
    rows = score_answers(["1 - 3 seconds", "garbage", "from 10 to 20"], [[(1, 3)], [(0, 1)], [(10, 15)]])
    m = aggregate(rows, [0.5])
    assert m["miou"] == pytest.approx((1 + 0 + 0.5) / 3) and m["parse_failure_rate"] == pytest.approx(1 / 3)
    assert m["r1@0.5"] == pytest.approx(2 / 3)
    gain, which = visual_gain(m, {"prior": {"miou": 0.2, "r1@0.5": 0.7}, "blank": {"miou": 0.4, "r1@0.5": 0.1}},
                              ["miou", "r1@0.5"])
    assert which == {"miou": "blank", "r1@0.5": "prior"}
    assert gain["miou"] == pytest.approx(0.5 - 0.4) and gain["r1@0.5"] == pytest.approx(2 / 3 - 0.7)
