"""The plot of an audit: the output distributions on the worst pair (PNG, matplotlib's Agg canvas)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["plot_worst_pair"]

#: Statistics with at most this many distinct values are drawn as bars per value.
MAX_BARS = 40


def plot_worst_pair(report, path: str | Path) -> Path:
    """The tested statistic's distribution under each dataset of the worst pair, event shaded.

    Discrete statistics are drawn as the frequency of each value, others as histograms; the
    event's values are marked, and the title gives the lower bound found.
    """
    a = np.asarray(report.statistic_a, dtype=np.float64)
    b = np.asarray(report.statistic_b, dtype=np.float64)
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    values = np.unique(np.concatenate([a, b]))
    if values.size <= MAX_BARS:
        fa = np.array([np.mean(a == v) for v in values])
        fb = np.array([np.mean(b == v) for v in values])
        width = 0.4 * (np.min(np.diff(values)) if values.size > 1 else 1.0)
        ax.bar(values - width / 2, fa, width, label="dataset a", color="tab:blue")
        ax.bar(values + width / 2, fb, width, label="dataset b", color="tab:orange")
        for v in values[report.event.contains(values)]:
            ax.axvspan(v - width, v + width, color="grey", alpha=0.15, lw=0)
        ax.set_ylabel("frequency over the test runs")
    else:
        lo, hi = np.quantile(np.concatenate([a, b]), [0.001, 0.999])
        bins = np.linspace(lo, hi, 60) if hi > lo else 30
        ax.hist(a, bins=bins, alpha=0.55, density=True, label="dataset a", color="tab:blue")
        ax.hist(b, bins=bins, alpha=0.55, density=True, label="dataset b", color="tab:orange")
        ax.set_ylabel("density over the test runs")
    if report.event.kind in ("ge", "le", "score_ge", "score_le"):
        ax.axvline(report.event.value, color="black", ls="--", lw=1, label="event threshold")
    ax.set_xlabel(_short(report.event.label.split(" >= ")[0].split(" <= ")[0]))
    ax.set_title(f"{report.target}: event {_short(report.event.label, 60)}\n"
                 f"epsilon >= {report.epsilon_lower_bound:.3f} (claimed {report.claim.epsilon:.3g})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def _short(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
