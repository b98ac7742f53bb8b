"""The matrix-mechanism side of the Figure 2 benchmark (examples/benchmarks/bench_mwem_ranges.py --matrix):
the bound as the MWEM paper instantiates it, and the non-negative fits."""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import RangeQueries

BENCHMARKS = Path(__file__).resolve().parents[1] / "examples" / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import bench_mwem_ranges as bench  # noqa: E402  (a script beside _common.py, not a package)


@pytest.fixture(scope="module")
def small():
    domain = Domain(("v",), (12,))
    data = Dataset.from_histogram(np.array([5, 0, 3, 9, 1, 0, 0, 4, 2, 8, 6, 1]), domain)
    W = RangeQueries(domain, "v", [0, 2, 5, 0, 7], [11, 6, 5, 3, 9])
    return data, W


def test_paper_bound_is_p_eps_delta_times_the_squared_nuclear_norm_over_n(small):
    data, W = small
    eps = Fraction(1, 10)
    sv = np.linalg.svd(W.to_dense(), compute_uv=False)
    n = data.total
    expected = 2 * math.log(2 * n) / float(eps) ** 2 * sv.sum() ** 2 / 12 / W.num_rows
    assert bench.paper_bound_per_query(W, eps, n) == pytest.approx(expected, rel=1e-10)


def test_nonnegative_fits_and_expected_errors(small):
    data, W = small
    exp = bench.Experiment(rounds=2, runs=1, counts=[5], matrix=True)
    strategies = exp.strategies("toy", data, 0, 5, W)
    assert set(strategies) == set(bench.MM_STRATEGIES)
    truth = W.matvec(data.histogram())
    for name in bench.MM_STRATEGIES:
        error = exp.matrix_method(f"MM {name} >= 0", "toy", data, 0, 5, W, truth, Fraction(1, 2), seed=3)
        assert error >= 0 and math.isfinite(error)
    best = exp.matrix_method("MM best (expected)", "toy", data, 0, 5, W, truth, Fraction(1, 2), seed=3)
    bound = exp.matrix_method("SVD bound", "toy", data, 0, 5, W, truth, Fraction(1, 2), seed=3)
    assert best > 0 and bound > 0
    # The fitted table behind a non-negative answer has no negative cell.
    strategy = strategies["hierarchical"][0]
    answers = bench.nonnegative_answers(data, W, strategy, Fraction(1, 2), seed=4)
    assert answers.shape == (W.num_rows,) and (answers >= -1e-7).all()
