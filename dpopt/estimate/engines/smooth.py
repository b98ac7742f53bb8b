"""The smooth estimate: least squares regularised by relative entropy, in proximal steps whose weight follows the noise.

    step k = 1..K:   x_k = argmin  Φ_k(x) = ½ Σ_i ((Q x − y)_i / σ_i)²  +  λ D(x ‖ x_{k−1})
                     subject to A x = b (invariants),  x_j = 0 on structural zeros,

with ``x_0 = p`` the prior, ``K = 3`` by default (option ``steps``) and
``D(x ‖ p) = Σ_j x_j log(x_j / p_j) − x_j + p_j`` the generalised relative entropy. One step is
the maximum a posteriori table under Gaussian noise and the *entropic prior* of maximum-entropy
image reconstruction (Skilling and Gull 1984; Gull 1989): ``exp(−D(x ‖ p))`` is, by Stirling's
formula, the probability of the counts ``x`` under a multinomial (Poisson) draw with expected
counts ``p``. The ``K`` steps are the Bregman proximal-point method on the least-squares fit
(iterated Tikhonov regularisation: Censor and Zenios 1992; Hanke and Groetsch 1998), started
at the prior. Where the least-squares and maximum-entropy fits (objectives ``l2`` and
``entropy``) put exact zeros on cells the measurements cannot resolve, and so have infinite
KL(true ‖ estimate) whenever the data hold a record there, this estimate:

- **is unique**: every step minimises a strictly convex function;
- **keeps full support**: ``x log x`` has slope ``−∞`` at 0, so every step's optimum is
  positive on every free cell (``info["full_support"]`` says whether that held in floating
  point, ``info["smallest_cell"]`` gives the smallest free cell; nothing is added to the table);
- **lies in the exponential family of the measured queries**: ``x = p ∘ exp(Qᵀ θ + Aᵀ η)``
  (a log-linear model whose sufficient statistics are the measured rows, as in the graphical
  models of Private-PGM), with the natural parameters shrunk towards the prior;
- **equals the exact fit when the noise vanishes**: ``σ → 0`` leaves, in every step,
  ``½ ‖Q x − y‖² + c σ̄ D(x ‖ x_{k−1})`` (times ``σ̄²``), whose minimiser tends to the table
  closest to the step's prior among those that fit the measurements exactly (the
  maximum-entropy exact fit), or among the best fits when none is exact.

**The weight λ follows the noise, never the data.** ``λ = c / σ̄`` with ``σ̄`` the root of
the mean noise variance over the measured rows (``σ̄² = m / Σ_i σ_i⁻²``). Linearised, a
direction of the natural parameters with Fisher information ``f`` keeps the fraction
``1 − (κ / (f + κ))^K`` of its least-squares fit, ``κ = λ σ̄² = c σ̄``: one step is Tikhonov's
filter, many approach Landweber's (the filter of early-stopped mirror descent, Private-PGM's
regulariser), whose bias on well-measured directions is far smaller. The default
``c = 1 / (2^{1/K} − 1)`` (:func:`default_smoothing`; 3.85 for three steps, 1 for one; option
``smoothing``) puts the filter's half-way point at ``f = σ̄``: along a measured row with count
``s`` (``f = s``) the prior keeps half of the rows whose count equals the noise's standard
deviation (signal-to-noise ratio 1), more below and less above. ``λ`` does not depend on the
answers ``y``.

**The prior** is uniform over the free cells with the total ``N̂`` of the measurements
(:meth:`~dpopt.estimate.problem.ConsistencyProblem.total_estimate`: an invariant's total,
or the inverse-variance combination of the measured totals; at least its standard error,
since an estimate at or below zero only says the total is within noise of zero), unless
``prior=`` gives a table.

**The total.** Without invariants the table's total is held at ``N̂`` (one more equality row,
``info["held_total"]``; Private-PGM's ``known_total``): otherwise each step trades the total
against the penalty (nltcs, all 2-way marginals, ε = 0.1, 3-way error: 0.0160 free against
0.0156 held at the default ``c``; 0.0153 against 0.0147 at ``c = 6``).
``total="free"`` lets the fit decide it. Invariants
that fix the total fix it; invariants that leave it free leave it free (an estimated total
could contradict them).

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

Each step is solved this way with the previous step's table as ``p``; a step that does not
reach OPTIMAL ends the sequence with its status.

**Certificate** (checked by dpopt before OPTIMAL, for the last step): the gradient of ``Φ_K``
at ``x``, computed from ``x`` itself and the invariants' multipliers, vanishes on every free cell
(``info["stationarity"]``, relative to the largest of its terms or to the gradient of a misfit
of one noise s.d. on every row, whichever is larger: a late step barely moves and its terms are
then rounding-sized); the invariants and the held total hold (``info["invariant_residual"]``);
and the duality gap ``Φ_K(x) − g(ν)`` (``info["duality_gap"]``, relative) is below
:data:`~dpopt.estimate.certificates.verify.CERTIFICATE_TOL`.
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
from dpopt.estimate.certificates.verify import CERTIFICATE_TOL
from dpopt.model.queries import Identity, Marginal, MarginalWorkload, Total

__all__ = ["SMOOTH_OPTIONS", "STEPS", "default_smoothing", "relative_entropy", "smooth_weight", "solve_smooth"]

#: Options of the smooth objective (backend "newton").
SMOOTH_OPTIONS = ("smoothing", "prior", "steps", "total", "tol", "max_steps", "iterates")
#: Explicit Newton systems up to this many rows (with an explicit stacked matrix of at most
#: EXPLICIT_NNZ non-zeros); conjugate gradients beyond.
EXPLICIT_ROWS = 3000
EXPLICIT_NNZ = 3_000_000
#: Proximal steps of the default estimate (module notes).
STEPS = 3
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


def default_smoothing(steps: int) -> float:
    """``c = 1 / (2^{1/K} − 1)``: after ``K`` proximal steps a direction whose data curvature
    equals the penalty's at signal-to-noise ratio 1 keeps half its fit (module notes); 1 for ``K = 1``."""
    return 1.0 / (2.0 ** (1.0 / steps) - 1.0)


def smooth_weight(problem: ConsistencyProblem, c: float) -> float:
    """``λ = c / σ̄``, ``σ̄² = m / Σ_i σ_i⁻²`` over the ``m`` measured rows (module notes); ``c``
    without noisy measurements (then the optimum does not depend on ``λ``)."""
    sigma = problem.sigmas()
    if sigma.size == 0:
        return c
    return c * float(np.sqrt(np.mean(1.0 / sigma**2)))


def held_total(problem: ConsistencyProblem, total: str) -> float | None:
    """The value the table's total is held at, or None (invariants fix it, or ``total="free"``, or
    invariants that do not fix it: an estimated total could contradict them)."""
    if total not in ("estimate", "free"):
        raise SolverError(f"total must be 'estimate' or 'free', got total={total!r}")
    if total == "free" or problem.constraints.invariants:
        return None
    return prior_total(problem)


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
                 verbose: bool = False, smoothing: float | None = None, prior: np.ndarray | None = None,
                 steps: int = STEPS, total: str = "estimate", tol: float = 1e-10, max_steps: int = 100,
                 iterates: bool = False) -> Result:
    """The smooth estimate: ``steps`` proximal steps from the prior; see the module notes.

    Parameters
    ----------
    problem : ConsistencyProblem
    backend : {None, "newton"}
    time_limit : float, optional
        For all the steps together.
    verbose : bool
        Print one line per Newton step.
    smoothing : float, optional
        ``c`` in ``λ = c / σ̄`` (larger is smoother); default ``1 / (2^{1/K} − 1)`` for
        ``K = steps`` (3.85 for the default 3 steps, 1 for one step).
    prior : ndarray, optional
        The prior table ``p`` over the cells (positive on the free cells); default uniform
        with the measurements' total.
    steps : int
        ``K``, the proximal steps (default :data:`STEPS`); 1 gives the single penalised fit
        ``½ χ² + λ D(x ‖ p)``.
    total : {"estimate", "free"}
        Without invariants, ``"estimate"`` holds the table's total at the measurements'
        inverse-variance total (as Private-PGM's ``known_total``); ``"free"`` lets the fit
        decide it. With invariants the total is theirs (or free where they leave it free).
    tol : float
        Newton stops when every row's dual residual is below ``tol`` relative.
    max_steps : int
        Newton steps per proximal step.
    iterates : bool
        Keep every step's table in ``info["iterates"]`` (the first prior, then ``x_1 .. x_K``):
        what the exact Jacobian of the estimate needs (:mod:`dpopt.estimate.choice.jacobian`).

    Returns
    -------
    Result
        ``fun`` is the last step's ``Φ(x) = ½ χ² + λ D(x ‖ x_{K−1})``; ``info`` holds ``lambda``,
        ``smoothing``, ``steps``, ``held_total`` (None when not held), ``prior_total``,
        ``full_support``, ``smallest_cell``, ``kl_to_prior`` (``D(x ‖ p)`` to the first prior),
        ``kl_to_previous`` (``D(x ‖ x_{K−1})``), ``chi2`` (``Σ ((Qx − y)/σ)²``) and the last step's
        certificate figures (module notes).
    """
    if backend not in (None, "newton"):
        raise SolverError(f"the smooth objective is solved by backend 'newton', not {backend!r}")
    if problem.constraints.inequalities:
        raise SolverError("the smooth objective does not take linear inequalities; use objective 'l2' or 'l1'")
    if smoothing is not None and not (np.isfinite(smoothing) and smoothing > 0):
        raise SolverError(f"smoothing must be a positive number, got smoothing={smoothing!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise SolverError(f"steps must be a positive whole number, got steps={steps!r}")
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
    first_prior = p
    held = held_total(problem, total)
    c = default_smoothing(steps) if smoothing is None else float(smoothing)
    lam = smooth_weight(problem, c)
    rows = _stack_rows(problem, n, held)
    info = {"lambda": lam, "smoothing": c, "steps": int(steps), "held_total": held,
            "prior_total": float(p.sum()), "newton_steps": 0}
    newton_steps, done = 0, 0
    kept = [p.copy()] if iterates else None
    for done in range(1, steps + 1):
        remaining = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - start))
        x, nu, used, status, message = _newton(rows, p, free, lam, tol, max_steps, remaining, time.perf_counter(),
                                               verbose)
        newton_steps += used
        if kept is not None and x is not None:
            kept.append(x.copy())
        if x is None or status is not Status.OPTIMAL or done == steps:
            break
        if not (x[free] > 0).all():  # underflow: the next prior would not be positive
            status, message = Status.NUMERICAL_ERROR, f"a free cell underflowed to 0 ({message})"
            break
        p = np.zeros(n)
        p[free] = x[free]  # the next step's prior: this step's optimum
    info["newton_steps"] = newton_steps
    if kept is not None:
        info["iterates"] = kept
    solver = "Newton's method on the dual" + (" (conjugate gradients)" if rows.gram is None else "")
    if steps > 1:
        message = f"proximal step {done} of {steps}: {message}"
    if x is None:
        return make_result(status, None, message=message, fun=None, objective="smooth", backend="newton",
                           solver=solver, time=time.perf_counter() - start, nit=newton_steps, problem=problem,
                           info=info)
    certificate = _certificate(problem, rows, x, nu, p, free, lam, held)
    info.update(certificate)
    positive = x[free] > 0
    info["full_support"] = bool(positive.all())
    info["smallest_cell"] = float(x[free].min()) if free.size else 0.0
    info["kl_to_prior"] = relative_entropy(x[free], first_prior[free])
    info["kl_to_previous"] = relative_entropy(x[free], p[free])
    residual = (problem.stacked_operator().matvec(x) - problem.targets()) if problem.noisy else np.zeros(0)
    info["chi2"] = float(np.sum(residual**2 / problem.sigmas() ** 2)) if problem.noisy else 0.0
    fun = 0.5 * info["chi2"] + lam * info["kl_to_previous"]
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
    return make_result(status, x, message=message, fun=fun, objective="smooth", backend="newton", solver=solver,
                       time=time.perf_counter() - start, nit=newton_steps, problem=problem, info=info,
                       incumbent=status is not Status.OPTIMAL)


def options_in_units(options: dict, scale: float) -> dict:
    """The options for a problem whose counts are divided by ``scale``: the prior table is a
    table of counts too (the other options are pure numbers)."""
    if options.get("prior") is None:
        return options
    return {**options, "prior": np.asarray(options["prior"], dtype=np.float64) / scale}


def in_units(info: dict, scale: float) -> dict:
    """The engine's figures for counts multiplied by ``scale`` (``λ`` is per count)."""
    out = dict(info)
    if "lambda" in out:
        out["lambda"] = out["lambda"] / scale
    for key in ("prior_total", "smallest_cell", "kl_to_prior", "kl_to_previous"):  # D is in counts
        if key in out:
            out[key] = out[key] * scale
    if out.get("held_total") is not None:
        out["held_total"] = out["held_total"] * scale
    if "iterates" in out:
        out["iterates"] = [x * scale for x in out["iterates"]]
    return out


# ---- the stacked rows ------------------------------------------------------------------------
def _equalities(problem: ConsistencyProblem, held: float | None) -> list[tuple]:
    """``(query, values)`` of every equality row: the invariants, then the held total."""
    rows = [(inv.query, np.asarray(inv.values, dtype=np.float64)) for inv in problem.constraints.invariants]
    if held is not None:
        rows.append((Total(problem.constraints.domain), np.array([held])))
    return rows


def _stack_rows(problem: ConsistencyProblem, n: int, held: float | None) -> _Rows:
    equalities = _equalities(problem, held)
    invariants = [query for query, _ in equalities]
    queries = [m.query for m in problem.noisy] + invariants
    targets = np.concatenate([problem.targets()] + [values for _, values in equalities])
    variances = np.concatenate([problem.sigmas() ** 2, np.zeros(targets.size - problem.num_rows)])
    noisy_op = problem.stacked_operator() if problem.noisy else None

    def matvec(x):
        parts = [noisy_op.matvec(x)] if noisy_op is not None else []
        return np.concatenate(parts + [query.matvec(x) for query in invariants])

    def rmatvec(u):
        out = noisy_op.rmatvec(u[: problem.num_rows]) if noisy_op is not None else np.zeros(n)
        offset = problem.num_rows
        for query in invariants:
            out = out + query.rmatvec(u[offset : offset + query.num_rows])
            offset += query.num_rows
        return out

    gram = None
    if targets.size <= EXPLICIT_ROWS:
        # A fast weighted Gram (one transform, or small contractions per block) beats the sparse
        # product C diag(x) Cᵀ whenever the query offers one.
        gram = _structured_gram(problem, invariants)
        if gram is None and _nnz_estimate(queries, n) <= EXPLICIT_NNZ:
            C = sp.vstack([q.to_sparse() for q in queries]).tocsr()
            gram = lambda x: np.asarray((C.multiply(x[None, :]) @ C.T).todense())
    diagonal = None
    if all(isinstance(q, (Marginal, Identity, Total, MarginalWorkload)) for q in queries):
        diagonal = matvec  # 0/1 entries: diag(C diag(x) Cᵀ) = C x
    return _Rows(matvec, rmatvec, targets, variances, problem.num_rows, gram, diagonal)


def _structured_gram(problem: ConsistencyProblem, invariants: list):
    """``C diag(x) Cᵀ`` without a matrix when the measured rows have a fast weighted Gram (a
    marginal workload on a binary domain, one Fourier query) and the invariants few rows (their
    blocks by one product per row); else None."""
    if not problem.noisy:
        return None
    query = problem.marginal_workload()
    if query is None and len(problem.noisy) == 1:
        query = problem.noisy[0].query
    if query is None or not getattr(query, "fast_weighted_gram", False):
        return None
    if sum(q.num_rows for q in invariants) > 64:
        return None
    A = sp.vstack([q.to_sparse() for q in invariants]).tocsr() if invariants else None
    # The invariants' rows, dense once when small: no sparse slicing in every Newton step.
    A_rows = None if A is None else (A.toarray() if A.shape[0] * A.shape[1] <= 4_000_000
                                     else [A[i].toarray().ravel() for i in range(A.shape[0])])

    def gram(x):
        top = query.weighted_gram(x)
        if A is None:
            return top
        cross = np.column_stack([query.matvec(x * row) for row in A_rows])
        corner = (A_rows * x[None, :]) @ A_rows.T if isinstance(A_rows, np.ndarray) else \
            np.asarray((A.multiply(x[None, :]) @ A.T).todense())
        return np.block([[top, cross], [cross.T, corner]])

    return gram


def _nnz_estimate(queries, n: int) -> int:
    # sum_i |Q_ij|^p with a tiny p counts the non-zeros of a column, whatever the row weights
    # (the L1 norm undercounts weighted rows, e.g. whitened residual statistics).
    total = 0
    for q in queries:
        powers = q.column_norm_powers(1e-12)
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
            norm = float(np.linalg.norm(gradient / row_scale))

            def trial(trial_nu):
                trial_x = primal(trial_nu)
                return dual(trial_nu, trial_x), rows.matvec(trial_x) - d - var * trial_nu, trial_x

            step = dual_backtrack(nu, direction, value, slope, norm, row_scale, trial)
            if step is None:
                status, message = dual_stalled(steps, worst, tol,
                                               ": the invariants may leave no table positive on every free cell")
                break
            nu, value, gradient, x = step
    if not np.isfinite(x).all():
        return None, nu, steps, Status.NUMERICAL_ERROR, "Newton's method on the dual diverged (non-finite table)"
    return x, nu, steps, status, message


def dual_backtrack(nu: np.ndarray, direction: np.ndarray, value: float, slope: float, norm: float,
                   row_scale: np.ndarray, trial, *, finite_gradient: bool = False):
    """The Newton step's backtracking on the concave dual, shared by the dense and the
    marginal-space smooth estimates: the first ``t = 1, 1/2, …`` (above 1e-12) whose dual value
    rises by Armijo's ``1e-4 t slope`` or whose scaled gradient norm falls by the factor
    ``1 − 1e-4 t`` (near the optimum rounding can hide the value's rise, not the gradient's fall).

    ``trial(nu)`` returns ``(value, gradient, state)``; with ``finite_gradient`` a step whose
    gradient is not finite is refused too. Returns ``(nu, value, gradient, state)`` of the accepted
    step, or None when none is."""
    t = 1.0
    while t > 1e-12:
        trial_nu = nu + t * direction
        trial_value, trial_gradient, state = trial(trial_nu)
        if np.isfinite(trial_value) and (not finite_gradient or np.isfinite(trial_gradient).all()) and (
                trial_value >= value + 1e-4 * t * slope
                or np.linalg.norm(trial_gradient / row_scale) < (1.0 - 1e-4 * t) * norm):
            return trial_nu, trial_value, trial_gradient, state
        t /= 2
    return None


def dual_stalled(steps: int, worst: float, tol: float, why: str = "") -> tuple[Status, str]:
    """Status and message when no step is accepted: OPTIMAL when the largest relative residual
    ``worst`` is within ``1e3 tol`` (rounding, not the method, stops progress; the certificate
    judges the point), else NUMERICAL_ERROR (``why`` appended)."""
    if worst <= 1e3 * tol:
        return Status.OPTIMAL, (f"Newton's method on the dual converged to rounding level in {steps} steps "
                                f"(largest relative residual {worst:.1e})")
    return Status.NUMERICAL_ERROR, (f"Newton's method on the dual could not improve after {steps} steps (largest "
                                    f"relative residual {worst:.2e}){why}")


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
def _certificate(problem: ConsistencyProblem, rows: _Rows, x, nu, p, free, lam, held) -> dict:
    """Stationarity of Φ at ``x`` (with the invariants' multipliers), the invariants' residual and
    the duality gap, each relative (module notes)."""
    k = rows.num_noisy
    data_gradient = np.zeros(p.size)
    misfit_unit = 0.0  # the data term's gradient for a misfit of one noise s.d. on every row
    if problem.noisy:
        op = problem.stacked_operator()
        data_gradient = op.rmatvec((op.matvec(x) - problem.targets()) / problem.sigmas() ** 2)
        misfit_unit = float(np.abs(op.rmatvec(1.0 / problem.sigmas()))[free].max(initial=0.0))
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
    # Judged against the largest term, or the gradient of a one-s.d. misfit when every term is
    # smaller (a late proximal step barely moves, and its terms are then rounding-sized).
    scale = max(float(np.abs(data_gradient[free]).max(initial=0.0)), float(np.abs(lam * log_ratio).max(initial=0.0)),
                float(np.abs(invariant_term[free]).max(initial=0.0)), misfit_unit, 1e-300)
    inv_residual = 0.0
    for query, values in _equalities(problem, held):
        size = max(1.0, float(np.abs(values).max(initial=0.0)))
        inv_residual = max(inv_residual, float(np.abs(query.matvec(x) - values).max(initial=0.0)) / size)
    chi2 = 0.0
    if problem.noisy:
        r = problem.stacked_operator().matvec(x) - problem.targets()
        chi2 = float(np.sum(r**2 / problem.sigmas() ** 2))
    primal = 0.5 * chi2 + lam * relative_entropy(x[free], p[free])
    d, var = rows.targets, rows.variances
    dual = float(lam * (p.sum() - x.sum()) - nu @ d - 0.5 * np.sum(var * nu * nu))
    gap = (primal - dual) / (1.0 + abs(primal) + abs(dual))
    return {"stationarity": float(np.abs(stationarity).max(initial=0.0)) / scale, "invariant_residual": inv_residual,
            "duality_gap": float(gap)}


def relative_entropy(x: np.ndarray, p: np.ndarray) -> float:
    """``D(x ‖ p) = Σ x log(x/p) − x + p`` (``p > 0``; 0 log 0 = 0)."""
    positive = x > 0
    return float(np.sum(x[positive] * np.log(x[positive] / p[positive])) - x.sum() + p.sum())
