"""What a release publishes: labelled tables, synthetic records, and the files written atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpopt.algorithms.base import Release, measured_answers
from dpopt.atomic import atomic_directory
from dpopt.errors import DataError, SolverError
from dpopt.model.data import cells_frame, decode_codes
from dpopt.model.domain import Domain

__all__ = ["ReleaseResult", "released_counts", "released_table", "released_marginals", "synthesize",
           "write_release", "slug"]


class ReleaseResult(Release):
    """What :func:`dpopt.release.run` returns: the algorithm's :class:`~dpopt.algorithms.base.Release`
    plus the pipeline's outputs.

    Attributes (besides those of :class:`~dpopt.algorithms.base.Release`)
    -----------------------------------------------------------------------
    plan : ReleasePlan
    constraints : ConstraintSet
        Every constraint, invariants from the data included.
    table : DataFrame or None
        Labelled cells and ``count`` (None when the algorithm releases no table).
    marginals : dict of str to DataFrame
        The released answers (``answers``): measured queries with their ``noisy`` column, or the
        marginals an algorithm read off its table.
    synthetic : DataFrame or None
        One row per person when the release is integral and synthetic output is on (or the
        algorithm's released records).
    evaluation, evaluation_summary : DataFrame, dict or None
        Errors against the confidential data (``evaluate=True`` only; NOT private).
    evaluation_truth : dict of str to ndarray or None
        True answers of each measured query (``evaluate=True`` only; NOT private).
    report : dict
        The JSON report.
    out : Path or None
        Where the release was written.
    timings : dict of str to float
        Seconds per step.
    random_description, random_is_private
        The noise source (seeded sources are NOT private).
    """

    @property
    def spec(self):
        return self.plan.spec

    @property
    def constraint_residuals(self) -> pd.DataFrame:
        """Every constraint's largest violation by the released table."""
        rows = self.constraints.residuals(np.asarray(self.counts, dtype=np.float64))
        return pd.DataFrame(rows, columns=["constraint", "max_violation", "satisfied"])


def released_counts(p, x: np.ndarray) -> np.ndarray:
    """The released cell values: int64 when the release is integral, else float."""
    if p.spec.constraints.integer:
        counts = np.rint(x)
        if np.abs(counts - x).max(initial=0.0) > 1e-6:
            raise SolverError("the rounded release is not integral")  # pragma: no cover - guarded by rounding
        return counts.astype(np.int64)
    return np.asarray(x, dtype=np.float64)


def released_table(p, counts: np.ndarray) -> pd.DataFrame:
    """Labelled cells with their released ``count`` (every cell, or the non-zero ones)."""
    frame = cells_frame(p.domain, counts)
    if p.spec.output.cells == "nonzero":
        frame = frame[frame["count"] != 0].reset_index(drop=True)
    return frame


#: For each measured query: its released answers (``count``) next to the noisy ones (``noisy``).
released_marginals = measured_answers


def synthesize(domain: Domain, counts: np.ndarray) -> pd.DataFrame:
    """Integer synthetic microdata: one row per person, ``counts[c]`` rows for cell ``c``.

    The number of rows equals ``counts.sum()``; every marginal of the rows equals the
    released table's. Built with ``np.repeat`` (no loop over cells).
    """
    counts = np.asarray(counts)
    if counts.dtype.kind not in "iu" or (counts < 0).any():
        raise DataError("synthetic microdata need non-negative integer counts")
    cells = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    return decode_codes(domain.unravel(cells), domain)


def write_release(release: ReleaseResult, out: str | Path, *, overwrite: bool = False) -> Path:
    """Write a release into ``out`` atomically (all files or none).

    Layout: ``release.{csv,parquet}`` (the table), ``marginals/<label>.{csv,parquet}``,
    ``synthetic.{csv,parquet}``, ``plots/*.png``, ``report.json``, ``summary.{md,html}``.
    """
    from dpopt.report import render_html, render_markdown, write_json

    spec = release.spec
    formats = spec.output.formats
    with atomic_directory(out, overwrite=overwrite) as tmp:
        files = []

        def write_frame(frame: pd.DataFrame, stem: str) -> None:
            for fmt in formats:
                target = tmp / f"{stem}.{fmt}"
                target.parent.mkdir(parents=True, exist_ok=True)
                if fmt == "csv":
                    frame.to_csv(target, index=False)
                else:
                    frame.to_parquet(target, index=False)
                files.append(f"{stem}.{fmt}")

        if release.table is not None:
            write_frame(release.table, "release")
        if spec.output.marginals:
            used: set[str] = set()
            for label, frame in release.marginals.items():
                name, k = slug(label), 2
                while name in used:  # labels that differ only in punctuation get distinct files
                    name, k = f"{slug(label)}_{k}", k + 1
                used.add(name)
                write_frame(frame, f"marginals/{name}")
        if release.synthetic is not None:
            write_frame(release.synthetic, "synthetic")
        plots = {}
        if spec.output.plots:
            from dpopt.plots import release_plots

            plots = release_plots(release, tmp / "plots")
            files.extend(f"plots/{name}" for name in plots.values())
        report = dict(release.report)
        report["files"] = files + ["report.json"] + [f"summary.{f}" for f in spec.output.summary]
        report["plots"] = {k: f"plots/{v}" for k, v in plots.items()}
        report["timings"] = dict(release.timings)
        release.report = report
        write_json(report, tmp / "report.json")
        if "md" in spec.output.summary:
            (tmp / "summary.md").write_text(render_markdown(report), encoding="utf-8")
        if "html" in spec.output.summary:
            (tmp / "summary.html").write_text(render_html(report), encoding="utf-8")
    return Path(out)


def slug(label: str) -> str:
    """A file-name-safe version of a label (``"county x sex"`` → ``"county_x_sex"``)."""
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in label.strip())
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_") or "query"
