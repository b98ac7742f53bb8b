"""Records over a domain, and the counts (histogram, marginals) made from them.

A :class:`Dataset` holds records as integer codes, one column per attribute, with an
optional integer weight per row (a count table is a dataset whose rows are cells).
Counts are made with ``np.bincount`` over the projected cell numbers, the vectorised
equivalent of a pandas group-by; a marginal never materialises the full domain.
Nothing is silently dropped: values outside the domain, NaNs, missing columns and bad
weights are errors that name the column, the value and how many rows hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from dpopt.errors import DataError, DomainError
from dpopt.model.domain import MAX_DENSE_CELLS, Domain


@dataclass(frozen=True, eq=False)
class Dataset:
    """Encoded records over a domain.

    Parameters
    ----------
    codes : ndarray of int64, shape (rows, len(domain))
        Attribute codes in domain order, each in ``0..size-1``.
    domain : Domain
    weights : ndarray of int64, shape (rows,), optional
        Non-negative integer multiplicity of each row (default one record per row).

    Use :meth:`from_frame`, :meth:`from_csv`, :meth:`from_parquet` or :meth:`from_counts`
    rather than the constructor.
    """

    codes: np.ndarray
    domain: Domain
    weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        codes = np.asarray(self.codes, dtype=np.int64)
        if codes.ndim != 2 or codes.shape[1] != len(self.domain):
            raise DataError(
                f"codes must have shape (rows, {len(self.domain)}), got {codes.shape}"
            )
        sizes = np.asarray(self.domain.sizes, dtype=np.int64)
        bad = (codes < 0) | (codes >= sizes)
        if bad.any():
            col = int(np.argmax(bad.any(axis=0)))
            raise DataError(
                f"column {self.domain.attrs[col]!r}: {int(bad[:, col].sum())} rows hold codes "
                f"outside 0..{sizes[col] - 1}"
            )
        object.__setattr__(self, "codes", codes)
        if self.weights is not None:
            object.__setattr__(self, "weights", _check_weights(self.weights, len(codes)))

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def from_frame(
        cls,
        frame: pd.DataFrame,
        domain: Domain | None = None,
        *,
        weight_column: str | None = None,
    ) -> "Dataset":
        """Encode a DataFrame of labels (or codes) against a domain.

        When ``domain`` is None it is built from the frame's Categorical columns (their
        declared categories, unused ones included); any other column is an error, since
        inferring a domain from the data's own values would leak which values occur.
        """
        if not isinstance(frame, pd.DataFrame):
            raise DataError(f"expected a pandas DataFrame, got {type(frame).__name__}")
        if domain is None:
            domain = domain_from_categories(frame, exclude=(weight_column,))
        missing = [a for a in domain.attrs if a not in frame.columns]
        if missing:
            raise DataError(
                f"columns {missing} of the domain are missing from the data "
                f"(data columns: {list(frame.columns)})"
            )
        codes = np.empty((len(frame), len(domain)), dtype=np.int64)
        for j, attr in enumerate(domain.attrs):
            codes[:, j] = encode_column(frame[attr], domain, attr)
        weights = None
        if weight_column is not None:
            if weight_column not in frame.columns:
                raise DataError(f"weight column {weight_column!r} is missing from the data")
            weights = frame[weight_column].to_numpy()
        return cls(codes, domain, weights)

    @classmethod
    def from_csv(cls, path: str | Path, domain: Domain, **kwargs) -> "Dataset":
        """Read a CSV of labels or codes; every domain attribute must be a column."""
        path = _existing(path)
        frame = pd.read_csv(path, dtype=str, keep_default_na=True, usecols=_usecols(domain, kwargs))
        return cls.from_frame(_parse_strings(frame, domain), domain, **kwargs)

    @classmethod
    def from_parquet(cls, path: str | Path, domain: Domain, **kwargs) -> "Dataset":
        path = _existing(path)
        frame = pd.read_parquet(path)
        return cls.from_frame(frame, domain, **kwargs)

    @classmethod
    def from_file(cls, path: str | Path, domain: Domain, **kwargs) -> "Dataset":
        """CSV or Parquet, by file extension."""
        suffix = Path(path).suffix.lower()
        if suffix in (".parquet", ".pq"):
            return cls.from_parquet(path, domain, **kwargs)
        if suffix in (".csv", ".txt", ".gz"):
            return cls.from_csv(path, domain, **kwargs)
        raise DataError(f"{path}: unknown data file type {suffix!r} (use .csv or .parquet)")

    @classmethod
    def from_counts(cls, frame: pd.DataFrame, domain: Domain, count_column: str = "count") -> "Dataset":
        """A count table: one row per cell, a non-negative integer count column."""
        return cls.from_frame(frame, domain, weight_column=count_column)

    @classmethod
    def from_histogram(cls, counts: np.ndarray, domain: Domain) -> "Dataset":
        """A dataset whose histogram is ``counts`` (non-negative integers, length domain.size)."""
        n = domain.require_dense("a histogram")
        counts = np.asarray(counts)
        if counts.shape != (n,):
            raise DataError(f"a histogram over {domain} needs {n} counts, got shape {counts.shape}")
        weights = _check_weights(counts, n)
        cells = np.flatnonzero(weights)
        return cls(domain.unravel(cells), domain, weights[cells])

    # ---- counts ---------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return len(self.codes)

    @property
    def total(self) -> int:
        """Number of records (sum of weights)."""
        return int(self.weights.sum()) if self.weights is not None else self.num_rows

    def histogram(self) -> np.ndarray:
        """Counts over every cell of the domain (refused when the domain is too large)."""
        n = self.domain.require_dense("the full histogram")
        return self._bincount(self.codes, self.domain.sizes, n)

    def binary_marginal_counts(self, k: int, *, chunk_rows: int | None = None) -> np.ndarray:
        """Every cell of every ``k``-way marginal of binary data, shape ``(M, 2^k)``, without the
        full histogram (:func:`dpopt.model.binary_marginals.binary_marginal_counts`)."""
        from dpopt.model.binary_marginals import binary_marginal_counts

        return binary_marginal_counts(self, k, chunk_rows=chunk_rows)

    def marginal(self, attrs: Sequence[str]) -> np.ndarray:
        """Counts over the cells of ``domain.project(attrs)``, flattened in C order."""
        sub = self.domain.project(attrs)
        n = sub.size
        if n > MAX_DENSE_CELLS:
            raise DomainError(
                f"the marginal over {list(attrs)} has {n:.3g} cells, above {MAX_DENSE_CELLS:.0e}"
            )
        cols = list(self.domain.axes(sub.attrs))
        return self._bincount(self.codes[:, cols], sub.sizes, n)

    def marginal_frame(self, attrs: Sequence[str]) -> pd.DataFrame:
        """A marginal as a DataFrame with labelled attribute columns and a ``count`` column."""
        sub = self.domain.project(attrs)
        return cells_frame(sub, self.marginal(attrs))

    def _bincount(self, codes: np.ndarray, sizes: tuple[int, ...], n: int) -> np.ndarray:
        flat = np.ravel_multi_index(tuple(codes.T), sizes) if len(codes) else np.zeros(0, np.int64)
        return np.bincount(flat, weights=self.weights, minlength=n).astype(np.int64)

    def to_frame(self, labels: bool = True) -> pd.DataFrame:
        """The records (weights expanded) as a DataFrame of labels or codes."""
        codes = self.codes if self.weights is None else np.repeat(self.codes, self.weights, axis=0)
        return decode_codes(codes, self.domain, labels=labels)

    def __repr__(self) -> str:
        return f"Dataset({self.total} records over {self.domain})"


# ---- helpers shared with synthetic-data output ------------------------------------------
def domain_from_categories(frame: pd.DataFrame, exclude: Iterable[str | None] = ()) -> Domain:
    """A domain from the declared categories of a frame's Categorical columns."""
    exclude = set(exclude)
    spec = {}
    for col in frame.columns:
        if col in exclude:
            continue
        series = frame[col]
        if not isinstance(series.dtype, pd.CategoricalDtype):
            raise DataError(
                f"column {col!r} has no declared categories (dtype {series.dtype}); give a Domain "
                "or make it a pandas Categorical: a domain must not be read off the private data"
            )
        spec[col] = list(series.cat.categories)
    return Domain.from_dict(spec)


def encode_column(series: pd.Series, domain: Domain, attr: str) -> np.ndarray:
    """Codes of one column; errors name the column, the offending values and their row counts."""
    nan = series.isna().to_numpy()
    if nan.any():
        raise DataError(f"column {attr!r}: {int(nan.sum())} rows hold a missing value (NaN)")
    labels = domain.labels.get(attr)
    size = domain.size_of(attr)
    if labels is not None:
        values = series.astype(object) if isinstance(series.dtype, pd.CategoricalDtype) else series
        codes = pd.Index(list(labels)).get_indexer(values)
        labels_are_ints = any(isinstance(v, (int, np.integer)) for v in labels)
        if (codes < 0).any() and not (codes >= 0).any() and not labels_are_ints:
            # No value is a label: the column may hold codes instead (e.g. a coded export).
            as_codes = _integer_codes(series, size)
            if as_codes is not None:
                return as_codes
        bad = codes < 0
        if bad.any():
            _raise_out_of_domain(series, bad, attr, domain)
        return codes.astype(np.int64)
    as_codes = _integer_codes(series, size)
    if as_codes is None:
        numeric = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(numeric) | (numeric != np.floor(numeric)) | (numeric < 0) | (numeric >= size)
        _raise_out_of_domain(series, bad, attr, domain)
    return as_codes


def _integer_codes(series: pd.Series, size: int) -> np.ndarray | None:
    """The column as codes ``0..size-1``, or None when some value is not such a code."""
    numeric = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
    ok = np.isfinite(numeric) & (numeric == np.floor(numeric)) & (numeric >= 0) & (numeric < size)
    return numeric.astype(np.int64) if ok.all() else None


def _raise_out_of_domain(series: pd.Series, bad: np.ndarray, attr: str, domain: Domain) -> None:
    counts = pd.Series(series.to_numpy()[bad]).astype(str).value_counts()
    shown = ", ".join(f"{v!r} ({c} rows)" for v, c in counts.head(5).items())
    more = f" and {len(counts) - 5} more values" if len(counts) > 5 else ""
    allowed = list(domain.labels_of(attr))
    allowed_txt = repr(allowed) if len(allowed) <= 10 else f"0..{len(allowed) - 1}"
    raise DataError(
        f"column {attr!r}: {int(bad.sum())} rows hold values outside the domain: {shown}{more}; "
        f"allowed values: {allowed_txt}"
    )


def decode_codes(codes: np.ndarray, domain: Domain, labels: bool = True) -> pd.DataFrame:
    """A frame of attribute columns from codes (Categorical with the domain's labels)."""
    out = {}
    for j, attr in enumerate(domain.attrs):
        col = np.asarray(codes[:, j], dtype=np.int64)
        if labels and attr in domain.labels:
            out[attr] = pd.Categorical.from_codes(col, categories=list(domain.labels[attr]))
        else:
            out[attr] = col
    return pd.DataFrame(out)


def cells_frame(domain: Domain, values: np.ndarray, column: str = "count") -> pd.DataFrame:
    """Every cell of a (small) domain with its value, labelled."""
    n = domain.require_dense("a table of cells")
    frame = decode_codes(domain.unravel(np.arange(n)), domain)
    frame[column] = np.asarray(values)
    return frame


def _check_weights(weights, rows: int) -> np.ndarray:
    w = np.asarray(weights)
    if w.shape != (rows,):
        raise DataError(f"weights must have one entry per row ({rows}), got shape {w.shape}")
    if w.dtype.kind not in "iuf":
        w = pd.to_numeric(pd.Series(w), errors="coerce").to_numpy()
    wf = w.astype(np.float64)
    if np.isnan(wf).any():
        raise DataError(f"count column: {int(np.isnan(wf).sum())} rows hold a missing value (NaN)")
    if (wf < 0).any():
        raise DataError(f"count column: {int((wf < 0).sum())} rows hold negative counts")
    if (wf != np.floor(wf)).any() or not np.isfinite(wf).all():
        raise DataError(f"count column: {int((wf != np.floor(wf)).sum())} rows hold non-integer counts")
    return w.astype(np.int64)


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {str(path)!r} does not exist")
    return path


def _usecols(domain: Domain, kwargs: Mapping):
    wanted = set(domain.attrs)
    if kwargs.get("weight_column"):
        wanted.add(kwargs["weight_column"])
    return lambda col: col in wanted


def _parse_strings(frame: pd.DataFrame, domain: Domain) -> pd.DataFrame:
    """CSV cells arrive as strings: match labels by their text, codes by number."""
    out = frame.copy()
    for attr in domain.attrs:
        if attr not in out.columns:
            continue
        labels = domain.labels.get(attr)
        if labels is None:
            continue
        by_text = {str(v): v for v in labels}
        col = out[attr]
        mapped = col.map(by_text)
        # Keep unmatched text as it is, so errors (or integer codes) are handled by encode_column.
        out[attr] = mapped.where(mapped.notna() | col.isna(), col)
    return out
