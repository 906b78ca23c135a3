"""Issue 35, Qwen3-VL: the `<t seconds>` before each temporal patch is the mean presentation time of its frames from
the answer's origin, on every path (support.clock_fixtures.check_every_path), on a variable-frame-rate file and on one whose
video track starts late; its rope ids carry no time (transformers' own)."""

from __future__ import annotations

from support.clock_fixtures import check_every_path

FAMILY = "qwen3_vl"


def test_every_path_gives_the_presentation_time(tiny, clock_project):
    model, tokenizer = tiny(FAMILY)
    assert check_every_path(model, tokenizer, clock_project) == {"text"}
