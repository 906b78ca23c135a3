"""The annotate stage's parts that need no model: the captioning format, the precision against withheld truth, which
videos are withheld, auto source ids, and SFT's declared mix of auto labels (issue 24 item 2)."""

from __future__ import annotations

import random

import pytest

from annotate.captions import caption_text, parse_captions
from annotate.run import precision
from training.data import keep_by_source, source_keep
from vtg.errors import VTGError
from vtg.records import CanonicalRecord
from vtg.sources import SourceDecl, auto_source, is_auto


def test_captions_round_trip_in_start_order_and_bad_lines_are_skipped():
    text = caption_text([("a blue square appears", (9.0, 12.5)), ("the red circle moves left", (2.5, 6.0))])
    assert text == "the red circle moves left: 2.5 - 6.0 seconds\na blue square appears: 9.0 - 12.5 seconds"
    assert parse_captions(text) == [("the red circle moves left", (2.5, 6.0)), ("a blue square appears", (9.0, 12.5))]
    noisy = ("1. the red circle moves left: from 2 to 6\n"   # numbered, another span form
             "no colon here 3 - 4 seconds\n"                 # no query: skipped
             "a green triangle: soon\n"                      # no span: skipped
             "The Red  Circle moves left: 7 - 8 seconds\n"   # the same query again (case, spaces): first kept
             "a cyan square rises: 9.5 - 30 seconds\n"        # clipped to the video
             "a white circle appears: 12 - 14 seconds")      # empty after clipping: skipped
    assert parse_captions(noisy, duration_s=11.0) == [("the red circle moves left", (2.0, 6.0)),
                                                       ("a cyan square rises", (9.5, 11.0))]


def _rec(vid: str, query: str, window: tuple[float, float], source: str = "synthetic",
         aid: str = "") -> CanonicalRecord:
    return CanonicalRecord(video_id=vid, video_path=f"videos/{vid}.mp4", duration_s=20.0, query=query,
                           windows=[window], source=source, annotation_id=aid or f"{source}:{vid}:{query}")


def test_precision_scores_window_text_and_recall_against_the_withheld_truth():
    truth = [_rec("v1", "the red circle moves left", (2.0, 6.0)), _rec("v1", "a blue square appears", (10.0, 14.0)),
             _rec("v2", "the green square moves up", (0.0, 4.0))]
    auto = [_rec("v1", "the red circle moves left", (2.5, 6.0), "auto:x"),   # text and window right
            _rec("v1", "a yellow square appears", (10.0, 13.0), "auto:x"),   # window right, text wrong
            _rec("v2", "the green square moves up", (8.0, 12.0), "auto:x"),  # text right, window wrong
            _rec("v9", "anything", (0.0, 1.0), "auto:x")]                   # no truth for v9: not scored
    p = precision(auto, truth)
    assert p == {"scored": 3, "window_iou_0.5": round(2 / 3, 4), "query_exact": round(2 / 3, 4),
                 "query_and_window": round(1 / 3, 4), "withheld_records": 3, "recall_iou_0.5": round(2 / 3, 4)}
    assert precision(auto, []) is None


def test_auto_source_ids_are_never_declared_and_name_only_auto_records():
    assert auto_source("0123456789ab") == "auto:0123456789ab"
    assert is_auto("auto:0123456789ab") and is_auto("auto:a+auto:b")
    assert not is_auto("synthetic") and not is_auto("auto:a+synthetic") and not is_auto("")
    with pytest.raises(ValueError, match="`auto:` ids are the annotate stage's"):
        SourceDecl(id="auto:mine", licence="CC0-1.0", roots=["x"])
    # an auto record names its video's declared source, and serializes it; a labelled one is unchanged
    r = _rec("v1", "q", (0.0, 1.0), "auto:x").model_copy(update={"video_source": "synthetic", "confidence": 0.5})
    assert r.video_owner == "synthetic" and '"video_source":"synthetic"' in r.model_dump_json()
    plain = _rec("v1", "q", (0.0, 1.0))
    assert plain.video_owner == "synthetic" and "video_source" not in plain.model_dump_json()


def test_source_keep_makes_auto_labels_the_declared_share():
    rows = [{"source": "synthetic", "queries": 300}, {"source": "auto:x", "queries": 900}]
    assert source_keep(rows, None) == (1.0, 1.0)
    assert source_keep(rows, 0.0) == (1.0, 0.0)
    keep_h, keep_a = source_keep(rows, 0.5)  # 300 labelled kept whole, 900 auto thinned to 300
    assert keep_h == 1.0 and keep_a == pytest.approx(1 / 3)
    keep_h, keep_a = source_keep(rows, 0.9)  # 900 auto whole, 300 labelled thinned to 100
    assert keep_a == 1.0 and keep_h == pytest.approx(1 / 3)
    assert source_keep([{"source": "synthetic", "queries": 5}], 0.5) == (1.0, 1.0)  # no auto label: as it comes
    with pytest.raises(VTGError, match="only auto labels"):
        source_keep([{"source": "auto:x", "queries": 5}], 0.5)

    stream = [{"key": str(i), "auto": i % 4 != 0} for i in range(40_000)]  # 1 labelled : 3 auto
    kept = list(keep_by_source(iter(stream), source_keep([{"source": "s", "queries": 1},
                                                          {"source": "auto:x", "queries": 3}], 0.5), random.Random(0)))
    share = sum(ex["auto"] for ex in kept) / len(kept)
    assert share == pytest.approx(0.5, abs=0.01)
    assert kept == list(keep_by_source(iter(stream), (1.0, 1 / 3), random.Random(0)))  # same seed, same examples
