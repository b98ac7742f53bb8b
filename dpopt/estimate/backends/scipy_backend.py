"""scipy.optimize: LPs through ``linprog(method="highs")`` (``"highs-ipm"`` above
:data:`~dpopt.estimate.backends.highs.IPM_MIN_VARS` variables), MILPs through ``milp``, and
bounded least squares (:class:`~dpopt.estimate.form.LeastSquaresForm`) through
``lsq_linear`` / L-BFGS-B / LSMR (:mod:`dpopt.estimate.backends.least_squares`).

Both LP entry points run HiGHS inside scipy; scipy reports HiGHS's model status only in
its message (``"... (HiGHS Status 7: Optimal)"``), so the status map reads that code and
falls back to scipy's own ``status`` when it is absent.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from dpopt.atomic import run_interruptibly
from dpopt.errors import SolverError
from dpopt.estimate.backends.base import DEFAULT_MIP_GAP, Backend, SolveSettings, importable
from dpopt.estimate.backends.highs import IPM_MIN_VARS, HighsBackend
from dpopt.estimate.backends.least_squares import LSQ_METHODS, solve_least_squares
from dpopt.estimate.form import LeastSquaresForm, ProgramForm
from dpopt.estimate.status import SolveOutcome, Status

__all__ = ["ScipyBackend"]

_HIGHS_CODE = re.compile(r"HiGHS Status (\d+)")

#: scipy's own LP/MILP statuses, used when the message carries no HiGHS code.
_SCIPY_STATUS = {0: Status.OPTIMAL, 1: Status.ITERATION_LIMIT, 2: Status.INFEASIBLE,
                 3: Status.UNBOUNDED, 4: Status.NUMERICAL_ERROR}


def _highs_status_name(message: str) -> str | None:
    """The HiGHS model status name scipy embedded in ``message``, if any."""
    import highspy

    match = _HIGHS_CODE.search(message or "")
    if match is None:
        return None
    try:
        return highspy.HighsModelStatus(int(match.group(1))).name
    except ValueError:
        return None


class ScipyBackend(Backend):
    """scipy.optimize (LP via linprog/HiGHS, MILP via milp, bounded least squares).

    ``tolerance`` sets HiGHS's primal/dual feasibility and IPM optimality tolerances (LP),
    the primal and MIP feasibility tolerances (MILP; passed through ``milp``'s verbatim
    options), or the least-squares method's stopping tolerance.
    """

    name: ClassVar[str] = "scipy"
    kinds: ClassVar[frozenset[str]] = frozenset({"LP", "MILP", "LSQ"})
    options: ClassVar[dict[str, str]] = {
        "mip_gap": f"relative MIP gap (default {DEFAULT_MIP_GAP})",
        "presolve": "bool: run HiGHS presolve (default True)",
        "method": f"least squares only: one of {list(LSQ_METHODS)} (default 'auto')",
        "max_iter": "least squares only: iteration limit",
        "x0": "least squares only: start point for 'lbfgsb' and 'lsmr'",
    }
    status_map: ClassVar[dict[Any, Status]] = {**HighsBackend.status_map}

    @classmethod
    def is_installed(cls) -> bool:
        return importable("scipy.optimize")

    def _check_options(self, form, settings: SolveSettings) -> None:
        super()._check_options(form, settings)
        if isinstance(form, ProgramForm):
            lsq_only = sorted({"method", "max_iter", "x0"} & set(settings.options))
            if lsq_only:
                raise SolverError(f"backend 'scipy': option(s) {lsq_only} apply only to LeastSquaresForm")
        elif "mip_gap" in settings.options or "presolve" in settings.options:
            raise SolverError("backend 'scipy': options mip_gap and presolve do not apply to LeastSquaresForm")

    def _solve(self, form: ProgramForm | LeastSquaresForm, settings: SolveSettings) -> SolveOutcome:
        if isinstance(form, LeastSquaresForm):
            return self._solve_lsq(form, settings)
        if form.is_integer:
            return self._solve_milp(form, settings)
        return self._solve_lp(form, settings)

    def _map(self, message: str, scipy_status: int) -> tuple[Status, str]:
        name = _highs_status_name(message)
        if name is not None and name in self.status_map:
            return self.status_map[name], name
        return _SCIPY_STATUS.get(int(scipy_status), Status.NOT_SOLVED), f"scipy status {scipy_status}"

    # ---- LP --------------------------------------------------------------------------
    def _solve_lp(self, form: ProgramForm, settings: SolveSettings) -> SolveOutcome:
        from scipy.optimize import linprog

        lo, hi = form.row_lower, form.row_upper
        eq = lo == hi
        ub = np.isfinite(hi) & ~eq
        lb = np.isfinite(lo) & ~eq
        A = form.A
        A_ub = sp.vstack([A[np.flatnonzero(ub)], -A[np.flatnonzero(lb)]], format="csr")
        b_ub = np.concatenate([hi[ub], -lo[lb]])
        options: dict[str, Any] = {"disp": settings.verbose, "presolve": bool(settings.option("presolve", True))}
        if settings.time_limit is not None:
            options["time_limit"] = settings.time_limit
        if settings.tolerance is not None:
            for opt in ("primal_feasibility_tolerance", "dual_feasibility_tolerance", "ipm_optimality_tolerance"):
                options[opt] = settings.tolerance
        res = run_interruptibly(  # scipy's HiGHS has no callback: a helper thread (issue 24)
            linprog,
            form.c,
            A_ub=A_ub if A_ub.shape[0] else None, b_ub=b_ub if A_ub.shape[0] else None,
            A_eq=A[np.flatnonzero(eq)] if eq.any() else None, b_eq=lo[eq] if eq.any() else None,
            bounds=np.column_stack([form.lower, form.upper]), options=options,
            method="highs-ipm" if form.num_vars > IPM_MIN_VARS else "highs",
        )
        status, raw = self._map(res.message, res.status)
        duals = None
        if status is Status.OPTIMAL:
            duals = np.zeros(form.num_rows)
            if eq.any():
                duals[eq] = res.eqlin.marginals
            if A_ub.shape[0]:
                marg = np.asarray(res.ineqlin.marginals)
                n_ub = int(ub.sum())
                duals[ub] += marg[:n_ub]
                duals[lb] -= marg[n_ub:]  # the row -A v <= -lo: d/d(lo) = -d/d(-lo)
        x = res.x if res.x is not None else None
        outcome = self._outcome(
            status, x=x, objective=None if res.fun is None or x is None else float(res.fun) + form.c0,
            message=str(res.message), solver="scipy.optimize.linprog/highs", raw_status=raw, form=form,
            iterations=getattr(res, "nit", None), row_duals=duals,
        )
        if raw == "kUnboundedOrInfeasible":
            outcome = self._resolve_unbounded_or_infeasible(form, settings, outcome)
        return outcome

    # ---- MILP ------------------------------------------------------------------------
    def _solve_milp(self, form: ProgramForm, settings: SolveSettings) -> SolveOutcome:
        from scipy.optimize import Bounds, LinearConstraint, milp

        options: dict[str, Any] = {
            "disp": settings.verbose,
            "presolve": bool(settings.option("presolve", True)),
            "mip_rel_gap": float(settings.option("mip_gap", DEFAULT_MIP_GAP)),
        }
        if settings.time_limit is not None:
            options["time_limit"] = settings.time_limit
        if settings.tolerance is not None:
            # milp passes options it does not know verbatim to HiGHS (with a warning).
            options["primal_feasibility_tolerance"] = settings.tolerance
            options["mip_feasibility_tolerance"] = settings.tolerance
        constraints = LinearConstraint(form.A, form.row_lower, form.row_upper) if form.num_rows else None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Unrecognized options detected", category=RuntimeWarning)
            res = run_interruptibly(  # scipy's HiGHS has no callback: a helper thread (issue 24)
                milp,
                form.c, integrality=form.integrality.astype(np.int8), bounds=Bounds(form.lower, form.upper),
                constraints=constraints, options=options,
            )
        status, raw = self._map(res.message, res.status)
        x = res.x if res.x is not None else None
        extra = {k: res.get(k) for k in ("mip_node_count", "mip_dual_bound", "mip_gap")}
        outcome = self._outcome(
            status, x=x, objective=None if res.fun is None or x is None else float(res.fun) + form.c0,
            message=f"{res.message} (nodes {extra['mip_node_count']})", solver="scipy.optimize.milp/highs",
            raw_status=raw, form=form, extra=extra,
        )
        if raw == "kUnboundedOrInfeasible":
            outcome = self._resolve_unbounded_or_infeasible(form, settings, outcome)
        return outcome

    # ---- least squares -------------------------------------------------------------------
    def _solve_lsq(self, form: LeastSquaresForm, settings: SolveSettings) -> SolveOutcome:
        res = solve_least_squares(
            form, method=settings.option("method", "auto"), time_limit=settings.time_limit,
            tolerance=settings.tolerance, max_iter=settings.option("max_iter"), x0=settings.option("x0"),
            verbose=settings.verbose,
        )
        return self._outcome(
            res.status, x=res.x, objective=res.objective, message=res.message,
            solver=f"scipy.optimize/{res.method}", raw_status=res.raw_status, form=form,
            iterations=res.iterations, extra={"method": res.method},
        )
