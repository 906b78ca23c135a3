"""Static HTML report with PNG plots (matplotlib Agg): IoU histogram, timelines, step curve, baselines."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PLOTS = ("iou_hist.png", "timelines.png", "step_curve.png", "baselines.png")


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_iou_hist(predictions: Sequence[dict], thresholds: Sequence[float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.2))
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
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(sample) + 1.2))
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


def plot_step_curve(steps: Sequence[dict], metrics: Sequence[str], baselines: dict, select: str,
                    path: Path) -> None:
    """`steps`: one flat row per evaluated checkpoint (`step` and metric columns, as in steps.csv)."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    rows = sorted(steps, key=lambda r: r["step"])
    for m in metrics:
        ax.plot([r["step"] for r in rows], [r[m] for r in rows], marker="o", label=m)
    for (name, b), style in zip(baselines.items(), ("--", ":", "-.")):
        if select in b:
            ax.axhline(b[select], ls=style, lw=1.2, color="black", label=f"{name} (blind) {select}")
    ax.set(xlabel="training step", ylabel="metric", ylim=(0, 1.02), title="Evaluation vs training step")
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_baselines(model: dict, baselines: dict, metrics: Sequence[str], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.2))
    series = {"model": model, **{f"{k} (blind)": v for k, v in baselines.items()}}
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + i * width for j in range(len(metrics))]
        ax.bar(xs, [values.get(m, 0) for m in metrics], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(metrics))], metrics)
    ax.set(ylim=(0, 1.02), title="Model vs blind baselines")
    ax.legend(fontsize=7)
    _save(fig, path)


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(result: dict, predictions: Sequence[dict], metrics: Sequence[str]) -> str:
    s = result["summary"]
    model, baselines, gain = s["model"], s["baselines"], s["visual_gain"]
    main = _table(["", *metrics], [["model", *(model[m] for m in metrics)],
                                   *([f"{k} (blind)", *(v[m] for m in metrics)] for k, v in baselines.items()),
                                   ["visual gain", *(gain.get(m, float("nan")) for m in metrics)]])
    by_len = _table(["length", "n", *metrics], [[k, v["n"], *(v[m] for m in metrics)]
                                                for k, v in s["by_length"].items()])
    by_src = _table(["source", "n", *metrics], [[k, v["n"], *(v[m] for m in metrics)]
                                                for k, v in s["by_source"].items()])
    preds = _table(["key", "query", "ground truth", "answer", "IoU"],
                   [[p["key"], p["query"], p["gt"], p["raw"], p["iou"]] for p in predictions[:30]])
    imgs = "".join(f'<img src="{name}" alt="{name}">' for name in PLOTS)
    c = s["counts"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Evaluation {html.escape(result['checkpoint_name'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px}}img{{max-width:48%;margin:4px}}</style></head><body>
<h1>Temporal grounding evaluation: {html.escape(result['checkpoint_name'])} (step {result['step']}, split {html.escape(result['split'])})</h1>
<p>Checkpoint <code>{html.escape(result['checkpoint'])}</code>; data version {html.escape(str(result.get('data_version')))};
train run {html.escape(str(result.get('train_run_id')))}. Queries scored: {c['scored']} from {c['samples']} windows
(skipped: {html.escape(str(c['skipped'] or 'none'))}). Parse failures: {model.get('parse_failure_rate', 0):.1%} (scored as IoU 0).
Eval loss: {model.get('eval_loss', float('nan')):.4f}.</p>
<h2>Model vs blind baselines</h2>{main}
<p>Visual gain = model minus the best blind baseline per metric: a model that does not beat the blind baselines is
reading the text, not the video.</p>
<h2>By moment length</h2>{by_len}<h2>By source</h2>{by_src}
<h2>Plots</h2>{imgs}
<h2>Sample predictions</h2>{preds}
</body></html>
"""


def write_report(out: Path, result: dict, predictions: Sequence[dict], steps: Sequence[dict],
                 thresholds: Sequence[float], samples: int) -> Path:
    """report.html plus its PNGs into `out`; returns the HTML path."""
    from evaluation.metrics import metric_name

    out.mkdir(parents=True, exist_ok=True)
    s = result["summary"]
    metrics = ["miou"] + [metric_name(t) for t in thresholds]
    plot_iou_hist(predictions, thresholds, out / "iou_hist.png")
    plot_timelines(predictions, samples, out / "timelines.png")
    plot_step_curve(steps, metrics, s["baselines"], result["select_metric"], out / "step_curve.png")
    plot_baselines(s["model"], s["baselines"], metrics, out / "baselines.png")
    path = out / "report.html"
    path.write_text(render_html(result, predictions, metrics))
    return path
