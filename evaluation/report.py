"""Static HTML report with PNG plots (matplotlib Agg): IoU histogram, timelines, step curve, baselines; with RL,
the reward/KL/entropy curves of the RL run and the SFT-vs-RL comparison on test by query type."""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Sequence
from pathlib import Path

from evaluation.intervals import format_ci, format_delta
from evaluation.pareto import PARETO_PLOT, plane_lines, plot_plane
from evaluation.registry import DEFAULT_STAGE
from vtg.harness import card_digest
from vtg.sources import describe
from vtg.util import pyplot

PLOTS = ("iou_hist.png", "timelines.png", "step_curve.png", "baselines.png")
RL_PLOT = "rl_curves.png"
"""Reward/KL/entropy per RL step: drawn into the evaluate stage's outputs when the RL run left its steps.csv."""


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    pyplot().close(fig)


def plot_iou_hist(predictions: Sequence[dict], thresholds: Sequence[float], path: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(6, 3.2))
    bins = [i / 20 for i in range(21)]
    ax.hist([p["iou"] for p in predictions], bins=bins, alpha=0.8, label="model")
    if predictions and "blank_iou" in predictions[0]:
        ax.hist([p["blank_iou"] for p in predictions], bins=bins, alpha=0.5, label="model, blank frames")
    for t in thresholds:
        ax.axvline(t, color="grey", ls="--", lw=0.8)
    ax.set(xlabel="IoU with best-matching ground truth", ylabel="queries", title="IoU histogram")
    ax.legend()
    _save(fig, path)


def plot_timelines(predictions: Sequence[dict], n: int, path: Path) -> None:
    step = max(1, len(predictions) // max(n, 1))  # evenly spread over the split, deterministic
    sample = list(predictions[::step][:n]) or [{"key": "(none)", "gt": [], "pred": None, "duration_s": 1, "iou": 0}]
    fig, ax = pyplot().subplots(figsize=(7, 0.45 * len(sample) + 1.2))
    for row, p in enumerate(sample):
        y, d = len(sample) - 1 - row, p["duration_s"] or 1
        ax.broken_barh([(0, 1)], (y - 0.4, 0.8), color="#eeeeee")
        ax.broken_barh([(s / d, (e - s) / d) for s, e in p["gt"]], (y - 0.05, 0.4), color="tab:green")
        if p["pred"]:
            s, e = p["pred"]
            ax.broken_barh([(s / d, max(e - s, 0.005 * d) / d)], (y - 0.4, 0.35), color="tab:blue")
        ax.text(1.01, y, f"IoU {p['iou']:.2f}", va="center", fontsize=7)
    ax.set_yticks(range(len(sample)), [p["key"][-24:] for p in reversed(sample)], fontsize=7)
    ax.set(xlim=(0, 1.12), xlabel="time / window length (green: ground truth, blue: prediction)",
           title="Ground truth vs predicted spans")
    _save(fig, path)


def _curve_x(row: dict) -> float:
    return row.get("curve_step", row["step"])


def plot_step_curve(steps: Sequence[dict], metrics: Sequence[str], baselines: dict, select: str,
                    path: Path) -> None:
    """`steps`: one flat row per evaluated checkpoint (`step` and metric columns, as in steps.csv; with RL also
    `stage` and `curve_step`). SFT and RL are drawn as separate lines (RL dashed) on the `curve_step` axis, RL
    after SFT's last step, with a line where RL starts."""
    fig, ax = pyplot().subplots(figsize=(6, 3.2))
    rows = sorted(steps, key=_curve_x)
    stages = list(dict.fromkeys(r.get("stage", DEFAULT_STAGE) for r in rows)) or [DEFAULT_STAGE]
    for i, m in enumerate(metrics):
        for stage in stages:
            part = [r for r in rows if r.get("stage", DEFAULT_STAGE) == stage]
            first = stage == stages[0]
            ax.plot([_curve_x(r) for r in part], [r[m] for r in part], marker="o" if first else "s",
                    ls="-" if first else "--", color=f"C{i}", label=m if len(stages) == 1 else f"{m} ({stage})")
    for (name, b), style in zip(baselines.items(), ("--", ":", "-.")):
        if select in b:
            ax.axhline(b[select], ls=style, lw=1.2, color="black", label=f"{name} (blind) {select}")
    xlabel = "training step"
    if len(stages) > 1:
        first_later = min(_curve_x(r) for r in rows if r.get("stage", DEFAULT_STAGE) != stages[0])
        ax.axvline(first_later, color="grey", lw=0.8, ls=":")
        xlabel = f"training step ({', '.join(stages[1:])} steps counted on from the last {stages[0]} step)"
    ax.set(xlabel=xlabel, ylabel="metric", ylim=(0, 1.02), title="Evaluation vs training step")
    ax.xaxis.label.set_fontsize(7 if len(stages) > 1 else 10)
    ax.legend(fontsize=6 if len(stages) > 1 else 7)
    _save(fig, path)


def read_rl_steps(path: str | Path) -> list[dict]:
    """The RL run's steps.csv (`<rl.report_dir>/steps.csv`, written by `python -m training.rl`) as numbers by
    step: an empty cell (a metric not measured on that step, e.g. KL between measurements) is NaN. [] when the
    file is not there or has no `step` column."""
    path = Path(path)
    if not path.is_file():
        return []

    def number(text):
        try:
            return float(text) if text not in (None, "") else math.nan
        except ValueError:
            return math.nan

    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if "step" not in (reader.fieldnames or []):
            return []
        rows = [{**{k: number(v) for k, v in raw.items() if k}, "step": int(number(raw["step"]))}
                for raw in reader if not math.isnan(number(raw.get("step")))]
    return sorted(rows, key=lambda r: r["step"])


def plot_rl_curves(rows: Sequence[dict], path: Path, kl_warn: float | None = None,
                   entropy_warn: float | None = None) -> None:
    """Reward (mean +- std, with the tIoU it is made of), KL to the start policy and entropy per RL step; the
    warning thresholds as dashed lines. A step without a value (NaN) leaves a gap."""
    fig, axes = pyplot().subplots(1, 3, figsize=(10, 3), sharex=True)
    steps = [r["step"] for r in rows]

    def series(key):
        return [r.get(key, math.nan) for r in rows]

    def finite(key):
        pts = [(s, v) for s, v in zip(steps, series(key)) if isinstance(v, float | int) and math.isfinite(v)]
        return [p[0] for p in pts], [p[1] for p in pts]

    ax = axes[0]
    xs, mean = finite("reward_mean")
    ax.plot(xs, mean, label="reward mean")
    std = dict(zip(*finite("reward_std")))
    if xs and all(x in std for x in xs):
        ax.fill_between(xs, [m - std[x] for x, m in zip(xs, mean)], [m + std[x] for x, m in zip(xs, mean)],
                        alpha=0.2, label="+- std")
    ax.plot(*finite("iou_mean"), ls="--", label="tIoU mean")
    ax.set(xlabel="RL step", title="reward (should rise)")
    for ax, key, warn, title in ((axes[1], "kl", kl_warn, "KL to start (too high: hacking)"),
                                 (axes[2], "entropy", entropy_warn, "entropy (too low: collapse)")):
        ax.plot(*finite(key), marker=".", label=key)
        if warn is not None:
            ax.axhline(warn, color="red", ls="--", lw=0.8, label=f"warn {warn:g}")
        ax.set(xlabel="RL step", title=title)
    for ax in axes:
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_baselines(model: dict, baselines: dict, metrics: Sequence[str], path: Path,
                   ci: dict | None = None) -> None:
    """Bars of the model and each blind baseline per metric, with their 95% intervals (`ci`: the summary's
    `intervals`) as error bars."""
    fig, ax = pyplot().subplots(figsize=(6, 3.2))
    series = {"model": model, **{f"{k} (blind)": v for k, v in baselines.items()}}
    ci = ci or {}
    bounds = {"model": ci.get("model") or {}, **{f"{k} (blind)": (ci.get("baselines") or {}).get(k) or {}
                                                for k in baselines}}
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + i * width for j in range(len(metrics))]
        heights = [values.get(m, 0) for m in metrics]
        err = [[max(h - bounds[name].get(m, (h, h))[0], 0) for m, h in zip(metrics, heights)],
               [max(bounds[name].get(m, (h, h))[1] - h, 0) for m, h in zip(metrics, heights)]]
        ax.bar(xs, heights, width, label=name, yerr=err if bounds[name] else None, capsize=2)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(metrics))], metrics)
    ax.set(ylim=(0, 1.02), title="Model vs blind baselines")
    ax.legend(fontsize=7)
    _save(fig, path)


def comparison_table(comparison: dict) -> tuple[list[str], list[list]]:
    """(header, rows) of the SFT-vs-RL comparison: one row per query group (all, then each query type) with n
    and, per metric, `SFT -> RL (RL - SFT [paired bootstrap interval])`. Shared by the HTML report and summary.md."""
    metrics = comparison["metrics"]
    groups = {"all": comparison["overall"], **comparison.get("by_query_type", {})}
    rows = []
    for name, g in groups.items():
        cells = []
        for m in metrics:
            rl = g["rl"].get(m, math.nan)
            if "sft" in g:
                paired = (g.get("delta_ci") or {}).get(m)
                delta = format_delta(paired) if paired else f"{g['delta'].get(m, math.nan):+.3f}"
                cells.append(f"{g['sft'].get(m, math.nan):.3f} -> {rl:.3f} ({delta})")
            else:
                cells.append(f"- -> {rl:.3f}")
        rows.append([name, g["n"], *cells])
    return ["queries", "n", *(f"{m}: SFT -> RL (delta [95% paired CI])" for m in metrics)], rows


def _comparison_html(comparison: dict | None) -> str:
    if not comparison:
        return ""
    sft, rl = comparison.get("sft") or {}, comparison["rl"]
    header, rows = comparison_table(comparison)
    counts = comparison["query_type_counts"]
    note = (f"SFT: <code>{html.escape(str(sft.get('checkpoint')))}</code> (the RL run's start checkpoint); "
            if sft else f"SFT: none ({html.escape(str(comparison.get('reason')))}); ")
    note += (f"RL: <code>{html.escape(rl['checkpoint'])}</code> (best RL checkpoint on "
             f"{html.escape(comparison['selected_on'])}{', the overall best' if rl.get('overall_best') else ''}). ")
    note += ("Query types (" + ", ".join(f"{html.escape(k)}: {v}" for k, v in counts.items())
             + f"): {html.escape(comparison['query_types']['rule'])}")
    return (f"<h2>SFT vs RL on {html.escape(comparison['split'])}</h2><p>{note}</p>{_table(header, rows)}")


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def metric_rows(summary: dict, metrics: Sequence[str]) -> list[list]:
    """Model, each blind baseline and the visual gain, per metric `value [95% CI]` (the gain's interval is the
    paired one against the best baseline of that metric). Shared by the HTML report and summary.md."""
    ci = summary.get("intervals") or {}
    model_ci, base_ci, gain_ci = ci.get("model") or {}, ci.get("baselines") or {}, ci.get("visual_gain") or {}
    rows = [["model", *(format_ci(summary["model"][m], model_ci.get(m)) for m in metrics)]]
    for name, b in summary["baselines"].items():
        rows.append([f"{name} (blind)", *(format_ci(b[m], (base_ci.get(name) or {}).get(m)) if m in b else "-"
                                          for m in metrics)])
    rows.append(["visual gain", *(format_delta(gain_ci[m]) if m in gain_ci
                                  else f"{summary['visual_gain'].get(m, math.nan):+.3f}" for m in metrics)])
    return rows


def card_lines(card: dict | None) -> list[tuple[str, str]]:
    """(field, value) rows of a harness card for the reports (the prompt text separately)."""
    if not card:
        return [("card", "none (stored before harness cards existed)")]
    frames = card["frames"]

    def spread(d):
        return f"{d.get('min')} / {d.get('median')} / {d.get('max')}" if d else "-"

    data, model, prompt = card["data"], card["model"], card["prompt"]
    return [
        ("protocol", card["protocol"]),
        ("data", (f"split {data['split']}, {data['queries']} queries, shards {data['split_digest']}, "
                 f"data version {str(data['data_version'])[:12]}")),
        ("frames per query (min / median / max)", spread(frames.get("per_query"))),
        ("sampling fps (min / median / max)", spread(frames.get("fps"))),
        ("model pixels per frame (min / median / max)", spread(frames.get("model_pixels_per_frame"))),
        ("video tokens per query (min / median / max)", spread(frames.get("video_tokens"))),
        ("pixel bounds", (f"{card['pixels']['min_pixels']}-{card['pixels']['max_pixels']} per "
                         f"{card['pixels']['scope']}")),
        ("family, processor facts", f"{model['family']}, {model['processor_digest']}; time: {model['timestamps']}"),
        ("prompt, chat template", (f"{prompt['digest']}, {prompt['chat_template_digest']} (query "
                                  f"{prompt['query_position']} the video)")),
        ("answer parser", _parser_line(card["parser"])),
        ("decoding", ", ".join(f"{k} {v}" for k, v in card["decoding"].items())),
        ("scoring", (f"R@1 at IoU {card['scoring']['iou_thresholds']}; {card['scoring']['several_windows']}; "
                    f"unparsed: {card['scoring']['unparsed']}")),
        ("intervals", (f"{card['intervals']['confidence']:.0%} {card['intervals']['method']}, "
                      f"{card['intervals']['resamples']} resamples")),
        ("card digest", card_digest(card)),
    ]


def _parser_line(parser: dict) -> str:
    """`v1: rule` for our parser; an lmms-eval reader's version names its release and file, and which code ran."""
    version = str(parser["version"])
    line = f"{'v' if version[:1].isdigit() else ''}{version}: {parser['rule']}"
    return line + (f" (read by {parser['implementation']})" if parser.get("implementation") else "")


def _card_html(card: dict | None) -> str:
    rows = _table(["harness", ""], card_lines(card))
    text = html.escape(card["prompt"]["text"]) if card else ""
    return (f"<h2>Harness card</h2><p>How these numbers were measured: a metric is comparable only with one "
            f"measured under the same card.</p>{rows}<p>Prompt as the model gets it:</p><pre>{text}</pre>")


def forgetting_table(general: dict | None) -> tuple[list[str], list[list], list[str]]:
    """(header, rows, notes) of the general-task retention: per task n, the base's accuracy, the checkpoint's
    with its interval, and retention = checkpoint / base; notes: warnings, or why nothing was measured."""
    header = ["general task", "n", "base accuracy", "checkpoint accuracy [95% CI]", "retention"]
    if not general or "tasks" not in general and "scores" not in general:
        return header, [], [f"no forgetting measurement: {(general or {}).get('skipped', 'not configured')}"]
    tasks = general.get("tasks") or general["scores"]
    rows = [[task, t["n"], "-" if t.get("base_accuracy") is None else f"{t['base_accuracy']:.3f}",
             format_ci(t["accuracy"], t.get("ci")),
             "-" if t.get("retention") is None else f"{t['retention']:.2f}"] for task, t in tasks.items()]
    if len(tasks) > 1 and general.get("min_retention") is not None:
        mean = general.get("mean_retention")  # absent from results stored before it was added
        rows.append(["overall (lowest / mean of the tasks)", sum(t["n"] for t in tasks.values()), "", "",
                     f"{general['min_retention']:.2f} / {'-' if mean is None else f'{mean:.2f}'}"])
    notes = list(general.get("warnings") or [])
    if general.get("base_note"):
        notes.append(general["base_note"])
    return header, rows, notes


def _forgetting_html(general: dict | None) -> str:
    header, rows, notes = forgetting_table(general)
    text = "".join(f"<p>{html.escape(n)}</p>" for n in notes)
    return (f"<h2>General-task retention (forgetting)</h2><p>The base model and this checkpoint answer the same "
            f"general questions; retention = checkpoint accuracy / base accuracy.</p>"
            f"{_table(header, rows) if rows else ''}{text}")


def audit_line(audit: dict | None) -> str:
    """One sentence on the preprocess annotation audit of the evaluated split (beam_jobs/audit.py)."""
    if not audit:
        return "Annotation audit: not run for these shards (written before the audit existed)."
    flags = ", ".join(f"{k} {v}" for k, v in audit["per_flag"].items() if v) or "none"
    filtered = f"; filtered before scoring: {', '.join(audit['filter'])}" if audit["filter"] else ""
    return (f"Annotation audit of {audit['split']}: {audit['flagged']} of {audit['queries']} queries flagged "
            f"({flags}){filtered}; the list: {audit['list']}.")


def _overfit_html(overfit: dict | None) -> str:
    return f'<p style="color:#b00"><b>Warning:</b> {html.escape(overfit["message"])}</p>' if overfit else ""


def _pareto_html(pareto: dict | None) -> str:
    if not pareto:
        return ""
    lines = plane_lines(pareto)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    table = _table(rows[0], rows[1:]) if len(rows) > 1 else ""
    return (f"<h2>Grounding and retention ({html.escape(pareto['split'])})</h2><p>{html.escape(lines[2])}</p>"
            f"{table}" + ("" if pareto.get("drawn") is False else
                          f'<img src="{PARETO_PLOT}" alt="grounding-retention plane" style="max-width:60%">'))


def render_html(result: dict, predictions: Sequence[dict], metrics: Sequence[str], comparison: dict | None = None,
                plots: Sequence[str] = PLOTS, overfit: dict | None = None, pareto: dict | None = None) -> str:
    s = result["summary"]
    model = s["model"]
    main = _table(["", *(f"{m} [95% CI]" for m in metrics)], metric_rows(s, metrics))
    by_len = _table(["length", "n", *metrics], [[k, v["n"], *(v[m] for m in metrics)]
                                                for k, v in s["by_length"].items()])
    by_src = _table(["source", "n", *metrics], [[k, v["n"], *(v[m] for m in metrics)]
                                                for k, v in s["by_source"].items()])
    preds = _table(["key", "query", "ground truth", "answer", "IoU"],
                   [[p["key"], p["query"], p["gt"], p["raw"], p["iou"]] for p in predictions[:30]])
    imgs = "".join(f'<img src="{name}" alt="{name}">' for name in plots)
    c = s["counts"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Evaluation {html.escape(result['checkpoint_name'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px}}img{{max-width:48%;margin:4px}}</style></head><body>
<h1>Temporal grounding evaluation: {html.escape(result['checkpoint_name'])} (step {result['step']}, split {html.escape(result['split'])})</h1>
<p>Checkpoint <code>{html.escape(result['checkpoint'])}</code>; data version {html.escape(str(result.get('data_version')))};
trained on {html.escape(describe(result.get('data_sources') or []))};
train run {html.escape(str(result.get('train_run_id')))}. Queries scored: {c['scored']} from {c['samples']} windows
(skipped: {html.escape(str(c['skipped'] or 'none'))}). Parse failures: {model.get('parse_failure_rate', 0):.1%} (scored as IoU 0).
Eval loss: {format_ci(model.get('eval_loss', float('nan')), (s.get('intervals') or {}).get('model', {}).get('eval_loss'), 4)}.</p>
{_overfit_html(overfit)}
<h2>Model vs blind baselines</h2>{main}
<p>Visual gain = model minus the best blind baseline per metric (with the paired bootstrap interval of the
difference): a model that does not beat the blind baselines is reading the text, not the video.</p>
{_comparison_html(comparison)}
{_forgetting_html(s.get("forgetting"))}
{_pareto_html(pareto)}
<h2>Annotation audit</h2><p>{html.escape(audit_line(s.get("annotation_audit")))}</p>
{_card_html(s.get("harness"))}
<h2>By moment length</h2>{by_len}<h2>By source</h2>{by_src}
<h2>Plots</h2>{imgs}
<h2>Sample predictions</h2>{preds}
</body></html>
"""


def write_report(out: Path, result: dict, predictions: Sequence[dict], steps: Sequence[dict],
                 thresholds: Sequence[float], samples: int, comparison: dict | None = None,
                 rl_steps: Sequence[dict] = (), rl_warn: tuple[float | None, float | None] = (None, None),
                 overfit: dict | None = None, pareto: dict | None = None) -> Path:
    """report.html plus its PNGs into `out`; returns the HTML path. With `comparison` (SFT vs RL on test) its
    table; with `rl_steps` (`read_rl_steps`) the RL curves (`RL_PLOT`, thresholds `rl_warn` = (KL, entropy)); with
    `pareto` (`evaluation.pareto.plane`) the grounding-retention plane and its front."""
    from evaluation.metrics import metric_name

    out.mkdir(parents=True, exist_ok=True)
    s = result["summary"]
    metrics = ["miou"] + [metric_name(t) for t in thresholds]
    plot_iou_hist(predictions, thresholds, out / "iou_hist.png")
    plot_timelines(predictions, samples, out / "timelines.png")
    plot_step_curve(steps, metrics, s["baselines"], result["select_metric"], out / "step_curve.png")
    plot_baselines(s["model"], s["baselines"], metrics, out / "baselines.png", s.get("intervals"))
    plots = list(PLOTS)
    if rl_steps:
        plot_rl_curves(rl_steps, out / RL_PLOT, *rl_warn)
        plots.append(RL_PLOT)
    (out / PARETO_PLOT).unlink(missing_ok=True)  # a previous run's plane
    if pareto and not plot_plane(pareto, out / PARETO_PLOT):
        pareto = {**pareto, "drawn": False}
    path = out / "report.html"
    path.write_text(render_html(result, predictions, metrics, comparison, plots, overfit, pareto))
    return path
