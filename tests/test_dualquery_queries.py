"""The conjunction workload of DualQuery: answers against brute force, on records and on tables."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.errors import QueryError
from dpopt.model.data import Dataset
from dpopt.model.domain import MAX_DENSE_CELLS, Domain
from dpopt.model.queries import Conjunctions, Marginal, distinct_records


def small():
    dom = Domain.from_dict({"a": 3, "b": 2, "c": 4, "d": 2})
    gen = np.random.default_rng(0)  # test input, not privacy noise
    codes = np.stack([gen.integers(0, s, 200) for s in dom.sizes], axis=1)
    return dom, codes


def brute_matrix(q: Conjunctions) -> np.ndarray:
    """Row i, column c: whether cell c satisfies row i, by evaluating every cell."""
    cells = q.domain.unravel(np.arange(q.domain.size))
    return np.stack([q.satisfied(c) for c in cells], axis=1).astype(np.float64)


def test_operator_matches_the_brute_force_matrix():
    dom, codes = small()
    q = Conjunctions.random(dom, 2, 15, seed=3).with_negations()
    q = Conjunctions(dom, np.concatenate([q.positions, [[0, -1]]]), np.concatenate([q.values, [[2, 0]]]),
                     np.concatenate([q.negated, [True]]))  # a one-literal negated row too
    M = brute_matrix(q)
    assert np.array_equal(q.to_dense(), M)
    x = np.random.default_rng(1).integers(0, 5, dom.size)
    assert np.array_equal(q.matvec(x), M @ x)
    y = np.random.default_rng(2).normal(size=q.num_rows)
    assert np.allclose(q.rmatvec(y), M.T @ y)
    assert np.allclose(q.column_norm_powers(1), M.sum(axis=0))
    assert q.sensitivity(1) == M.sum(axis=0).max()


def test_answers_from_records_equal_the_histogram_answers():
    dom, codes = small()
    q = Conjunctions.random(dom, 3, 40, seed=1).with_negations()
    data = Dataset(codes, dom)
    assert np.array_equal(q.count_records(codes), q.matvec(data.histogram()))
    assert np.array_equal(q.answer(data), q.matvec(data.histogram()))
    weights = np.random.default_rng(4).integers(0, 4, len(codes))
    weighted = Dataset(codes, dom, weights)
    assert np.array_equal(q.count_records(codes, weights), q.matvec(weighted.histogram()))


def test_marginal_cells_are_the_marginals():
    dom, codes = small()
    data = Dataset(codes, dom)
    q = Conjunctions.marginal_cells(dom, [("a", "c"), ("b",)])
    expected = np.concatenate([Marginal(dom, ("a", "c")).answer(data), Marginal(dom, ("b",)).answer(data)])
    assert np.array_equal(q.count_records(codes), expected)
    assert Conjunctions.marginal_cells(dom, 2).num_rows == sum(
        Marginal(dom, m).num_rows for m in [("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("c", "d")])


def test_random_workload_is_reproducible_and_well_formed():
    dom, _ = small()
    q1 = Conjunctions.random(dom, 3, 500, seed=7)
    q2 = Conjunctions.random(dom, 3, 500, seed=7)
    assert np.array_equal(q1.positions, q2.positions) and np.array_equal(q1.values, q2.values)
    assert (np.diff(q1.positions, axis=1) > 0).all()  # three distinct attributes, sorted
    assert (q1.values < np.asarray(dom.sizes)[q1.positions]).all()
    # Every attribute triple appears: uniform 3-subsets of 4 attributes (4 triples, 500 draws).
    assert len(np.unique(q1.positions, axis=0)) == 4
    restricted = Conjunctions.random(dom, 2, 50, seed=1, attributes=["a", "d"])
    assert set(restricted.depends_on) == {"a", "d"}


def test_answers_on_a_domain_far_too_large_to_hold():
    dom = Domain.from_dict({f"x{i}": 10 for i in range(40)})  # 10^40 cells
    assert dom.size > MAX_DENSE_CELLS
    gen = np.random.default_rng(5)
    codes = gen.integers(0, 10, (3000, 40))
    q = Conjunctions.random(dom, 3, 2000, seed=2).with_negations()
    got = q.count_records(codes)
    rows = np.random.default_rng(6).choice(q.num_rows, 50, replace=False)
    for i in rows:  # brute force on the records, row by row
        lit = q.positions[i] >= 0
        hit = (codes[:, q.positions[i][lit]] == q.values[i][lit]).all(axis=1)
        assert got[i] == (len(codes) - hit.sum() if q.negated[i] else hit.sum())


def test_distinct_records_groups_rows_with_their_weights():
    dom = Domain.from_dict({f"x{i}": 1000 for i in range(8)})  # keys need two 62-bit words
    codes = np.array([[1] * 8, [2] * 8, [1] * 8, [1] * 7 + [2]])
    rows, w = distinct_records(codes, dom, np.array([2, 1, 3, 0]))
    got = {tuple(r): int(c) for r, c in zip(rows, w)}
    assert got == {(1,) * 8: 5, (2,) * 8: 1}


@pytest.mark.parametrize("positions, values, message", [
    ([[0, 0]], [[1, 1]], "twice"),
    ([[0, 1]], [[3, 0]], "outside"),
    ([[-1, -1]], [[0, 0]], "no literal"),
    ([[7, -1]], [[0, 0]], "positions"),
])
def test_malformed_rows_are_refused(positions, values, message):
    dom, _ = small()
    with pytest.raises(QueryError, match=message):
        Conjunctions(dom, positions, values)


def test_labels_name_the_literals():
    dom = Domain.from_dict({"sex": ["F", "M"], "age": 3})
    q = Conjunctions.from_literals(dom, [{"sex": "M", "age": 2}]).with_negations()
    assert q.row_labels() == ["sex=M and age=2", "not (sex=M and age=2)"]
