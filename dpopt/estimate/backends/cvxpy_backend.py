"""cvxpy with whichever installed solver fits the form.

The form becomes one cvxpy problem with vectorised sparse constraints (equality rows,
``≥`` rows and ``≤`` rows as three matrix constraints, bounds on the variables), so the
model is built without a Python loop over variables or rows. Default solvers: CLARABEL
for LP and QP (an interior-point method, accurate to ~1e-8), HiGHS for MILP; override with
``solver=``. The outcome names the solver that ran, e.g. ``"cvxpy/CLARABEL"``.

cvxpy folds time and iteration limits into one status, ``user_limit``; the adapter
reports TIME_LIMIT when a time limit was set and the solver's own clock reached it, else
ITERATION_LIMIT. cvxpy raises ``cvxpy.error.SolverError`` when a solver reports a
numerical failure; that becomes :attr:`Status.NUMERICAL_ERROR` (any other exception is a
crash and raises :class:`~dpopt.errors.SolverError`).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from dpopt.atomic import run_interruptibly
from dpopt.errors import SolverError
from dpopt.estimate.backends.base import DEFAULT_MIP_GAP, Backend, SolveSettings, importable
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.status import SolveOutcome, Status

__all__ = ["CvxpyBackend"]

#: Solvers tried in order for each kind when ``solver=`` is not given.
PREFERRED_SOLVERS: dict[str, tuple[str, ...]] = {
    "LP": ("CLARABEL", "HIGHS", "SCIPY", "ECOS", "SCS"),
    "QP": ("CLARABEL", "OSQP", "PIQP", "ECOS", "SCS"),
    "MILP": ("HIGHS", "SCIP", "GLPK_MI", "CBC", "SCIPY", "GUROBI", "CPLEX", "MOSEK", "XPRESS", "COPT"),
    "MIQP": ("SCIP", "GUROBI", "CPLEX", "MOSEK", "XPRESS", "COPT"),
}

#: The Python module of each solver cvxpy can call: :meth:`CvxpyBackend.supports` (choosing a
#: backend) looks them up with ``find_spec`` instead of importing cvxpy (~1 s, issue #30); the solve
#: itself asks cvxpy (``cvxpy.installed_solvers()``).
SOLVER_MODULES: dict[str, str] = {
    "CLARABEL": "clarabel", "HIGHS": "highspy", "SCIPY": "scipy", "ECOS": "ecos", "SCS": "scs", "OSQP": "osqp",
    "PIQP": "piqp", "SCIP": "pyscipopt", "GLPK_MI": "cvxopt", "CBC": "cylp", "GUROBI": "gurobipy", "CPLEX": "cplex",
    "MOSEK": "mosek", "XPRESS": "xpress", "COPT": "coptpy",
}

# Per-solver option names (cvxpy passes solver options through verbatim).
_TIME_LIMIT = {"CLARABEL": "time_limit", "HIGHS": "time_limit", "OSQP": "time_limit", "SCS": "time_limit_secs"}
_TOLERANCE = {
    "CLARABEL": ("tol_feas", "tol_gap_abs", "tol_gap_rel"),
    "HIGHS": ("primal_feasibility_tolerance", "dual_feasibility_tolerance", "ipm_optimality_tolerance"),
    "OSQP": ("eps_abs", "eps_rel"),
    "SCS": ("eps_abs", "eps_rel"),
}
_MIP_GAP = {"HIGHS": "mip_rel_gap"}


def _status_map() -> dict[str, Status]:
    return {
        "optimal": Status.OPTIMAL,
        "optimal_inaccurate": Status.NUMERICAL_ERROR,  # reduced accuracy: a point, not a success
        "infeasible": Status.INFEASIBLE,
        "infeasible_inaccurate": Status.NUMERICAL_ERROR,
        "unbounded": Status.UNBOUNDED,
        "unbounded_inaccurate": Status.NUMERICAL_ERROR,
        "infeasible_or_unbounded": Status.NOT_SOLVED,  # resolved by a feasibility re-solve
        "user_limit": Status.ITERATION_LIMIT,  # TIME_LIMIT when the time limit was reached
        "solver_error": Status.NUMERICAL_ERROR,
    }


class CvxpyBackend(Backend):
    """cvxpy (LP, QP, MILP; MIQP when a mixed-integer QP solver is installed).

    ``tolerance`` sets the chosen solver's feasibility / gap tolerances (CLARABEL:
    ``tol_feas``, ``tol_gap_abs``, ``tol_gap_rel``; HiGHS: primal/dual feasibility and IPM
    optimality; OSQP, SCS: ``eps_abs``, ``eps_rel``).
    """

    name: ClassVar[str] = "cvxpy"
    kinds: ClassVar[frozenset[str]] = frozenset({"LP", "QP", "MILP", "MIQP"})
    options: ClassVar[dict[str, str]] = {
        "solver": "cvxpy solver name (default: CLARABEL for LP/QP, HIGHS for MILP, if installed)",
        "mip_gap": f"relative MIP gap (default {DEFAULT_MIP_GAP}; HIGHS only)",
        "solver_options": "dict passed verbatim to Problem.solve as solver keyword arguments",
    }
    status_map: ClassVar[dict[str, Status]] = _status_map()

    @classmethod
    def is_installed(cls) -> bool:
        return importable("cvxpy")

    @staticmethod
    def installed_solvers() -> list[str]:
        """cvxpy's installed solvers."""
        import cvxpy as cp

        return list(cp.installed_solvers())

    def default_solver(self, kind: str) -> str | None:
        """The first installed solver preferred for ``kind``, or None."""
        installed = set(self.installed_solvers())
        return next((s for s in PREFERRED_SOLVERS.get(kind, ()) if s in installed), None)

    @staticmethod
    def findable_solver(kind: str) -> str | None:
        """The first solver preferred for ``kind`` whose module is installed, found without importing
        cvxpy or the solver (:data:`SOLVER_MODULES`), or None."""
        return next((s for s in PREFERRED_SOLVERS.get(kind, ()) if importable(SOLVER_MODULES[s])), None)

    def supports(self, form) -> bool:
        if isinstance(form, ProgramForm):
            return self.is_installed() and self.findable_solver(form.kind) is not None
        return super().supports(form) and self.findable_solver("QP") is not None

    def _check_options(self, form, settings: SolveSettings) -> None:
        super()._check_options(form, settings)
        solver = settings.option("solver")
        if solver is not None and solver not in self.installed_solvers():
            raise SolverError(
                f"backend 'cvxpy': solver {solver!r} is not installed; installed cvxpy solvers: "
                f"{self.installed_solvers()}"
            )
        if not isinstance(settings.option("solver_options", {}), dict):
            raise SolverError("backend 'cvxpy': solver_options must be a dict")

    def _solver_kwargs(self, solver: str, form: ProgramForm, settings: SolveSettings) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        scipy_options: dict[str, Any] = {}
        if settings.time_limit is not None:
            if solver == "SCIPY":
                scipy_options["time_limit"] = settings.time_limit
            elif solver in _TIME_LIMIT:
                kwargs[_TIME_LIMIT[solver]] = settings.time_limit
            else:
                raise SolverError(
                    f"backend 'cvxpy': no known time-limit option for solver {solver!r} "
                    f"(known: {sorted(_TIME_LIMIT) + ['SCIPY']})"
                )
        if settings.tolerance is not None:
            if solver == "SCIPY":
                for opt in ("primal_feasibility_tolerance", "dual_feasibility_tolerance"):
                    scipy_options[opt] = settings.tolerance
            elif solver in _TOLERANCE:
                kwargs.update({opt: settings.tolerance for opt in _TOLERANCE[solver]})
            else:
                raise SolverError(f"backend 'cvxpy': no known tolerance options for solver {solver!r}")
        if form.is_integer:
            gap = float(settings.option("mip_gap", DEFAULT_MIP_GAP))
            if solver == "SCIPY":
                scipy_options["mip_rel_gap"] = gap
            elif solver in _MIP_GAP:
                kwargs[_MIP_GAP[solver]] = gap
            elif "mip_gap" in settings.options:
                raise SolverError(f"backend 'cvxpy': no known MIP-gap option for solver {solver!r}")
        if scipy_options:
            kwargs["scipy_options"] = scipy_options
        kwargs.update(settings.option("solver_options", {}))
        return kwargs

    def _solve(self, form: ProgramForm, settings: SolveSettings) -> SolveOutcome:
        import cvxpy as cp

        solver = settings.option("solver") or self.default_solver(form.kind)
        if solver is None:
            raise SolverError(f"backend 'cvxpy': no installed cvxpy solver for {form.kind} forms (tried "
                              f"{list(PREFERRED_SOLVERS.get(form.kind, ()))}; installed: {self.installed_solvers()})")
        n = form.num_vars
        # Integer and continuous variables are separate cvxpy variables (cvxpy's per-index
        # integrality is unreliable for vectors); v = S_c v_c + S_i v_i.
        if form.integrality is None or form.integrality.all():
            integer = form.integrality is not None
            v = cp.Variable(n, integer=integer, bounds=[form.lower, form.upper])
        else:
            int_idx = np.flatnonzero(form.integrality)
            cont_idx = np.flatnonzero(~form.integrality)
            v_c = cp.Variable(cont_idx.size, bounds=[form.lower[cont_idx], form.upper[cont_idx]])
            v_i = cp.Variable(int_idx.size, integer=True, bounds=[form.lower[int_idx], form.upper[int_idx]])
            S_c = sp.csr_array((np.ones(cont_idx.size), (cont_idx, np.arange(cont_idx.size))), shape=(n, cont_idx.size))
            S_i = sp.csr_array((np.ones(int_idx.size), (int_idx, np.arange(int_idx.size))), shape=(n, int_idx.size))
            v = S_c @ v_c + S_i @ v_i

        objective = form.c @ v + form.c0
        if form.P is not None:
            objective = objective + 0.5 * cp.quad_form(v, sp.csc_array(form.P), assume_PSD=True)

        lo, hi = form.row_lower, form.row_upper
        eq = np.flatnonzero(lo == hi)
        ge = np.flatnonzero(np.isfinite(lo) & (lo != hi))
        le = np.flatnonzero(np.isfinite(hi) & (lo != hi))
        constraints, blocks = [], []
        for rows, sense in ((eq, "eq"), (ge, "ge"), (le, "le")):
            if rows.size == 0:
                continue
            expr = form.A[rows] @ v
            con = expr == lo[rows] if sense == "eq" else (expr >= lo[rows] if sense == "ge" else expr <= hi[rows])
            constraints.append(con)
            blocks.append((rows, sense, con))

        problem = cp.Problem(cp.Minimize(objective), constraints)
        kwargs = self._solver_kwargs(solver, form, settings)
        if solver == "HIGHS" and not settings.verbose:
            from dpopt.estimate.backends.highs import silence_banner

            silence_banner()  # cvxpy's HIGHS interface would print HiGHS's banner
        try:
            with warnings.catch_warnings():
                # cvxpy warns on "infeasible or unbounded"; the adapter resolves it below.
                warnings.filterwarnings("ignore", message=r"\s*The problem is either infeasible or unbounded")
                # ... and on inaccurate / limited solves, which the status reports.
                warnings.filterwarnings("ignore", message="Solution may be inaccurate")
                # In a helper thread: Clarabel and the other solvers never call back into Python,
                # so a signal's handler runs in the waiting main thread at once (issue 24).
                run_interruptibly(problem.solve, solver=solver, verbose=settings.verbose, **kwargs)
        except cp.error.SolverError as exc:
            return self._outcome(
                Status.NUMERICAL_ERROR, x=None, objective=None, message=f"cvxpy: {exc}",
                solver=f"cvxpy/{solver}", raw_status="solver_error", form=form,
            )

        raw = str(problem.status)
        status = self.map_status(raw)
        stats = problem.solver_stats
        if raw == "user_limit" and settings.time_limit is not None:
            solve_time = stats.solve_time if stats.solve_time is not None else 0.0
            if solve_time >= 0.95 * settings.time_limit:
                status = Status.TIME_LIMIT
        x = None if v.value is None else np.asarray(v.value, dtype=np.float64).reshape(-1)
        duals = None
        if status is Status.OPTIMAL and not form.is_integer:
            duals = np.zeros(form.num_rows)
            for rows, sense, con in blocks:
                if con.dual_value is None:
                    duals = None
                    break
                # cvxpy's duals are ≥ 0 multipliers: d opt / d b is +y for "≥ b", −y for "≤ b" and "= b".
                duals[rows] += (1.0 if sense == "ge" else -1.0) * np.asarray(con.dual_value).reshape(-1)
        outcome = self._outcome(
            status, x=x, objective=None if problem.value is None or x is None else float(problem.value),
            message=f"cvxpy status {raw!r} from {stats.solver_name}", solver=f"cvxpy/{stats.solver_name or solver}",
            raw_status=raw, form=form, iterations=stats.num_iters, row_duals=duals,
        )
        if raw == "infeasible_or_unbounded":
            outcome = self._resolve_unbounded_or_infeasible(form, settings, outcome)
        return outcome
