"""The one result object of every consistency solve, in the style of ``scipy.optimize.OptimizeResult``.

Infeasible, unbounded and time-limited solves are statuses (``success`` False, ``x`` None
unless the solver returned an incumbent, flagged as such), never estimates presented as
solved. Input errors are exceptions, raised before any solve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.optimize import OptimizeResult

from dpopt.estimate.status import SolveOutcome, Status

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.queries.base import LinearQuery


class Result(OptimizeResult):
    """Outcome of :func:`dpopt.estimate.reconstruct` or :func:`dpopt.estimate.round_to_integers`.

    Attributes
    ----------
    x : ndarray or None
        The estimate over the domain's cells (None when no solution was found).
    status : Status
    success : bool
        True only for an optimal (or, for iterative engines, converged) solve.
    message : str
        The solver's own words.
    fun : float or None
        Objective value at ``x``.
    objective : str
        ``"l2"``, ``"l1"``, ``"linf"``, ``"entropy"`` or ``"round"``.
    backend, solver : str
        The adapter and the solver that ran (e.g. ``"highs"``, ``"HiGHS 1.15.1"``).
    time : float
        Wall-clock seconds.
    nit : int or None
        Iterations (solver iterations, or column-generation / MW passes).
    constraint_residuals : DataFrame
        One row per constraint: its largest violation and whether it holds (tolerance 1e-6).
    max_violation : float
        The largest violation over all constraints.
    measurement_residuals : DataFrame
        One row per measurement: RMS and largest absolute residual standardised by sigma.
    info : dict
        Anything else the engine reports (sizes, column-generation rounds, rounding method).
    """

    @property
    def constraint_residuals(self) -> pd.DataFrame:
        """The constraint residual table, built when first read from the rows computed at return
        (``max_violation`` is computed then too): a solve's engine builds a result in its scaled
        units that is then rebuilt in the original ones, and most tables were never read."""
        if "constraint_residuals" not in self:
            rows = self.__dict__.pop("_constraint_rows", None)
            self["constraint_residuals"] = pd.DataFrame(columns=CONSTRAINT_COLUMNS) if rows is None else \
                pd.DataFrame(rows, columns=CONSTRAINT_COLUMNS)
        return self["constraint_residuals"]

    @property
    def measurement_residuals(self) -> pd.DataFrame:
        """The measurement residual table, built when first read from the estimate as it was
        returned (a copy of ``x`` is kept for it): no solve reads it, and building it for every
        fit of an audit or a line search took ~10 % of their time (2026-11-28). Once built, or
        when set, it is the entry of that name like any other."""
        if "measurement_residuals" not in self:
            source = self.__dict__.pop("_measurement_source", None)
            self["measurement_residuals"] = empty_measurement_frame() if source is None else \
                measurement_residual_frame(*source)
        return self["measurement_residuals"]

    def answer(self, query: "LinearQuery") -> np.ndarray:
        """A query's answers on the estimate."""
        if self.x is None:
            raise ValueError(f"no estimate to answer from: the solve ended with status {self.status.name}")
        return query.matvec(self.x)


def make_result(
    outcome_status: Status,
    x: np.ndarray | None,
    *,
    message: str,
    fun: float | None,
    objective: str,
    backend: str,
    solver: str,
    time: float,
    nit: int | None,
    problem=None,
    info: dict | None = None,
    incumbent: bool = False,
) -> Result:
    """Build a :class:`Result`, computing residual tables from ``problem`` when ``x`` exists."""
    res = Result(
        x=None if x is None else np.asarray(x, dtype=np.float64),
        status=outcome_status,
        success=bool(outcome_status.success and x is not None),
        message=message,
        fun=fun,
        objective=objective,
        backend=backend,
        solver=solver,
        time=float(time),
        nit=nit,
        incumbent=incumbent,
        info=dict(info or {}),
    )
    if x is not None and problem is not None and getattr(problem, "objective", None) == objective \
            and objective in OWN_OBJECTIVE_VALUES:
        # The objective is always dpopt's own figure at x (a solver's may be in its scaling,
        # or off by its tolerance); the solver's figure is kept beside it.
        res.fun = objective_value(problem, res.x)
        if fun is not None and fun != res.fun:
            res.info.setdefault("solver_objective", fun)
    if x is not None and problem is not None:
        rows = problem.constraints.residuals(res.x, tol=constraint_tolerance(problem))
        res.__dict__["_constraint_rows"] = rows  # the table is built when read
        res.max_violation = largest_violation(rows) if rows else 0.0
        res.__dict__["_measurement_source"] = (problem.measurements, res.x.copy(), problem)  # read lazily
    else:
        res.max_violation = None  # and an empty constraint table when read
    return res


CONSTRAINT_COLUMNS = ["constraint", "max_violation", "satisfied"]


def largest_violation(rows: list[dict]) -> float:
    """The largest ``max_violation`` of the rows, NaN skipped (NaN when all are): the table's
    column ``.max()`` computed as pandas does it (NaN filled with -inf, then numpy's max, so even
    the sign of a zero agrees), without building the table."""
    values = np.array([r["max_violation"] for r in rows], dtype=np.float64)
    nan = np.isnan(values)
    if nan.all():
        return float("nan")
    values[nan] = -np.inf
    return float(values.max())


def empty_measurement_frame() -> pd.DataFrame:
    """The measurement residual table of a result without an estimate."""
    return pd.DataFrame(columns=["measurement", "rows", "rms_z", "max_abs_z"])


#: Objectives whose value :func:`objective_value` computes from the problem alone.
OWN_OBJECTIVE_VALUES = ("l2", "l1", "linf", "entropy")


def objective_value(problem, x: np.ndarray) -> float:
    """The objective of ``problem`` at ``x``, from the standardised residuals ``(Q x − y)/σ``:
    their sum of squares (``l2``, and ``entropy``, whose fit is least squares), of absolute
    values (``l1``) or their largest absolute value (``linf``); 0 without noisy measurements."""
    if not problem.noisy:
        return 0.0
    z = (problem.stacked_operator().matvec(x) - problem.targets()) / problem.sigmas()
    if problem.objective == "l1":
        return float(np.abs(z).sum())
    if problem.objective == "linf":
        return float(np.abs(z).max())
    return float(z @ z)


def constraint_tolerance(problem) -> float:
    """Largest violation that counts as satisfied in the residual table: 1e-6 persons, or 1e-9 of
    the problem's count scale when counts are so large that double precision cannot do better."""
    from dpopt.estimate.scaling import count_scale
    from dpopt.estimate.certificates.verify import feasibility_tolerance

    return feasibility_tolerance(count_scale(problem))


def from_outcome(outcome: SolveOutcome, x, *, objective: str, problem, time: float, nit=None, info=None) -> Result:
    """A :class:`Result` from a backend's :class:`SolveOutcome` (status and words kept)."""
    return make_result(
        outcome.status,
        x,
        message=outcome.message,
        fun=outcome.objective,
        objective=objective,
        backend=outcome.backend,
        solver=outcome.solver,
        time=time,
        nit=outcome.iterations if nit is None else nit,
        problem=problem,
        info={**(info or {}), **({"conflicting_constraints": outcome.conflicting_rows} if outcome.conflicting_rows else {})},
        incumbent=outcome.incumbent,
    )


def measurement_residual_frame(measurements, x: np.ndarray, problem=None) -> pd.DataFrame:
    """RMS and largest ``|Q x - y| / sigma`` of each measurement.

    With ``problem`` the noisy measurements' answers come from its stacked operator in one
    product (one Walsh–Hadamard transform for a marginal workload).
    """
    stacked = {}
    if len(getattr(problem, "noisy", ())) > 50:
        answers = problem.stacked_operator().matvec(x)
        splits = np.cumsum([m.query.num_rows for m in problem.noisy])[:-1]
        stacked = {id(m): a for m, a in zip(problem.noisy, np.split(answers, splits))}
    rows = []
    for m in measurements:
        raw = stacked[id(m)] - m.values if id(m) in stacked else m.residuals(x)
        z = raw / m.stddev if m.variance > 0 else np.full_like(raw, np.nan)
        rows.append(
            {
                "measurement": m.label,
                "rows": m.query.num_rows,
                "rms_z": float(np.sqrt(np.mean(z**2))) if m.variance > 0 else float("nan"),
                "max_abs_z": float(np.abs(z).max()) if m.variance > 0 else float("nan"),
                "max_abs_residual": float(np.abs(raw).max()),
            }
        )
    return pd.DataFrame(rows)
