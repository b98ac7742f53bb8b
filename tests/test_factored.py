"""Factored MWEM (Hardt, Ligett, McSherry 2012, Sec. 4): the factored table against dense MW
states and a plain dense re-implementation of the paper's update, moment-based marginals and
matrix-product data answers against brute force, whole runs against the dense ``mwem``."""

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from dpopt.algorithms.mwem import mwem
from dpopt.algorithms.mwem_factored import binary_marginal_counts, factored_mwem
from dpopt.errors import DataError, DomainError, ParameterError, PrivacyParameterError, QueryError, SolverError
from dpopt.estimate.engines.factored import (
    BinaryMarginalCells,
    FactoredMWState,
    FactoredTable,
    attribute_combinations,
    inclusion_exclusion_matrix,
    superset_sums,
)
from dpopt.estimate.engines.mw_step import MWState
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import Marginal, all_marginals
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.randomness import make_random

BITS = Domain(tuple("abcdefg"), (2,) * 7)


@pytest.fixture(scope="module")
def bits_data():
    gen = np.random.default_rng(7)
    # correlated bits: a few latent factors, so that the marginals are far from uniform
    latent = gen.random((400, 3)) < 0.4
    noise = gen.random((400, 7)) < 0.15
    codes = (latent[:, [0, 0, 1, 1, 2, 2, 0]] ^ noise).astype(np.int64)
    return Dataset(codes, BITS)


def dense_reference(domain, n, steps, start=None):
    """The paper's update written plainly over dense marginal matrices.

    ``steps`` lists ``(terms, passes)``: ``passes`` times, for each term ``(attrs, sums,
    counts)`` in order, ``A *= exp(Q^T (sums - counts * Q A) / (2n))``, renormalised to n.
    """
    A = np.full(domain.size, n / domain.size) if start is None else start.copy()
    for terms, passes in steps:
        for _ in range(passes):
            for attrs, sums, counts in terms:
                Q = Marginal(domain, attrs).to_dense()
                A = A * np.exp(Q.T @ (sums - counts * (Q @ A)) / (2.0 * n))
                A = A * (n / A.sum())
    return A


def all_marginals_of(x_or_table, domain, kmax=3):
    out = []
    for k in range(1, kmax + 1):
        for attrs in combinations(domain.attrs, k):
            if isinstance(x_or_table, FactoredTable):
                out.append(x_or_table.marginal(attrs))
            else:
                out.append(Marginal(domain, attrs).matvec(x_or_table))
    return np.concatenate(out)


# ---- (a) the factored table and its MW state --------------------------------------------------
def test_to_dense_order_and_marginals_on_mixed_domain():
    dom = Domain(("a", "b", "c", "d"), (2, 3, 2, 4))
    gen = np.random.default_rng(0)
    tca = gen.random((2, 2))  # over (c, a): not domain order
    tb, td = gen.random(3), gen.random(4)
    table = FactoredTable(dom, 50.0, tables={("c", "a"): tca, "b": tb, ("d",): td})
    joint_ac = (tca / tca.sum()).T  # (a, c)
    expected = 50.0 * np.einsum("ac,b,d->abcd", joint_ac, tb / tb.sum(), td / td.sum()).reshape(-1)
    np.testing.assert_allclose(table.to_dense(), expected, rtol=1e-13)
    assert table.groups == [("a", "c"), ("b",), ("d",)]
    for k in (1, 2, 3, 4):
        for attrs in combinations(("d", "b", "a", "c"), k):  # any order given: answers in domain order
            np.testing.assert_allclose(table.marginal(attrs), Marginal(dom, attrs).matvec(expected), rtol=1e-12)
    table.merge(["b", "d"])
    assert table.groups == [("a", "c"), ("b", "d")] and table.group_table("d").shape == (3, 4)
    np.testing.assert_allclose(table.to_dense(), expected, rtol=1e-13)  # merging keeps the distribution
    with pytest.raises(QueryError, match="span 2 groups"):
        table.multiply(["a", "b"], np.ones(6))


def test_mw_state_matches_dense_state_and_reference():
    """A fixed sequence: cells and whole marginals, measurements spanning groups (merges),
    a repeated marginal (one merged term), passes over everything and over one group only."""
    dom = Domain(tuple("abcdef"), (2, 3, 2, 2, 2, 2))
    n = 300.0
    gen = np.random.default_rng(1)
    seq = [  # (attrs, measured cells)
        (("a", "b"), [4]), (("c",), [0, 1]), (("b", "d", "e"), [3]), (("a", "b"), [0, 1, 2, 3, 4, 5]),
        (("f",), [1]), (("a", "b"), [2]), (("c", "f"), [0, 3]),
    ]
    values = [n / len(cells) / 2 + gen.normal(0, 20, len(cells)) for _, cells in seq]
    for merge in (True, False):
        fac = FactoredMWState(FactoredTable(dom, n), merge=merge)
        den = MWState(dom, n, merge=merge)
        for i, ((attrs, cells), v) in enumerate(zip(seq, values)):
            key = attrs if merge else i
            fac.add_measurement(attrs, cells, v, key=key)
            den.add_measurement(Marginal(dom, attrs), cells, v, key=key)
            if i % 2 == 0:
                fac.update_once(attrs, cells, v)
                den.update_once(Marginal(dom, attrs), cells, v)
            else:
                fac.passes(2)
                den.passes(2)
        assert fac.table.groups == [("a", "b", "d", "e"), ("c", "f")]
        np.testing.assert_allclose(fac.table.to_dense(), den.x, rtol=1e-10)
        np.testing.assert_allclose(all_marginals_of(fac.table, dom), all_marginals_of(den.x, dom), rtol=1e-9)
        assert abs(fac.table.to_dense().sum() - n) < 1e-9 * n

    # the independent plain re-implementation, including passes over one group's terms only
    fac = FactoredMWState(FactoredTable(dom, n))
    steps, terms = [], {}
    for (attrs, cells), v in zip(seq, values):
        fac.add_measurement(attrs, cells, v)
        size = Marginal(dom, attrs).num_rows
        sums, counts = terms.get(attrs, (np.zeros(size), np.zeros(size)))
        sums, counts = sums.copy(), counts.copy()
        np.add.at(sums, cells, v)
        np.add.at(counts, cells, 1.0)
        terms[attrs] = (sums, counts)
    fac.passes(3)
    before_cf = fac.table.group_table("c")
    fac.passes(4, group="d")  # the group (a, b, d, e) only
    np.testing.assert_array_equal(fac.table.group_table("f"), before_cf)  # other groups untouched
    listed = [(attrs, *terms[attrs]) for attrs in terms]
    in_group = [t for t in listed if set(t[0]) <= set("abde")]
    expected = dense_reference(dom, n, [(listed, 3), (in_group, 4)])
    np.testing.assert_allclose(fac.table.to_dense(), expected, rtol=1e-10)
    np.testing.assert_allclose(all_marginals_of(fac.table, dom), all_marginals_of(expected, dom), rtol=1e-9)
    assert [t.attrs for t in fac.terms_of_group("e")] == [("a", "b"), ("b", "d", "e")]


# ---- (b) moments and inclusion-exclusion against brute force -----------------------------------
def brute_cells(table, k):
    dense = table.to_dense() / table.total
    return np.array([Marginal(table.domain, [table.domain.attrs[i] for i in c]).matvec(dense)
                     for c in attribute_combinations(len(table.domain), k)])


def test_moment_cells_match_brute_force_and_refresh_incrementally():
    dom = Domain(tuple(f"x{i}" for i in range(8)), (2,) * 8)
    gen = np.random.default_rng(2)
    tables = {("x0", "x3"): gen.random((2, 2)), ("x1", "x2", "x5"): gen.random((2, 2, 2)), ("x6",): gen.random(2)}
    for k in (1, 2, 3):
        table = FactoredTable(dom, 10.0, tables=tables)
        cells = BinaryMarginalCells(table, k)
        assert cells.combos.tolist() == [list(c) for c in combinations(range(8), k)]
        np.testing.assert_allclose(cells.cells, brute_cells(table, k), atol=1e-13)
        assert cells.refresh().size == 0  # nothing changed
        # change one group, then merge two groups and change the result
        table.multiply(["x2"], [0.3, 1.7])
        idx = cells.refresh()
        touches = np.isin(cells.combos, [1, 2, 5]).any(axis=1)
        assert np.array_equal(idx, np.flatnonzero(touches))
        np.testing.assert_allclose(cells.cells, brute_cells(table, k), atol=1e-13)
        table.merge(["x3", "x5", "x7"])
        table.multiply(["x0", "x5", "x7"], gen.random(8) + 0.2)
        idx = cells.refresh()
        assert np.array_equal(idx, np.flatnonzero(np.isin(cells.combos, [0, 1, 2, 3, 5, 7]).any(axis=1)))
        np.testing.assert_allclose(cells.cells, brute_cells(table, k), atol=1e-13)


def test_superset_sums_and_inclusion_exclusion():
    p = np.random.default_rng(3).random((2, 2, 2))
    z = superset_sums(p)
    for mask in range(8):
        bits = [(mask >> (2 - l)) & 1 for l in range(3)]
        keep = p[tuple(slice(1, 2) if b else slice(None) for b in bits)]
        assert np.isclose(z[mask], keep.sum())
    # inclusion-exclusion inverts the superset sums exactly
    np.testing.assert_allclose(z @ inclusion_exclusion_matrix(3).T, p.reshape(-1), atol=1e-15)


# ---- (c) the data's answers by matrix products ----------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True])
def test_data_counts_equal_bincount_marginals(bits_data, weighted):
    data = bits_data
    if weighted:
        hist = np.random.default_rng(4).integers(0, 40, BITS.size)
        data = Dataset.from_histogram(hist, BITS)
    for k in (1, 2, 3):
        expected = np.array([Marginal(BITS, attrs).answer(data) for attrs in combinations(BITS.attrs, k)])
        for chunk in (None, 37):
            counts = binary_marginal_counts(data, k, chunk_rows=chunk)
            assert counts.shape == (len(expected), 2**k)
            assert np.array_equal(counts, expected)


# ---- (d) whole runs against the dense mwem ----------------------------------------------------------
@pytest.mark.parametrize("ways,select,passes,scope", [
    (2, "query", 0, "all"), (3, "query", 3, "all"), (2, "block", 2, "all"), (3, "block", 0, "all"),
    (1, "query", 1, "all"),
])
def test_seeded_run_equals_dense_mwem(bits_data, ways, select, passes, scope):
    """Same seed and options: the same candidates in the same order with the same scores, so
    the exponential and Laplace mechanisms draw the same numbers and the tables agree."""
    W = all_marginals(BITS, ways)
    dense = mwem(bits_data, W, "3/2", rounds=9, rng=make_random(21), select=select,
                 repeat_passes=passes, final_passes=2)
    fac = factored_mwem(bits_data, ways, "3/2", rounds=9, rng=make_random(21), select=select,
                        repeat_passes=passes, final_passes=2, pass_scope=scope)
    assert fac.selected == dense.selected
    assert fac.marginals == [W[b].attrs for b, _ in dense.selected]
    for mf, md in zip(fac.measurements, dense.measurements):
        assert np.array_equal(mf.values, md.values) and mf.scale == md.scale and mf.noise == md.noise
    np.testing.assert_allclose(fac.table.to_dense(), dense.last, rtol=1e-9)
    assert fac.info["largest_group_cells"] == max(fac.table.group_cells)
    assert set(fac.info) >= {"time_data", "time_score", "time_mask", "time_select", "time_measure", "time_update",
                             "group_sizes"}
    # the default cap (2^20 cells) is far above this 2^7-cell domain: the capped-group policy excluded nothing
    assert fac.info["on_large_group"] == "exclude"
    assert fac.info["excluded_candidates"] == [0] * 9 and fac.info["excluded_candidates_total"] == 0


def test_zcdp_run_equals_dense_mwem(bits_data):
    W = all_marginals(BITS, 2)
    dense = mwem(bits_data, W, rho="1/2", rounds=6, rng=make_random(5))
    fac = factored_mwem(bits_data, 2, rho="1/2", rounds=6, rng=make_random(5), select="query", repeat_passes=0,
                        pass_scope="all", final_passes=0)
    assert fac.selected == dense.selected
    np.testing.assert_allclose(fac.table.to_dense(), dense.last, rtol=1e-9)
    assert all(m.noise == "discrete_gaussian" for m in fac.measurements)
    assert fac.accountant.spent.rho == Fraction(1, 2) == sum(fac.accountant.ledger_frame()["rho"])


def test_group_pass_scope_replays_by_hand(bits_data):
    """pass_scope="group": after each round, passes over the new measurement's group only."""
    res = factored_mwem(bits_data, 2, 2, rounds=7, rng=make_random(8), select="query", repeat_passes=3,
                        pass_scope="group", final_passes=0)
    state = FactoredMWState(FactoredTable(BITS, float(bits_data.total)))
    for attrs, (_, row), m in zip(res.marginals, res.selected, res.measurements):
        state.add_measurement(attrs, [row], m.values)
        state.passes(3, group=attrs[0])
    np.testing.assert_allclose(state.table.to_dense(), res.table.to_dense(), rtol=1e-12)


# ---- (e) the ledger ---------------------------------------------------------------------------------
@pytest.mark.parametrize("select", ["query", "block"])
def test_ledger_sums_exactly_to_epsilon(bits_data, select):
    res = factored_mwem(bits_data, 3, "7/10", rounds=6, rng=make_random(2), select=select)
    frame = res.accountant.ledger_frame()
    assert frame["epsilon"].sum() == Fraction(7, 10) == res.accountant.spent.epsilon
    assert all(e == Fraction(7, 10) / 12 for e in frame["epsilon"])  # eps/(2T) each, Fig. 1
    assert sum("select" in label for label in frame["label"]) == 6 == len(res.measurements)
    assert all(np.isclose(m.scale, 12 / 0.7) for m in res.measurements)  # Laplace scale 2T/eps
    given = Accountant.pure(1)
    factored_mwem(bits_data, 2, "1/3", rounds=4, rng=make_random(3), accountant=given)
    assert given.spent.epsilon == Fraction(1, 3)


# ---- (f) the group-size guard and the capped-group policy ---------------------------------------------
def test_group_size_guard_raises_before_measuring(bits_data):
    """on_large_group="error": the old behaviour, the selection charged and nothing measured."""
    table = FactoredTable(BITS, 10.0, max_group_cells=8)
    table.merge(["a", "b", "c"])
    with pytest.raises(DomainError, match=r"\['c', 'd'\].*16 cells, above max_group_cells=8"):
        table.merge(["c", "d"])
    assert table.groups[0] == ("a", "b", "c")  # unchanged by the refused merge
    with pytest.raises(DomainError, match="max_group_cells=4") as info:
        factored_mwem(bits_data, 3, 1, rounds=3, rng=make_random(1), max_group_cells=4, on_large_group="error")
    assert "round 1 of 3" in str(info.value) and info.value.round == 1
    acc = Accountant.pure(1)
    with pytest.raises(DomainError, match=r"would create a group of 8 cells, above max_group_cells=4"):
        factored_mwem(bits_data, 3, 1, rounds=3, rng=make_random(1), max_group_cells=4, accountant=acc,
                      on_large_group="error")
    labels = list(acc.ledger_frame()["label"])
    assert labels == ["factored mwem round 1: select"]  # the measurement was never paid for


def test_all_candidates_excluded_raises_before_charging(bits_data):
    """A 3-way marginal alone needs 8 cells: with a cap of 4 nothing may be measured, and the
    run stops before round 1 charges anything."""
    for select in ("query", "block"):
        acc = Accountant.pure(1)
        with pytest.raises(DomainError, match=r"round 1 of 3: every one of the 35 3-way marginals .*"
                                              r"max_group_cells=4 .*nothing was charged") as info:
            factored_mwem(bits_data, 3, 1, rounds=3, rng=make_random(1), max_group_cells=4, accountant=acc,
                          select=select)
        assert info.value.round == 1
        assert len(acc.ledger_frame()) == 0 and acc.spent.epsilon == 0


def test_within_cap_equals_brute_force_merges():
    """The vectorised mask against, per candidate, the merged size and an actual merge attempt."""
    dom = Domain(tuple("abcdefgh"), (2, 3, 2, 4, 2, 3, 2, 2))
    layouts = [  # (merges, caps at least the largest group, as in any run)
        ([["a", "d"], ["b", "f", "h"], ["c", "g"]], (18, 20, 36, 64, 143, 144, 300, 10**6, 2**63 + 5)),
        ([["a", "c"], ["e", "g"]], (4, 5, 8, 12, 16, 24, 48)),
        ([], (4, 6, 9, 12)),
    ]
    outcomes = {k: np.zeros(2, dtype=np.int64) for k in (1, 2, 3, 4)}  # refused, allowed
    for merges, caps in layouts:
        table = FactoredTable(dom, 10.0)
        for attrs in merges:
            table.merge(attrs)
        for k in (1, 2, 3, 4):
            combos = attribute_combinations(len(dom), k)
            for cap in caps:
                capped = table.copy()
                capped.max_group_cells = cap
                mask = capped.within_cap(combos)
                sizes = np.array([capped.merged_cells([dom.attrs[i] for i in row]) for row in combos])
                assert np.array_equal(mask, sizes <= cap), (merges, k, cap)
                outcomes[k] += np.bincount(mask.astype(np.int64), minlength=2)
                for row, allowed in zip(combos, mask):
                    trial = capped.copy()
                    try:
                        trial.merge([dom.attrs[i] for i in row])
                        merged = True
                    except DomainError:
                        merged = False
                    assert merged == allowed, (merges, k, cap, row)
    assert all(outcomes[k].min() > 0 for k in (2, 3, 4))  # the caps both admit and refuse
    with pytest.raises(QueryError, match="2-d"):
        table.within_cap(np.array([0, 1]))
    with pytest.raises(QueryError, match="0..7"):
        table.within_cap(np.array([[0, 8]]))


def replay_exclusions(domain, combos, marginals, n, cap, per_marginal):
    """Brute force: replay the run's merges on a fresh table; per round, the candidates whose
    marginal would merge groups beyond ``cap`` (one merged size per candidate)."""
    table = FactoredTable(domain, n, max_group_cells=10**9)
    excluded = []
    for attrs in marginals:
        sizes = np.array([table.merged_cells([domain.attrs[i] for i in row]) for row in combos])
        excluded.append(int((sizes > cap).sum()) * per_marginal)
        assert table.merged_cells(attrs) <= cap  # the selected marginal was a candidate
        table.merge(attrs)
    return excluded, table


@pytest.mark.parametrize("ways,select,cap", [(2, "query", 8), (2, "block", 8), (3, "query", 32), (3, "block", 16)])
def test_capped_groups_run_stays_within_cap(bits_data, ways, select, cap):
    """A full run on a small cap: no group ever exceeds it (groups only grow, and the replay
    checks every round), candidates are excluded once groups grow, and every round's count
    equals the brute-force count; the exponential mechanism saw exactly the rest."""
    rounds = 16
    res = factored_mwem(bits_data, ways, 12, rounds=rounds, rng=make_random(11), select=select,
                        repeat_passes=1, max_group_cells=cap)
    assert len(res.measurements) == rounds and max(res.table.group_cells) <= cap
    assert res.info["largest_group_cells"] <= cap
    combos = attribute_combinations(len(BITS), ways)
    per_marginal = 2**ways if select == "query" else 1
    expected, replayed = replay_exclusions(BITS, combos, res.marginals, float(bits_data.total), cap, per_marginal)
    assert res.info["excluded_candidates"] == expected
    assert res.info["excluded_candidates_total"] == sum(expected) > 0
    assert expected[0] == 0  # singletons: every marginal fits at first
    assert replayed.groups == res.table.groups
    details = list(res.accountant.ledger_frame()["detail"][::2])  # the selections
    assert details == [f"exponential mechanism over {res.info['candidates'] - e} candidates" for e in expected]


@pytest.mark.parametrize("budget", [{"epsilon": "7/10"}, {"rho": "1/3"}])
def test_ledger_exact_with_exclusions(bits_data, budget):
    res = factored_mwem(bits_data, 2, rounds=9, rng=make_random(4), max_group_cells=8, **budget)
    assert res.info["excluded_candidates_total"] > 0
    (name, value), = budget.items()
    frame = res.accountant.ledger_frame()
    assert frame[name].sum() == Fraction(value) == getattr(res.accountant.spent, name)
    assert len(frame) == 18
    if name == "epsilon":
        assert all(c == Fraction(value) / 18 for c in frame[name])  # eps/(2T) each, Fig. 1


@pytest.mark.parametrize("ways,select,passes", [(3, "query", 2), (2, "block", 0)])
def test_exclude_equals_error_mode_when_nothing_is_excluded(bits_data, ways, select, passes):
    """With a cap no merge reaches (2^7 cells here), both policies draw the same numbers."""
    runs = [factored_mwem(bits_data, ways, 2, rounds=8, rng=make_random(6), select=select, repeat_passes=passes,
                          max_group_cells=2**7, on_large_group=mode) for mode in ("exclude", "error")]
    assert runs[0].selected == runs[1].selected
    for a, b in zip(runs[0].measurements, runs[1].measurements):
        assert np.array_equal(a.values, b.values)
    assert np.array_equal(runs[0].table.to_dense(), runs[1].table.to_dense())
    assert [r.info["excluded_candidates"] for r in runs] == [[0] * 8, [0] * 8]


# ---- (g) bad inputs -------------------------------------------------------------------------------------
def test_bad_inputs_raise_named_errors(bits_data):
    mixed = Dataset(np.zeros((3, 3), dtype=np.int64), Domain(("p", "q", "r"), (2, 3, 2)))
    with pytest.raises(DomainError, match="attribute 'q' has 3 values"):
        factored_mwem(mixed, 2, 1, rounds=2)
    with pytest.raises(DomainError, match="attribute 'q' has 3 values"):
        BinaryMarginalCells(FactoredTable(mixed.domain, 3.0), 2)
    for ways in (0, 4, "2", True, 2.0):
        with pytest.raises(QueryError, match="ways"):
            factored_mwem(bits_data, ways, 1, rounds=2)
    tiny = Dataset(np.zeros((3, 2), dtype=np.int64), Domain(("p", "q"), (2, 2)))
    with pytest.raises(QueryError, match="ways=3 exceeds the 2 attributes"):
        factored_mwem(tiny, 3, 1, rounds=2)
    for eps in (0, -1, "-1/2"):
        with pytest.raises(PrivacyParameterError, match="epsilon must be positive"):
            factored_mwem(bits_data, 2, eps, rounds=2)
    with pytest.raises(PrivacyParameterError, match="rho must be positive"):
        factored_mwem(bits_data, 2, rho=0, rounds=2)
    with pytest.raises(PrivacyParameterError, match="exactly one of epsilon"):
        factored_mwem(bits_data, 2, 1, rho=1, rounds=2)
    with pytest.raises(PrivacyParameterError, match="selection_share"):
        factored_mwem(bits_data, 2, 1, rounds=2, selection_share=1)
    for name, value in (("rounds", 0), ("select", "cells"), ("repeat_passes", -1), ("final_passes", 1.5),
                        ("pass_scope", "some"), ("merge", "yes"), ("on_large_group", "skip")):
        with pytest.raises(ParameterError, match=name):
            factored_mwem(bits_data, 2, 1, **{"rounds": 2, name: value})
    with pytest.raises(ParameterError, match="max_group_cells"):
        factored_mwem(bits_data, 2, 1, rounds=2, max_group_cells=0)
    with pytest.raises(DataError, match="Dataset"):
        factored_mwem(bits_data.codes, 2, 1, rounds=2)
    with pytest.raises(DomainError, match="belong to two initial tables"):
        FactoredTable(BITS, 1.0, tables={("a", "b"): np.ones((2, 2)), ("b",): np.ones(2)})
    with pytest.raises(SolverError, match="shape"):
        FactoredTable(BITS, 1.0, tables={("a", "b"): np.ones(4)})
    with pytest.raises(SolverError, match="total"):
        FactoredTable(BITS, 0.0)
    state = FactoredMWState(FactoredTable(BITS, 1.0))
    with pytest.raises(QueryError, match="0..3"):
        state.add_measurement(("a", "b"), [4], [1.0])
    with pytest.raises(SolverError, match="2 values for 1 measured"):
        state.add_measurement(("a", "b"), [1], [1.0, 2.0])
