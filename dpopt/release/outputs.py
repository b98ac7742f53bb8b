"""What a release publishes: labelled tables, synthetic records, and the files written atomically.

A release that is not private (seeded noise, or an evaluation against the confidential data)
says so in every file it writes: a ``NOT_PRIVATE`` file beside them, a first line
``# NOT PRIVATE: ...`` in every CSV (a comment, so no column is added; read them with
:func:`read_released` or ``pd.read_csv(path, skiprows=1)``), the key ``dpopt.not_private`` in
every Parquet file's metadata, and the manifest, report and summaries.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import numpy as np
import pandas as pd

from dpopt.algorithms.base import Release, measured_answers
from dpopt.atomic import MANIFEST_NAME, atomic_directory
from dpopt.errors import DataError, SolverError
from dpopt.estimate.result import CONSTRAINT_COLUMNS
from dpopt.model.data import cells_frame, decode_codes
from dpopt.model.domain import Domain

__all__ = ["ReleaseResult", "released_counts", "released_table", "released_marginals", "synthesize",
           "write_release", "slug", "read_released", "not_private_reasons", "long_answers", "long_answer_chunks",
           "marginals_layout", "LONG_CHUNK_ROWS",
           "NOT_PRIVATE_MARKER", "NOT_PRIVATE_METADATA_KEY", "MAX_SYNTHETIC_RECORDS", "MAX_TABLE_FILES"]

#: The file a non-private release carries beside its outputs.
NOT_PRIVATE_MARKER = "NOT_PRIVATE"
#: The Parquet metadata key that marks a non-private release's files.
NOT_PRIVATE_METADATA_KEY = b"dpopt.not_private"
#: Synthetic microdata above this many records are refused before any is allocated.
MAX_SYNTHETIC_RECORDS = 50_000_000
#: ``output.marginals_layout = "auto"`` writes one file per answer table up to this many tables.
MAX_TABLE_FILES = 50


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
        return pd.DataFrame(rows, columns=CONSTRAINT_COLUMNS)


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


def synthesize(domain: Domain, counts: np.ndarray, *, limit: int | None = None) -> pd.DataFrame:
    """Integer synthetic microdata: one row per person, ``counts[c]`` rows for cell ``c``.

    The number of rows equals ``counts.sum()``; every marginal of the rows equals the
    released table's. Built with ``np.repeat`` (no loop over cells). A total above ``limit``
    (default :data:`MAX_SYNTHETIC_RECORDS`) is refused before anything is allocated.
    """
    counts = np.asarray(counts)
    if counts.dtype.kind not in "iu" or (counts < 0).any():
        raise DataError("synthetic microdata need non-negative integer counts")
    total = int(counts.sum(dtype=np.int64))
    limit = MAX_SYNTHETIC_RECORDS if limit is None else limit
    if total > limit:
        from dpopt.release.resources import format_bytes

        need = total * (8 + 16 * len(domain))
        raise DataError(f"the released table totals {total:,} records, above the limit of {limit:,} synthetic "
                        f"records (they would take about {format_bytes(need)}); set output.synthetic = false: the "
                        "table itself is still released")
    cells = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    return decode_codes(domain.unravel(cells), domain)


def not_private_reasons(release) -> list[str]:
    """Why a release must not be published (empty when it is private)."""
    reasons = []
    if release.plan.seed is not None:
        reasons.append(f"its noise was seeded (seed {release.plan.seed}): anyone with the seed can remove it")
    elif not release.get("random_is_private", True):
        reasons.append(f"its noise came from a reproducible source ({release.get('random_description')})")
    if release.get("evaluation") is not None:
        reasons.append("it holds an evaluation against the confidential data (--evaluate)")
    return reasons


def write_release(release: ReleaseResult, out: str | Path, *, overwrite: bool = False, plot_worker=None) -> Path:
    """Write a release into ``out`` atomically (all files or none), with its manifest.

    ``plot_worker`` (a started :class:`~dpopt.release.plot_worker.PlotWorker`, optional) draws
    the figures in its own process while the tables are written; the files are the same.

    Layout: ``release.{csv,parquet}`` (the table), the answer tables (``marginals/<label>.{csv,parquet}``,
    or all of them in ``marginals.{csv,parquet}`` with a ``table`` column: :func:`marginals_layout`),
    ``synthetic.{csv,parquet}``, ``transcript.{csv,parquet}`` (algorithms asked to release their
    measurement transcript), ``plots/*.png``, ``report.json``, ``summary.{md,html}``,
    ``NOT_PRIVATE`` (seeded or evaluated runs only) and ``dpopt-manifest.json`` (what dpopt
    wrote, so that ``overwrite`` replaces a previous release and nothing else). The report and
    summaries name the data file by its base name only.
    """
    from dpopt.report import publishable, render_html, render_markdown, write_json

    spec = release.spec
    formats = spec.output.formats
    reasons = not_private_reasons(release)
    mark = ("NOT PRIVATE: " + "; ".join(reasons) + "; do not publish") if reasons else None
    protected = getattr(release.plan, "protected", None)
    with atomic_directory(out, overwrite=overwrite, protected=protected,
                          manifest={"release": spec.name, "not_private": reasons or None}) as tmp, \
            _stopped_on_error(plot_worker):
        files = []
        if spec.output.plots:
            from dpopt.plots import draw_plots, plot_inputs

            figures = plot_inputs(release)
            if plot_worker is not None and figures:
                plot_worker.submit(figures, tmp / "plots")  # drawn while the tables are written

        def write_frame(frame: pd.DataFrame, stem: str) -> None:
            for fmt in formats:
                target = tmp / f"{stem}.{fmt}"
                target.parent.mkdir(parents=True, exist_ok=True)
                if fmt == "csv":
                    _write_csv(frame, target, mark)
                else:
                    _write_parquet(frame, target, mark)
                files.append(f"{stem}.{fmt}")

        if release.table is not None:
            write_frame(release.table, "release")
        if spec.output.marginals and len(release.marginals):
            if marginals_layout(release) == "long":
                # piece by piece, each piece built once for every format: the long frame of a wide
                # release can be gigabytes
                targets = [tmp / f"marginals.{fmt}" for fmt in formats]
                _write_long_pieces(long_answer_chunks(release.marginals, release.plan.domain), targets, mark)
                files.extend(t.name for t in targets)
            else:
                used: set[str] = set()
                for label, frame in release.marginals.items():
                    name, k = slug(label), 2
                    while name in used:  # labels that differ only in punctuation get distinct files
                        name, k = f"{slug(label)}_{k}", k + 1
                    used.add(name)
                    write_frame(frame, f"marginals/{name}")
        if release.synthetic is not None:
            write_frame(release.synthetic, "synthetic")
        if release.get("transcript") is not None:  # the noisy answers drawn (dpopt.algorithms.transcript)
            write_frame(release["transcript"], "transcript")
        plots = {}
        if spec.output.plots:
            if plot_worker is not None and figures:
                plots = plot_worker.result()
            else:
                plots = draw_plots(figures, tmp / "plots")
            files.extend(f"plots/{name}" for name in plots.values())
        if mark is not None:
            (tmp / NOT_PRIVATE_MARKER).write_text(
                "This release is NOT PRIVATE and must not be published:\n"
                + "".join(f"- {r}\n" for r in reasons), encoding="utf-8")
            files.append(NOT_PRIVATE_MARKER)
        report = dict(release.report)
        report["files"] = files + ["report.json"] + [f"summary.{f}" for f in spec.output.summary] + [MANIFEST_NAME]
        report["plots"] = {k: f"plots/{v}" for k, v in plots.items()}
        report["timings"] = dict(release.timings)
        report["not_private"] = reasons or None
        release.report = report
        published = publishable(report)
        write_json(published, tmp / "report.json")
        if "md" in spec.output.summary:
            (tmp / "summary.md").write_text(render_markdown(published), encoding="utf-8")
        if "html" in spec.output.summary:
            (tmp / "summary.html").write_text(render_html(published), encoding="utf-8")
    return Path(out)


@contextlib.contextmanager
def _stopped_on_error(plot_worker):
    """Kill the figures' child (if any) when the block fails, before the temporary directory it
    draws into is removed: it must not write there once the release is abandoned."""
    try:
        yield
    except BaseException:
        if plot_worker is not None:
            plot_worker.close()
        raise


def marginals_layout(release) -> str:
    """``"long"`` or ``"files"``: how a release writes its answer tables (``output.marginals_layout``).

    ``"auto"`` writes one file per table for a release with a table and at most
    :data:`MAX_TABLE_FILES` answer tables; a table-free release (records, answers only) or one
    with more tables gets one long file, so that writing never dominates the run (a file per
    table cost 45 of 62 seconds on the polynomial release of 1,120 marginals).
    """
    layout = release.spec.output.marginals_layout
    if layout != "auto":
        return layout
    return "files" if release.table is not None and len(release.marginals) <= MAX_TABLE_FILES else "long"


def long_answers(tables, domain: Domain) -> pd.DataFrame:
    """Every answer table in one long frame: a ``table`` column (the table's label), then the
    attributes of any table (domain order; empty where a table does not have one), then the
    other columns in order of appearance (``row``, ``count``, ``noisy``, ``stddev``, ...).

    Built column by column (no ``pd.concat`` of thousands of small frames): integer columns
    with gaps become pandas' nullable ``Int64``, labels stay text. :func:`long_answer_chunks`
    gives the same rows in pieces, for writing without holding them all.
    """
    (frame,) = long_answer_chunks(tables, domain, rows=None)
    return frame


#: Rows per piece when a release writes its long answers file: 364 adult triples are 20.9 M rows,
#: 3.3 GB as one frame (and as much again in Arrow); a piece of 2^21 rows holds about 300 MB.
LONG_CHUNK_ROWS = 2**21


def long_answer_chunks(tables, domain: Domain, rows: int | None = LONG_CHUNK_ROWS):
    """:func:`long_answers` in pieces of whole tables, at most ``rows`` rows each (a longer table
    alone; None: one piece).

    Every piece has the same columns with the same dtypes (decided over all tables first), so the
    pieces concatenate, or append to one CSV or Parquet file, to exactly :func:`long_answers`.
    """
    collecting = gc.isenabled()
    gc.disable()  # thousands of small column objects: the cyclic collector's passes cost half the time
    try:
        labels = list(tables)
        lengths = np.array([len(tables[label]) for label in labels], dtype=np.int64)
        # per column, over all tables: the dtype kinds, how many tables hold it, and whether it is
        # text wherever it appears (pandas' "str" dtype; judged by each table's first value), so that
        # every piece gets the same dtype
        kinds: dict[str, set] = {}
        present: dict[str, int] = {}
        text: dict[str, bool] = {}
        for label in labels:
            for column, values in tables[label].items():
                dtype = values.dtype
                kinds.setdefault(column, set()).add(dtype.kind if isinstance(dtype, np.dtype) else "O")
                present[column] = present.get(column, 0) + 1
                text[column] = text.get(column, True) and (len(values) == 0 or isinstance(values.iloc[0], str))
        attrs = [a for a in domain.attrs if a in kinds]
        columns = attrs + [c for c in kinds if c not in set(attrs)]
        layout = {c: ("int" if kinds[c] <= set("iub") else "float" if kinds[c] <= set("iubf")
                      else "text" if text[c] else "object", present[c] == len(labels)) for c in columns}
        bounds = _chunk_bounds(lengths, rows)
        for a, b in zip(bounds[:-1], bounds[1:]):
            yield _long_piece(tables, labels, range(a, b), lengths[a:b], columns, layout)
            # the next piece is built only when the writer asks for it
    finally:
        if collecting:
            gc.enable()


def _chunk_bounds(lengths: np.ndarray, rows: int | None) -> list[int]:
    """Table indices where the pieces start (and the end): whole tables, at most ``rows`` rows each."""
    if rows is None or len(lengths) == 0:
        return [0, len(lengths)]
    ends = np.cumsum(lengths)
    bounds, start_rows = [0], 0
    while bounds[-1] < len(lengths):
        nxt = int(np.searchsorted(ends, start_rows + rows, side="right"))
        nxt = max(nxt, bounds[-1] + 1)  # at least one table, however long
        bounds.append(min(nxt, len(lengths)))
        start_rows = int(ends[bounds[-1] - 1])
    return bounds


def _long_piece(tables, labels, numbers, lengths, columns, layout) -> pd.DataFrame:
    pieces: dict[str, list] = {}
    for j, i in enumerate(numbers):
        for column, values in tables[labels[i]].items():
            pieces.setdefault(column, []).append((j, _plain_array(values)))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    codes = np.repeat(np.asarray(numbers, dtype=np.int64), lengths)
    out = {"table": pd.Categorical.from_codes(codes, categories=labels)}
    for column in columns:
        kind, complete = layout[column]
        out[column] = _stacked(pieces.get(column, []), starts, kind, complete)
    return pd.DataFrame(out)


def _plain_array(column: pd.Series) -> np.ndarray:
    """A column's values as numpy: numbers and booleans as they are, anything else (labels,
    nullable or categorical columns) as objects. Converted once per piece: each conversion of
    a Series costs more than copying its few values."""
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iubf":
        return column.to_numpy()
    return np.asarray(column, dtype=object)


def _stacked(pieces: list, starts: np.ndarray, kind: str, complete: bool):
    """One column of :func:`long_answers` from ``(table number, values)`` pieces, missing elsewhere;
    ``kind`` (int, float, text or object) and ``complete`` (every table has the column) are
    decided over all the tables."""
    total = int(starts[-1])
    if kind == "int":
        values = np.zeros(total, dtype=np.int64)
        present = np.zeros(total, dtype=bool)
        for i, p in pieces:
            values[starts[i]:starts[i + 1]] = p
            present[starts[i]:starts[i + 1]] = True
        return values if complete else pd.arrays.IntegerArray(values, ~present)
    if kind == "float":
        values = np.full(total, np.nan)
        for i, p in pieces:
            values[starts[i]:starts[i + 1]] = p
        return values
    values = np.full(total, None, dtype=object)
    for i, p in pieces:
        values[starts[i]:starts[i + 1]] = p
    return pd.array(values, dtype="str") if kind == "text" else values


def _write_csv(frame: pd.DataFrame, target: Path, mark: str | None) -> None:
    with open(target, "w", encoding="utf-8", newline="") as fh:
        if mark is not None:
            fh.write(f"# {mark}\n")
        frame.to_csv(fh, index=False)


def _write_parquet(frame: pd.DataFrame, target: Path, mark: str | None) -> None:
    if mark is None:
        frame.to_parquet(target, index=False)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata[NOT_PRIVATE_METADATA_KEY] = mark.encode("utf-8")
    pq.write_table(table.replace_schema_metadata(metadata), target)


def _write_long_pieces(chunks, targets: list, mark: str | None) -> None:
    """Pieces of one frame (same columns and dtypes) appended to each target, CSV or Parquet by its
    suffix: every piece is built once and written to all of them before the next is asked for."""
    writers = [_CsvPieces(t, mark) if Path(t).suffix == ".csv" else _ParquetPieces(t, mark) for t in targets]
    try:
        for frame in chunks:
            for writer in writers:
                writer.add(frame)
        for writer in writers:
            writer.finish()
    finally:
        for writer in writers:
            writer.close()


class _CsvPieces:
    """One CSV file from pieces: the NOT-PRIVATE line and the header once."""

    def __init__(self, target: Path, mark: str | None) -> None:
        self.fh = open(target, "w", encoding="utf-8", newline="")
        if mark is not None:
            self.fh.write(f"# {mark}\n")
        self.header = True

    def add(self, frame: pd.DataFrame) -> None:
        frame.to_csv(self.fh, index=False, header=self.header)
        self.header = False

    def finish(self) -> None:
        pass

    def close(self) -> None:
        self.fh.close()


class _ParquetPieces:
    """One Parquet file from pieces, a row group each. The schema is the first piece's, except that
    a column with no value there (a label column only later tables have) waits for the first piece
    that types it; pieces are held only until then."""

    def __init__(self, target: Path, mark: str | None) -> None:
        self.target, self.mark, self.writer, self.waiting = target, mark, None, []

    def _marked(self, schema):
        metadata = dict(schema.metadata or {})
        if self.mark is not None:
            metadata[NOT_PRIVATE_METADATA_KEY] = self.mark.encode("utf-8")
        return schema.with_metadata(metadata)

    def add(self, frame: pd.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.waiting.append(pa.Table.from_pandas(frame, preserve_index=False))
        if self.writer is None:
            schema = pa.unify_schemas([t.schema for t in self.waiting], promote_options="permissive")
            if any(pa.types.is_null(f.type) for f in schema):
                return
            self.writer = pq.ParquetWriter(self.target, self._marked(schema))
        for table in self.waiting:
            self.writer.write_table(table.cast(self.writer.schema))
        self.waiting = []

    def finish(self) -> None:
        if self.writer is None:  # a column empty in every piece: written untyped, as pandas would
            import pyarrow as pa
            import pyarrow.parquet as pq

            merged = pa.concat_tables(self.waiting, promote_options="permissive")
            pq.write_table(merged.replace_schema_metadata(self._marked(merged.schema).metadata), self.target)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_released(path: str | Path, **kwargs) -> pd.DataFrame:
    """Read a released CSV or Parquet file, skipping the ``# NOT PRIVATE`` line of a non-private
    release. Labels are read as text (``keep_default_na=False``: a label "NA" stays "NA")."""
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path, **kwargs)
    with open(path, encoding="utf-8") as fh:
        skip = 1 if fh.readline().startswith("# NOT PRIVATE") else 0
    kwargs.setdefault("keep_default_na", False)
    kwargs.setdefault("na_values", [""])
    return pd.read_csv(path, skiprows=skip, **kwargs)


def slug(label: str) -> str:
    """A file-name-safe version of a label (``"county x sex"`` → ``"county_x_sex"``)."""
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in label.strip())
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_") or "query"
