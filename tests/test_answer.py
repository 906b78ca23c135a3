import math

import pytest

from vtg.answer import format_answer, parse_answer


@pytest.mark.parametrize("text, span", [
    ("12.0 - 15.5 seconds", (12.0, 15.5)),  # canonical
    ("The moment is from 3 to 7.5 s.", (3.0, 7.5)),
    ("from 3 s to 5 s", (3.0, 5.0)),
    ("From 0:12 to 0:15", (12.0, 15.0)),  # mm:ss
    ("between 1:05 and 1:10", (65.0, 70.0)),
    ("12s-15s", (12.0, 15.0)),
    ("12 to 15 seconds", (12.0, 15.0)),
    ("3 sec until 5 sec", (3.0, 5.0)),
    ("12 — 14", (12.0, 14.0)),
    ("10 -- 12", (10.0, 12.0)),
    ("00:01:05.50 - 00:01:10.25", (65.5, 70.25)),  # hh:mm:ss.ff
    ("1:02:03 to 1:02:04.5", (3723.0, 3724.5)),
    ("15.5 - 12.0 seconds", (12.0, 15.5)),  # reversed pair is swapped
    ("[3.5, 9]", (3.5, 9.0)),
    ("start: 2.0, end: 4.5", (2.0, 4.5)),
    ("4.0 - 4.0 seconds", (4.0, 4.0)),  # zero length is kept (scores IoU 0)
    ("12.0 - 15.5 seconds12.0 - 1", (12.0, 15.5)),  # run-on generation: the first span wins
    ("between 1 and 2, or 5 - 6", (1.0, 2.0)),
])
def test_parse_variants(text, span):
    assert parse_answer(text) == pytest.approx(span)


@pytest.mark.parametrize("text", ["", "no idea", "12.0 seconds", "1:75 - 1:80", "1.2.3 - 4", "seconds - seconds",
                                  "8.8.8.8.8 seconds", None])
def test_parse_failures(text):
    assert parse_answer(text) is None


@pytest.mark.parametrize("start, end", [(0.0, 1.0), (12.04, 15.46), (0.5, 29.9), (100.0, 101.2)])
def test_round_trip_of_the_training_format(start, end):
    s, e = parse_answer(format_answer(start, end))
    assert math.isclose(s, round(start, 1)) and math.isclose(e, round(end, 1))
    assert format_answer(12, 15.5) == "12.0 - 15.5 seconds"
