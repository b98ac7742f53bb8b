"""Domain and Dataset: indexing, counts against pandas group-by, and every bad input."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from dpopt.errors import DataError, DomainError
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain


def test_cell_index_round_trip(small_domain):
    n = small_domain.size
    assert n == 24
    cells = np.arange(n)
    codes = small_domain.unravel(cells)
    assert np.array_equal(small_domain.ravel(codes), cells)
    # first attribute most significant
    assert small_domain.cell_index({"sex": 1, "age": 0, "region": 0}) == 12
    assert small_domain.cell_values(23) == {"sex": 1, "age": 2, "region": 3}


def test_project_keeps_order_and_labels(small_domain):
    sub = small_domain.project(["region", "sex"])
    assert sub.attrs == ("region", "sex") and sub.sizes == (4, 2)
    assert sub.labels["sex"] == ("F", "M")
    assert small_domain.canonical(["region", "sex"]) == ("sex", "region")


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: Domain((), ()), "at least one attribute"),
        (lambda: Domain(("a", "a"), (2, 2)), "duplicate attribute name 'a'"),
        (lambda: Domain(("a",), (0,)), "attribute 'a': size must be an integer >= 1"),
        (lambda: Domain(("a",), (2.5,)), "attribute 'a': size must be an integer"),
        (lambda: Domain(("",), (2,)), "non-empty strings"),
        (lambda: Domain(("a",), (2,), {"a": ("x",)}), "1 labels do not match its size 2"),
        (lambda: Domain(("a",), (2,), {"b": ("x", "y")}), "unknown attribute 'b'"),
        (lambda: Domain(("a",), (2,), {"a": ("x", "x")}), "not unique"),
        (lambda: Domain(("a", "b"), (2,)), "2 attribute names but 1 sizes"),
        (lambda: Domain.from_dict({"a": "abc"}), "expected a size or a list of labels"),
    ],
)
def test_domain_validation(build, match):
    with pytest.raises(DomainError, match=match):
        build()


def test_domain_lookup_errors(small_domain):
    with pytest.raises(DomainError, match="unknown attribute 'income'"):
        small_domain.project(["income"])
    with pytest.raises(DomainError, match="attribute 'sex' named twice"):
        small_domain.project(["sex", "sex"])
    with pytest.raises(DomainError, match="value 'X' is not in the domain of attribute 'sex'"):
        small_domain.code_of("sex", "X")
    big = Domain(tuple(f"a{i}" for i in range(40)), (2,) * 40)
    with pytest.raises(DomainError, match="work with marginals"):
        big.require_dense()


def test_histogram_and_marginals_match_pandas(small_domain, small_frame):
    data = Dataset.from_frame(small_frame, small_domain)
    assert data.total == len(small_frame)
    hist = data.histogram()
    assert hist.sum() == len(small_frame)
    for attrs in (["sex"], ["age", "region"], ["region", "sex"], ["sex", "age", "region"]):
        expected = (
            small_frame.groupby(attrs).size()
        )
        got = data.marginal_frame(attrs)
        got_map = {tuple(str(v) for v in row[:-1]): row[-1] for row in got.itertuples(index=False)}
        for key, count in expected.items():
            key = key if isinstance(key, tuple) else (key,)
            assert got_map[tuple(str(k) for k in key)] == count
        assert got["count"].sum() == len(small_frame)


def test_marginal_of_huge_domain_without_histogram(rng):
    dom = Domain(tuple(f"a{i}" for i in range(30)), (7,) * 30)  # 2e25 cells
    codes = rng.integers(0, 7, size=(1000, 30))
    data = Dataset(codes, dom)
    m = data.marginal(["a3", "a17"])
    ref = pd.DataFrame(codes[:, [3, 17]]).groupby([0, 1]).size()
    for (i, j), c in ref.items():
        assert m[i * 7 + j] == c
    with pytest.raises(DomainError, match="work with marginals"):
        data.histogram()


def test_counts_table_and_round_trip(small_domain, small_frame):
    data = Dataset.from_frame(small_frame, small_domain)
    again = Dataset.from_histogram(data.histogram(), small_domain)
    assert np.array_equal(again.histogram(), data.histogram())
    counts = data.marginal_frame(list(small_domain.attrs))
    from_counts = Dataset.from_counts(counts, small_domain)
    assert np.array_equal(from_counts.histogram(), data.histogram())
    assert len(from_counts.to_frame()) == len(small_frame)


def test_domain_from_declared_categories():
    frame = pd.DataFrame({"c": pd.Categorical(["x", "y"], categories=["x", "y", "z"])})
    data = Dataset.from_frame(frame)
    assert data.domain.sizes == (3,)
    with pytest.raises(DataError, match="column 'd' has no declared categories"):
        Dataset.from_frame(pd.DataFrame({"d": [1, 2]}))


def test_codes_accepted_when_the_domain_declares_them(small_domain, small_frame):
    coded = small_frame.assign(sex=(small_frame["sex"] == "M").astype(int))
    assert np.array_equal(
        Dataset.from_frame(coded, small_domain.with_codes(["sex"])).histogram(),
        Dataset.from_frame(small_frame, small_domain).histogram(),
    )
    # Undeclared, a column of numbers is never read as positions: the error says how to declare them.
    with pytest.raises(DataError, match=r"column 'sex'.*declare them: \[domain\] codes = \['sex'\]"):
        Dataset.from_frame(coded, small_domain)


@pytest.mark.parametrize(
    "mutate, match, shown",
    [
        (lambda f: f.drop(columns="age"), r"columns \['age'\] of the domain are missing", None),
        (lambda f: f.assign(age=f["age"].where(f.index != 3)), r"column 'age' holds missing values \(empty", None),
        (lambda f: f.assign(sex=f["sex"].where(f.index > 1, "X")),
         r"column 'sex' holds values outside the domain \(the values are confidential", "domain: 'X'; allowed"),
        (lambda f: f.assign(region=f["region"].where(f.index != 0, 9)),
         r"column 'region' holds values outside the domain \(the values are confidential", "domain: '9'; allowed"),
        (lambda f: f.assign(region=f["region"].where(f.index != 0, -1)), "column 'region'", "'-1'"),
        (lambda f: f.assign(region=f["region"].astype(float).where(f.index != 0, 1.5)), "column 'region'", "'1.5'"),
    ],
)
def test_dataset_validation(small_domain, small_frame, mutate, match, shown):
    """Errors name the column; the offending values only when asked; row counts never."""
    frame = mutate(small_frame.copy())
    with pytest.raises(DataError, match=match) as hidden:
        Dataset.from_frame(frame, small_domain)
    assert "rows" not in str(hidden.value)
    if shown is not None:
        assert shown not in str(hidden.value)
        with pytest.raises(DataError, match=re.escape(shown)) as info:
            Dataset.from_frame(frame, small_domain, show_confidential=True)
        assert "rows" not in str(info.value)


@pytest.mark.parametrize(
    "counts, match",
    [
        ([1, -2], "negative counts"),
        ([1, 0.5], "non-integer counts"),
        ([1, np.nan], "missing value"),
    ],
)
def test_count_validation(counts, match):
    dom = Domain(("a",), (2,))
    frame = pd.DataFrame({"a": [0, 1], "count": counts})
    with pytest.raises(DataError, match=match):
        Dataset.from_counts(frame, dom)


def test_csv_and_parquet_round_trip(tmp_path, small_domain, small_frame):
    csv = tmp_path / "d.csv"
    small_frame.to_csv(csv, index=False)
    pq = tmp_path / "d.parquet"
    small_frame.to_parquet(pq)
    h = Dataset.from_frame(small_frame, small_domain).histogram()
    assert np.array_equal(Dataset.from_file(csv, small_domain).histogram(), h)
    assert np.array_equal(Dataset.from_file(pq, small_domain).histogram(), h)
    with pytest.raises(DataError, match="does not exist"):
        Dataset.from_csv(tmp_path / "nope.csv", small_domain)
    with pytest.raises(DataError, match="unknown data file type"):
        Dataset.from_file(tmp_path / "x.xlsx", small_domain)


def test_benchmark_counts_file_matches_records():
    from tests.conftest import shared_data

    counts = pd.read_csv(shared_data("czech_counts.csv"))
    records = pd.read_csv(shared_data("czech.csv"))
    attrs = [c for c in counts.columns if c != "count"]
    dom = Domain(tuple(attrs), (2,) * len(attrs))
    assert np.array_equal(
        Dataset.from_counts(counts, dom).histogram(), Dataset.from_frame(records, dom).histogram()
    )
    # cells in the file are in lexicographic order, first column most significant
    assert np.array_equal(Dataset.from_counts(counts, dom).histogram(), counts["count"].to_numpy())
