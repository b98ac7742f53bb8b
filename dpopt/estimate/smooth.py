"""The smooth objective: least squares plus a relative-entropy penalty whose weight follows the noise.

    minimise   Φ(x) = ½ Σ_i ((Q x − y)_i / σ_i)²  +  λ D(x ‖ p)
    subject to A x = b (invariants),  x_j = 0 on structural zeros,

with ``D(x ‖ p) = Σ_j x_j log(x_j / p_j) − x_j + p_j`` the generalised relative entropy of
the table to a prior table ``p``. It is the maximum a posteriori table under Gaussian noise
and the *entropic prior* of maximum-entropy image reconstruction (Skilling and Gull 1984;
Gull 1989): ``exp(−D(x ‖ p))`` is, by Stirling's formula, the probability of the counts
``x`` under a multinomial (Poisson) draw with expected counts ``p``. Where the least-squares
and maximum-entropy fits (objectives ``l2`` and ``entropy``) put exact zeros on cells the
measurements cannot resolve, and so have infinite KL(true ‖ estimate) whenever the data
hold a record there, this objective:

- **has a unique optimum**, because ``D`` is strictly convex;
- **keeps full support**: ``x log x`` has slope ``−∞`` at 0, so the optimum is positive on
  every free cell (``info["full_support"]`` says whether that held in floating point,
  ``info["smallest_cell"]`` gives the smallest free cell; nothing is added to the table);
- **lies in the exponential family of the measured queries**: the optimum is
  ``x = p ∘ exp(Qᵀ θ + Aᵀ η)`` (a log-linear model whose sufficient statistics are the
  measured rows, as in the graphical models of Private-PGM), with the natural parameters
  shrunk towards the prior by the penalty;
- **equals the exact fit when the noise vanishes**: with ``λ`` as below, ``σ → 0``
  leaves ``½ ‖Q x − y‖² + σ̄ D(x ‖ p)`` (times ``σ̄²``), whose minimiser tends to the table
  closest to the prior among those that fit the measurements exactly (the maximum-entropy
  exact fit), or among the best fits when none is exact.

**The weight λ follows the noise, never the data.** ``λ = c / σ̄`` with ``σ̄`` the root of
the mean noise variance over the measured rows (``σ̄² = m / Σ_i σ_i⁻²``) and ``c = 1``
(option ``smoothing``). ``λ`` has the units of 1/count. Along a measured row with count
``s``, the penalty's curvature is ``λ / s`` and the data's is ``1 / σ²``: their ratio is
``σ / s`` when ``c = 1``. The prior therefore dominates exactly the rows whose count is
below the noise's standard deviation (signal-to-noise ratio under 1) and gives way to the
data on rows the noise cannot hide. It does not depend on the answers ``y``.

**The prior** is uniform over the free cells with the total ``N̂`` of the measurements
(:meth:`~dpopt.estimate.problem.ConsistencyProblem.total_estimate`: an invariant's total,
or the inverse-variance combination of the measured totals; at least its standard error,
since an estimate at or below zero only says the total is within noise of zero), unless
``prior=`` gives a table. The penalty does not fix the total: the fit decides it.

**Solver.** Newton's method on the concave dual (Boyd and Vandenberghe 2004, §5.2 and
§9.5), in one multiplier per measured row and per invariant row:

    g(ν) = λ Σ_j (p_j − x_j(ν)) − νᵀ d − ½ Σ_i σ_i² ν_i²,     x(ν) = p ∘ exp(−Cᵀ ν / λ),

with ``C`` the measured rows stacked over the invariants' rows, ``d`` their targets and
``σ_i = 0`` on invariant rows. Its Hessian is ``−(C diag(x) Cᵀ / λ + diag(σ²))``:
a dense ``m × m`` matrix solved by Cholesky when ``m`` is at most :data:`EXPLICIT_ROWS` (from
the explicit rows on small domains, or without any matrix over the cells when the rows have
a fast weighted Gram: a marginal workload on a binary domain gets every block from one
Walsh–Hadamard transform); matrix-free conjugate gradients with a diagonal preconditioner
beyond (one ``Cᵀ`` and one ``C`` product per iteration).

**Certificate** (checked by dpopt before OPTIMAL): the gradient of ``Φ`` at ``x``, computed
from ``x`` itself and the invariants' multipliers, vanishes on every free cell
(``info["stationarity"]``, relative); the invariants hold (``info["invariant_residual"]``);
and the duality gap ``Φ(x) − g(ν)`` (``info["duality_gap"]``, relative) is below
:data:`~dpopt.estimate.verify.CERTIFICATE_TOL`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, cg

from dpopt.errors import SolverError
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import Result, make_result
from dpopt.estimate.status import Status
from dpopt.estimate.verify import CERTIFICATE_TOL
from dpopt.model.queries import Identity, Marginal, MarginalWorkload, Total

__all__ = ["SMOOTH_OPTIONS", "smooth_weight", "solve_smooth"]

#: Options of the smooth objective (backend "newton").
SMOOTH_OPTIONS = ("smoothing", "prior", "tol", "max_steps")
#: Explicit Newton systems up to this many rows (with an explicit stacked matrix of at most
#: EXPLICIT_NNZ non-zeros); conjugate gradients beyond.
EXPLICIT_ROWS = 3000
EXPLICIT_NNZ = 3_000_000
#: Conjugate gradients stop at a relative residual of RTOL_FACTOR times the root of Newton's
#: (relative) residual: loose early, tight near the optimum (an inexact Newton forcing term).
RTOL_FACTOR = 0.1


def prior_total(problem: ConsistencyProblem) -> float:
    """The default prior's total: the measurements' total, but at least its standard error (an
    estimate at or below zero says only that the total is within noise of zero)."""
    total, error = problem.total_estimate_with_error()
    if not max(total, error) > 0:
        raise SolverError(f"the smooth objective needs a positive total, the measurements imply {total:g}")
    return max(total, error)


def smooth_weight(problem: ConsistencyProblem, smoothing: float = 1.0) -> float:
    """``λ = smoothing / σ̄``, ``σ̄² = m / Σ_i σ_i⁻²`` over the ``m`` measured rows (module notes);
    1 without noisy measurements (then the optimum does not depend on ``λ``)."""
    sigma = problem.sigmas()
    if sigma.size == 0:
        return 1.0
    return float(smoothing) * float(np.sqrt(np.mean(1.0 / sigma**2)))


@dataclass
class _Rows:
    """The stacked rows ``C`` (measured rows, then invariant rows), targets and variances."""

    matvec: object
    rmatvec: object
    targets: np.ndarray
    variances: np.ndarray  # σ_i² on measured rows, 0 on invariant rows
    num_noisy: int
    gram: object  # x -> C diag(x) Cᵀ as a dense array, or None (conjugate gradients)
    diagonal: object  # x -> diag(C diag(x) Cᵀ), or None


def solve_smooth(problem: ConsistencyProblem, backend: str | None = None, time_limit: float | None = None, *,
                 verbose: bool = False, smoothing: float = 1.0, prior: np.ndarray | None = None,
                 tol: float = 1e-10, max_steps: int = 100) -> Result:
    """The smooth objective's optimum; see the module notes.

    Parameters
    ----------
    problem : ConsistencyProblem
    backend : {None, "newton"}
    time_limit : float, optional
    verbose : bool
        Print one line per Newton step.
    smoothing : float
        ``c`` in ``λ = c / σ̄`` (default 1; larger is smoother).
    prior : ndarray, optional
        The prior table ``p`` over the cells (positive on the free cells); default uniform
        with the measurements' total.
    tol : float
        Newton stops when every row's dual residual is below ``tol`` relative.
    max_steps : int

    Returns
    -------
    Result
        ``fun`` is ``Φ(x)``; ``info`` holds ``lambda``, ``smoothing``, ``prior_total``,
        ``full_support``, ``smallest_cell``, ``kl_to_prior`` (``D(x ‖ p)``), ``chi2``
        (``Σ ((Qx − y)/σ)²``) and the certificate figures (module notes).
    """
    if backend not in (None, "newton"):
        raise SolverError(f"the smooth objective is solved by backend 'newton', not {backend!r}")
    if problem.constraints.inequalities:
        raise SolverError("the smooth objective does not take linear inequalities; use objective 'l2' or 'l1'")
    if not (np.isfinite(smoothing) and smoothing > 0):
        raise SolverError(f"smoothing must be a positive number, got smoothing={smoothing!r}")
    start = time.perf_counter()
    free = problem.free_cells()
    n = problem.num_cells
    p = np.zeros(n)
    if prior is None:
        p[free] = prior_total(problem) / free.size
    else:
        prior = np.asarray(prior, dtype=np.float64)
        if prior.shape != (n,) or not np.isfinite(prior).all() or (prior[free] <= 0).any():
            raise SolverError(f"prior must be a finite table of {n} cells, positive on every free cell")
        p[free] = prior[free]
    lam = smooth_weight(problem, smoothing)
    rows = _stack_rows(problem, n)
    outcome = _newton(rows, p, free, lam, tol, max_steps, time_limit, start, verbose)
    x, nu, steps, status, message = outcome
    info = {"lambda": lam, "smoothing": float(smoothing), "prior_total": float(p.sum()), "newton_steps": steps}
    if x is None:
        return make_result(status, None, message=message, fun=None, objective="smooth", backend="newton",
                           solver="Newton's method on the dual", time=time.perf_counter() - start, nit=steps,
                           problem=problem, info=info)
    certificate = _certificate(problem, rows, x, nu, p, free, lam)
    info.update(certificate)
    positive = x[free] > 0
    info["full_support"] = bool(positive.all())
    info["smallest_cell"] = float(x[free].min()) if free.size else 0.0
    info["kl_to_prior"] = _divergence(x, p, free)
    residual = (problem.stacked_operator().matvec(x) - problem.targets()) if problem.noisy else np.zeros(0)
    info["chi2"] = float(np.sum(residual**2 / problem.sigmas() ** 2)) if problem.noisy else 0.0
    fun = 0.5 * info["chi2"] + lam * info["kl_to_prior"]
    ok = max(certificate["stationarity"], certificate["invariant_residual"], abs(certificate["duality_gap"])) \
        <= CERTIFICATE_TOL
    if status is Status.OPTIMAL and not ok:
        status = Status.NUMERICAL_ERROR
        message += (f"; dpopt's certificate failed: stationarity {certificate['stationarity']:.1e}, invariants "
                    f"{certificate['invariant_residual']:.1e}, duality gap {certificate['duality_gap']:.1e} "
                    f"(tolerance {CERTIFICATE_TOL:g})")
    elif status is Status.OPTIMAL:
        message += (f"; certified: stationarity {certificate['stationarity']:.1e}, duality gap "
                    f"{certificate['duality_gap']:.1e}; {int(positive.sum())} of {free.size} free cells positive "
                    f"(smallest {info['smallest_cell']:.3g})")
    return make_result(status, x, message=message, fun=fun, objective="smooth", backend="newton",
                       solver="Newton's method on the dual" + (" (conjugate gradients)" if rows.gram is None else ""),
                       time=time.perf_counter() - start, nit=steps, problem=problem, info=info,
                       incumbent=status is not Status.OPTIMAL)


def in_units(info: dict, scale: float) -> dict:
    """The engine's figures for counts multiplied by ``scale`` (``λ`` is per count)."""
    out = dict(info)
    if "lambda" in out:
        out["lambda"] = out["lambda"] / scale
    for key in ("prior_total", "smallest_cell"):
        if key in out:
            out[key] = out[key] * scale
    if "kl_to_prior" in out:
        out["kl_to_prior"] = out["kl_to_prior"] * scale  # D is in counts
    return out


# ---- the stacked rows ------------------------------------------------------------------------
def _stack_rows(problem: ConsistencyProblem, n: int) -> _Rows:
    queries = [m.query for m in problem.noisy] + [inv.query for inv in problem.constraints.invariants]
    targets = np.concatenate([problem.targets()] + [np.asarray(inv.values, dtype=np.float64)
                                                   for inv in problem.constraints.invariants])
    variances = np.concatenate([problem.sigmas() ** 2, np.zeros(targets.size - problem.num_rows)])
    noisy_op = problem.stacked_operator() if problem.noisy else None
    invariants = problem.constraints.invariants

    def matvec(x):
        parts = [noisy_op.matvec(x)] if noisy_op is not None else []
        return np.concatenate(parts + [inv.query.matvec(x) for inv in invariants])

    def rmatvec(u):
        out = noisy_op.rmatvec(u[: problem.num_rows]) if noisy_op is not None else np.zeros(n)
        offset = problem.num_rows
        for inv in invariants:
            out = out + inv.query.rmatvec(u[offset : offset + inv.query.num_rows])
            offset += inv.query.num_rows
        return out

    gram = None
    if targets.size <= EXPLICIT_ROWS:
        gram = _structured_gram(problem, n) if _nnz_estimate(queries, n) > EXPLICIT_NNZ else None
        if gram is None and _nnz_estimate(queries, n) <= EXPLICIT_NNZ:
            C = sp.vstack([q.to_sparse() for q in queries]).tocsr()
            gram = lambda x: np.asarray((C.multiply(x[None, :]) @ C.T).todense())
    diagonal = None
    if all(isinstance(q, (Marginal, Identity, Total, MarginalWorkload)) for q in queries):
        diagonal = matvec  # 0/1 entries: diag(C diag(x) Cᵀ) = C x
    return _Rows(matvec, rmatvec, targets, variances, problem.num_rows, gram, diagonal)


def _structured_gram(problem: ConsistencyProblem, n: int):
    """``C diag(x) Cᵀ`` without a matrix when the measured rows have a fast weighted Gram (a
    marginal workload on a binary domain, one Fourier query) and the invariants few rows (their
    blocks by one product per row); else None."""
    if not problem.noisy:
        return None
    query = problem.marginal_workload()
    if query is None and len(problem.noisy) == 1:
        query = problem.noisy[0].query
    invariants = problem.constraints.invariants
    if query is None or not getattr(query, "fast_weighted_gram", False):
        return None
    if sum(inv.query.num_rows for inv in invariants) > 64:
        return None
    A = sp.vstack([inv.query.to_sparse() for inv in invariants]).tocsr() if invariants else None

    def gram(x):
        top = query.weighted_gram(x)
        if A is None:
            return top
        cross = np.column_stack([query.matvec(x * A[i].toarray().ravel()) for i in range(A.shape[0])])
        corner = np.asarray((A.multiply(x[None, :]) @ A.T).todense())
        return np.block([[top, cross], [cross.T, corner]])

    return gram


def _nnz_estimate(queries, n: int) -> int:
    total = 0
    for q in queries:
        powers = q.column_norm_powers(1)
        per_col = float(np.mean(powers)) if np.ndim(powers) else float(powers)
        total += int(per_col * n) + q.num_rows
    return total


# ---- Newton's method on the dual ----------------------------------------------------------------
def _newton(rows: _Rows, p, free, lam, tol, max_steps, time_limit, start, verbose):
    """``(x, ν, steps, status, message)``; ``x`` None when no step could be taken."""
    d, var = rows.targets, rows.variances
    is_free = np.zeros(p.size, dtype=bool)
    is_free[free] = True
    log_p = np.where(is_free, np.log(np.where(is_free, p, 1.0)), -np.inf)
    # Each row's residual is judged against its own noise (measured rows) or its value (invariants).
    largest = max(float(np.abs(d).max(initial=0.0)), 1e-300)
    row_scale = np.where(var > 0, np.sqrt(var), np.maximum(np.abs(d), 1e-3 * largest))

    def primal(nu):
        exponent = np.minimum(log_p - rows.rmatvec(nu) / lam, 700.0)
        return np.where(is_free, np.exp(exponent), 0.0)

    def dual(nu, x):
        return float(lam * (p.sum() - x.sum()) - nu @ d - 0.5 * np.sum(var * nu * nu))

    nu = np.zeros(d.size)
    x = primal(nu)
    value = dual(nu, x)
    gradient = rows.matvec(x) - d - var * nu
    status, message = Status.ITERATION_LIMIT, f"Newton's method stopped after {max_steps} steps"
    steps = 0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for steps in range(max_steps + 1):
            worst = float(np.max(np.abs(gradient) / row_scale, initial=0.0))
            if verbose:
                print(f"smooth: step {steps}: dual {value:.12g}, largest relative residual {worst:.3e}")
            if worst <= tol:
                status, message = Status.OPTIMAL, f"Newton's method on the dual converged in {steps} steps"
                break
            if steps == max_steps:
                break
            if time_limit is not None and time.perf_counter() - start > time_limit:
                status, message = Status.TIME_LIMIT, f"time limit after {steps} Newton steps"
                break
            direction = _newton_direction(rows, x, var, lam, gradient, worst)
            slope = float(gradient @ direction)
            t, accepted = 1.0, False
            norm = float(np.linalg.norm(gradient / row_scale))
            while t > 1e-12:
                trial_nu = nu + t * direction
                trial_x = primal(trial_nu)
                trial_value = dual(trial_nu, trial_x)
                trial_gradient = rows.matvec(trial_x) - d - var * trial_nu
                if np.isfinite(trial_value) and (
                        trial_value >= value + 1e-4 * t * slope
                        or np.linalg.norm(trial_gradient / row_scale) < (1.0 - 1e-4 * t) * norm):
                    accepted = True
                    break
                t /= 2
            if not accepted and worst <= 1e3 * tol:
                # Rounding error, not the method, stops further progress: the certificate judges.
                status, message = Status.OPTIMAL, (f"Newton's method on the dual converged to rounding level in "
                                                   f"{steps} steps (largest relative residual {worst:.1e})")
                break
            if not accepted:
                status, message = Status.NUMERICAL_ERROR, (
                    f"Newton's method on the dual could not improve after {steps} steps (largest relative "
                    f"residual {worst:.2e}): the invariants may leave no table positive on every free cell")
                break
            nu, x, value, gradient = trial_nu, trial_x, trial_value, trial_gradient
    if not np.isfinite(x).all():
        return None, nu, steps, Status.NUMERICAL_ERROR, "Newton's method on the dual diverged (non-finite table)"
    return x, nu, steps, status, message


def _newton_direction(rows: _Rows, x, var, lam, gradient, worst):
    """Solve ``(C diag(x) Cᵀ / λ + diag(σ²)) Δ = ∇g``: Cholesky when ``C`` is explicit, else
    preconditioned conjugate gradients to a relative accuracy that tightens as Newton converges."""
    if rows.gram is not None:
        hessian = rows.gram(x) / lam + np.diag(var)
        try:
            factor = la.cho_factor(hessian)
            step = la.cho_solve(factor, gradient)
            step += la.cho_solve(factor, gradient - hessian @ step)  # one refinement
            if np.linalg.norm(hessian @ step - gradient) <= 1e-8 * np.linalg.norm(gradient):
                return step
        except la.LinAlgError:
            pass
        return np.linalg.lstsq(hessian, gradient, rcond=None)[0]  # redundant invariant rows
    m = gradient.size
    hess = LinearOperator((m, m), matvec=lambda v: rows.matvec(x * rows.rmatvec(v)) / lam + var * v, dtype=np.float64)
    precond = None
    if rows.diagonal is not None:
        diag = np.asarray(rows.diagonal(x)) / lam + var
        diag = np.where(diag > 0, diag, 1.0)
        precond = LinearOperator((m, m), matvec=lambda v: v / diag, dtype=np.float64)
    step, _ = cg(hess, gradient, rtol=min(0.5, max(1e-10, np.sqrt(worst) * RTOL_FACTOR)), maxiter=500, M=precond)
    return step


# ---- certificate ----------------------------------------------------------------------------------
def _certificate(problem: ConsistencyProblem, rows: _Rows, x, nu, p, free, lam) -> dict:
    """Stationarity of Φ at ``x`` (with the invariants' multipliers), the invariants' residual and
    the duality gap, each relative (module notes)."""
    k = rows.num_noisy
    data_gradient = np.zeros(p.size)
    if problem.noisy:
        op = problem.stacked_operator()
        data_gradient = op.rmatvec((op.matvec(x) - problem.targets()) / problem.sigmas() ** 2)
    with np.errstate(divide="ignore"):
        log_ratio = np.log(x[free]) - np.log(p[free])
    # Cells whose value underflowed: their log from the dual's exponent (the same formula).
    underflow = ~np.isfinite(log_ratio)
    if underflow.any():
        log_ratio[underflow] = -rows.rmatvec(nu)[free][underflow] / lam
    invariant_term = np.zeros(p.size)
    if nu.size > k:
        padded = np.zeros(nu.size)
        padded[k:] = nu[k:]
        invariant_term = rows.rmatvec(padded)
    stationarity = data_gradient[free] + lam * log_ratio + invariant_term[free]
    scale = max(float(np.abs(data_gradient[free]).max(initial=0.0)), float(np.abs(lam * log_ratio).max(initial=0.0)),
                float(np.abs(invariant_term[free]).max(initial=0.0)), 1e-300)
    inv_residual = 0.0
    for inv in problem.constraints.invariants:
        size = max(1.0, float(np.abs(inv.values).max(initial=0.0)))
        inv_residual = max(inv_residual, float(np.abs(inv.query.matvec(x) - inv.values).max(initial=0.0)) / size)
    chi2 = 0.0
    if problem.noisy:
        r = problem.stacked_operator().matvec(x) - problem.targets()
        chi2 = float(np.sum(r**2 / problem.sigmas() ** 2))
    primal = 0.5 * chi2 + lam * _divergence(x, p, free)
    d, var = rows.targets, rows.variances
    dual = float(lam * (p.sum() - x.sum()) - nu @ d - 0.5 * np.sum(var * nu * nu))
    gap = (primal - dual) / (1.0 + abs(primal) + abs(dual))
    return {"stationarity": float(np.abs(stationarity).max(initial=0.0)) / scale, "invariant_residual": inv_residual,
            "duality_gap": float(gap)}


def _divergence(x, p, free) -> float:
    """``D(x ‖ p) = Σ x log(x/p) − x + p`` over the free cells (0 log 0 = 0)."""
    xf, pf = x[free], p[free]
    positive = xf > 0
    return float(np.sum(xf[positive] * np.log(xf[positive] / pf[positive])) - xf.sum() + pf.sum())
