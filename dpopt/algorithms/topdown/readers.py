"""Unit histograms from record files, behind one interface: pandas for files that fit, Spark for the rest.

:func:`read_unit_counts` returns the counts per leaf unit and characteristics cell (a sparse
matrix, rows in the geography's leaf order) of a CSV or Parquet file of records (one row per
person) or of a count table (``count_column``). The pandas engine reads the file in chunks,
so memory is bounded by the chunk, not the file; the Spark engine groups the records by their
codes on the cluster and brings back only the non-empty (unit, cell) counts. Both engines
validate alike: a value outside the domain, or a record whose geography columns do not nest,
is a :class:`~dpopt.errors.DataError` naming the column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from dpopt.errors import DataError, ParameterError
from dpopt.model.data import Dataset, csv_header, file_format, out_of_domain_message
from dpopt.model.domain import Domain
from dpopt.model.geography import Geography

__all__ = ["read_unit_counts", "ENGINES"]

ENGINES = ("pandas", "spark")


def read_unit_counts(path: str | Path, geography: Geography, domain: Domain, *, engine: str = "pandas",
                     count_column: str | None = None, chunksize: int = 1_000_000, spark=None) -> sp.csr_matrix:
    """Counts per leaf (rows) and characteristics cell (columns) of a record file.

    Parameters
    ----------
    path : str or Path
        A ``.csv`` or ``.parquet`` file (Spark also reads a directory of part files).
    geography : Geography
        Bound to ``domain`` (its attributes locate each record).
    domain : Domain
        Every domain attribute must be a column of the file.
    engine : {"pandas", "spark"}
    count_column : str, optional
        The file is a count table: each row stands for this many records.
    chunksize : int
        Rows per pandas chunk.
    spark : pyspark.sql.SparkSession, optional
        For ``engine="spark"`` (default: ``SparkSession.builder.getOrCreate()``).
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {str(path)!r} does not exist")
    if engine == "pandas":
        return _pandas(path, geography, domain, count_column, chunksize)
    if engine == "spark":
        return _spark(path, geography, domain, count_column, spark)
    raise ParameterError(f"engine must be one of {list(ENGINES)}, got {engine!r}")


def _format(path: Path) -> str:
    """By the file's content, then its name, like every other reader (a directory is a Parquet dataset)."""
    fmt = "parquet" if path.is_dir() else file_format(path)
    if fmt is None:
        raise DataError(f"{path}: unknown data file type {path.suffix.lower()!r} (use .csv or .parquet)")
    return fmt


def _chunks(path: Path, domain: Domain, count_column: str | None, chunksize: int):
    columns = list(domain.attrs) + ([count_column] if count_column else [])
    if _format(path) == "csv":
        csv_header(path)  # a column named twice is an error, not read silently
        # Text matched to labels as text: "NA", "None" or "007" are values; only empty cells are missing.
        yield from pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""],
                               usecols=lambda c: c in columns, chunksize=chunksize)
    else:
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=chunksize, columns=columns):
            yield batch.to_pandas()


def _pandas(path, geography, domain, count_column, chunksize) -> sp.csr_matrix:
    chars = geography.characteristics(domain)
    total = sp.csr_matrix((geography.sizes[-1], chars.size), dtype=np.int64)
    for chunk in _chunks(path, domain, count_column, chunksize):
        data = Dataset.from_frame(chunk, domain, weight_column=count_column)
        total = total + geography.leaf_histograms(data)
    return sp.csr_matrix(total)


def _spark(path, geography, domain, count_column, spark) -> sp.csr_matrix:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = spark or SparkSession.builder.getOrCreate()
    if _format(path) == "csv":
        frame = spark.read.csv(str(path), header=True, inferSchema=False)
    else:
        frame = spark.read.parquet(str(path))
    missing = [a for a in domain.attrs if a not in frame.columns]
    if missing:
        raise DataError(f"columns {missing} of the domain are missing from the data (data columns: {frame.columns})")
    if count_column is not None and count_column not in frame.columns:
        raise DataError(f"weight column {count_column!r} is missing from the data")
    weight = F.col(count_column).cast("long") if count_column else F.lit(1).cast("long")
    frame = frame.select(*[F.col(a).cast("string").alias(a) for a in domain.attrs], weight.alias("__weight"))
    for attr in domain.attrs:  # label -> code, by a (broadcast) join with the domain's labels
        labels = spark.createDataFrame(pd.DataFrame({attr: [str(v) for v in domain.labels_of(attr)],
                                                     f"{attr}__code": np.arange(domain.size_of(attr))}))
        frame = frame.join(F.broadcast(labels), on=attr, how="left")
    bad = frame.where(F.greatest(*[F.col(f"{a}__code").isNull() for a in domain.attrs]) | F.col("__weight").isNull()
                      | (F.col("__weight") < 0))
    if bad.limit(1).count():
        _raise_bad(bad, domain)
    codes = [f"{a}__code" for a in domain.attrs]
    grouped = frame.groupBy(*codes).agg(F.sum("__weight").alias("__weight")).toPandas()
    data = Dataset(grouped[codes].to_numpy(dtype=np.int64).reshape(-1, len(domain)), domain,
                   grouped["__weight"].to_numpy(dtype=np.int64))
    return geography.leaf_histograms(data)


def _raise_bad(bad, domain: Domain) -> None:
    from pyspark.sql import functions as F

    for attr in domain.attrs:
        rows = bad.where(F.col(f"{attr}__code").isNull())
        if rows.limit(1).count():  # values only when shown, row counts never (dpopt.errors)
            values = [r[attr] for r in rows.select(attr).distinct().limit(10).collect()]
            raise DataError(out_of_domain_message(attr, values, domain))
    raise DataError("count column: holds missing or negative counts")
