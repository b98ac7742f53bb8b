"""Top-down on Spark (``local[2]``): the same release as the serial executor, bit for bit, and the
Spark reader counts like pandas. One Spark session for the module (its start-up takes seconds)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e \".[test,spark]\"")
if shutil.which("java") is None:  # pragma: no cover - CI has Java 17
    pytest.skip("Spark needs a Java runtime (17 or later) on the PATH", allow_module_level=True)

from dpopt.algorithms.topdown.executors import SparkExecutor, spark_session  # noqa: E402
from dpopt.algorithms.topdown.readers import read_unit_counts  # noqa: E402
from dpopt.errors import DataError  # noqa: E402
from dpopt.model.data import Dataset  # noqa: E402
from dpopt.model.geography import Geography  # noqa: E402

from .test_topdown import run_census  # noqa: E402

# pyspark warns that it does not fully support pandas 3 yet; the RDD and toPandas paths used here work.
pytestmark = [pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
              pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")]


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.mark.parametrize("batch", [None, 1])
def test_spark_releases_the_same_tables_as_the_serial_executor(spark, batch, monkeypatch):
    """In one ``parallelize`` per level, and in many small batches, two at a time."""
    from dpopt.algorithms.topdown import executors

    calls = []
    parallelize = spark.sparkContext.parallelize
    monkeypatch.setattr(spark.sparkContext, "parallelize", lambda data, *a: calls.append(len(data)) or
                        parallelize(data, *a))
    if batch is not None:
        monkeypatch.setattr(executors, "SPARK_BATCH_BYTES", batch)
    serial = run_census("serial", seed=8)
    on_spark = run_census(SparkExecutor(context=spark.sparkContext), seed=8)
    levels = len(serial.level_tables)
    assert (len(calls) == levels) if batch is None else (len(calls) > levels), (calls, levels)
    assert serial.success and on_spark.success
    for name in serial.level_tables:
        assert np.array_equal(serial.level_tables[name], on_spark.level_tables[name]), name
    assert np.array_equal(serial.counts, on_spark.counts)
    assert serial.ledger["rho"].tolist() == on_spark.ledger["rho"].tolist()
    assert on_spark.info["executor"] == "spark (given context)"


def test_the_spark_reader_counts_like_pandas(spark, tmp_path):
    from dpopt.datasets.census import census_domain, generate_census

    domain = census_domain(2, 3)
    frame = generate_census(2500, num_states=2, counties_per_state=3, seed=6)
    geography = Geography.from_columns(domain, ["state", "county"])
    expected = geography.leaf_histograms(Dataset.from_frame(frame, domain))
    for fmt in ("csv", "parquet"):
        path = tmp_path / f"people.{fmt}"
        frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
        counts = read_unit_counts(path, geography, domain, engine="spark", spark=spark)
        assert (counts != expected).nnz == 0, fmt
    bad = frame.astype({"sex": str})
    bad.loc[:2, "sex"] = "X"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(DataError, match=r"column 'sex': 3 rows hold values outside the domain: \['X'\]"):
        read_unit_counts(tmp_path / "bad.csv", geography, domain, engine="spark", spark=spark)
