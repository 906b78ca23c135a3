"""The annotation audit's rules as pure functions (beam_jobs/audit.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from beam_jobs.audit import (
    FLAGS,
    ambiguous_partners,
    audit_video,
    change_points,
    filter_reason,
    manifest_entry,
    query_flags,
    reason_of,
)
from beam_jobs.items import AuditRow
from beam_jobs.summary import Facts, audit_facts
from vtg.config.preprocess import AuditConfig

CFG = AuditConfig()


def test_same_text_other_moment_is_ambiguous_same_moment_is_a_duplicate():
    queries = [("a", "the red circle moves left", (1.0, 4.0)),
               ("b", "The red circle moves left.", (9.0, 12.0)),  # same words, another moment
               ("c", "the  red circle moves left", (1.2, 4.0)),  # same words, same moment: a duplicate
               ("d", "the blue circle moves left", (14.0, 16.0))]  # another object
    assert ambiguous_partners(queries, 2, 0.8, 0.5) == {"a": ["b"], "b": ["a", "c"], "c": ["b"]}


def test_near_same_text_is_ambiguous_down_to_the_jaccard_threshold():
    a, b = ("a", "the red circle moves left", (1.0, 4.0)), ("b", "the red circle moves left again", (9.0, 12.0))
    assert ambiguous_partners([a, b], 2, 0.8, 0.5) == {"a": ["b"], "b": ["a"]}  # 4 of 5 shingles shared
    assert ambiguous_partners([a, b], 2, 0.85, 0.5) == {}


def test_change_points_are_spikes_and_steps_not_steady_motion():
    fps = 8.0
    change = np.full(80, 0.2)
    change[20] = 6.0  # something appears
    change[30:50] = 2.0  # it moves from 3.75 s: steady change
    change[50] = 7.0  # it disappears
    points = change_points(change, fps, 1.0, 3.0, 1.0)
    assert points[0] == 2.5 and points[-1] == 6.25 and len(points) == 3
    assert abs(points[1] - 3.75) <= 1 / fps  # the onset of motion: a step
    assert change_points(change, fps, 8.0, 3.0, 1.0) == []  # below change_min
    still = np.zeros(40)
    still[10:] = 2.0  # motion that starts and goes on: one step, none while it goes on
    assert len(change_points(still, fps, 1.0, 2.0, 1.0)) == 1
    assert change_points(np.zeros(2), fps, 1.0, 3.0, 1.0) == []


def test_far_from_scene_change_only_where_the_video_has_one():
    cfg = AuditConfig(boundary_tolerance_s=0.5)
    assert "far_from_scene_change" in query_flags([(2.0, 5.0)], 20.0, [10.0], [], cfg)
    assert "far_from_scene_change" not in query_flags([(2.0, 9.7)], 20.0, [10.0], [], cfg)  # its end is at the cut
    assert "far_from_scene_change" not in query_flags([(2.0, 5.0)], 20.0, [], [], cfg)  # single shot: no opinion


def test_no_change_at_boundary_names_the_unsupported_boundaries_and_spares_the_ends():
    cfg = AuditConfig(boundary_tolerance_s=0.5)
    flags = query_flags([(2.0, 5.0)], 20.0, [10.0], [2.1], cfg)
    assert flags["no_change_at_boundary"] == {"nearest_s": {"5": 2.9}}
    assert "no_change_at_boundary" not in query_flags([(2.0, 5.0)], 20.0, [5.3], [2.1], cfg)
    assert "no_change_at_boundary" not in query_flags([(0.0, 20.0)], 20.0, [], [], cfg)  # both at the ends
    assert query_flags([(3.0, 4.0)], 20.0, [], [], cfg)["no_change_at_boundary"] == {
        "nearest_s": {"3": None, "4": None}}


def test_touches_video_end_and_too_long():
    cfg = AuditConfig(end_margin_s=0.1, max_fraction=0.8)
    assert "touches_video_end" in query_flags([(0.05, 4.0)], 20.0, [], [], cfg)
    assert "touches_video_end" in query_flags([(15.0, 19.95)], 20.0, [], [], cfg)
    assert "touches_video_end" not in query_flags([(0.2, 19.8)], 20.0, [], [], cfg)
    assert query_flags([(0.2, 19.8)], 20.0, [], [], cfg)["too_long"] == {"fraction": 0.98}
    assert "too_long" not in query_flags([(2.0, 17.0)], 20.0, [], [], cfg)  # 0.75 of the video
    # a query with two moments: its span is first start to last end
    assert "too_long" in query_flags([(1.0, 3.0), (15.0, 19.0)], 20.0, [], [], cfg)


def test_audit_video_lists_flagged_queries_in_flag_order():
    change = np.zeros(160)
    change[[16, 40, 72, 96]] = 5.0  # appear/disappear at 2, 5, 9, 12 s
    queries = [("a", "a red square appears", [(2.0, 5.0)]), ("b", "a red square appears", [(9.0, 12.0)]),
               ("c", "the green circle moves up", [(2.0, 5.0)]), ("d", "the title", [(0.0, 19.95)])]
    out = audit_video(queries, 20.0, [], change, 8.0, CFG, 2)
    assert out["a"] == {"ambiguous": {"with": ["b"]}} and out["b"] == {"ambiguous": {"with": ["a"]}}
    assert "c" not in out
    assert list(out["d"]) == ["touches_video_end", "too_long"]
    assert all(list(v) == [f for f in FLAGS if f in v] for v in out.values())


def test_filter_reason_is_the_first_filtered_flag():
    flags = {"ambiguous": {}, "too_long": {}}
    assert filter_reason(flags, []) is None
    assert filter_reason(flags, ["too_long", "ambiguous"]) == reason_of("too_long") == "audit_too_long"
    assert filter_reason(flags, ["touches_video_end"]) is None


def test_manifest_counts_reconcile_with_the_rows():
    rows = [AuditRow("a", "v", "train", {"ambiguous": {}}), AuditRow("b", "v", "train", {}),
            AuditRow("c", "w", "test", {"ambiguous": {}, "too_long": {}}, "audit_ambiguous"),
            AuditRow("d", "x", "test", None)]
    facts = Facts()
    for r in rows:
        for kind, value in audit_facts(r):
            facts.add(kind, value)
    m = manifest_entry(facts.audited, AuditConfig(filter=["ambiguous"]))
    assert m["queries"] == {"test": 2, "train": 2} and m["flagged"] == {"test": 1, "train": 1}
    assert m["per_flag"]["test"]["too_long"] == 1 and m["per_flag"]["train"]["ambiguous"] == 1
    assert m["unaudited"] == {"test": 1, "train": 0}
    assert [r["annotation_id"] for r in facts.audit_rows] == ["a", "c"]
    assert facts.audit_rows[1]["flags"] == ["ambiguous", "too_long"]
    assert sum(m["flagged"].values()) == len(facts.audit_rows)
    assert m["filter"] == ["ambiguous"] and m["rules"]["max_fraction"] == 0.8 and "filter" not in m["rules"]
    assert manifest_entry(Counter(), CFG) == {"queries": {}, "flagged": {}, "per_flag": {}, "unaudited": {},
                                              "rules": CFG.model_dump(exclude={"filter"}), "filter": [],
                                              "list": "audit.jsonl"}


def test_filter_takes_only_known_flags():
    with pytest.raises(ValueError):
        AuditConfig(filter=["ambiguos"])
