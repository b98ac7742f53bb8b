"""Standard errors of a consistent estimate: exact GLS, active-set GLS, or a parametric bootstrap.

**GLS (no active bound).** For ``x^ = argmin (Qx - y)^T W (Qx - y)`` subject to ``C x = d``
with ``W = diag(1/sigma^2)`` and noise covariance ``W^{-1}``, write ``x = x0 + N z`` with ``N``
an orthonormal basis of ``null(C)`` (pinned structural zeros included in ``C``). Then
``x^ = x0 + N (N^T H N)^{-1} N^T Q^T W (y - Q x0)`` with ``H = Q^T W Q``, so

    Cov(x^) = N (N^T H N)^{-1} N^T,        Cov(A x^) = A Cov(x^) A^T

(the equality-constrained Gauss–Markov estimator; e.g. Rao, *Linear Statistical Inference*,
4a.9). Exact when no inequality is active: simulated coverage of ``x^ ± 1.96 se`` is 95 %.

**Active bounds.** With non-negativity active on small counts the released estimate is a
projection, not a linear function of ``y``; its spread is smaller than the GLS figure (2–4
times on counts of 0–3 with noise of standard deviation 2). Two remedies:

- ``method="active_set"``: the bounds active at ``x^`` (cells at 0, inequality rows at a
  bound) join ``C`` as equalities. This is the covariance of the estimate *given its active
  set* (the projection is linear on each piece). It is analytic and deterministic but
  approximate: a cell held at 0 gets standard error 0 although on other noise it would be
  positive, so it understates the spread of cells near the bound.
- ``method="bootstrap"``: a parametric bootstrap through the same solve. For every row of
  ``draws`` (noise drawn by the caller from the measurements' laws), ``y* = Q x^ + z*`` is
  solved again with the same objective, constraints and backend; the standard errors are the
  standard deviations of the replicates. It holds for whatever estimator is released (any
  objective, any constraint) to the extent that its spread at ``x^`` resembles its spread at
  the truth. ``dpopt.estimate`` never draws random numbers: the caller passes ``draws`` (for
  example from :mod:`dpopt.privacy.samplers` with each measurement's law, or Gaussian draws
  with its variance). This randomness is post-processing and costs no privacy.

``method="auto"`` uses GLS when no bound is active, the bootstrap when bounds are active and
``draws`` are given, and otherwise the active-set formula with a ``UserWarning``. ``"gls"`` on
an estimate with active bounds warns too. Cells the measurements cannot identify get infinite
standard errors. Dense linear algebra: meant for up to a few thousand free cells.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from dpopt.errors import QueryError, SolverError
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.model.measurement import Measurement

__all__ = ["gls_covariance", "standard_errors", "active_bounds", "bootstrap_replicates", "ERRORBAR_METHODS"]

MAX_ERRORBAR_CELLS = 6000
ERRORBAR_METHODS = ("auto", "gls", "active_set", "bootstrap")
#: A cell within this share of the table's largest value of its bound counts as at the bound.
ACTIVE_TOL = 1e-7


def gls_covariance(problem: ConsistencyProblem, active: np.ndarray | None = None,
                   active_rows: sp.spmatrix | None = None) -> np.ndarray:
    """Covariance of the equality-constrained GLS estimate over all cells (dense n x n).

    ``active`` (a boolean mask of cells) and ``active_rows`` (rows of inequalities at a bound)
    join the equalities: the covariance given the active set.
    """
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
    pinned = problem.constraints.zero_mask() if problem.constraints.zero_rules else np.zeros(n, dtype=bool)
    if active is not None:
        pinned = pinned | active
    if pinned.any():
        zero = np.flatnonzero(pinned)
        pin = np.zeros((zero.size, n))
        pin[np.arange(zero.size), zero] = 1.0
        rows.append(pin)
    if active_rows is not None and active_rows.shape[0]:
        rows.append(sp.csr_matrix(active_rows).toarray())
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


def active_bounds(problem: ConsistencyProblem, x: np.ndarray) -> tuple[np.ndarray, sp.csr_matrix]:
    """Cells where non-negativity is active at ``x`` (structural zeros excluded), and the
    inequality rows at one of their bounds."""
    cs = problem.constraints
    x = np.asarray(x, dtype=np.float64)
    tol = ACTIVE_TOL * max(1.0, float(np.abs(x).max(initial=0.0)))
    pinned = cs.zero_mask() if cs.zero_rules else np.zeros(x.size, dtype=bool)
    at_zero = (x <= tol) & ~pinned if cs.nonnegative else np.zeros(x.size, dtype=bool)
    A, lower, upper, _ = cs.inequality_rows()
    if A.shape[0]:
        ax = A @ x
        scale = tol * np.maximum(1.0, np.abs(ax))
        at = (np.abs(ax - lower) <= scale) | (np.abs(ax - upper) <= scale)
        A = sp.csr_matrix(A)[np.flatnonzero(at)]
    return at_zero, sp.csr_matrix(A)


def _problem_and_estimate(result_or_problem, x):
    problem = getattr(result_or_problem, "problem", result_or_problem)
    if not isinstance(problem, ConsistencyProblem):
        raise SolverError("standard_errors needs a reconstruct() result or a ConsistencyProblem")
    if x is None and problem is not result_or_problem:
        info = getattr(result_or_problem, "info", {}) or {}
        x = info.get("fractional_x", getattr(result_or_problem, "x", None))
    if x is not None:
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (problem.num_cells,):
            raise QueryError(f"the estimate must have {problem.num_cells} cells, got shape {x.shape}")
    return problem, x


def standard_errors(result_or_problem, query=None, *, method: str = "auto", draws: np.ndarray | None = None,
                    x: np.ndarray | None = None, backend: str | None = None, **options) -> np.ndarray:
    """Standard errors of every cell, or of every answer of ``query``, of a consistent estimate.

    Parameters
    ----------
    result_or_problem : Result or ConsistencyProblem
        A :func:`~dpopt.estimate.reconstruct` result (its estimate is read from it, before
        integer rounding if any) or a problem (then pass ``x`` to detect active bounds).
    query : LinearQuery, optional
        Standard errors of its answers instead of the cells.
    method : {"auto", "gls", "active_set", "bootstrap"}
        See the module notes. ``"gls"`` and ``"active_set"`` need the L2 objective.
    draws : ndarray, shape (B, rows), optional
        Noise replicates for the bootstrap, one column per noisy measured row (measurements
        in the problem's order), in the units of the answers; drawn by the caller.
    x : ndarray, optional
        The estimate, when ``result_or_problem`` is a problem.
    backend, **options
        For the bootstrap's solves (default: the result's backend).

    Returns
    -------
    ndarray
        One standard error per cell (or per answer of ``query``); ``inf`` where the
        measurements do not identify it.
    """
    if method not in ERRORBAR_METHODS:
        raise QueryError(f"unknown error-bar method {method!r}; choose one of {list(ERRORBAR_METHODS)}")
    problem, x = _problem_and_estimate(result_or_problem, x)
    active, active_rows = (active_bounds(problem, x) if x is not None
                           else (np.zeros(problem.num_cells, bool), sp.csr_matrix((0, problem.num_cells))))
    n_active = int(active.sum()) + active_rows.shape[0]
    if method == "auto":
        method = "gls" if n_active == 0 else ("bootstrap" if draws is not None else "active_set")
        if method == "active_set":
            warnings.warn(
                f"standard_errors: {n_active} bound(s) are active at the estimate, so the GLS formula does not apply; "
                "using the covariance given the active set, which is approximate (cells held at a bound get 0). "
                "Pass draws= for a parametric bootstrap through the same solve", UserWarning, stacklevel=2)
    if method == "bootstrap":
        if draws is None:
            raise QueryError("method 'bootstrap' needs draws: noise replicates of shape (B, measured rows) drawn "
                             "by the caller from the measurements' laws")
        replicates = bootstrap_replicates(result_or_problem, draws, x=x, backend=backend, **options)
        answers = replicates if query is None else np.stack([query.matvec(r) for r in replicates])
        return answers.std(axis=0, ddof=1)
    if problem.objective != "l2":
        raise SolverError(f"analytic error bars are defined for the l2 objective, not {problem.objective!r}; "
                          "use method='bootstrap'")
    if method == "gls" and n_active:
        warnings.warn(
            f"standard_errors: {n_active} bound(s) are active at the estimate; the GLS formula ignores them and "
            "overstates the error of the released estimate (2-4x on small counts). Use method='bootstrap' with "
            "draws, or 'active_set'", UserWarning, stacklevel=2)
    cov = gls_covariance(problem, active, active_rows) if method == "active_set" else gls_covariance(problem)
    return _spread(cov, query)


def _spread(cov: np.ndarray, query) -> np.ndarray:
    if query is None:
        return np.sqrt(np.maximum(np.diag(cov), 0.0))
    A = query.to_dense()
    finite = np.isfinite(cov)
    if not finite.all():
        reach = np.abs(A[:, ~np.isfinite(np.diag(cov))]).sum(axis=1) > 0
        out = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", A, np.where(finite, cov, 0.0), A), 0.0))
        out[reach] = np.inf
        return out
    return np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", A, cov, A), 0.0))


def bootstrap_replicates(result_or_problem, draws: np.ndarray, *, x: np.ndarray | None = None,
                         backend: str | None = None, **options) -> np.ndarray:
    """Estimates re-solved on ``y* = Q x^ + z*`` for each row ``z*`` of ``draws`` (shape ``(B, n)``).

    The same objective and constraints as the original problem; ``backend`` defaults to the
    result's. A replicate whose solve fails raises :class:`SolverError` naming it.
    """
    from dpopt.estimate import reconstruct  # the package entry point (imports this module)

    problem, x = _problem_and_estimate(result_or_problem, x)
    if x is None:
        raise QueryError("the bootstrap needs the estimate: pass a reconstruct() result or x=")
    draws = np.asarray(draws, dtype=np.float64)
    rows = problem.num_rows
    if draws.ndim != 2 or draws.shape[1] != rows or draws.shape[0] < 2 or not np.isfinite(draws).all():
        raise QueryError(f"draws must be a finite array of shape (B >= 2, {rows}) (one column per noisy measured row), "
                         f"got shape {draws.shape}")
    if backend is None:
        backend = getattr(result_or_problem, "backend", None)
        backend = backend if backend in ("clarabel", "cvxpy", "scipy", "highs", "pulp", "exact", "mw") else None
    fitted = [m.query.matvec(x) for m in problem.noisy]
    splits = np.cumsum([m.query.num_rows for m in problem.noisy])[:-1]
    out = np.empty((draws.shape[0], problem.num_cells))
    for b, z in enumerate(draws):
        ms = [Measurement(m.query, f + part, m.noise, m.scale, m.variance, m.cost, m.label, m.info)
              for m, f, part in zip(problem.noisy, fitted, np.split(z, splits))]
        rep = reconstruct(ms, problem.constraints, problem.objective, backend=backend, integer=False, **options)
        if not rep.success and backend is not None and not options:
            # A solver's rare numerical failure (HiGHS's QP: about 1 solve in 1000 on tiny tables)
            # must not bias the replicates by dropping them: solve the same problem with the default.
            rep = reconstruct(ms, problem.constraints, problem.objective, integer=False)
        if not rep.success:
            raise SolverError(f"bootstrap replicate {b} did not solve: {rep.status.name}: {rep.message}")
        out[b] = rep.x
    return out
