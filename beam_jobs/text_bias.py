"""Blind text-bias filter ("watch before you answer") and the location-bias histogram.

The blind predictor sees only the query text and the video duration: per word, the mean and spread of the
moment (normalized by the duration, in seconds from the start, in seconds before the end) over *other* folds'
queries. Folds are a stable hash of the
source video (or duplicate cluster), so no query -- and no query about the same video -- helps score itself.
A word is trusted when it has >= `min_count` occurrences and its start/end std are <= `max_std` of the
duration; the most certain trusted word predicts the moment, and a query is flagged when that prediction's IoU with the truth is
>= `iou_threshold`. Statistics are integers (micro-units) so the result is independent of combine order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from beam_jobs.dedup import words
from vtg.splits import stable_fraction

SCALE = 1_000_000  # normalized positions are accumulated as integer micro-units (exact, order-independent)
Stats = tuple[int, int, int, int, int]  # count, sum s, sum s^2, sum e, sum e^2


def fold_of(group: str, folds: int) -> int:
    return int(stable_fraction("fold:" + group) * folds)


def normalized_span(windows: Sequence[tuple[float, float]], duration: float) -> tuple[int, int]:
    """(start, end) of the union of a query's windows over the duration, in micro-units."""
    s = min(a for a, _ in windows) / duration
    e = max(b for _, b in windows) / duration
    return round(min(max(s, 0.0), 1.0) * SCALE), round(min(max(e, 0.0), 1.0) * SCALE)


def moment_params(windows: Sequence[tuple[float, float]], duration: float) -> dict[str, tuple[int, int]]:
    """The moment in three parametrizations (micro-units): normalized by the duration, seconds from the
    start, and seconds before the end. A word may pin any of them (\"halfway\", \"first 2 s\", \"last 3 s\")."""
    s, e = min(a for a, _ in windows), max(b for _, b in windows)
    return {"norm": (round(s / duration * SCALE), round(e / duration * SCALE)),
            "start": (round(s * SCALE), round(e * SCALE)),
            "end": (round((duration - s) * SCALE), round((duration - e) * SCALE))}


def token_stats(text: str, windows: Sequence[tuple[float, float]], duration: float
                ) -> list[tuple[tuple[str, str], Stats]]:
    params = moment_params(windows, duration)
    return [((w, name), (1, a, a * a, b, b * b)) for w in sorted(set(words(text)))
            for name, (a, b) in params.items()]


def add_stats(items: Iterable[Stats]) -> Stats:
    acc = [0, 0, 0, 0, 0]
    for st in items:
        for i, v in enumerate(st):
            acc[i] += v
    return tuple(acc)  # type: ignore[return-value]


def sub_stats(a: Stats, b: Stats) -> Stats:
    return tuple(x - y for x, y in zip(a, b))  # type: ignore[return-value]


def _mean_std(n: int, s: int, s2: int) -> tuple[float, float]:
    mean = s / n
    var = max(0.0, s2 / n - mean * mean)
    return mean / SCALE, math.sqrt(var) / SCALE


def _to_seconds(param: str, a: float, b: float, duration: float) -> tuple[float, float]:
    if param == "norm":
        return a * duration, b * duration
    if param == "start":
        return a, b
    return duration - a, duration - b


def blind_predict(text: str, duration: float, fold: int, stats: dict[str, dict[tuple[str, int], Stats]],
                  min_count: int, max_std: float) -> tuple[float, float] | None:
    """(start, end) seconds predicted from the words of `text` and the duration, fitted on the other folds:
    the trusted (word, parametrization) with the smallest spread relative to the duration, or None."""
    best = None
    for w in sorted(set(words(text))):
        table = stats.get(w)
        if not table:
            continue
        for param in ("norm", "start", "end"):
            total = add_stats(st for (p, _), st in table.items() if p == param)
            n, ss, ss2, se, se2 = sub_stats(total, table.get((param, fold), (0, 0, 0, 0, 0)))
            if n < min_count:
                continue
            ms, sds = _mean_std(n, ss, ss2)
            me, sde = _mean_std(n, se, se2)
            unit = duration if param == "norm" else 1.0
            spread = max(sds, sde) * unit / duration
            if spread <= max_std and (best is None or spread < best[0]):
                best = (spread, *_to_seconds(param, ms, me, duration))
    if best is None:
        return None
    s, e = sorted((min(max(best[1], 0.0), duration), min(max(best[2], 0.0), duration)))
    return s, e


def iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def blind_iou(pred: tuple[float, float] | None, windows: Sequence[tuple[float, float]]) -> float:
    """Best IoU of the blind prediction with any ground-truth window (0 without a prediction)."""
    if pred is None:
        return 0.0
    return round(max(iou(pred, tuple(w)) for w in windows), 6)


def histogram_bins(span: tuple[int, int], bins: int) -> tuple[int, int]:
    """Histogram bin of the normalized start and end."""
    return min(bins - 1, span[0] * bins // SCALE), min(bins - 1, span[1] * bins // SCALE)


def plot_location_bias(counts: dict[str, dict[str, list[int]]], path: str) -> None:
    """Normalized start/end histograms (one line per population, e.g. all vs kept) as a PNG."""
    import io

    from apache_beam.io.filesystems import FileSystems

    from vtg.util import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for ax, which in zip(axes, ("start", "end")):
        for label, h in sorted(counts.items()):
            bins = len(h[which])
            total = max(1, sum(h[which]))
            xs = [(i + 0.5) / bins for i in range(bins)]
            ax.step(xs, [c / total for c in h[which]], where="mid", label=f"{label} (n={total})")
        ax.set_xlabel(f"normalized moment {which}")
        ax.set_xlim(0, 1)
    axes[0].set_ylabel("fraction of queries")
    axes[1].legend(fontsize=8)
    fig.suptitle("Location bias of the ground-truth moments")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    with FileSystems.create(path) as f:
        f.write(buf.getvalue())
