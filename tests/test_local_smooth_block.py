"""Tests of the per-clique block preconditioner of examples/benchmarks/local_smooth.py (a prototype,
issue 27): equation (P1) of :class:`CliqueBlockPreconditioner` against dense linear algebra."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from dpopt.estimate.marginal_space.layout import ResidualIndex, SetFamily
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries.marginal import Marginal

BENCHMARKS = Path(__file__).resolve().parents[1] / "examples" / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from local_smooth import CliqueBlockPreconditioner, estimate_local_smooth, squared_adjoint  # noqa: E402


def _three_pairs(sizes, zeros, poisson, seed):
    """Every pair of three attributes measured once with Gaussian noise of s.d. 3 (a tiny cyclic
    family), from Poisson counts with the first ``zeros`` cells empty."""
    rng = np.random.default_rng(seed)
    domain = Domain(("a", "b", "c"), sizes)
    x = rng.poisson(poisson, size=domain.size).astype(float)
    x[:zeros] = 0
    ms = []
    for s in [("a", "b"), ("b", "c"), ("a", "c")]:
        q = Marginal(domain, s)
        ms.append(Measurement(q, q.matvec(x) + rng.normal(0, 3, q.num_rows), "gaussian", 3.0, 9.0,
                              label=",".join(s)))
    return ms


def _dense(sizes, cliques, seed):
    """The family, dense ``E``, a curvature spanning ~1e10, ``H = Eᵀ D E``, and the preconditioner
    as a dense matrix on the free residuals (the total, residual 0, held fixed)."""
    domain = Domain(tuple("abcd"[:len(sizes)]), sizes)
    index = ResidualIndex(domain, cliques)
    family = SetFamily(index, cliques)
    dense = np.stack([family.expand(v) for v in np.eye(index.size)], 1)
    curvature = np.exp(np.random.default_rng(seed).normal(0.0, 4.0, family.size))
    floor = np.full(family.size, 0.5)
    hessian = dense.T @ ((floor + curvature)[:, None] * dense)
    free = np.ones(index.size, dtype=bool)
    free[index.set_offsets[index.position_of(())]] = False
    block = CliqueBlockPreconditioner(family, free, floor)
    diagonal = squared_adjoint(family, floor + curvature)
    np.testing.assert_allclose(diagonal, np.diag(hessian), rtol=1e-10)
    block.update(curvature, diagonal)
    applied = np.stack([block(v) for v in np.eye(index.size)], 1)
    return hessian[np.ix_(free, free)], applied[np.ix_(free, free)]


@pytest.mark.parametrize("sizes", [(3, 4, 2), (40, 3, 5)])  # a dense transform, and per-axis cumulative sums
def test_one_clique_is_inverted_exactly_on_the_free_residuals(sizes):
    hessian, applied = _dense(sizes, [(0, 1, 2)], seed=1)
    np.testing.assert_allclose(applied @ hessian, np.eye(len(hessian)), atol=1e-6)


def test_overlapping_cliques_give_a_symmetric_positive_definite_preconditioner():
    hessian, applied = _dense((3, 4, 2, 5), [(0, 1, 2), (1, 2, 3), (0, 3)], seed=2)
    np.testing.assert_allclose(applied, applied.T, atol=1e-12 * np.abs(applied).max())
    assert np.linalg.eigvalsh(0.5 * (applied + applied.T)).min() > 0


@pytest.mark.parametrize("counting", ["cliques", "conditional"])
def test_block_preconditioned_newton_reaches_the_jacobi_optimum(counting):
    ms = _three_pairs((3, 3, 2), zeros=4, poisson=5, seed=0)
    jacobi = estimate_local_smooth(ms, steps=1, prior="uniform", counting=counting)
    block = estimate_local_smooth(ms, steps=1, prior="uniform", counting=counting, preconditioner="block")
    path = estimate_local_smooth(ms, steps=1, prior="uniform", counting=counting, preconditioner="block",
                                 lam_path=(100.0, 0.1))
    for est in (jacobi, block, path):
        assert est.success and est.info["certificate"]["gap"] <= 1e-6
    # both certified to a relative gap of 1e-7, W-strong convexity: |Δr|_W <= sqrt(2 gap (1+f)) each
    np.testing.assert_allclose(block.clique_marginals, jacobi.clique_marginals, atol=1e-3)
    np.testing.assert_allclose(path.clique_marginals, jacobi.clique_marginals, atol=1e-3)


@pytest.mark.parametrize("counting", ["cliques", "conditional"])
@pytest.mark.parametrize("steps", [1, 3])
def test_primal_dual_newton_reaches_the_primal_optimum(counting, steps):
    """The primal-dual step (clique cells as variables, local_smooth._newton_pd) certifies on ``r``
    with the primal certificate, so both optima agree to the certificate's accuracy; data with a
    zero block and λ at a tenth of the default put cells near the barrier."""
    ms = _three_pairs((4, 3, 3), zeros=12, poisson=4, seed=3)
    options = dict(steps=steps, prior="uniform", counting=counting, preconditioner="block", smoothing=0.1)
    primal = estimate_local_smooth(ms, **options)
    dual = estimate_local_smooth(ms, **options, newton="primal-dual")
    for est in (primal, dual):
        assert est.success and est.info["certificate"]["gap"] <= 1e-6 and est.clique_marginals.min() > 0
    np.testing.assert_allclose(dual.clique_marginals, primal.clique_marginals, atol=1e-3)
