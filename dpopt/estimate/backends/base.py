"""The common interface of the solver adapters.

One adapter per solver (cvxpy's design): each knows whether its solver is installed,
which program kinds it supports, how to pass a :class:`~dpopt.estimate.form.ProgramForm`
through the solver's public API, and a table from the solver's own statuses to
:class:`~dpopt.estimate.status.Status`. The template method :meth:`Backend.solve`
validates the call, times it, turns any unexpected exception of the solver into a
:class:`~dpopt.errors.SolverError` naming the backend, and, for an infeasible form,
attaches the conflicting constraint groups.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dpopt.errors import DpoptError, SolverError
from dpopt.estimate.form import LeastSquaresForm, ProgramForm
from dpopt.estimate.status import SolveOutcome, Status

__all__ = ["Backend", "SolveSettings", "CONFLICT_ROW_LIMIT", "DEFAULT_MIP_GAP", "importable"]

#: Largest number of rows for which an infeasible solve looks for conflicting groups.
CONFLICT_ROW_LIMIT = 20_000

#: Default relative MIP gap: consistency rounding wants the optimum, not a 1e-4 approximation
#: (HiGHS's default), so every backend closes the gap unless told otherwise.
DEFAULT_MIP_GAP = 1e-9

#: Options every backend accepts, with their meaning.
COMMON_OPTIONS: dict[str, str] = {
    "conflicts": "bool (default True): on an infeasible ProgramForm with at most "
    f"{CONFLICT_ROW_LIMIT} rows, name the conflicting constraint groups",
}


@dataclass(frozen=True)
class SolveSettings:
    """The validated arguments of one :meth:`Backend.solve` call."""

    time_limit: float | None
    tolerance: float | None
    verbose: bool
    options: dict[str, Any]

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)


def importable(module: str) -> bool:
    """True when ``module`` is installed (an adapter's solver), found without importing it: learning
    that cvxpy is there must not cost its 1-3 s import (it is imported when it first solves)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or a broken entry in sys.modules
        return False


def _positive(name: str, value: Any, backend: str) -> float | None:
    if value is None:
        return None
    try:
        val = float(value)
    except (TypeError, ValueError) as exc:
        raise SolverError(f"{backend}: {name} must be a positive number, got {value!r}") from exc
    if not (val > 0 and math.isfinite(val)):
        raise SolverError(f"{backend}: {name} must be a positive finite number, got {value!r}")
    return val


class Backend(ABC):
    """A solver adapter.

    Subclasses set :attr:`name`, :attr:`kinds`, :attr:`options` and :attr:`status_map`,
    and implement :meth:`is_installed` and :meth:`_solve`.
    """

    #: Registry name, e.g. ``"highs"``.
    name: ClassVar[str]
    #: Program kinds the adapter solves: a subset of {"LP", "QP", "MILP", "MIQP", "LSQ"}.
    kinds: ClassVar[frozenset[str]]
    #: Backend-specific options accepted by :meth:`solve`, with their meaning.
    options: ClassVar[dict[str, str]] = {}
    #: The solver's own statuses mapped to :class:`Status`.
    status_map: ClassVar[Mapping[Any, Status]] = {}
    #: True when :meth:`incremental_lp` keeps an LP loaded between solves (column generation).
    incremental: ClassVar[bool] = False

    # ---- capabilities ------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def is_installed(cls) -> bool:
        """True when the solver is installed (found without importing it where that is possible)."""

    def supports(self, form: ProgramForm | LeastSquaresForm) -> bool:
        """True when this backend can solve ``form``'s kind.

        A :class:`LeastSquaresForm` with an explicit ``M`` is also accepted by every
        QP-capable backend, through its lifted QP (:meth:`LeastSquaresForm.to_program`).
        """
        if isinstance(form, LeastSquaresForm):
            return "LSQ" in self.kinds or ("QP" in self.kinds and not form.is_matrix_free)
        if isinstance(form, ProgramForm):
            return form.kind in self.kinds
        return False

    def incremental_lp(self, form: ProgramForm, *, first_method: str = "ipm", dual_tolerance: float | None = None,
                       verbose: bool = False):
        """An LP held in the solver between solves, to which columns can be added (column
        generation: each solve continues from the previous basis), or None when the backend
        cannot (see :attr:`incremental`). The object has ``add_columns(cost, lower, upper,
        columns)``, ``solve(time_limit) -> SolveOutcome`` and ``num_vars``."""
        return None

    @classmethod
    def accepted_options(cls) -> dict[str, str]:
        """Every option name :meth:`solve` accepts, with its meaning."""
        return {**COMMON_OPTIONS, **cls.options}

    def map_status(self, raw: Any) -> Status:
        """The :class:`Status` of the solver's own status ``raw`` (NOT_SOLVED if unknown)."""
        return self.status_map.get(raw, Status.NOT_SOLVED)

    # ---- solving -----------------------------------------------------------------------
    def solve(
        self,
        form: ProgramForm | LeastSquaresForm,
        *,
        time_limit: float | None = None,
        tolerance: float | None = None,
        verbose: bool = False,
        **options: Any,
    ) -> SolveOutcome:
        """Solve ``form``.

        Parameters
        ----------
        form : ProgramForm or LeastSquaresForm
            The problem.
        time_limit : float, optional
            Seconds; reaching it gives :attr:`Status.TIME_LIMIT` (with the incumbent, if
            any), never an exception.
        tolerance : float, optional
            The solver's feasibility / optimality tolerance (each backend documents which
            of its parameters it sets).
        verbose : bool
            Let the solver print its log.
        **options
            Backend options; see :meth:`accepted_options`.

        Returns
        -------
        SolveOutcome

        Raises
        ------
        SolverError
            Unknown option (the message lists the accepted ones), a bad time limit or
            tolerance, a kind the backend does not support, the solver not installed, or
            the solver crashed (the message names the backend).
        """
        unknown = sorted(set(options) - set(self.accepted_options()))
        if unknown:
            raise SolverError(
                f"backend {self.name!r}: unknown option(s) {unknown}; accepted options: "
                f"{sorted(self.accepted_options())}"
            )
        if not isinstance(form, (ProgramForm, LeastSquaresForm)):
            raise SolverError(
                f"backend {self.name!r}: form must be a ProgramForm or LeastSquaresForm, "
                f"got {type(form).__name__}"
            )
        if not self.is_installed():
            raise SolverError(f"backend {self.name!r}: its solver is not installed")
        if not self.supports(form):
            raise SolverError(
                f"backend {self.name!r} does not support {form.kind} forms"
                + (" with a matrix-free M" if isinstance(form, LeastSquaresForm) and "QP" in self.kinds else "")
                + f"; it supports {sorted(self.kinds)}"
            )
        settings = SolveSettings(
            time_limit=_positive("time_limit", time_limit, self.name),
            tolerance=_positive("tolerance", tolerance, self.name),
            verbose=bool(verbose),
            options=dict(options),
        )
        self._check_options(form, settings)

        start = time.perf_counter()
        try:
            if isinstance(form, ProgramForm) and form.num_vars == 0:
                outcome = self._solve_empty(form)
            elif isinstance(form, LeastSquaresForm) and "LSQ" not in self.kinds:
                outcome = self._solve_lifted(form, settings)
            else:
                outcome = self._solve(form, settings)
        except DpoptError:
            raise
        except Exception as exc:  # the solver itself failed: an error naming the backend
            raise SolverError(
                f"backend {self.name!r} crashed: {type(exc).__name__}: {exc}"
            ) from exc
        if outcome.status is Status.OPTIMAL and outcome.x is not None:
            outcome = self._certified(form, outcome, settings)
        if (
            outcome.status is Status.INFEASIBLE
            and isinstance(form, ProgramForm)
            and settings.option("conflicts", True)
            and outcome.conflicting_rows is None
            and form.num_rows <= CONFLICT_ROW_LIMIT
        ):
            from dpopt.estimate.backends.conflicts import find_conflicting_rows

            outcome = dataclasses.replace(
                outcome, conflicting_rows=find_conflicting_rows(form, self, time_limit=settings.time_limit)
            )
        return dataclasses.replace(outcome, wall_time=time.perf_counter() - start)

    def _certified(self, form: ProgramForm | LeastSquaresForm, outcome: SolveOutcome,
                   settings: SolveSettings) -> SolveOutcome:
        """The outcome with dpopt's own check of its point (:mod:`dpopt.estimate.certificates.verify`): an
        "optimal" point that fails it becomes NUMERICAL_ERROR, kept only as an incumbent."""
        from dpopt.estimate.certificates.verify import CERTIFICATE_TOL, certify_least_squares, certify_program

        tol = max(CERTIFICATE_TOL, 10.0 * settings.tolerance) if settings.tolerance else CERTIFICATE_TOL
        if isinstance(form, LeastSquaresForm):
            cert = certify_least_squares(form, outcome.x, tol)
        else:
            cert = certify_program(form, outcome.x, outcome.row_duals, tol)
        extra = {**outcome.extra, "certificate": cert.as_dict()}
        if cert.ok:
            return dataclasses.replace(outcome, extra=extra)
        return dataclasses.replace(
            outcome, status=Status.NUMERICAL_ERROR, row_duals=None, incumbent=True, extra=extra,
            message=f"{outcome.message}; the solver called its point optimal but dpopt's check failed: "
                    f"{cert.describe()}")

    def _check_options(self, form: ProgramForm | LeastSquaresForm, settings: SolveSettings) -> None:
        """Validate option values (names are already known to be accepted)."""
        if not isinstance(settings.options.get("conflicts", True), bool):
            raise SolverError(f"backend {self.name!r}: conflicts must be True or False")
        if "mip_gap" in settings.options:
            gap = settings.options["mip_gap"]
            if not isinstance(gap, (int, float)) or not (0 <= gap < 1):
                raise SolverError(f"backend {self.name!r}: mip_gap must be in [0, 1), got {gap!r}")

    @abstractmethod
    def _solve(self, form: ProgramForm | LeastSquaresForm, settings: SolveSettings) -> SolveOutcome:
        """Run the solver on a form of a supported kind."""

    def _solve_empty(self, form: ProgramForm) -> SolveOutcome:
        """A form without variables: feasible iff every row admits ``A v = 0``."""
        feasible = bool(np.all(form.row_lower <= 0) and np.all(form.row_upper >= 0))
        return self._outcome(
            Status.OPTIMAL if feasible else Status.INFEASIBLE,
            x=np.zeros(0) if feasible else None, objective=form.c0 if feasible else None,
            message="no variables: " + ("all rows admit 0" if feasible else "some row excludes 0"),
            solver="none", raw_status="empty", form=form,
            row_duals=np.zeros(form.num_rows) if feasible else None,
        )

    def _solve_lifted(self, form: LeastSquaresForm, settings: SolveSettings) -> SolveOutcome:
        """Solve a least-squares form as its lifted QP and keep the first ``n`` entries."""
        settings = dataclasses.replace(settings, options={**settings.options, "conflicts": False})
        out = self._solve(form.to_program(), settings)
        x = None if out.x is None else out.x[: form.num_vars]
        return dataclasses.replace(out, x=x, row_duals=None)

    # ---- helpers for subclasses ------------------------------------------------------------
    def _outcome(
        self,
        status: Status,
        *,
        x: np.ndarray | None,
        objective: float | None,
        message: str,
        solver: str,
        raw_status: Any,
        form: ProgramForm | LeastSquaresForm,
        iterations: int | None = None,
        row_duals: np.ndarray | None = None,
        extra: dict | None = None,
    ) -> SolveOutcome:
        """Assemble an outcome, dropping points the status does not vouch for."""
        if x is not None:
            x = np.asarray(x, dtype=np.float64).reshape(-1)
            if x.shape[0] != form.num_vars or not np.isfinite(x).all():
                x = None
        if status in (Status.INFEASIBLE, Status.UNBOUNDED, Status.NOT_SOLVED):
            x = None
        if x is None or status is not Status.OPTIMAL:
            row_duals = None
        if x is not None and objective is None:
            objective = form.objective(x)
        if x is None and status is not Status.OPTIMAL:
            objective = None
        if row_duals is not None:
            row_duals = np.asarray(row_duals, dtype=np.float64).reshape(-1)
        return SolveOutcome(
            status=status,
            x=x,
            objective=None if objective is None else float(objective),
            message=message,
            backend=self.name,
            solver=solver,
            raw_status=str(raw_status),
            iterations=None if iterations is None or iterations < 0 else int(iterations),
            row_duals=row_duals,
            incumbent=x is not None and status is not Status.OPTIMAL,
            extra=extra or {},
        )

    def _resolve_unbounded_or_infeasible(
        self, form: ProgramForm, settings: SolveSettings, outcome: SolveOutcome
    ) -> SolveOutcome:
        """Decide an "unbounded or infeasible" report by solving the feasibility problem.

        A feasible form whose solver reports "unbounded or infeasible" is unbounded (for a
        MILP with rational data too: an unbounded relaxation ray is rational).
        """
        quiet = dataclasses.replace(settings, options={**settings.options, "conflicts": False})
        check = self._solve(form.feasibility(), quiet)
        if check.status is Status.INFEASIBLE:
            status = Status.INFEASIBLE
        elif check.status is Status.OPTIMAL:
            status = Status.UNBOUNDED
        else:
            status = Status.NOT_SOLVED
        return dataclasses.replace(
            outcome,
            status=status,
            x=None,
            objective=None,
            incumbent=False,
            message=f"{outcome.message}; feasibility re-solve: {check.status.name} ({check.message})",
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, installed={self.is_installed()})"
