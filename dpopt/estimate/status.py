"""Solver-independent statuses and the outcome of one backend solve.

Every backend maps its solver's own statuses onto :class:`Status` (a table per backend,
as cvxpy does) and returns a :class:`SolveOutcome`. Infeasible, unbounded and
time-limited solves are statuses, never exceptions; only :attr:`Status.OPTIMAL` counts as
success for a solve; :attr:`Status.COMPLETED` is an algorithm's (never a solver's) and, with
OPTIMAL, :attr:`Status.releasable`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Status", "SolveOutcome"]


class Status(enum.Enum):
    """What a solve established about the problem."""

    #: A solution optimal to the solver's tolerances.
    OPTIMAL = "optimal"
    #: The constraints admit no point (proven by the solver).
    INFEASIBLE = "infeasible"
    #: The objective is unbounded below on the feasible set.
    UNBOUNDED = "unbounded"
    #: Stopped by the time limit; ``x`` is the incumbent if one was found.
    TIME_LIMIT = "time_limit"
    #: Stopped by an iteration (or node) limit; ``x`` is the last iterate if any.
    ITERATION_LIMIT = "iteration_limit"
    #: The solver gave up or reached only reduced accuracy; see the message.
    NUMERICAL_ERROR = "numerical_error"
    #: The solver did not run or reported no usable status.
    NOT_SOLVED = "not_solved"
    #: An iterative algorithm (MWEM, DualQuery, ...) ran all its planned steps. It makes no
    #: optimality claim: what it releases is what its privacy proof covers, not an optimum.
    COMPLETED = "completed"

    @property
    def success(self) -> bool:
        """True only for :attr:`OPTIMAL` (a solve's success)."""
        return self is Status.OPTIMAL

    @property
    def releasable(self) -> bool:
        """True for what a release may publish: a verified optimum, or an algorithm that ran to completion."""
        return self is Status.OPTIMAL or self is Status.COMPLETED


@dataclass(frozen=True, eq=False)
class SolveOutcome:
    """The result of one backend solve (a solver-level ``OptimizeResult``).

    Attributes
    ----------
    status : Status
        The mapped status.
    x : ndarray or None
        The solution for OPTIMAL; for a limit or a numerical error the best point the
        solver returned, if any (then :attr:`incumbent` is True); otherwise None.
    objective : float or None
        The objective of the form at ``x`` (including ``c0``), as the solver reports it.
    message : str
        The solver's own words about how it stopped (prefixed with its raw status).
    backend : str
        Registry name of the backend, e.g. ``"highs"``.
    solver : str
        The solver that ran, e.g. ``"HiGHS 1.15.1"``, ``"cvxpy/CLARABEL"``, ``"PuLP/PULP_CBC_CMD"``.
    raw_status : str
        The solver's own status name or code before mapping.
    iterations : int or None
        Iterations reported by the solver (simplex + barrier + QP; B&B nodes are in
        ``message`` for MIPs where the solver reports them).
    wall_time : float
        Seconds spent in the backend, model building included.
    row_duals : ndarray or None
        Shadow prices of the rows, ``∂ optimum / ∂ (active row bound)``: non-negative on a
        row at its lower bound, non-positive at its upper bound (minimisation). Only for
        continuous problems solved to optimality by a solver that reports them.
    conflicting_rows : list of str or None
        For an infeasible form, a minimal set of conflicting constraint groups (row names
        up to the first ``"["``; ``"bounds"`` stands for the variable bounds) found by
        :func:`~dpopt.estimate.backends.find_conflicting_rows`; None when not computed.
    incumbent : bool
        True when ``x`` is a point the solver returned without proving it optimal.
    """

    status: Status
    x: np.ndarray | None
    objective: float | None
    message: str
    backend: str
    solver: str
    raw_status: str = ""
    iterations: int | None = None
    wall_time: float = 0.0
    row_duals: np.ndarray | None = None
    conflicting_rows: list[str] | None = None
    incumbent: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """True only when the status is OPTIMAL."""
        return self.status.success

    def __repr__(self) -> str:
        obj = "None" if self.objective is None else f"{self.objective:.10g}"
        return (
            f"SolveOutcome(status={self.status.name}, objective={obj}, solver={self.solver!r}, "
            f"iterations={self.iterations}, wall_time={self.wall_time:.3g}s, message={self.message!r})"
        )
