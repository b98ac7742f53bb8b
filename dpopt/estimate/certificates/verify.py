"""dpopt's own check of every point a solver calls optimal.

A solver's "optimal" means "optimal to my tolerances, in my scaling". dpopt checks the
returned point itself, in the problem's own terms, before it reports
:attr:`~dpopt.estimate.status.Status.OPTIMAL`; a failed check becomes
:attr:`Status.NUMERICAL_ERROR` with the solver's message and the failed figure, and the
point is kept only as an incumbent (``success`` False), never released.

**Programs** (:func:`certify_program`, LP and QP in the canonical
:class:`~dpopt.estimate.form.ProgramForm`) are certified by duality (Boyd and Vandenberghe
2004, §5.5.3). With the row duals ``y`` (shadow prices) the solver returns, the reduced
costs are ``d = c + P v − Aᵀ y``. The point is optimal when it is primal feasible, the
multipliers have the signs their bounds allow (``y_i > 0`` only on a finite lower row
bound, ``d_j < 0`` only on a finite upper bound, ...), and complementary slackness holds:

    gap = Σ_i y_i (A v − b_i) + Σ_j d_j (v_j − l_j)        (b_i, l_j: the bound each sign selects)

is the difference between the primal objective and the dual objective of ``(y, d)``, a
lower bound on the optimum by weak duality. Each figure is compared with
:data:`CERTIFICATE_TOL` relative to the problem's scale.

**Bounded least squares** (:func:`certify_least_squares`) are certified by the natural
residual of ``‖D(M v − y)‖²`` (the step projected gradient descent would take): it vanishes
exactly when the gradient is zero on free variables, non-negative at lower bounds and
non-positive at upper bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpopt.estimate.form import LeastSquaresForm, ProgramForm

__all__ = [
    "CERTIFICATE_TOL",
    "Certificate",
    "certify_least_squares",
    "certify_program",
    "feasibility_tolerance",
    "largest_eigenvalue",
    "project_rows",
]

#: Relative tolerance of every certificate: what the solvers dpopt uses certify (HiGHS,
#: Clarabel and CBC stop at 1e-7 to 1e-9 relative residuals), with room for rounding.
CERTIFICATE_TOL = 1e-6


@dataclass(frozen=True)
class Certificate:
    """The figures of one optimality check, each relative to its scale (ok when all are small)."""

    primal: float  # largest violation of a row or variable bound
    dual: float  # largest sign violation of a multiplier (or projected gradient)
    gap: float  # complementary-slackness gap (duality gap); 0 when not computed
    checked_duals: bool
    tol: float = CERTIFICATE_TOL

    @property
    def ok(self) -> bool:
        return max(self.primal, self.dual, abs(self.gap)) <= self.tol

    def describe(self) -> str:
        duals = f", multiplier signs {self.dual:.1e}, duality gap {self.gap:.1e}" if self.checked_duals else \
            " (no duals to check optimality)"
        return f"relative primal violation {self.primal:.1e}{duals} (tolerance {self.tol:g})"

    def as_dict(self) -> dict:
        return {"primal": self.primal, "dual": self.dual, "gap": self.gap, "checked_duals": self.checked_duals,
                "tol": self.tol, "ok": self.ok}


def feasibility_tolerance(scale: float) -> float:
    """Largest constraint violation a released table may have: 1e-6 persons, or 1e-9 of the
    count scale when counts are so large that double precision cannot do better."""
    return max(1e-6, 1e-9 * float(scale))


def _finite_max(*arrays) -> float:
    out = 0.0
    for a in arrays:
        a = np.asarray(a, dtype=np.float64)
        finite = np.abs(a[np.isfinite(a)])
        if finite.size:
            out = max(out, float(finite.max()))
    return out


def certify_program(form: ProgramForm, v: np.ndarray, row_duals: np.ndarray | None,
                    tol: float = CERTIFICATE_TOL) -> Certificate:
    """Primal feasibility and, with duals of a continuous form, the duality certificate (module notes)."""
    v = np.asarray(v, dtype=np.float64)
    Av = form.A @ v if form.num_rows else np.zeros(0)
    bound_scale = 1.0 + _finite_max(form.row_lower, form.row_upper, form.lower, form.upper, Av, v)
    primal = form.max_violation(v) / bound_scale
    if row_duals is None or form.is_integer:
        return Certificate(max(primal, 0.0), 0.0, 0.0, False, tol)
    Pv = form.P @ v if form.P is not None else np.zeros_like(v)
    if _finite_max(form.c, Pv) == 0.0:
        # A constant objective (a feasibility problem): every feasible point is optimal.
        return Certificate(max(primal, 0.0), 0.0, 0.0, False, tol)
    y = np.asarray(row_duals, dtype=np.float64)
    d = form.c + Pv - (form.A.T @ y if form.num_rows else 0.0)
    # Multipliers are judged against the objective's own gradient sizes: the costs, and for a QP
    # its curvature times the size of the point (at an exact fit every multiplier is ~0).
    curvature = float(abs(form.P).max()) * bound_scale if form.P is not None else 0.0
    cost_scale = max(_finite_max(form.c, Pv, abs(form.A).T @ np.abs(y) if form.num_rows else 0.0), curvature, 1e-300)
    # Signs: a positive multiplier needs a finite lower bound, a negative one a finite upper bound.
    sign = np.concatenate([
        np.where(np.isfinite(form.row_lower), 0.0, np.maximum(y, 0.0)),
        np.where(np.isfinite(form.row_upper), 0.0, np.maximum(-y, 0.0)),
        np.where(np.isfinite(form.lower), 0.0, np.maximum(d, 0.0)),
        np.where(np.isfinite(form.upper), 0.0, np.maximum(-d, 0.0)),
    ])
    dual = float(sign.max(initial=0.0)) / cost_scale
    # Complementary slackness against the bound each multiplier's sign selects.
    row_bound = np.where(y >= 0, form.row_lower, form.row_upper)
    var_bound = np.where(d >= 0, form.lower, form.upper)
    row_terms = np.where(np.isfinite(row_bound), y * (Av - np.where(np.isfinite(row_bound), row_bound, 0.0)), 0.0)
    var_terms = np.where(np.isfinite(var_bound), d * (v - np.where(np.isfinite(var_bound), var_bound, 0.0)), 0.0)
    objective = form.objective(v)
    gap = float(row_terms.sum() + var_terms.sum())
    gap /= 1.0 + abs(objective) + abs(objective - gap)  # |primal - dual| / (1 + |primal| + |dual|)
    return Certificate(max(primal, 0.0), dual, gap, True, tol)


def certify_least_squares(form: LeastSquaresForm, v: np.ndarray, tol: float = CERTIFICATE_TOL) -> Certificate:
    """The natural residual ``v − clip(v − ∇f(v) / L, lower, upper)`` of ``f = ‖D(M v − y)‖²``
    (``L`` the largest eigenvalue of ``f``'s Hessian ``2 (DM)ᵀ DM``, by power iteration),
    relative to the size of ``v``. It is the step of projected gradient descent: 0 exactly at
    the KKT points of the bounded problem, of the order of ``v``'s distance to them otherwise,
    and it tolerates the tiny values an interior-point method leaves on cells at a bound."""
    v = np.asarray(v, dtype=np.float64)
    op = form.weighted_operator()
    b = form.weighted_target()
    grad = 2.0 * op.rmatvec(op.matvec(v) - b)
    lipschitz = 2.0 * largest_eigenvalue(lambda u: op.rmatvec(op.matvec(u)), form.num_vars)
    width = 1.0 + _finite_max(v, form.lower, form.upper)
    natural = v - np.clip(v - grad / max(lipschitz, 1e-300), form.lower, form.upper)
    primal = float(np.maximum(form.lower - v, v - form.upper).max(initial=0.0)) / width
    return Certificate(max(primal, 0.0), float(np.abs(natural).max(initial=0.0)) / width, 0.0, True, tol)


def largest_eigenvalue(gram, n: int, steps: int = 12) -> float:
    """Power iteration for the largest eigenvalue of a positive semidefinite operator (a lower
    estimate, which only makes the natural residual above larger: the check stays conservative)."""
    u = 1.0 + np.cos(np.arange(n, dtype=np.float64))  # a fixed start with weight on every coordinate
    value = 0.0
    for _ in range(steps):
        norm = float(np.linalg.norm(u))
        if norm == 0.0:
            return value
        u = u / norm
        w = gram(u)
        value = float(u @ w)
        u = w
    return value


def project_rows(v: np.ndarray, group: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` onto ``{x ≥ 0 : Σ_{j ∈ row g} x_j = targets[g]}`` for
    disjoint rows covering every entry (``group[j]`` the row of ``j``): per row, the sort-based
    simplex projection (Held, Wolfe and Crowder 1974; Duchi et al. 2008), all rows at once."""
    order = np.lexsort((-v, group))
    g, sorted_v = group[order], v[order]
    counts = np.bincount(g, minlength=targets.size)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.arange(v.size) - np.repeat(starts, counts)  # 0-based rank within the row
    cumulative = np.cumsum(sorted_v)
    before = np.repeat(np.concatenate([[0.0], cumulative])[starts], counts)
    within = cumulative - before
    shift = (within - targets[g]) / (position + 1)
    active = sorted_v - shift > 0
    rho = np.zeros(targets.size, dtype=np.int64)  # the last active rank of every row
    np.maximum.at(rho, g[active], position[active])
    theta = (within[starts + rho] - targets) / (rho + 1)
    return np.maximum(v - theta[group], 0.0)
