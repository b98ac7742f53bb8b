"""Records over a domain, and the counts (histogram, marginals) made from them.

A :class:`Dataset` holds records as integer codes, one column per attribute, with an
optional integer weight per row (a count table is a dataset whose rows are cells).
Counts are made with ``np.bincount`` over the projected cell numbers, the vectorised
equivalent of a pandas group-by; a marginal never materialises the full domain.
Nothing is silently dropped: values outside the domain, NaNs, missing or duplicated columns
and bad weights are errors that name the column. They quote the offending values only when the
user asks (``show_confidential=True``, ``--show-confidential``; :mod:`dpopt.errors`) and never
say how many rows hold them: messages end up in shared logs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from dpopt.errors import (
    HIDDEN_VALUES,
    DataError,
    DomainError,
    confidential_values,
    confidential_values_shown,
    showing_confidential,
)
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
            raise DataError(f"column {self.domain.attrs[col]!r} holds codes outside 0..{sizes[col] - 1}"
                            + confidential_values(codes[bad[:, col], col]))
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
        show_confidential: bool | None = None,
    ) -> "Dataset":
        """Encode a DataFrame of labels (or codes) against a domain.

        When ``domain`` is None it is built from the frame's Categorical columns (their
        declared categories, unused ones included); any other column is an error, since
        inferring a domain from the data's own values would leak which values occur.
        ``show_confidential=True`` lets errors quote the offending values (never their row
        counts); None follows :func:`dpopt.errors.confidential_values_shown` (default: not shown).
        """
        with _shown(show_confidential):
            return cls._from_frame(frame, domain, weight_column)

    @classmethod
    def _from_frame(cls, frame: pd.DataFrame, domain: Domain | None, weight_column: str | None) -> "Dataset":
        if not isinstance(frame, pd.DataFrame):
            raise DataError(f"expected a pandas DataFrame, got {type(frame).__name__}")
        duplicated = frame.columns[frame.columns.duplicated()]
        if len(duplicated):
            raise DataError(f"the data name column {str(duplicated[0])!r} twice; rename or drop one")
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
    def from_csv(cls, path: str | Path, domain: Domain, *, missing_values: Sequence[str] = (), **kwargs) -> "Dataset":
        """Read a CSV of labels (or codes); every domain attribute must be a column.

        Every cell is read as text and matched to the labels by its text, so labels such as
        ``"NA"``, ``"None"``, ``"null"`` or ``"007"`` are values like any other: only a truly
        empty cell is missing, plus the markers given in ``missing_values``. A header row that
        names a column twice is an error (pandas would read the first and rename the other).
        """
        path = _existing(path)
        _check_text_labels(domain, missing_values)
        header = csv_header(path)
        wanted = list(domain.attrs) + ([kwargs["weight_column"]] if kwargs.get("weight_column") else [])
        missing = [c for c in wanted if c not in header]
        if missing:
            shown = [h if len(h) <= 30 else h[:27] + "..." for h in map(str, header[:8])]
            raise DataError(f"columns {missing} are missing from the data (its header row holds {shown}"
                            f"{' and more' if len(header) > 8 else ''})")
        with _shown(kwargs.pop("show_confidential", None)):
            try:
                frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""] + list(missing_values),
                                    usecols=_usecols(domain, kwargs))
            except UnicodeDecodeError as exc:  # its text quotes the data's bytes
                raise DataError(f"{str(path)!r} is not {exc.encoding} text (at byte {exc.start})"
                                + confidential_values([exc.object[exc.start:exc.end]])) from None
            return cls.from_frame(frame, domain, **kwargs)

    @classmethod
    def from_parquet(cls, path: str | Path, domain: Domain, **kwargs) -> "Dataset":
        """Read a Parquet file of labels (or codes); nulls are missing values. A column name
        given twice is an error."""
        path = _existing(path)
        _check_parquet_names(path)
        frame = pd.read_parquet(path, columns=_columns(path, domain, kwargs))
        return cls.from_frame(frame, domain, **kwargs)

    @classmethod
    def from_file(cls, path: str | Path, domain: Domain, **kwargs) -> "Dataset":
        """CSV or Parquet, by the file's content (Parquet's magic bytes), else its extension."""
        fmt = file_format(path)
        if fmt == "parquet":
            return cls.from_parquet(path, domain, **kwargs)
        if fmt == "csv":
            return cls.from_csv(path, domain, **kwargs)
        raise DataError(f"{path}: unknown data file type {Path(path).suffix.lower()!r} (use .csv or .parquet)")

    @classmethod
    def from_counts(cls, frame: pd.DataFrame, domain: Domain, count_column: str = "count", *,
                    show_confidential: bool | None = None) -> "Dataset":
        """A count table: one row per cell, a non-negative integer count column."""
        return cls.from_frame(frame, domain, weight_column=count_column, show_confidential=show_confidential)

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
    """Codes of one column; errors name the column and (when shown: :mod:`dpopt.errors`) the offending values.

    Values are matched to labels *as labels*: a text value to the label with that text, a
    number to a label equal to it, else to the label whose text is the number's (``1`` → ``"1"``).
    A number that could stand for more than one text (``1.0`` for ``"1"``), or whose text lost
    something (``6`` where the label is ``"06"``), is an error saying so. Positions are never
    guessed: a column holds codes ``0..size-1`` only for an attribute without labels, or one the
    domain declares in ``codes`` (:class:`~dpopt.model.domain.Domain`).
    """
    nan = series.isna().to_numpy()
    if nan.any():
        raise DataError(f"column {attr!r} holds missing values (empty cells or NaN)")
    labels = domain.labels.get(attr)
    size = domain.size_of(attr)
    if labels is None or attr in domain.codes:
        as_codes = _integer_codes(series, size)
        if as_codes is None:
            numeric = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
            bad = ~np.isfinite(numeric) | (numeric != np.floor(numeric)) | (numeric < 0) | (numeric >= size)
            _raise_out_of_domain(series, bad, attr, domain, note=" (declared as codes 0..size-1)" if labels else "")
        return as_codes
    values = series.astype(object) if isinstance(series.dtype, pd.CategoricalDtype) else series
    row_value, uniques = pd.factorize(values, use_na_sentinel=False)
    index = _LabelIndex(labels, attr)
    unique_codes = np.array([index.code(v) for v in uniques], dtype=np.int64)
    codes = unique_codes[row_value] if len(row_value) else np.zeros(0, dtype=np.int64)
    bad = codes < 0
    if bad.any():
        _raise_out_of_domain(series, bad, attr, domain, note=_unmatched_hint(uniques[unique_codes < 0], labels, attr,
                                                                             size))
    return codes


class _LabelIndex:
    """Codes of data values by label: text to text labels, numbers to number labels, else a
    number to the text label that reads the same (see :func:`encode_column`)."""

    def __init__(self, labels: tuple, attr: str) -> None:
        self.attr = attr
        self.by_text = {label: code for code, label in enumerate(labels) if isinstance(label, str)}
        self.by_number = {label: code for code, label in enumerate(labels) if _is_number(label)}
        # Labels declared as numbers (TOML [1, 2]) read back from a CSV as text.
        self.number_text = {str(label): code for label, code in self.by_number.items()}
        self.other = [(code, label) for code, label in enumerate(labels)
                      if not isinstance(label, str) and not _is_number(label)]

    def code(self, value) -> int:
        if isinstance(value, str):
            code = self.by_text.get(str(value))
            return code if code is not None else self.number_text.get(str(value), -1)
        if not _is_number(value):
            return next((code for code, label in self.other if label == value), -1)
        number = value.item() if isinstance(value, np.generic) else value
        if isinstance(number, float) and not np.isfinite(number):
            return -1
        code = self.by_number.get(number)
        if code is not None:
            return code
        if isinstance(number, float):
            if number.is_integer() and str(int(number)) in self.by_text:
                also = f" and {repr(number)!r}" if repr(number) in self.by_text else ""
                which = (f"the number {number!r} where the labels are text ({str(int(number))!r}{also})"
                         if showing_confidential() else
                         f"a number with a decimal point where the labels are text ({HIDDEN_VALUES})")
                raise DataError(
                    f"column {self.attr!r} holds {which}: it is ambiguous which text it stands for; read the column "
                    "as text (e.g. pd.read_csv(..., dtype=str)) or as integers")
            return self.by_text.get(repr(number), -1)
        return self.by_text.get(str(int(number)), -1)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _unmatched_hint(values, labels: tuple, attr: str, size: int) -> str:
    """Why numbers found no label: leading zeros lost, or a column of codes to declare."""
    numbers = [v for v in values if _is_number(v)]
    if not numbers:
        return ""
    texts = [str(label) for label in labels if isinstance(label, str)]
    if any(len(t) > 1 and t[0] == "0" and t.isdigit() for t in texts):
        return ("; the column holds numbers but labels such as "
                f"{next(t for t in texts if len(t) > 1 and t[0] == '0' and t.isdigit())!r} have leading zeros, "
                "which numbers lose: read the column as text (e.g. pd.read_csv(..., dtype=str))")
    if all(float(v).is_integer() and 0 <= float(v) < size for v in numbers):
        return (f"; if the column holds codes 0..{size - 1} rather than labels, declare them: "
                f"[domain] codes = [{attr!r}] (Domain(..., codes=[{attr!r}]))")
    return ""


def _integer_codes(series: pd.Series, size: int) -> np.ndarray | None:
    """The column as codes ``0..size-1``, or None when some value is not such a code."""
    row_value = None
    if pd.api.types.is_numeric_dtype(series.dtype):
        numeric = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
    else:
        # Text (a CSV is read as text): parse each distinct value once, not every row. A column of
        # valid codes has at most ``size`` of them; parsing KDD99's 494,021 rows took 0.24 CPU-s a
        # column (42 columns: 7 s of the shipped spec's run), the distinct values 0.01 s.
        row_value, uniques = pd.factorize(series, use_na_sentinel=False)
        numeric = pd.to_numeric(pd.Series(uniques, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    ok = np.isfinite(numeric) & (numeric == np.floor(numeric)) & (numeric >= 0) & (numeric < size)
    if not ok.all():
        return None
    codes = numeric.astype(np.int64)
    return codes if row_value is None else codes[row_value]


def _raise_out_of_domain(series: pd.Series, bad: np.ndarray, attr: str, domain: Domain, note: str = "") -> None:
    raise DataError(out_of_domain_message(attr, pd.unique(series.to_numpy()[bad]), domain, note))


def out_of_domain_message(attr: str, values, domain: Domain, note: str = "") -> str:
    """``column 'a' holds values outside the domain ...; allowed values: ...``: the offending
    values only when shown (:func:`dpopt.errors.confidential_values`), never how many rows hold them."""
    allowed = list(domain.labels_of(attr))
    allowed_txt = repr(allowed) if len(allowed) <= 10 else f"0..{len(allowed) - 1}"
    return (f"column {attr!r} holds values outside the domain{confidential_values(values)}; "
            f"allowed values: {allowed_txt}{note}")


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
        raise DataError("count column: holds missing values (NaN or text that is not a number)")
    if (wf < 0).any():
        raise DataError("count column: holds negative counts" + confidential_values(w[wf < 0]))
    fractional = (wf != np.floor(wf)) | ~np.isfinite(wf)
    if fractional.any():
        raise DataError("count column: holds non-integer counts" + confidential_values(w[fractional]))
    return w.astype(np.int64)


def _shown(show: bool | None):
    """The block's rule for confidential values: ``show`` when given, else the caller's."""
    return contextlib.nullcontext() if show is None else confidential_values_shown(show)


def csv_header(path: str | Path) -> list[str]:
    """The column names of a CSV's header row, refusing a name given twice (an error naming it).

    Read as the file has them (pandas would rename a second ``a`` to ``a.1``); an empty file,
    without even a header row, is an error saying so.
    """
    try:
        first = pd.read_csv(path, dtype=str, header=None, nrows=1, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise DataError(f"{str(path)!r} is empty: not even a header row names its columns") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{str(path)!r}: its header row is not {exc.encoding} text") from None
    names = [str(v) for v in first.iloc[0].tolist()] if len(first) else []
    seen = set()
    for name in names:
        if name in seen:
            raise DataError(f"{str(path)!r}: the header row names column {name!r} twice; rename or drop one "
                            "(a reader would silently take one of them)")
        seen.add(name)
    return names


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


def file_format(path: str | Path) -> str | None:
    """``"parquet"`` or ``"csv"`` from a file's content, else from its extension; None if neither says.

    A file that starts with Parquet's magic bytes ``PAR1`` is Parquet whatever its name; a file
    named ``.parquet`` that does not is refused (it is not Parquet); gzip content or a
    ``.csv``/``.txt``/``.csv.gz`` name is CSV.
    """
    path = Path(path)
    suffixes = [s.lower() for s in path.suffixes]
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        head = b""
    if head == b"PAR1":
        return "parquet"
    if suffixes and suffixes[-1] in (".parquet", ".pq"):
        if head:
            raise DataError(f"{str(path)!r} is named like a Parquet file but is not one (no PAR1 magic bytes)")
        return "parquet"
    if head[:2] == b"\x1f\x8b" or (suffixes and suffixes[-1] in (".csv", ".txt", ".gz")):
        return "csv"
    return None


def _check_text_labels(domain: Domain, missing_values: Sequence[str]) -> None:
    """Labels a CSV cannot tell apart: the empty label, two labels with one text, a missing marker."""
    markers = set(missing_values)
    for attr, labels in domain.labels.items():
        if attr in domain.codes:
            continue
        texts = [str(v) for v in labels]
        if "" in texts:
            raise DataError(f"attribute {attr!r} declares the empty label '', which a CSV cannot tell from an "
                            "empty (missing) cell")
        if len(set(texts)) != len(texts):
            dup = next(t for t in texts if texts.count(t) > 1)
            raise DataError(f"attribute {attr!r} declares two labels written {dup!r} (a number and a text); "
                            "a CSV cannot tell them apart")
        clash = sorted(markers & set(texts))
        if clash:
            raise DataError(f"attribute {attr!r}: the label {clash[0]!r} is also declared a missing-value marker")


def _check_parquet_names(path: Path) -> None:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception:  # noqa: BLE001 - a broken file is reported by read_parquet itself
        return
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise DataError(f"{str(path)!r}: the file names column {dup!r} twice; rename or drop one")


def _columns(path: Path, domain: Domain, kwargs: Mapping) -> list[str] | None:
    """The Parquet columns to read (the domain's and the weight column), when the file has them all."""
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 - a broken file is reported by read_parquet itself
        return None
    wanted = list(domain.attrs) + ([kwargs["weight_column"]] if kwargs.get("weight_column") else [])
    return wanted if set(wanted) <= names else None
