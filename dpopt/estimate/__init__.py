"""Consistency optimization: pure post-processing of measurements under public constraints.

This package never sees the private data nor a random source. Entry points:

- :func:`reconstruct` — the table that fits the measurements best under the constraints,
  for the L2, L1, L-infinity, entropy and smooth objectives, with any installed backend;
- :func:`round_to_integers` — integer tables keeping every equality: controlled rounding of the
  measured answers, the per-cell L1 optimum, or unbiased randomised rounding;
- :func:`standard_errors` — error bars: exact GLS, given the active set, or a parametric
  bootstrap through the same solve.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Sequence

from dpopt.estimate.backends import available_backends, get_backend, installed_backends
from dpopt.estimate.engines.coupled import coupled_applies, solve_coupled
from dpopt.estimate.engines.entropy import solve_entropy
from dpopt.estimate.certificates.errorbars import bootstrap_replicates, gls_covariance, standard_errors
from dpopt.estimate.certificates.finalize import in_original_units
from dpopt.estimate.engines.least_squares import solve_l2
from dpopt.estimate.engines.linear import solve_linear
from dpopt.estimate.policy import BACKENDS_FOR, backends_for, check_backend, installed_backends_for
from dpopt.estimate.problem import OBJECTIVES, ConsistencyProblem
from dpopt.estimate.result import Result
from dpopt.estimate.rounding import round_to_integers
from dpopt.estimate.scaling import prepare
from dpopt.estimate.engines.separable import separable_applies, solve_separable
from dpopt.estimate.engines.smooth import options_in_units, solve_smooth
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet
from dpopt.model.measurement import Measurement

__all__ = [
    "reconstruct", "round_to_integers", "standard_errors", "gls_covariance", "ConsistencyProblem",
    "bootstrap_replicates",
    "Result", "Status", "OBJECTIVES", "BACKENDS_FOR", "backends_for", "installed_backends_for",
    "installed_backends", "available_backends", "get_backend",
]

#: The default of ``reconstruct(verbose=...)`` in this context: ``dpopt run --verbose`` sets it for
#: the run, so the solves inside any algorithm print their logs without each passing the keyword.
SOLVER_VERBOSE: ContextVar[bool] = ContextVar("dpopt_solver_verbose", default=False)

#: The engine of each objective (see each module's notes).
ENGINES = {"l2": solve_l2, "l1": solve_linear, "linf": solve_linear, "entropy": solve_entropy, "smooth": solve_smooth}


def reconstruct(
    measurements: Sequence[Measurement],
    constraints: ConstraintSet | None = None,
    objective: str = "l2",
    *,
    backend: str | None = None,
    time_limit: float | None = None,
    integer: bool | None = None,
    verbose: bool | None = None,
    **options,
) -> Result:
    """Find the table that fits the measurements best and obeys every constraint.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers; noise-free ones (variance 0) act as invariants.
    constraints : ConstraintSet, optional
        Checked for consistency first (:meth:`ConstraintSet.check`).
    objective : {"l2", "l1", "linf", "entropy", "smooth"}
        Weighted least squares (weights ``1/sigma^2``), weighted L1 (``1/sigma``),
        weighted L-infinity (the Barak et al. LP), entropy projection (the maximum-entropy
        best fit) or ``"smooth"``: least squares regularised by relative entropy in three
        proximal steps whose weight follows the noise (:mod:`dpopt.estimate.engines.smooth`; every free
        cell positive).
    backend : str, optional
        Any installed adapter that fits the objective (see :data:`BACKENDS_FOR`); default:
        the first. ``installed_backends()`` lists what this machine has. Problems whose
        measurements are all diagonal (the identity) are solved exactly cell by cell
        (:mod:`dpopt.estimate.engines.separable`), and L2 problems with an identity beside other
        measurements, disjoint invariant rows and ``x >= 0`` (at least 1,000 cells: a top-down
        parent) by accelerated projected gradient (:mod:`dpopt.estimate.engines.coupled`; the general
        engine when its certificate fails), unless a backend or an engine option is named.
    time_limit : float, optional
        Seconds; a solve that hits it returns status TIME_LIMIT, not an estimate.
    integer : bool, optional
        Round the estimate exactly to integers afterwards (default: when the constraint set
        declares integrality): controlled rounding that keeps every measured answer at the floor
        or ceiling of its fitted value (:func:`round_to_integers`). The rounding's own result is
        in ``info["rounding"]``.
    verbose : bool, optional
        Let the solvers print their logs (default: :data:`SOLVER_VERBOSE`, which is False —
        silent, banners included — unless a ``dpopt run --verbose`` is under way).
    **options
        Passed to the engine / backend; unknown names raise :class:`SolverError` listing
        the accepted ones.

    Returns
    -------
    Result
        Before any solver sees it, the problem is scaled (:mod:`dpopt.estimate.scaling`):
        counts in units of a power of two near the largest (``info["count_scale"]``), and
        measurements whose noise is below a solver's resolution imposed as exact equalities
        (``info["exact_by_resolution"]``, also named in the message). A status OPTIMAL means
        dpopt has checked the point itself: optimality certificate of the solve
        (:mod:`dpopt.estimate.certificates.verify`) and every constraint to
        :func:`~dpopt.estimate.certificates.verify.feasibility_tolerance` in the original units
        (:mod:`dpopt.estimate.certificates.finalize`). A failed check is status NUMERICAL_ERROR with the
        solver's message, never a success.
    """
    if verbose is None:
        verbose = SOLVER_VERBOSE.get()
    problem = ConsistencyProblem(measurements, constraints, objective)
    check_backend(objective, backend)
    problem.constraints.check()
    prepared = prepare(problem)
    if objective == "smooth":
        options = options_in_units(options, prepared.scale)
    if backend is None and not options and separable_applies(prepared.problem):
        result = solve_separable(prepared.problem, time_limit)
    elif backend is None and not options and coupled_applies(prepared.problem):
        result = solve_coupled(prepared.problem, time_limit)
        if not result.success and result.status is not Status.TIME_LIMIT:
            remaining = None if time_limit is None else max(float(time_limit) - result.time, 1e-3)
            fallback = ENGINES[objective](prepared.problem, backend, remaining, verbose=verbose)
            fallback.message = f"{fallback.message} (after the coupled engine: {result.message})"
            result = fallback
    else:
        result = ENGINES[objective](prepared.problem, backend, time_limit, verbose=verbose, **options)
    result = in_original_units(result, problem, prepared)
    result.problem = problem
    do_round = problem.constraints.integral if integer is None else integer
    if do_round and result.success:
        rounding = round_to_integers(result.x, problem.constraints, measured=problem.noisy or None,
                                     time_limit=time_limit)
        result.info["rounding"] = {k: rounding[k] for k in ("status", "message", "fun", "time", "info")}
        result.info["fractional_x"] = result.x
        if not rounding.success and not (rounding.incumbent and rounding.x is not None
                                         and rounding.max_violation == 0.0):
            result.x, result.success, result.status = None, False, rounding.status
            result.message = f"integer rounding failed: {rounding.message}"
        else:
            result.x = rounding.x
            result.constraint_residuals = rounding.constraint_residuals
            result.max_violation = rounding.max_violation
    return result

