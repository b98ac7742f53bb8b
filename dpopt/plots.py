"""Plots of a release (PNG, matplotlib's Agg canvas; no display and no global backend change).

Three figures go with every release (five with ``evaluate``):

* ``released_vs_*.png``: each measured answer's released value against a reference: the
  noisy measurement (always; this is private, post-processing only), or, with
  ``evaluate``, the true answer (NOT private). Points on the diagonal are unchanged.
* ``accuracy_by_query.png``: a bar group per measured query, in counts per answer: the noise
  standard deviation of its noisy answers, the plan's expected error of the fit and the fit's
  error bar (see :mod:`dpopt.release.accuracy`). Private: no true answer enters it.
* ``change_by_query.png``: how far the release moved each query's answers from the noisy ones
  (RMS, in noise standard deviations). This is a distance between two private quantities, not
  an error.
* with ``evaluate`` only, ``error_by_query.png``: the L1 error of the released and of the raw
  noisy answers against the truth (NOT private; consistency usually lowers it).

:func:`plot_inputs` computes what they show without matplotlib, which only :func:`draw_plots`
imports (0.3 CPU-s): ``dpopt run`` draws them in a child process that imports it while the
release is computed (:mod:`dpopt.release.plot_worker`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

#: Above this many measured queries the scatter uses one colour and the bars thin labels.
MAX_LEGEND = 10

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def decade_label(value: float, _position=None) -> str:
    """A symmetric-log tick's label: ``0``, ``1``, ``10``, then ``10²``, ``−10³``, ... in plain
    text (the label is empty off the decades, where the default formatter writes none either)."""
    if value == 0:
        return "0"
    exponent = np.log10(abs(value))
    if not np.isclose(exponent, round(exponent)):
        return ""
    k = int(round(exponent))
    sign = "−" if value < 0 else ""
    return f"{sign}{10 ** k}" if k <= 1 else f"{sign}10{str(k).translate(_SUPERSCRIPT)}"


def import_matplotlib() -> None:
    """Import what drawing needs (matplotlib's Agg canvas and figure: 0.3 CPU-s). The figures'
    inputs (:func:`plot_inputs`) do not need it, so a release can compute them before (or
    without) paying for it, e.g. in :class:`dpopt.release.plot_worker.PlotWorker`'s child."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import matplotlib.ticker  # noqa: F401


def _new_figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100)
    FigureCanvasAgg(fig)
    return fig


if TYPE_CHECKING:  # pragma: no cover
    from dpopt.release import ReleaseResult


def scatter_released(
    series: Sequence[tuple[str, np.ndarray, np.ndarray]],
    path: str | Path,
    *,
    reference_name: str,
    title: str,
) -> Path:
    """Scatter of released (y) against reference (x) values, one colour per query.

    Parameters
    ----------
    series : sequence of (label, reference, released)
    path : str or Path
        The PNG to write.
    reference_name, title : str
        Axis label of the reference values and the figure title.
    """
    if len(series) > MAX_LEGEND:  # too many colours to tell apart: one series
        series = [(f"all {len(series)} measured queries",
                   np.concatenate([np.asarray(s[1], float) for s in series]),
                   np.concatenate([np.asarray(s[2], float) for s in series]))]
    from matplotlib.ticker import FuncFormatter

    fig = _new_figure((6.4, 5.2))
    ax = fig.add_subplot()
    lo, hi = np.inf, -np.inf
    for label, ref, rel in series:
        ref, rel = np.asarray(ref, float), np.asarray(rel, float)
        ax.scatter(ref, rel, s=9, alpha=0.6, label=label)
        if ref.size:
            lo, hi = min(lo, ref.min(), rel.min()), max(hi, ref.max(), rel.max())
    if np.isfinite(lo):
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle="--", label="released = reference")
    # Counts span orders of magnitude and noisy ones can be negative: a symmetric log scale
    # (linear within +-10) shows small cells and large totals together.
    ax.set_xscale("symlog", linthresh=10)
    ax.set_yscale("symlog", linthresh=10)
    # The decades as plain text (10³, −10²): the default labels are mathtext, whose parser costs
    # 0.1-0.3 CPU-s the first time a process draws one (issue #30).
    ax.xaxis.set_major_formatter(FuncFormatter(decade_label))
    ax.yaxis.set_major_formatter(FuncFormatter(decade_label))
    ax.set_xlabel(f"{reference_name} (symmetric log scale)")
    ax.set_ylabel("released value")
    ax.set_title(title)
    ax.legend(fontsize="x-small", loc="upper left")
    fig.tight_layout()
    fig.set_layout_engine(None)  # the layout is done: savefig then draws once, not twice (issue #30)
    path = Path(path)
    fig.savefig(path)
    return path


def bar_by_query(
    labels: Sequence[str],
    values: dict[str, Sequence[float]],
    path: str | Path,
    *,
    ylabel: str,
    title: str,
) -> Path:
    """Grouped bars: one group per query, one bar per named series."""
    many = len(labels) > MAX_LEGEND
    fig = _new_figure((max(6.4, 0.22 * len(labels)) if many else 6.4, 4.8))
    ax = fig.add_subplot()
    pos = np.arange(len(labels))
    width = 0.8 / max(len(values), 1)
    for i, (name, vals) in enumerate(values.items()):
        ax.bar(pos + (i - (len(values) - 1) / 2) * width, np.asarray(vals, float), width, label=name)
    ax.set_xticks(pos)
    if many:
        ax.set_xticklabels(labels, rotation=90, fontsize="xx-small")
    else:
        ax.set_xticklabels(labels, rotation=25, ha="right", fontsize="small")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(values) > 1:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.set_layout_engine(None)  # the layout is done: savefig then draws once, not twice (issue #30)
    path = Path(path)
    fig.savefig(path)
    return path


def release_plots(release: "ReleaseResult", directory: str | Path) -> dict[str, str]:
    """Draw the release's figures into ``directory``; returns ``{name: file name}``.

    The figures compare the released table with the measurements: a release without a table
    (answers or records only) has none. Same as ``draw_plots(plot_inputs(release), directory)``.
    """
    return draw_plots(plot_inputs(release), directory)


def plot_inputs(release: "ReleaseResult") -> list[tuple[str, str, str, dict]]:
    """What the release's figures show, as plain arrays and strings (no matplotlib needed).

    Returns ``[(name, kind, file name, arguments)]``, ``kind`` being ``"scatter"``
    (:func:`scatter_released`) or ``"bars"`` (:func:`bar_by_query`); empty for a release without
    a table. Picklable: :class:`~dpopt.release.plot_worker.PlotWorker` draws them in another process.
    """
    if release.counts is None:
        return []
    x = np.asarray(release.counts, dtype=np.float64)
    ms = release.measurements
    labels = [m.label for m in ms]
    out = []
    released = [m.query.matvec(x) for m in ms]
    out.append(("released_vs_noisy", "scatter", "released_vs_noisy.png", dict(
        series=[(m.label, np.asarray(m.values), r) for m, r in zip(ms, released)],
        reference_name="noisy measurement", title="Released answers against the noisy measurements")))
    if release.evaluation is not None:
        ev = release.evaluation[release.evaluation["kind"] == "measured"].set_index("query")
        truth = release.evaluation_truth
        out.append(("released_vs_true", "scatter", "released_vs_true.png", dict(
            series=[(m.label, np.asarray(truth[m.label]), r) for m, r in zip(ms, released)],
            reference_name="true answer (NOT private)", title="Released against true answers (evaluation only)")))
        out.append(("error_by_query", "bars", "error_by_query.png", dict(
            labels=labels,
            values={"released": ev.loc[labels, "l1_error"].to_numpy(),
                    "noisy": ev.loc[labels, "noisy_l1_error"].to_numpy()},
            ylabel="L1 error against the truth", title="Error by query (evaluation only, NOT private)")))
    accuracy = (getattr(release, "report", None) or {}).get("accuracy") or {}
    planned = {r["table"]: r for r in accuracy.get("expected_before_data") or []}
    bars = {r["table"]: r for r in accuracy.get("error_bars") or []}
    shown = [label for label in labels if label in planned or label in bars]
    if shown:
        series = {"noisy answers (noise s.d.)": [planned.get(t, {}).get("noise_rmse") for t in shown]}
        if any(planned.get(t, {}).get("expected_rmse") is not None for t in shown):
            series["expected error of the fit (plan)"] = [planned.get(t, {}).get("expected_rmse") for t in shown]
        if bars:
            series["error bar of the fit"] = [bars.get(t, {}).get("rmse") for t in shown]
        series = {k: [np.nan if v is None else v for v in vals] for k, vals in series.items()}
        out.append(("accuracy_by_query", "bars", "accuracy_by_query.png", dict(
            labels=shown, values=series, ylabel="RMS error per answer (counts)",
            title="Accuracy by measured query (no true answer used)")))
    rms = [float(np.sqrt(np.mean((r - m.values) ** 2)) / m.stddev) if m.stddev > 0 else 0.0
           for m, r in zip(ms, released)]
    out.append(("change_by_query", "bars", "change_by_query.png", dict(
        labels=labels, values={"RMS change": rms}, ylabel="RMS(released - noisy) / noise std. dev.",
        title="How far consistency moved each query's answers (not an error)")))
    return out


def draw_plots(inputs: list[tuple[str, str, str, dict]], directory: str | Path) -> dict[str, str]:
    """Draw :func:`plot_inputs`'s figures into ``directory``; returns ``{name: file name}``."""
    if not inputs:
        return {}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    draw = {"scatter": scatter_released, "bars": bar_by_query}
    out = {}
    for name, kind, file, arguments in inputs:
        draw[kind](path=directory / file, **arguments)
        out[name] = file
    return out
