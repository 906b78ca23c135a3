import math

import pytest

from evaluation.metrics import (
    best_iou,
    breakdown_by_key,
    breakdown_by_length,
    length_bucket,
    summarize,
    temporal_iou,
)


@pytest.mark.parametrize("a, b, iou", [
    ((0, 10), (0, 10), 1.0),  # identical
    ((0, 10), (5, 15), 5 / 15),  # partial overlap
    ((0, 10), (2, 4), 2 / 10),  # containment
    ((2, 4), (0, 10), 2 / 10),  # symmetric
    ((0, 5), (5, 10), 0.0),  # touching
    ((0, 2), (7, 9), 0.0),  # disjoint
    ((3, 3), (0, 10), 0.0),  # zero-length prediction inside the moment
    ((3, 3), (3, 3), 1.0),  # identical zero-length spans
    ((3, 3), (4, 4), 0.0),
    ((1.5, 4.5), (3.0, 6.0), 1.5 / 4.5),
])
def test_temporal_iou(a, b, iou):
    assert temporal_iou(a, b) == pytest.approx(iou)


def test_best_matching_window_and_parse_failure():
    gts = [(0, 2), (10, 14)]
    assert best_iou((11, 14), gts) == (pytest.approx(3 / 4), 1)
    assert best_iou((0, 1), gts) == (pytest.approx(1 / 2), 0)
    assert best_iou(None, gts) == (0.0, -1)


def test_summarize_recall_uses_greater_or_equal():
    m = summarize([0.3, 0.5, 0.69, 0.7, 0.0], [0.3, 0.5, 0.7])
    assert m["miou"] == pytest.approx(2.19 / 5)
    assert (m["r1@0.3"], m["r1@0.5"], m["r1@0.7"], m["n"]) == (0.8, 0.6, 0.2, 5)
    empty = summarize([], [0.5])
    assert empty["n"] == 0 and math.isnan(empty["miou"])


def test_length_buckets_and_breakdown():
    edges = [10, 30]
    assert [length_bucket(x, edges, ("s", "m", "l")) for x in (0.5, 10, 29.9, 30, 100)] == ["s", "m", "m", "l", "l"]
    preds = [(0, 5), (0, 20), None]
    gts = [[(0, 5)], [(0, 10), (40, 80)], [(0, 3)]]
    out = breakdown_by_length(preds, gts, [0.5], edges)
    # short: query 0 (IoU 1) and query 2 (failure); middle: query 1 vs (0,10) only: 10/20; long: query 1 vs (40,80)
    assert out["short"]["n"] == 2 and out["short"]["miou"] == pytest.approx(0.5)
    assert out["middle"]["n"] == 1 and out["middle"]["miou"] == pytest.approx(0.5) and out["middle"]["r1@0.5"] == 1
    assert out["long"]["miou"] == 0.0


def test_breakdown_by_source():
    out = breakdown_by_key([1.0, 0.0, 0.6], ["a", "b", "a"], [0.5])
    assert out["a"]["miou"] == pytest.approx(0.8) and out["a"]["r1@0.5"] == 1.0 and out["b"]["n"] == 1
