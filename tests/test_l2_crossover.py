"""The l2 engine's active-set polish (``crossover``) lands the interior point exactly on its face.

The reproducer is the fit ``auto`` makes under zCDP: least squares on a derived residual
measurement (the residuals up to order 2 of a noisy histogram) with the total held. The
interior point left up to 3e-3 persons on cells that belong at 0, and the polish was dropped
in 56 of 60 such fits (``examples/benchmarks/bench_l2_crossover.py --family``, #25): moving
*every* positive cell onto ``Q x = b*`` spread that residue and turned bound cells negative. Checked here against HiGHS's QP solver (an active-set method,
through cvxpy, at its default tolerances: primal and dual feasibility 1e-7) and Clarabel.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.estimate import reconstruct
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Total

from .residual_cases import sparse_residual_case

cp = pytest.importorskip("cvxpy")


def _held_total_residual_fit(d: int, seed: int):
    """The derived residual measurement (orders <= 2) of a sparse table's noisy histogram and the
    held total: ``(measurements, constraints, Q dense, answers v, total)``."""
    dom, q, v, offset, w0 = sparse_residual_case(d, seed)
    total = max(float(v[offset] / w0), 1.0)
    cs = ConstraintSet(dom, [NonNegativity(), Invariant(Total(dom), np.array([total]), name="held total")])
    return [Measurement(q, v, "derived", 1.0, 1.0)], cs, q.to_dense(), v, total


def _reference(Q, v, total, solver):
    """``min ‖Q x − v‖²`` over ``x >= 0``, ``Σ x = total`` by an independent solver: the point, the bound
    multipliers and the objective."""
    x = cp.Variable(Q.shape[1])
    nonneg = x >= 0
    problem = cp.Problem(cp.Minimize(cp.sum_squares(Q @ x - v)), [cp.sum(x) == total, nonneg])
    problem.solve(solver=solver)
    assert problem.status == "optimal", f"{solver}: {problem.status}"
    return np.asarray(x.value), np.asarray(nonneg.dual_value), float(problem.value)


@pytest.mark.parametrize("d", [4, 5, 6])
def test_a_held_total_residual_fit_lands_exactly_on_its_face(d):
    """Over 8 draws: the polish runs every time; every cell HiGHS's multipliers put at 0 (multiplier above
    1e-4 of the gradient's scale: a thousand times HiGHS's dual tolerance) is exactly 0.0; and the
    point is an optimum by the KKT conditions computed here, in exact zeros (no threshold on x)."""
    bound_cells = 0
    for seed in range(8):
        ms, cs, Q, v, total = _held_total_residual_fit(d, seed)
        r = reconstruct(ms, cs, "l2")
        assert r.success, r.message
        assert "crossover" in r.info, f"seed {seed}: the polish did not run"
        x = r.x
        _, mu, _ = _reference(Q, v, total, cp.HIGHS)
        scale = float(np.abs(2 * Q.T @ v).max())
        bound = mu > 1e-4 * scale
        bound_cells += int(bound.sum())
        assert np.all(x[bound] == 0.0), f"seed {seed}: {x[bound].max():.2e} left on a cell at its bound"
        # KKT at x itself: the gradient plus the total's multiplier vanishes on x > 0 and is >= 0 on x == 0.
        g = 2 * Q.T @ (Q @ x - v)
        positive = x > 0
        nu = -float(np.mean(g[positive]))
        assert np.abs(g[positive] + nu).max() <= 1e-9 * scale
        assert (g[~positive] + nu).min(initial=0.0) >= -1e-9 * scale
        assert x.min() >= 0.0 and abs(x.sum() - total) <= 1e-9 * total
    assert bound_cells >= 8 * 2 ** d // 4  # the family has cells at their bound (169-701 over 20 draws)


@pytest.mark.parametrize("solver", ["HIGHS", "CLARABEL"])
def test_the_polished_fit_equals_an_independent_solve(solver):
    """The answers ``Q x`` are unique at the optimum. For a feasible ``x_ref``, ``f(x_ref) − f(x) ≥
    ‖Q (x_ref − x)‖²`` when ``x`` is optimal (the linear term is ≥ 0 by optimality): so the reference's
    objective is no lower than ours beyond its own certified accuracy (HiGHS: primal and dual feasibility
    1e-7, its defaults; Clarabel: gap and feasibility 1e-8; compared at 1e-7 of ``1 + ‖v‖²``), and its
    answers are within the square root of the objective gap of ours."""
    for d, seed in [(4, 1), (5, 2), (6, 3)]:
        ms, cs, Q, v, total = _held_total_residual_fit(d, seed)
        x = reconstruct(ms, cs, "l2").x
        x_ref, _, f_ref = _reference(Q, v, total, getattr(cp, solver))
        f = float(np.sum((Q @ x - v) ** 2))
        size = 1.0 + float(v @ v)
        assert f <= f_ref + 1e-7 * size
        gap = max(f_ref - f, 0.0)
        x_ref = np.maximum(x_ref, 0.0) * total / np.maximum(x_ref, 0.0).sum()  # the reference made feasible
        f_feasible = float(np.sum((Q @ x_ref - v) ** 2))
        assert float(np.sum((Q @ (x_ref - x)) ** 2)) <= max(f_feasible - f, 0.0) + 1e-9 * size
        assert np.abs(Q @ (x_ref - x)).max() <= np.sqrt(max(f_feasible - f, 0.0) + 1e-9 * size)
        assert gap <= 1e-6 * size
