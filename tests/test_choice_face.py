"""The face of a least-squares fit under ``x >= 0``: the cells its Jacobian (and so SURE) counts.

A solver leaves rounding residue on cells that belong at 0 (an interior point stops near the face:
1e-8 to 3e-4 persons beside a largest cell of 3 to 9 on the cases below). A relative threshold on
the cells (``x > 1e-9 max x``) counted them as free, so ``tr J`` was the full dimension and SURE
charged the fit ``2σ²`` per miscounted dimension. The face is now read from the KKT conditions
(``fitted_face``, ``identity_face``): checked against the finite-difference Jacobian of the real
solver, against a closed-form projection with residue put on its zero cells, and the risk estimate
against simulation.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.estimate import reconstruct
from dpopt.estimate.choice.jacobian import EqualityRows, fitted_face, projection_jacobian
from dpopt.estimate.choice.risk import identity_face, identity_l2_risks
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, MarginalWorkload, Total, Weighted
from dpopt.strategy.tables import Workload

from .residual_cases import sparse_residual_case


def _held_total_projection(y: np.ndarray) -> tuple[np.ndarray, float]:
    """The exact ``argmin ‖x − y‖²`` over ``x >= 0``, ``Σ x = Σ y``: ``max(y − τ, 0)`` with ``τ`` from the
    sorted values (the projection onto a scaled simplex, Held, Wolfe and Crowder 1974)."""
    total = float(y.sum())
    u = np.sort(y)[::-1]
    k = np.arange(1, y.size + 1)
    tau = (np.cumsum(u) - total) / k
    rho = int(np.flatnonzero(u - tau > 0).max())
    return np.maximum(y - tau[rho], 0.0), float(tau[rho])


def _sparse_truth(dom: Domain, seed: int) -> np.ndarray:
    gen = np.random.default_rng(seed)  # test input
    x = gen.integers(2, 16, dom.size).astype(float)
    x[: dom.size // 2] = 0.0
    return x


@pytest.mark.parametrize("seed", [0, 3])
def test_the_solver_s_face_gives_the_finite_difference_jacobian(seed):
    """Least squares on the residuals up to order 2 of a sparse table, total held at its estimate:
    the solver's point has residue on the cells at 0, the KKT face's Jacobian is the finite-difference
    one, the relative threshold's is not."""
    dom, q, d, offset, w0 = sparse_residual_case(4, seed)

    def fit(v):
        cs = ConstraintSet(dom, [NonNegativity(), Invariant(Total(dom), np.array([v[offset] / w0]), name="held total")])
        r = reconstruct([Measurement(q, v, "derived", 1.0, 1.0)], cs, "l2")
        assert r.success, r.message
        return r.x

    xhat = fit(d)
    eq = EqualityRows([Total(dom)], 0, (offset, w0))
    face = fitted_face(q, d, xhat, np.ones(dom.size, dtype=bool), eq)
    J = projection_jacobian(q, eq, face)
    h = 1e-5
    fd = np.column_stack([(q.matvec(fit(d + h * e)) - q.matvec(fit(d - h * e))) / (2 * h) for e in np.eye(d.size)])
    assert np.abs(J - fd).max() < 1e-3
    assert abs(np.trace(J) - np.trace(fd)) < 1e-2
    # The cells off the face are at 0 to rounding, and the KKT multipliers there are positive.
    assert xhat[~face].max(initial=0.0) < 1e-3 * xhat.max()
    old = projection_jacobian(q, eq, xhat > 1e-9 * xhat.max())
    if (xhat[~face] > 1e-9 * xhat.max()).any():  # the solver left residue: the old rule over-counts
        assert np.trace(old) > np.trace(fd) + 0.5


def test_residue_on_the_zero_cells_does_not_move_the_face():
    """A closed-form projection (total held at Σ y) with 8e-8 put on every cell at 0, largest cell ≈ 50:
    both face rules give the exact face, and the identity Jacobian on it is the finite-difference one."""
    dom = Domain.from_dict({f"a{i}": 2 for i in range(5)})
    gen = np.random.default_rng(11)  # test input and test noise
    x = np.zeros(dom.size)
    x[:6] = [50.0, 30.0, 12.0, 9.0, 4.0, 2.0]
    sigma = 3.0
    y = x + gen.normal(0, sigma, dom.size)
    exact, tau = _held_total_projection(y)
    assert 0 < (exact > 0).sum() < dom.size
    dirty = np.where(exact > 0, exact, 8e-8)
    free = np.ones(dom.size, dtype=bool)
    assert (dirty > 1e-9 * dirty.max()).all()  # the old rule: every cell free
    assert np.array_equal(identity_face(y, dirty, free, "moving"), exact > 0)
    q = Weighted(Identity(dom), 1.0 / sigma)
    eq = EqualityRows([Total(dom)], 0, None)
    face = fitted_face(q, y / sigma, dirty, free, eq)
    assert np.array_equal(face, exact > 0)
    J = projection_jacobian(q, eq, face)  # the total's target fixed: ∂x̂/∂y on the face with Σ x̂ fixed
    step = 1e-6
    fd = np.column_stack([(_held_total_projection(y + step * e * sigma)[0]
                           - _held_total_projection(y - step * e * sigma)[0]) / (2 * step * sigma)
                          for e in np.eye(y.size)])
    # J is ∂(C x̂)/∂d with the total fixed; the closed form moves the total with y: compare on the
    # directions that keep Σ y (the projector's range is the same, the total's row is the difference).
    keep = np.eye(y.size) - np.ones((y.size, y.size)) / y.size
    assert np.abs(J @ keep - fd @ keep).max() < 1e-6


def test_the_identity_risk_is_unbiased_when_the_solver_leaves_residue():
    """SURE of least squares on the histogram (total held at Σ y) with 8e-8 of residue on the cells at
    0, against the true error over 2,000 Gaussian draws: unbiased within 4 standard errors with the
    KKT face; the relative threshold, which counts every cell, is biased high by more than 10."""
    dom = Domain.from_dict({f"a{i}": 2 for i in range(4)})
    x = _sparse_truth(dom, 5)
    sigma = 3.0
    W = Workload.all_k_way(dom, 2)
    MW = MarginalWorkload(dom, [t.attrs for t in W.tables])
    free = np.ones(dom.size, dtype=bool)
    norms = sum(float(np.sum(t.query(dom).column_norm_powers(2) * np.ones(dom.size))) for t in W.tables)
    gen = np.random.default_rng(2)  # test noise
    new, old, true = [], [], []
    for _ in range(2000):
        y = x + gen.normal(0, sigma, dom.size)
        exact, _ = _held_total_projection(y)
        dirty = np.where(exact > 0, exact, 8e-8 * max(1.0, exact.max() / 50))
        risk = sum(r.risk for r in identity_l2_risks(W, y, dirty, free, sigma**2, None, "moving"))
        new.append(risk)
        # the old face: every cell above 1e-9 of the largest (all of them here), so τ's divergence term is 0
        resid = MW.matvec(dirty - y)
        old.append(float(resid @ resid) + 2 * sigma**2 * norms - sigma**2 * norms)
        e = MW.matvec(exact - x)
        true.append(float(e @ e))
    new, old, true = map(np.asarray, (new, old, true))
    se = (new - true).std(ddof=1) / np.sqrt(true.size)
    assert abs((new - true).mean()) <= 4 * se, ((new - true).mean(), se)
    assert (old - true).mean() > 10 * (old - true).std(ddof=1) / np.sqrt(true.size)


def test_least_squares_risk_on_marginals_is_unbiased(monkeypatch):
    """Gaussian noise on the 2-way marginals of a sparse table (4 binary attributes, half the cells
    empty), least squares on every measured residual with the total held, scored through its face's
    Jacobian: the mean risk estimate equals the mean true error within 4 standard errors over 200
    draws. With the relative threshold (``x > 1e-9 max x``) and the interior point's residue on the
    cells at 0 (the engine's polish off, as it mostly was before #25's crossover fix), the same draws
    are biased high."""
    import dpopt.estimate.engines.least_squares as least_squares
    import dpopt.estimate.choice.rule as rule
    from dpopt.estimate.choice.rule import EstimatorCandidate, choose_fit
    from dpopt.model.queries import Marginal

    dom = Domain.from_dict({f"a{i}": 2 for i in range(4)})
    x = _sparse_truth(dom, 7)
    W = Workload.all_k_way(dom, 2)
    MW = MarginalWorkload(dom, [t.attrs for t in W.tables])
    queries = [Marginal(dom, t.attrs) for t in W.tables]
    sd = 4.0
    gen = np.random.default_rng(8)  # test noise
    draws = [[Measurement(q, q.matvec(x) + gen.normal(0, sd, q.num_rows), "gaussian", sd, sd**2) for q in queries]
             for _ in range(200)]

    def bias(ms_list):
        diffs = []
        for ms in ms_list:
            fc = choose_fit(ms, ConstraintSet(dom), W, candidates=[EstimatorCandidate("l2", "all")], blend=False,
                            select="least")
            e = MW.matvec(fc.chosen.result.x - x)
            diffs.append(fc.chosen.risk - float(e @ e))
        diffs = np.asarray(diffs)
        return diffs.mean(), diffs.std(ddof=1) / np.sqrt(diffs.size)

    mean, se = bias(draws)
    assert abs(mean) <= 4 * se, (mean, se)
    monkeypatch.setattr(rule, "fitted_face",
                        lambda q, d, xx, free, eq=None: free & (xx > 1e-9 * max(float(xx.max()), 1e-300)))
    monkeypatch.setattr(least_squares, "crossover", lambda *args, **kwargs: None)
    old_mean, old_se = bias(draws[:60])
    assert old_mean > 4 * old_se, (old_mean, old_se)
