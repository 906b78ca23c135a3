"""Selection on both axes: every checkpoint's grounding (the selection metric) and general-task retention (the lowest
task's, `evaluation.forgetting`) on val, the Pareto front of the two, and the plane drawn for the report.

A checkpoint is on the front when no other is at least as good on both axes and better on one: those are the
trade-offs worth choosing among; every other checkpoint loses to one of them on both. The chosen checkpoint is
the evaluate stage's (`vtg.selection.pick_best`: the best by `evaluate.select_metric` among those that keep
`evaluate.forgetting.min_for_selection`); the plane shows where that floor cuts. Checkpoints without a retention
measurement (no suite, no base) are listed but are on no front.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from vtg.selection import LOWER_IS_BETTER, checkpoint_label, checkpoint_stage, min_retention_of, order_key

PARETO_PLOT = "pareto.png"
RETENTION = "min_retention"
"""The retention axis: the lowest general task's retention (checkpoint accuracy / base accuracy)."""


def retention_interval(result: dict) -> list[float] | None:
    """The interval of the lowest task's retention: its accuracy interval over the base's accuracy (the base's own
    sampling error is not in it: the base is one fixed model asked the same items)."""
    general = (result.get("summary") or {}).get("forgetting") or {}
    tasks = [t for t in (general.get("tasks") or {}).values() if t.get("retention") is not None]
    if not tasks:
        return None
    low = min(tasks, key=lambda t: t["retention"])
    ci, base = low.get("ci"), low.get("base_accuracy")
    if not ci or not base:
        return None
    return [ci[0] / base, ci[1] / base]


def point(result: dict, metric: str) -> dict:
    s = result["summary"]
    ci = ((s.get("intervals") or {}).get("model") or {}).get(metric)
    return {"checkpoint": checkpoint_label(result), "stage": checkpoint_stage(result), "step": result["step"],
            "grounding": s["model"][metric], "grounding_ci": list(ci) if ci else None,
            "retention": min_retention_of(result), "retention_ci": retention_interval(result)}


def dominates(a: dict, b: dict, lower_is_better: bool) -> bool:
    """`a` is at least as good as `b` on both axes and better on one."""
    ga, gb = (-a["grounding"], -b["grounding"]) if lower_is_better else (a["grounding"], b["grounding"])
    return ga >= gb and a["retention"] >= b["retention"] and (ga > gb or a["retention"] > b["retention"])


def front(points: Sequence[dict], lower_is_better: bool = False) -> list[dict]:
    """The non-dominated points among those with both axes measured, best grounding first."""
    measured = [p for p in points if p["retention"] is not None and math.isfinite(p["grounding"])]
    out = [p for p in measured if not any(dominates(q, p, lower_is_better) for q in measured if q is not p)]
    return sorted(out, key=lambda p: p["grounding"], reverse=not lower_is_better)


def plane(results: Sequence[dict], metric: str, floor: float, chosen: str | None, split: str) -> dict:
    """metrics.json's `pareto`: the axes, every checkpoint's point (with intervals), the front and the chosen
    checkpoint, on `split`."""
    ordered = sorted(results, key=order_key)
    points = [point(r, metric) for r in ordered]
    best = [p["checkpoint"] for p in front(points, metric in LOWER_IS_BETTER)]
    for p in points:
        p["on_front"] = p["checkpoint"] in best
    return {"split": split, "x": metric, "y": RETENTION, "floor": floor, "chosen": chosen, "front": best,
            "points": points,
            "unmeasured": [p["checkpoint"] for p in points if p["retention"] is None]}


def plane_lines(pareto: dict) -> list[str]:
    """The front as a markdown table (summary.md) with one sentence on the choice."""
    front_points = [p for p in pareto["points"] if p["on_front"]]
    head = (f"## Grounding and retention ({pareto['split']}): the Pareto front", "",
            f"{len(front_points)} of {len(pareto['points'])} checkpoints are on the front of {pareto['x']} and "
            f"the lowest general task's retention (none beats them on both); the chosen one is "
            f"`{pareto['chosen']}`" + (f" (selection floor: retention >= {pareto['floor']:g})" if pareto["floor"]
                                       else " (no retention floor: evaluate.forgetting.min_for_selection is 0)")
            + ".", "")
    if not front_points:
        return [*head, "No checkpoint has a retention measurement: no front (evaluate.forgetting)."]
    rows = [f"| {p['checkpoint']}{' (chosen)' if p['checkpoint'] == pareto['chosen'] else ''} | "
            f"{_ci(p['grounding'], p['grounding_ci'])} | {_ci(p['retention'], p['retention_ci'])} |"
            for p in front_points]
    return [*head, f"| checkpoint | {pareto['x']} [95% CI] | retention [95% CI] |", "| --- | --- | --- |", *rows]


def _ci(value: float | None, ci: Sequence[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def plot_plane(pareto: dict, path: Path) -> bool:
    """The grounding-retention plane: every measured checkpoint with its two intervals (SFT circles, RL squares),
    the front as a line, the chosen checkpoint marked, the retention floor dashed. False when nothing is measured."""
    from vtg.util import pyplot

    plt = pyplot()
    pts = [p for p in pareto["points"] if p["retention"] is not None]
    if not pts:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for stage, marker in (("sft", "o"), ("rl", "s")):
        mine = [p for p in pts if p["stage"] == stage]
        if not mine:
            continue
        xs, ys = [p["grounding"] for p in mine], [p["retention"] for p in mine]
        xerr = [[p["grounding"] - (p["grounding_ci"] or [p["grounding"]] * 2)[0] for p in mine],
                [(p["grounding_ci"] or [p["grounding"]] * 2)[1] - p["grounding"] for p in mine]]
        yerr = [[p["retention"] - (p["retention_ci"] or [p["retention"]] * 2)[0] for p in mine],
                [(p["retention_ci"] or [p["retention"]] * 2)[1] - p["retention"] for p in mine]]
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt=marker, ms=5, alpha=0.6, capsize=2, label=stage.upper())
    fr = [p for p in pts if p["on_front"]]
    if fr:
        fr.sort(key=lambda p: p["grounding"])
        ax.plot([p["grounding"] for p in fr], [p["retention"] for p in fr], "-", color="k", lw=1,
                label="Pareto front")
    chosen = [p for p in pts if p["checkpoint"] == pareto["chosen"]]
    if chosen:
        ax.plot(chosen[0]["grounding"], chosen[0]["retention"], "*", ms=16, color="tab:red",
                label=f"chosen ({chosen[0]['checkpoint']})")
    if pareto["floor"]:
        ax.axhline(pareto["floor"], ls="--", color="gray", lw=1, label=f"floor {pareto['floor']:g}")
    top = max((p["retention_ci"] or [0, p["retention"]])[1] for p in pts)
    ax.set_ylim(-0.03, max(1.05, top + 0.03))  # retention 0 (all forgotten) to the base's 1 always in view
    ax.set_xlabel(f"{pareto['x']} ({pareto['split']})")
    ax.set_ylabel("retention of the lowest general task")
    ax.set_title("Grounding vs retention, per checkpoint")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
