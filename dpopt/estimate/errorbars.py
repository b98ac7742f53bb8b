"""Standard errors of a least-squares estimate with equality constraints (the GLS covariance).

For ``x^ = argmin (Qx - y)^T W (Qx - y)`` subject to ``C x = d`` with ``W = diag(1/sigma^2)``
and noise covariance ``W^{-1}``, write ``x = x0 + N z`` with ``N`` an orthonormal basis of
``null(C)`` (pinned structural zeros included in ``C``). Then
``x^ = x0 + N (N^T H N)^{-1} N^T Q^T W (y - Q x0)`` with ``H = Q^T W Q``, so

    Cov(x^) = N (N^T H N)^{-1} N^T,        Cov(A x^) = A Cov(x^) A^T

(the equality-constrained Gauss–Markov estimator; e.g. Rao, *Linear Statistical Inference*,
4a.9). It ignores inequality constraints and non-negativity: when bounds are active the
estimate is no longer linear in ``y`` and these figures describe the unconstrained-by-bounds
GLS solution. Cells the measurements cannot identify get infinite standard errors.
Dense linear algebra: meant for up to a few thousand free cells.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la

from dpopt.errors import SolverError
from dpopt.estimate.problem import ConsistencyProblem

MAX_ERRORBAR_CELLS = 6000


def gls_covariance(problem: ConsistencyProblem) -> np.ndarray:
    """Covariance of the equality-constrained GLS estimate over all cells (dense n x n)."""
    n = problem.num_cells
    if n > MAX_ERRORBAR_CELLS:
        raise SolverError(
            f"error bars use dense linear algebra and are limited to {MAX_ERRORBAR_CELLS} cells; "
            f"this domain has {n}"
        )
    Q = problem.stacked_sparse().toarray()
    w = 1.0 / problem.sigmas() ** 2
    H = Q.T @ (w[:, None] * Q)
    A_eq, _, _ = problem.constraints.equality_rows()
    rows = [A_eq.toarray()]
    if problem.constraints.zero_rules:
        zero = np.flatnonzero(problem.constraints.zero_mask())
        pin = np.zeros((zero.size, n))
        pin[np.arange(zero.size), zero] = 1.0
        rows.append(pin)
    C = np.vstack(rows) if any(r.shape[0] for r in rows) else np.zeros((0, n))
    N = la.null_space(C) if C.shape[0] else np.eye(n)
    if N.shape[1] == 0:
        return np.zeros((n, n))
    reduced = N.T @ H @ N
    eigval, eigvec = la.eigh(reduced)
    scale = max(float(eigval.max()), 1e-300)
    identifiable = eigval > 1e-10 * scale
    inv = (eigvec[:, identifiable] / eigval[identifiable]) @ eigvec[:, identifiable].T
    cov = N @ inv @ N.T
    if not identifiable.all():
        # Directions of null(C) no measurement sees: infinite variance on the cells they touch.
        blind = N @ eigvec[:, ~identifiable]
        touched = np.abs(blind).max(axis=1) > 1e-8
        cov[touched, :] = np.nan
        cov[:, touched] = np.nan
        cov[touched, touched] = np.inf
    return cov


def standard_errors(problem: ConsistencyProblem, query=None) -> np.ndarray:
    """Standard errors of every cell, or of every answer of ``query`` on the estimate."""
    cov = gls_covariance(problem)
    if query is None:
        return np.sqrt(np.diag(cov))
    A = query.to_dense()
    finite = np.isfinite(cov)
    if not finite.all():
        reach = np.abs(A[:, ~np.isfinite(np.diag(cov))]).sum(axis=1) > 0
        out = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", A, np.where(finite, cov, 0.0), A), 0.0))
        out[reach] = np.inf
        return out
    return np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", A, cov, A), 0.0))
