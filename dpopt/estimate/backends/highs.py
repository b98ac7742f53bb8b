"""HiGHS through highspy's public API (LP, convex QP, MILP).

The form is passed in one ``Highs.passModel`` call with CSC arrays (``a_format`` column-wise,
the Hessian's lower triangle column-wise), so building the model costs no Python loop
over variables or rows. HiGHS solves LPs by dual simplex or interior point, convex QPs by
an active-set method (continuous only: no MIQP) and MILPs by branch and cut.

HiGHS minimises ``cᵀx + ½ xᵀQx + offset`` subject to ``L ≤ Ax ≤ U``, ``l ≤ x ≤ u`` —
exactly :class:`~dpopt.estimate.form.ProgramForm` — and its row duals are the shadow
prices ``∂ objective / ∂ row bound``, the convention of
:attr:`~dpopt.estimate.status.SolveOutcome.row_duals`.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from dpopt.errors import SolverError
from dpopt.estimate.backends.base import DEFAULT_MIP_GAP, Backend, SolveSettings, importable
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.status import SolveOutcome, Status

__all__ = ["HighsBackend", "IncrementalLP", "MipBudget", "new_highs", "run_highs", "silence_banner", "HIGHS_THREADS"]

# HiGHS enum values of the C API used by Highs.passModel (documented in HConst.h).
_MATRIX_COLWISE = 1
_HESSIAN_TRIANGULAR = 1
_SENSE_MINIMIZE = 1
_SOLUTION_STATUS_FEASIBLE = 2

_METHODS = ("auto", "choose", "simplex", "ipm", "pdlp")

#: LPs with more variables are solved by interior point + crossover under method "auto": on
#: an L1 table-consistency LP with 8·10^4 variables IPM took 12.5 s, dual simplex 49 s.
IPM_MIN_VARS = 10_000


def _status_map() -> dict[str, Status]:
    return {
        "kNotset": Status.NOT_SOLVED,
        "kModelEmpty": Status.NOT_SOLVED,  # forms without variables never reach HiGHS
        "kOptimal": Status.OPTIMAL,
        "kInfeasible": Status.INFEASIBLE,
        "kUnboundedOrInfeasible": Status.NOT_SOLVED,  # resolved by a feasibility re-solve
        "kUnbounded": Status.UNBOUNDED,
        "kTimeLimit": Status.TIME_LIMIT,
        "kIterationLimit": Status.ITERATION_LIMIT,
        "kSolutionLimit": Status.ITERATION_LIMIT,
        "kObjectiveBound": Status.NOT_SOLVED,
        "kObjectiveTarget": Status.NOT_SOLVED,
        "kPresolveError": Status.NUMERICAL_ERROR,
        "kSolveError": Status.NUMERICAL_ERROR,
        "kPostsolveError": Status.NUMERICAL_ERROR,
        "kUnknown": Status.NUMERICAL_ERROR,
        "kInterrupt": Status.NOT_SOLVED,
        "kHighsInterrupt": Status.NOT_SOLVED,
        "kMemoryLimit": Status.NUMERICAL_ERROR,
        # kLoadError and kModelError mean HiGHS rejected a validated model: a crash.
    }


_BANNER_SILENCED = False


@contextmanager
def _stdout_to_devnull():
    """Send the process's file descriptor 1 to /dev/null for the duration (C-level prints)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def silence_banner() -> None:
    """Keep HiGHS's banner off standard output.

    HiGHS writes "Running HiGHS ..." to the C standard output when the first ``Highs``
    object of a process is constructed, before any option can be set (cvxpy's HIGHS
    interface constructs one too). Constructing that first object here, with file
    descriptor 1 sent to /dev/null, keeps every later construction quiet.
    """
    global _BANNER_SILENCED
    if _BANNER_SILENCED:
        return
    import highspy

    with _stdout_to_devnull():
        highspy.Highs()
    _BANNER_SILENCED = True


def _reset_scheduler_after_fork() -> None:
    highspy = sys.modules.get("highspy")  # only if this process has loaded HiGHS (directly or via cvxpy)
    if highspy is not None:
        highspy.Highs.resetGlobalScheduler(True)


if hasattr(os, "register_at_fork"):
    # HiGHS's task scheduler threads do not survive fork(): a forked worker (the audit's and
    # top-down's process pools) whose parent had solved MIPs waited forever in its next MIP.
    os.register_at_fork(after_in_child=_reset_scheduler_after_fork)


#: HiGHS runs on the calling thread only (its ``threads`` option). Its task scheduler is global
#: and its worker threads outlive a solve; a long-lived process that had done hundreds of solves
#: hung in a futex wait (issue 24), and solves from short-lived threads deadlock in HiGHS's
#: scheduler (HiGHS PR #1886). With one thread no worker is ever started. dpopt's rounding and
#: consistency programs gain nothing measurable from HiGHS's parallel MIP on 2 cores.
HIGHS_THREADS = 1


def new_highs(verbose: bool = False):
    """A ``highspy.Highs`` object whose output (banner included) appears only when ``verbose``,
    set to run on the calling thread alone (:data:`HIGHS_THREADS`)."""
    import highspy

    if not verbose:
        silence_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("threads", HIGHS_THREADS)
    return h


class MipBudget:
    """The work and CPU-time budget of one MILP run, spent in HiGHS's MIP interrupt callback.

    ``work`` counts the callback's calls (root cut rounds, nodes): solver events, not seconds,
    so a run stops at the same point on an idle and on a loaded machine. ``cpu_limit`` is in
    seconds of this process's CPU time. ``stopped`` is the HiGHS status to report instead of
    ``kInterrupt`` once the budget ran out (``kIterationLimit`` or ``kTimeLimit``).
    """

    __slots__ = ("work_limit", "cpu_limit", "work", "stopped", "cpu_start")

    def __init__(self, work_limit: int | None = None, cpu_limit: float | None = None) -> None:
        self.work_limit, self.cpu_limit = work_limit, cpu_limit
        self.work, self.stopped, self.cpu_start = 0, None, time.process_time()

    def spend(self) -> bool:
        """One unit of work; True once the budget has run out."""
        self.work += 1
        if self.work_limit is not None and self.work >= self.work_limit:
            self.stopped = "kIterationLimit"
        elif self.cpu_limit is not None and time.process_time() - self.cpu_start >= self.cpu_limit:
            self.stopped = "kTimeLimit"
        return self.stopped is not None


class _RunControls:
    """Per-``Highs`` state read by :func:`_interrupt`: the budget of the current run, if any."""

    __slots__ = ("budget", "mip_interrupt")

    def __init__(self, mip_interrupt) -> None:
        self.budget: MipBudget | None = None
        self.mip_interrupt = mip_interrupt  # highspy's kCallbackMipInterrupt


def _interrupt(event) -> None:
    """The one interrupt callback (simplex, IPM, QP, MIP): stop on a pending signal, and in a
    MIP once the run's :class:`MipBudget` has run out."""
    from dpopt.atomic import signal_pending

    if signal_pending():
        event.interrupt()
        return
    controls = event.user_data
    budget = controls.budget
    if budget is not None and event.callback_type == controls.mip_interrupt and budget.spend():
        event.interrupt()


def run_highs(h, budget: MipBudget | None = None) -> None:
    """``h.run()`` that a signal stops within a callback interval, on one thread.

    The run happens inside :func:`dpopt.atomic.deferred_signals`; HiGHS's simplex, IPM and MIP
    interrupt callbacks stop it once a signal has arrived, and the signal's exception is raised
    after ``run`` has returned. The same MIP interrupt callback spends ``budget`` (work and CPU
    seconds; :class:`MipBudget`) and stops the run when it runs out. If another user of HiGHS in
    this process (cvxpy's interface, another library) started the global scheduler with more
    threads, HiGHS refuses the run (status ``kNotset``): the scheduler is shut down
    (``Highs.resetGlobalScheduler``) and the run made again.
    """
    import highspy
    from dpopt.atomic import deferred_signals

    controls = getattr(h, "_dpopt_controls", None)
    if controls is None:
        controls = _RunControls(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
        for callback in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):
            callback.subscribe(_interrupt, controls)
        qp = getattr(highspy.cb.HighsCallbackType, "kHighsCallbackQpInterrupt", None)
        if qp is not None:
            h.callbacks[int(qp)].subscribe(_interrupt, controls)
        h._dpopt_controls = controls
    controls.budget = budget
    try:
        with deferred_signals():
            status = h.run()
            if status == highspy.HighsStatus.kError and h.getModelStatus().name == "kNotset":
                highspy.Highs.resetGlobalScheduler(True)
                h.run()
    finally:
        controls.budget = None


class HighsBackend(Backend):
    """HiGHS via highspy (LP, convex QP, MILP).

    ``tolerance`` sets HiGHS's ``primal_feasibility_tolerance``,
    ``dual_feasibility_tolerance``, ``ipm_optimality_tolerance`` and (MILP)
    ``mip_feasibility_tolerance``.
    """

    name: ClassVar[str] = "highs"
    kinds: ClassVar[frozenset[str]] = frozenset({"LP", "QP", "MILP"})
    incremental: ClassVar[bool] = True
    options: ClassVar[dict[str, str]] = {
        "mip_gap": f"relative MIP gap at which to stop (default {DEFAULT_MIP_GAP})",
        "presolve": "bool: run HiGHS presolve (default True)",
        "method": "'auto' (default), 'choose', 'simplex', 'ipm' or 'pdlp': HiGHS's `solver` option; "
        f"'auto' is 'ipm' (with crossover) for LPs of more than {IPM_MIN_VARS} variables, else 'choose'",
        "highs_options": "dict of further HiGHS options passed to Highs.setOptionValue",
        "mip_start": "MILP: a point (one value per variable) HiGHS starts from (Highs.setSolution)",
        "work_limit": "MILP: stop after this many calls of HiGHS's MIP interrupt callback (root cut rounds, "
        "nodes): a budget that does not depend on the machine's load; status ITERATION_LIMIT, incumbent kept",
        "cpu_limit": "MILP: stop once the solve has used this many seconds of the process's CPU time (checked in "
        "the same callback); status TIME_LIMIT, incumbent kept",
    }
    status_map: ClassVar[dict[str, Status]] = _status_map()

    @classmethod
    def is_installed(cls) -> bool:
        return importable("highspy")

    def _check_options(self, form, settings: SolveSettings) -> None:
        super()._check_options(form, settings)
        method = settings.option("method", "auto")
        if method not in _METHODS:
            raise SolverError(f"backend 'highs': method must be one of {list(_METHODS)}, got {method!r}")
        if not isinstance(settings.option("highs_options", {}), dict):
            raise SolverError("backend 'highs': highs_options must be a dict of HiGHS option names to values")
        limit = settings.option("work_limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
            raise SolverError(f"backend 'highs': work_limit must be a positive integer, got {limit!r}")
        cpu = settings.option("cpu_limit")
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not cpu > 0):
            raise SolverError(f"backend 'highs': cpu_limit must be a positive number of seconds, got {cpu!r}")

    def incremental_lp(self, form: ProgramForm, *, first_method: str = "ipm", dual_tolerance: float | None = None,
                       verbose: bool = False) -> "IncrementalLP":
        return IncrementalLP(form, first_method=first_method, dual_tolerance=dual_tolerance, verbose=verbose)

    @staticmethod
    def _set(h: Any, option: str, value: Any) -> None:
        import highspy

        if h.setOptionValue(option, value) != highspy.HighsStatus.kOk:
            raise SolverError(f"backend 'highs': HiGHS rejected option {option}={value!r}")

    def _solve(self, form: ProgramForm, settings: SolveSettings) -> SolveOutcome:
        import highspy

        h = new_highs(settings.verbose)
        if settings.time_limit is not None:
            self._set(h, "time_limit", settings.time_limit)
        if settings.tolerance is not None:
            for opt in ("primal_feasibility_tolerance", "dual_feasibility_tolerance", "ipm_optimality_tolerance"):
                self._set(h, opt, settings.tolerance)
            if form.is_integer:
                self._set(h, "mip_feasibility_tolerance", settings.tolerance)
        if form.is_integer:
            self._set(h, "mip_rel_gap", float(settings.option("mip_gap", DEFAULT_MIP_GAP)))
        if not settings.option("presolve", True):
            self._set(h, "presolve", "off")
        method = settings.option("method", "auto")
        if method == "auto":
            method = "ipm" if form.kind == "LP" and form.num_vars > IPM_MIN_VARS else "choose"
        self._set(h, "solver", method)
        for opt, value in settings.option("highs_options", {}).items():
            self._set(h, opt, value)

        n, m = form.num_vars, form.num_rows
        A = sp.csc_array(form.A)
        if form.P is not None:
            Q = sp.csc_array(sp.tril(form.P, format="csc"))
        else:
            Q = sp.csc_array((n, n))
        integrality = (
            form.integrality.astype(np.int32) if form.integrality is not None else np.zeros(n, dtype=np.int32)
        )
        status = h.passModel(
            n, m, A.nnz, Q.nnz, _MATRIX_COLWISE, _HESSIAN_TRIANGULAR, _SENSE_MINIMIZE, form.c0,
            np.ascontiguousarray(form.c), np.ascontiguousarray(form.lower), np.ascontiguousarray(form.upper),
            np.ascontiguousarray(form.row_lower), np.ascontiguousarray(form.row_upper),
            A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data,
            Q.indptr.astype(np.int32), Q.indices.astype(np.int32), Q.data,
            integrality,
        )
        if status == highspy.HighsStatus.kError:
            raise SolverError(f"backend 'highs': HiGHS rejected the {form.kind} model (passModel returned kError)")
        budget = _mip_controls(h, form, settings)
        run_highs(h, budget)
        model_status = h.getModelStatus()
        raw = model_status.name
        if budget is not None and raw == "kInterrupt" and budget.stopped:
            raw = budget.stopped  # our budget, not a signal (a signal raises as run_highs returns)
        if raw in ("kLoadError", "kModelError"):
            raise SolverError(f"backend 'highs': HiGHS reports {h.modelStatusToString(model_status)}")

        info = h.getInfo()
        sol = h.getSolution()
        iterations = sum(
            max(0, int(getattr(info, k)))
            for k in ("simplex_iteration_count", "ipm_iteration_count", "crossover_iteration_count",
                      "qp_iteration_count", "pdlp_iteration_count")
        )
        extra: dict[str, Any] = {}
        message = f"{raw}: {h.modelStatusToString(model_status)}"
        if form.is_integer:
            extra = {"mip_node_count": int(info.mip_node_count), "mip_gap": float(info.mip_gap),
                     "mip_dual_bound": float(info.mip_dual_bound)}
            if budget is not None:
                extra["work"] = budget.work
                extra["cpu_time"] = time.process_time() - budget.cpu_start
            message += f" (nodes {info.mip_node_count}, gap {info.mip_gap:.3g})"

        mapped = self.map_status(raw)
        has_point = bool(sol.value_valid) and info.primal_solution_status == _SOLUTION_STATUS_FEASIBLE
        x = np.asarray(sol.col_value, dtype=np.float64) if has_point or mapped is Status.OPTIMAL else None
        duals = None
        if mapped is Status.OPTIMAL and not form.is_integer and sol.dual_valid:
            duals = np.asarray(sol.row_dual, dtype=np.float64)
        outcome = self._outcome(
            mapped, x=x, objective=float(info.objective_function_value) if x is not None else None,
            message=message, solver=f"HiGHS {h.version()}", raw_status=raw, form=form,
            iterations=iterations, row_duals=duals, extra=extra,
        )
        if raw == "kUnboundedOrInfeasible":
            outcome = self._resolve_unbounded_or_infeasible(form, settings, outcome)
        return outcome


def _mip_controls(h: Any, form: ProgramForm, settings: SolveSettings) -> "MipBudget | None":
    """Apply the ``mip_start`` option; the ``work_limit`` / ``cpu_limit`` budget for
    :func:`run_highs`, or None."""
    start = settings.option("mip_start")
    if start is not None and form.is_integer:
        values = np.asarray(start, dtype=np.float64)
        if values.shape != (form.num_vars,):
            raise SolverError(f"backend 'highs': mip_start has {values.size} values for {form.num_vars} variables")
        h.setSolution(form.num_vars, np.arange(form.num_vars, dtype=np.int32), values)
    work, cpu = settings.option("work_limit"), settings.option("cpu_limit")
    if (work is None and cpu is None) or not form.is_integer:
        return None
    return MipBudget(work, cpu)


class IncrementalLP:
    """An LP held in HiGHS between solves, for column generation.

    New columns are appended with ``Highs.addCols``; they enter at zero, so the previous
    optimal basis stays primal feasible and the next ``run`` continues with the primal
    simplex from it instead of solving from scratch (on the Fourier LP of Barak et al.,
    HiGHS's own choice of variant was 7 times slower). The first master
    is solved by IPM with crossover, which hands the simplex a basis.
    """

    def __init__(self, form: ProgramForm, *, first_method: str = "ipm", verbose: bool = False,
                 dual_tolerance: float | None = None):
        import highspy

        if form.is_integer or form.P is not None:
            raise SolverError("backend 'highs': incremental solves are for continuous LPs")
        self._h = h = new_highs(verbose)
        h.setOptionValue("solver", first_method)
        if dual_tolerance is not None:
            h.setOptionValue("dual_feasibility_tolerance", float(dual_tolerance))
        A = sp.csc_array(form.A)
        status = h.passModel(
            form.num_vars, form.num_rows, A.nnz, 0, _MATRIX_COLWISE, _HESSIAN_TRIANGULAR, _SENSE_MINIMIZE, form.c0,
            np.ascontiguousarray(form.c), np.ascontiguousarray(form.lower), np.ascontiguousarray(form.upper),
            np.ascontiguousarray(form.row_lower), np.ascontiguousarray(form.row_upper),
            A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data,
            np.zeros(1, np.int32), np.zeros(0, np.int32), np.zeros(0), np.zeros(form.num_vars, np.int32),
        )
        if status == highspy.HighsStatus.kError:
            raise SolverError("backend 'highs': HiGHS rejected the LP (passModel returned kError)")
        self.num_vars = form.num_vars

    def add_columns(self, cost: np.ndarray, lower: np.ndarray, upper: np.ndarray, columns: sp.spmatrix) -> None:
        cols = sp.csc_array(columns)
        self._h.addCols(
            cols.shape[1], np.ascontiguousarray(cost, dtype=np.float64), np.ascontiguousarray(lower, dtype=np.float64),
            np.ascontiguousarray(upper, dtype=np.float64), cols.nnz, cols.indptr[:-1].astype(np.int32),
            cols.indices.astype(np.int32), cols.data.astype(np.float64),
        )
        self.num_vars += cols.shape[1]

    def solve(self, time_limit: float | None = None) -> SolveOutcome:
        h = self._h
        if time_limit is not None:
            # HiGHS measures its time limit on a clock that keeps running across runs.
            h.setOptionValue("time_limit", h.getRunTime() + float(time_limit))
        start = time.perf_counter()
        run_highs(h)
        h.setOptionValue("solver", "simplex")
        h.setOptionValue("simplex_strategy", 4)  # primal simplex: the old basis stays feasible
        raw = h.getModelStatus().name
        mapped = _status_map().get(raw, Status.NOT_SOLVED)
        info, sol = h.getInfo(), h.getSolution()
        x = np.asarray(sol.col_value, dtype=np.float64) if mapped is Status.OPTIMAL else None
        duals = np.asarray(sol.row_dual, dtype=np.float64) if mapped is Status.OPTIMAL and sol.dual_valid else None
        return SolveOutcome(
            status=mapped, x=x, objective=float(info.objective_function_value) if x is not None else None,
            message=f"{raw}: {h.modelStatusToString(h.getModelStatus())}", backend="highs",
            solver=f"HiGHS {h.version()} (column generation, warm-started primal simplex)", raw_status=raw,
            iterations=int(info.simplex_iteration_count) + max(0, int(info.ipm_iteration_count)),
            wall_time=time.perf_counter() - start, row_duals=duals,
        )
