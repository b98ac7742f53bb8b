"""Solver adapters for the canonical forms of :mod:`dpopt.estimate.form`.

One module per solver (HiGHS, Clarabel, cvxpy, PuLP/CBC, scipy), a common :class:`Backend`
interface with a status map each, a registry, and the conflict finder for infeasible
forms::

    from dpopt.estimate.backends import get_backend
    outcome = get_backend("highs").solve(form, time_limit=10)
    if outcome.status is Status.INFEASIBLE:
        print(outcome.conflicting_rows)    # e.g. ['invariant:total', 'upper:cap']
"""

from dpopt.estimate.backends.base import CONFLICT_ROW_LIMIT, DEFAULT_MIP_GAP, Backend, SolveSettings
from dpopt.estimate.backends.clarabel_backend import ClarabelBackend
from dpopt.estimate.backends.conflicts import BOUNDS_GROUP, find_conflicting_rows
from dpopt.estimate.backends.cvxpy_backend import CvxpyBackend
from dpopt.estimate.backends.highs import HighsBackend
from dpopt.estimate.backends.least_squares import LSQ_METHODS, solve_least_squares
from dpopt.estimate.backends.pulp_backend import PulpBackend
from dpopt.estimate.backends.registry import (
    BACKENDS,
    PREFERRED,
    available_backends,
    default_backend,
    get_backend,
    installed_backends,
)
from dpopt.estimate.backends.scipy_backend import ScipyBackend

__all__ = [
    "Backend", "SolveSettings", "CONFLICT_ROW_LIMIT", "DEFAULT_MIP_GAP",
    "HighsBackend", "ClarabelBackend", "CvxpyBackend", "PulpBackend", "ScipyBackend",
    "BACKENDS", "PREFERRED", "get_backend", "installed_backends", "available_backends", "default_backend",
    "find_conflicting_rows", "BOUNDS_GROUP", "LSQ_METHODS", "solve_least_squares",
]
