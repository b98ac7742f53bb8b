"""The smooth fit's Jacobian where equality rows pin cells at 0 or repeat each other.

A published state total of 0 pins that state's cells at 0 (the smooth engine leaves them at
rounding size, ~1e-17), and a total beside the state totals it sums is a dependent row: both made
``G / λ + V`` singular to rounding in the Jacobian's solve (726 LinAlgWarnings when auditing
``quickstart_auto``). The reduced system must give the finite-difference Jacobian without a warning.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg as la

from dpopt.estimate import reconstruct
from dpopt.estimate.choice.jacobian import EqualityRows, fitted_face, projection_jacobian, smooth_jacobian
from dpopt.estimate.choice.statistics import residual_statistics
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity, StructuralZeros
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, Marginal, Total


def _case(seed: int, dependent: bool):
    """State (2) x a (2) x b (3); state 1 empty, so its published total is 0; a structural zero;
    all residuals up to 2-way fitted (whitened, unit variance), the state totals held exactly (and
    the grand total too when ``dependent``)."""
    dom = Domain.from_dict({"s": 2, "a": 2, "b": 3})
    gen = np.random.default_rng(seed)  # test input and test noise
    x = gen.integers(1, 8, dom.size).astype(float)
    x[dom.size // 2:] = 0.0
    zero = np.zeros(dom.size, dtype=bool)
    zero[1] = True  # s=0, a=0, b=1
    x[zero] = 0.0
    m0 = Measurement(Identity(dom), x + gen.normal(0, 2.0, dom.size), "gaussian", 2.0, 4.0)
    meas = residual_statistics([m0]).measurement()
    queries, values = [Marginal(dom, ("s",))], [Marginal(dom, ("s",)).matvec(x)]
    if dependent:
        queries.append(Total(dom))
        values.append(np.array([x.sum()]))
    cs = ConstraintSet(dom, [NonNegativity(), StructuralZeros("s == 0 and a == 0 and b == 1", name="rule")]
                       + [Invariant(q, v, name=f"inv{i}") for i, (q, v) in enumerate(zip(queries, values))])
    eq = EqualityRows(queries, None, None, np.concatenate(values))
    return dom, meas.query, np.asarray(meas.values), cs, eq, x.sum()


def test_smooth_jacobian_with_a_zero_state_and_dependent_rows_matches_finite_differences():
    dom, q, d, cs, eq, total = _case(3, dependent=True)
    free = ~cs.zero_mask()
    prior = np.where(free, total / free.sum(), 0.0)

    def fit(v):
        r = reconstruct([Measurement(q, v, "derived", 1.0, 1.0)], cs, "smooth", prior=prior, iterates=True,
                        smoothing=2.0)
        assert r.status.name == "OPTIMAL", r.message
        return r

    r = fit(d)
    assert np.any((r.x > 0) & (r.x < 1e-12))  # the empty state's cells: rounding-sized, not 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", la.LinAlgWarning)
        J = smooth_jacobian(q, eq, r.info["iterates"], r.info["lambda"], False)
    h = 1e-5
    fd = np.column_stack([(q.matvec(fit(d + h * e).x) - q.matvec(fit(d - h * e).x)) / (2 * h)
                          for e in np.eye(d.size)])
    assert np.abs(J - fd).max() < 1e-7
    assert abs(np.trace(J) - np.trace(fd)) < 1e-7


def test_pinned_cells_are_those_a_zero_total_of_one_sign_covers():
    dom = Domain.from_dict({"s": 3, "a": 2})
    s = Marginal(dom, ("s",))
    eq = EqualityRows([s, Total(dom)], None, None, np.array([4.0, 0.0, 2.0, 6.0]))
    assert np.array_equal(eq.pinned_cells(dom.size), np.repeat([False, True, False], 2))
    moving = EqualityRows([Total(dom)], 0, (0, 1.0), np.array([0.0]))  # a held total moves with d
    assert not moving.pinned_cells(dom.size).any()


def test_projection_jacobian_with_a_zero_state_matches_finite_differences():
    dom, q, d, cs, eq, _ = _case(5, True)

    def fit(v):
        r = reconstruct([Measurement(q, v, "derived", 1.0, 1.0)], cs, "l2")
        assert r.success, r.message
        return r

    r = fit(d)
    with warnings.catch_warnings():
        warnings.simplefilter("error", la.LinAlgWarning)
        J = projection_jacobian(q, eq, fitted_face(q, d, r.x, ~cs.zero_mask(), eq))
    h = 1e-6
    fd = np.column_stack([(q.matvec(fit(d + h * e).x) - q.matvec(fit(d - h * e).x)) / (2 * h)
                          for e in np.eye(d.size)])
    assert np.abs(J - fd).max() < 1e-5


def test_dense_rows_give_the_residual_query_s_choice_and_risks(monkeypatch):
    """Small families are fitted on the rows as one dense array (``DenseRows``, for speed): the same
    choice, fits and risk estimates (to 1e-10 relative) as on the residual query itself, here with
    a zero state total and Laplace noise as in the audit of quickstart_auto."""
    import dpopt.estimate.choice.rule as rule
    from dpopt.estimate.choice.rule import choose_fit
    from dpopt.strategy.tables import Workload

    dom = Domain.from_dict({"s": 2, "a": 2, "b": 3})
    gen = np.random.default_rng(4)  # test input and test noise
    x = gen.integers(0, 6, dom.size).astype(float)
    x[dom.size // 2:] = 0.0
    W = Workload.marginals(dom, [("s", "a"), ("a", "b")])
    ms = [Measurement(Marginal(dom, t.attrs), Marginal(dom, t.attrs).matvec(x)
                      + gen.laplace(0, 1.5, Marginal(dom, t.attrs).num_rows), "laplace", 1.5 * np.sqrt(2), 4.5)
          for t in W.tables]
    s = Marginal(dom, ("s",))
    cs = ConstraintSet(dom, [Invariant(s, s.matvec(x), name="state totals")])
    dense = choose_fit(ms, cs, W)
    monkeypatch.setattr(rule, "EXPLICIT_GRAM", 0)
    residual = choose_fit(ms, cs, W)
    assert dense.chosen.candidate.name == residual.chosen.candidate.name
    assert [e.candidate.name for e in dense.evidence] == [e.candidate.name for e in residual.evidence]
    for a, b in zip(dense.evidence, residual.evidence):
        if np.isfinite(b.risk):
            assert np.allclose([a.risk] + [r.risk for r in a.tables], [b.risk] + [r.risk for r in b.tables],
                               rtol=1e-10, atol=0)
    assert np.allclose(dense.result.x, residual.result.x, rtol=0, atol=1e-9 * x.max())
