"""Clarabel through its own Python API (LP and convex QP), without a modelling layer.

Clarabel (Goulart and Chen 2024, an interior-point method for conic programs with a quadratic
objective) is the solver cvxpy calls for dpopt's least-squares QPs; its ``cvxpy`` import costs
about a second, ten times the solve of a quickstart-sized QP (issue #30). This adapter passes the
form straight to ``clarabel.DefaultSolver``::

    minimise  ½ xᵀPx + qᵀx   subject to  A x + s = b,  s ∈ {0}^e × R₊^k

with the rows in the order cvxpy's canonicalisation produces for
:class:`~dpopt.estimate.backends.cvxpy_backend.CvxpyBackend`'s model (equalities, then ``≥``
rows, ``≤`` rows, finite lower and finite upper variable bounds) and Clarabel's default
settings, so that both reach the same point (on the quickstart's QP, bit for bit).

Row duals: Clarabel's ``z`` satisfies ``Px + q + Aᵀz = 0`` with ``z ≥ 0`` on the cone R₊, so a
``≥`` row's multiplier is ``+z`` and an equality's or a ``≤`` row's is ``−z``: the shadow-price
convention of :attr:`~dpopt.estimate.status.SolveOutcome.row_duals`.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from dpopt.atomic import run_interruptibly
from dpopt.errors import SolverError
from dpopt.estimate.backends.base import Backend, SolveSettings, importable
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.status import SolveOutcome, Status

__all__ = ["ClarabelBackend"]

#: Clarabel's settings that ``tolerance`` sets (as the cvxpy adapter does for CLARABEL).
TOLERANCE_SETTINGS = ("tol_feas", "tol_gap_abs", "tol_gap_rel")


def _status_map() -> dict[str, Status]:
    return {
        "Solved": Status.OPTIMAL,
        "AlmostSolved": Status.NUMERICAL_ERROR,  # reduced accuracy: a point, not a success
        "PrimalInfeasible": Status.INFEASIBLE,
        "AlmostPrimalInfeasible": Status.NUMERICAL_ERROR,
        "DualInfeasible": Status.UNBOUNDED,
        "AlmostDualInfeasible": Status.NUMERICAL_ERROR,
        "MaxIterations": Status.ITERATION_LIMIT,
        "MaxTime": Status.TIME_LIMIT,
        "NumericalError": Status.NUMERICAL_ERROR,
        "InsufficientProgress": Status.NUMERICAL_ERROR,
        "CallbackTerminated": Status.NOT_SOLVED,
        "Unsolved": Status.NOT_SOLVED,
    }


class ClarabelBackend(Backend):
    """Clarabel's interior-point method (LP, QP), called directly.

    ``tolerance`` sets ``tol_feas``, ``tol_gap_abs`` and ``tol_gap_rel``; ``time_limit`` its
    ``time_limit``. ``solver_options`` sets any other attribute of ``clarabel.DefaultSettings``
    (e.g. ``{"max_iter": 200}``); an unknown name is an error naming it.
    """

    name: ClassVar[str] = "clarabel"
    kinds: ClassVar[frozenset[str]] = frozenset({"LP", "QP"})
    options: ClassVar[dict[str, str]] = {
        "solver_options": "dict of clarabel.DefaultSettings attributes, e.g. {'max_iter': 200}",
    }
    status_map: ClassVar[dict[str, Status]] = _status_map()

    @classmethod
    def is_installed(cls) -> bool:
        return importable("clarabel")

    def _check_options(self, form, settings: SolveSettings) -> None:
        super()._check_options(form, settings)
        if not isinstance(settings.option("solver_options", {}), dict):
            raise SolverError("backend 'clarabel': solver_options must be a dict")

    def _settings(self, settings: SolveSettings):
        import clarabel

        config = clarabel.DefaultSettings()
        config.verbose = settings.verbose
        if settings.time_limit is not None:
            config.time_limit = float(settings.time_limit)
        if settings.tolerance is not None:
            for name in TOLERANCE_SETTINGS:
                setattr(config, name, float(settings.tolerance))
        for name, value in settings.option("solver_options", {}).items():
            if name.startswith("_") or not hasattr(config, name):
                raise SolverError(f"backend 'clarabel': unknown solver option {name!r} (not a clarabel.DefaultSettings "
                                  "attribute)")
            try:
                setattr(config, name, value)
            except (TypeError, ValueError) as exc:
                raise SolverError(f"backend 'clarabel': solver option {name!r} = {value!r}: {exc}") from None
        return config

    def _solve(self, form: ProgramForm, settings: SolveSettings) -> SolveOutcome:
        import clarabel

        n = form.num_vars
        lo, hi = form.row_lower, form.row_upper
        eq = np.flatnonzero(lo == hi)
        ge = np.flatnonzero(np.isfinite(lo) & (lo != hi))
        le = np.flatnonzero(np.isfinite(hi) & (lo != hi))
        has_lower = np.flatnonzero(np.isfinite(form.lower))
        has_upper = np.flatnonzero(np.isfinite(form.upper))
        identity = sp.identity(n, format="csr")
        A = sp.vstack([form.A[eq], -form.A[ge], form.A[le], -identity[has_lower], identity[has_upper]],
                      format="csc")
        b = np.concatenate([lo[eq], -lo[ge], hi[le], -form.lower[has_lower], form.upper[has_upper]])
        P = sp.triu(form.P, format="csc") if form.P is not None else sp.csc_matrix((n, n))
        inequalities = ge.size + le.size + has_lower.size + has_upper.size
        cones = ([clarabel.ZeroConeT(eq.size)] if eq.size else []) + \
            ([clarabel.NonnegativeConeT(inequalities)] if inequalities else [])
        solver = clarabel.DefaultSolver(P, np.asarray(form.c, dtype=np.float64), A, b, cones, self._settings(settings))
        # In dpopt's solver thread: Clarabel never calls back into Python, so a signal's handler
        # runs in the waiting main thread at once (issue 24).
        solution = run_interruptibly(solver.solve)
        raw = str(solution.status)
        status = self.map_status(raw)
        x = np.asarray(solution.x, dtype=np.float64) if solution.x is not None else None
        duals = None
        if status is Status.OPTIMAL and solution.z is not None:
            z = np.asarray(solution.z, dtype=np.float64)
            duals = np.zeros(form.num_rows)
            k = eq.size
            duals[eq] = -z[:k]
            duals[ge] += z[k:k + ge.size]
            k += ge.size
            duals[le] -= z[k:k + le.size]
        return self._outcome(
            status, x=x, objective=None, message=f"clarabel status {raw!r}", solver="clarabel",
            raw_status=raw, form=form, iterations=int(solution.iterations), row_duals=duals,
            extra={"solve_time": float(solution.solve_time)},
        )
