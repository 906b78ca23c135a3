"""Selection on both axes (evaluation.pareto): the front of grounding and retention, its table and the plane."""

from __future__ import annotations

import pytest

from evaluation.pareto import front, plane, plane_lines, plot_plane, retention_interval


def result(stage: str, step: int, r07: float, retention: float | None, loss: float = 1.0) -> dict:
    forgetting = None
    if retention is not None:
        base = 0.8
        acc = retention * base
        forgetting = {"tasks": {"color": {"n": 100, "accuracy": acc, "ci": [acc - 0.08, acc + 0.08],
                                          "base_accuracy": base, "retention": retention}},
                      "min_retention": retention}
    return {"checkpoint": f"/x/{stage}/step-{step:06d}", "stage": stage, "step": step,
            "summary": {"model": {"r1@0.7": r07, "miou": r07, "eval_loss": loss},
                        "intervals": {"model": {"r1@0.7": [r07 - 0.05, r07 + 0.05]}}, "forgetting": forgetting}}


RESULTS = [result("sft", 500, 0.40, 0.95), result("sft", 1000, 0.55, 0.60), result("sft", 1500, 0.50, 0.50),
           result("rl", 100, 0.62, 0.20), result("rl", 200, 0.58, 0.20), result("sft", 0, 0.0, 1.0),
           result("sft", 250, 0.30, None)]


def test_the_front_keeps_exactly_the_checkpoints_nobody_beats_on_both_axes():
    p = plane(RESULTS, "r1@0.7", 0.9, "sft/step-000500", "val")
    # sft 1500 loses to sft 1000 on both; rl 200 loses to rl 100 (same retention, less grounding); 250: no retention
    assert p["front"] == ["rl/step-000100", "sft/step-001000", "sft/step-000500", "sft/step-000000"]
    assert p["unmeasured"] == ["sft/step-000250"]
    on = {q["checkpoint"]: q["on_front"] for q in p["points"]}
    assert on["sft/step-001500"] is False and on["rl/step-000200"] is False and on["sft/step-000250"] is False
    # every point off the front is dominated by one on it; none on it is
    pts = {q["checkpoint"]: q for q in p["points"] if q["retention"] is not None}
    for name, q in pts.items():
        beaten = any(o["grounding"] >= q["grounding"] and o["retention"] >= q["retention"]
                     and (o["grounding"], o["retention"]) != (q["grounding"], q["retention"]) for o in pts.values())
        assert beaten != q["on_front"], name


def test_a_metric_where_lower_wins_turns_the_grounding_axis_around():
    rs = [result("sft", 1, 0.1, 0.9, loss=2.0), result("sft", 2, 0.1, 0.5, loss=1.0),
          result("sft", 3, 0.1, 0.4, loss=1.5)]
    # the lowest loss first (the best grounding), then the best retention; step 3 loses to step 2 on both
    assert [p["checkpoint"] for p in front(plane(rs, "eval_loss", 0, None, "val")["points"], True)] == \
        ["sft/step-000002", "sft/step-000001"]


def test_retention_interval_is_the_lowest_tasks_accuracy_interval_over_the_base():
    r = result("sft", 1, 0.5, 0.5)
    assert retention_interval(r) == pytest.approx([(0.4 - 0.08) / 0.8, (0.4 + 0.08) / 0.8])
    assert retention_interval(result("sft", 1, 0.5, None)) is None


def test_the_table_names_the_choice_and_the_floor_and_the_plane_is_drawn(tmp_path):
    p = plane(RESULTS, "r1@0.7", 0.9, "sft/step-000500", "val")
    text = "\n".join(plane_lines(p))
    assert "4 of 7 checkpoints are on the front" in text and "(selection floor: retention >= 0.9)" in text
    assert "| sft/step-000500 (chosen) | 0.400 [0.350, 0.450] | 0.950 [0.850, 1.050] |" in text
    assert plot_plane(p, tmp_path / "pareto.png") and (tmp_path / "pareto.png").stat().st_size > 5000
    none = plane([result("sft", 1, 0.5, None)], "r1@0.7", 0, "sft/step-000001", "val")
    assert none["front"] == [] and not plot_plane(none, tmp_path / "none.png")
    assert "No checkpoint has a retention measurement" in "\n".join(plane_lines(none))
