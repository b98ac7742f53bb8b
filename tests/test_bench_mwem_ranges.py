"""Tests of the helpers of examples/benchmarks/bench_mwem_ranges.py (MWEM, Fig. 2 protocol)."""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.errors import DataError
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import RangeQueries
from dpopt.privacy.samplers import discrete_laplace_variance

BENCHMARKS = Path(__file__).resolve().parents[1] / "examples" / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import bench_mwem_ranges as bench  # noqa: E402  (a script beside _common.py, not a package)


# ---- encoding --------------------------------------------------------------------------------
def test_encode_capital_loss_keeps_dollar_amounts_as_codes():
    frame = pd.DataFrame({"capital-loss": [0, 1, 1902, 4356, 0]})
    data, attrs, outside = bench.encode_adult(frame, "capital-loss")
    assert attrs == ("capital-loss",)
    assert data.domain.sizes == (4357,)
    assert outside == {"capital-loss": 0}
    expected = np.zeros(4357, dtype=np.int64)
    for value in frame["capital-loss"]:
        expected[value] += 1
    np.testing.assert_array_equal(data.histogram(), expected)


def test_encode_age_hours_bins_match_brute_force():
    ages = [0, 17, 38, 89, 90, 90]
    hours = [0, 3, 4, 40, 97, 99]
    frame = pd.DataFrame({"age": ages, "hours-per-week": hours})
    data, attrs, outside = bench.encode_adult(frame, "age-hours")
    assert attrs == ("age", "hours")
    assert data.domain.sizes == (91, 25)
    assert outside == {"age": 0, "hours-per-week": 0}
    # Brute force: the bin k of h is the one with 4k <= h <= 4k + 3.
    bins = [next(k for k in range(25) if 4 * k <= h <= 4 * k + 3) for h in hours]
    assert bins == [0, 0, 1, 10, 24, 24]
    np.testing.assert_array_equal(data.codes, np.column_stack([ages, bins]))
    expected = np.zeros((91, 25), dtype=np.int64)
    for a, b in zip(ages, bins):
        expected[a, b] += 1
    np.testing.assert_array_equal(data.histogram(), expected.ravel())


@pytest.mark.parametrize(
    "name, frame, column",
    [
        ("capital-loss", pd.DataFrame({"capital-loss": [0, 4357]}), "capital-loss"),
        ("capital-loss", pd.DataFrame({"capital-loss": [-1, 0]}), "capital-loss"),
        ("capital-loss", pd.DataFrame({"capital-loss": [0.5, 0]}), "capital-loss"),
        ("capital-loss", pd.DataFrame({"capital-loss": [np.nan, 0]}), "capital-loss"),
        ("capital-loss", pd.DataFrame({"capital-loss": ["?", "0"]}), "capital-loss"),
        ("capital-loss", pd.DataFrame({"age": [30]}), "capital-loss"),
        ("age-hours", pd.DataFrame({"age": [91], "hours-per-week": [40]}), "age"),
        ("age-hours", pd.DataFrame({"age": [30], "hours-per-week": [100]}), "hours-per-week"),
        ("age-hours", pd.DataFrame({"age": [30], "hours-per-week": [-2]}), "hours-per-week"),
        ("age-hours", pd.DataFrame({"age": [30]}), "hours-per-week"),
        ("ages", pd.DataFrame({"age": [30]}), "name='ages'"),
    ],
)
def test_encode_refuses_instead_of_dropping(name, frame, column):
    with pytest.raises(DataError, match=column):
        bench.encode_adult(frame, name)


# ---- workloads -------------------------------------------------------------------------------
def test_nested_workloads_are_prefixes_and_answer_like_dense_boxes():
    domain = Domain(("a", "b"), (7, 5))
    workloads = bench.nested_workloads(domain, ("a", "b"), [3, 10, 25], np.random.default_rng(4))
    assert sorted(workloads) == [3, 10, 25]
    big = workloads[25]
    for count, W in workloads.items():
        assert isinstance(W, RangeQueries) and W.num_rows == count
        np.testing.assert_array_equal(W.lows, big.lows[:count])
        np.testing.assert_array_equal(W.highs, big.highs[:count])
    assert np.all(big.lows <= big.highs)
    # Brute force: each box's indicator over the 7 x 5 cells.
    x = np.random.default_rng(5).integers(0, 9, size=domain.size)
    grid_a, grid_b = np.meshgrid(np.arange(7), np.arange(5), indexing="ij")
    expected = [
        x[((grid_a >= lo[0]) & (grid_a <= hi[0]) & (grid_b >= lo[1]) & (grid_b <= hi[1])).ravel()].sum()
        for lo, hi in zip(big.lows, big.highs)
    ]
    np.testing.assert_array_equal(big.matvec(x), expected)


def test_nested_workloads_are_reproducible_from_the_seed():
    domain = Domain(("v",), (50,))
    one = bench.nested_workloads(domain, ("v",), [5, 20], np.random.default_rng(9))
    two = bench.nested_workloads(domain, ("v",), [5, 20], np.random.default_rng(9))
    np.testing.assert_array_equal(one[20].lows, two[20].lows)
    np.testing.assert_array_equal(one[20].highs, two[20].highs)


# ---- baselines and metric --------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_data() -> Dataset:
    domain = Domain(("v",), (12,))
    return Dataset.from_histogram(np.array([5, 0, 3, 9, 1, 0, 0, 4, 2, 8, 6, 1]), domain)


def test_noisy_histogram_answers_are_sums_of_the_same_noisy_cells(small_data):
    domain = small_data.domain
    cells = RangeQueries(domain, "v", np.arange(12), np.arange(12))  # one range per cell
    W = RangeQueries(domain, "v", [0, 2, 5, 0], [11, 6, 5, 3])
    noisy_cells = bench.noisy_histogram_answers(small_data, cells, Fraction(1, 2), seed=11)
    answers = bench.noisy_histogram_answers(small_data, W, Fraction(1, 2), seed=11)
    dense = W.to_sparse().toarray()
    np.testing.assert_allclose(answers, dense @ noisy_cells)
    assert np.any(noisy_cells != small_data.histogram())  # noise was added


def _variance_within(samples: np.ndarray, expected: float, z: float = 5.0) -> bool:
    """Sample variance within z standard errors (from the sample's fourth moment) of expected."""
    centred = samples - samples.mean()
    var = centred.var()
    se = math.sqrt(max(np.mean(centred**4) - var**2, 0.0) / samples.size)
    return abs(var - expected) <= z * se


@pytest.mark.parametrize("builder", ["noisy histogram", "Laplace per query"])
def test_baseline_noise_has_the_calibrated_variance(small_data, builder):
    domain = small_data.domain
    W = RangeQueries(domain, "v", [0, 1, 2, 3], [5, 6, 4, 3])
    truth = W.to_sparse().toarray() @ small_data.histogram()
    eps = Fraction(1, 2)
    coverage = W.to_sparse().toarray().sum(axis=0)  # brute-force L1 column norms
    if builder == "noisy histogram":
        # Per-cell scale 1/eps; a range's noise is the sum over its cells.
        lengths = (W.highs - W.lows + 1).ravel()
        expected = lengths * discrete_laplace_variance(Fraction(1) / eps)
        answer = bench.noisy_histogram_answers
    else:
        assert coverage.max() == 4
        expected = np.full(4, discrete_laplace_variance(Fraction(int(coverage.max())) / eps))
        answer = bench.laplace_per_query_answers
    noise = np.array([answer(small_data, W, eps, seed=s) - truth for s in range(1500)])
    for j in range(4):
        assert _variance_within(noise[:, j], float(expected[j])), (j, noise[:, j].var(), expected[j])
        assert not _variance_within(noise[:, j], 0.7**2 * float(expected[j]))
        assert not _variance_within(noise[:, j], 1.3**2 * float(expected[j]))


def test_mean_squared_error_closed_form():
    assert bench.mean_squared_error(np.array([1.0, 2.0, 5.0]), np.array([1, 4, 2])) == pytest.approx((0 + 4 + 9) / 3)


def test_seeds_are_distinct_reproducible_and_valid():
    seeds = {bench._seed(d, q, e, r, m) for d in range(2) for q in (250, 2000) for e in (1, 10)
             for r in range(5) for m in range(4)}
    assert len(seeds) == 2 * 2 * 2 * 5 * 4
    assert all(0 <= s < 2**63 for s in seeds)
    assert bench._seed(1, 2, 3) == bench._seed(1, 2, 3)
