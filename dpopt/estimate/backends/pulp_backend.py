"""PuLP with the CBC binary it bundles (``PULP_CBC_CMD``): LP and MILP.

PuLP models are made of one Python object per variable and per constraint, and CBC is
run as a subprocess on an MPS file, so building and passing a model costs Python work
proportional to its non-zeros. The adapter builds the expressions straight from the CSR
rows of ``A`` (one ``LpAffineExpression`` per row), but it is meant for small and medium
problems — up to roughly 10^5 non-zeros; use the HiGHS backend beyond that.

PuLP reports a pair (``LpStatus``, ``LpSolution``); the status map reads both. CBC
stopped on its time limit with an incumbent comes back as ``(Optimal, IntegerFeasible)``
and without one as ``(Not Solved, No Solution Found)``: the adapter reports TIME_LIMIT
for both when a time limit was set.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np

from dpopt.errors import SolverError
from dpopt.estimate.backends.base import DEFAULT_MIP_GAP, Backend, SolveSettings
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.status import SolveOutcome, Status

__all__ = ["PulpBackend"]


def _status_map() -> dict[tuple[int, int], Status]:
    # (LpStatus, LpSolution) codes, from pulp.constants.
    return {
        (1, 1): Status.OPTIMAL,          # Optimal / Optimal Solution Found
        (1, 2): Status.ITERATION_LIMIT,  # Optimal / Solution Found (stopped with an incumbent)
        (0, 0): Status.NOT_SOLVED,       # Not Solved / No Solution Found
        (-1, -1): Status.INFEASIBLE,
        (-1, 0): Status.INFEASIBLE,
        (-2, -2): Status.UNBOUNDED,
        (-2, 0): Status.UNBOUNDED,
        (-3, 0): Status.NOT_SOLVED,      # Undefined
    }


class PulpBackend(Backend):
    """PuLP + CBC (LP, MILP), for small and medium problems.

    ``tolerance`` sets CBC's ``primalTolerance`` and ``dualTolerance`` (and
    ``integerTolerance`` for a MILP).
    """

    name: ClassVar[str] = "pulp"
    kinds: ClassVar[frozenset[str]] = frozenset({"LP", "MILP"})
    options: ClassVar[dict[str, str]] = {
        "mip_gap": f"relative MIP gap, CBC's ratioGap (default {DEFAULT_MIP_GAP})",
        "threads": "int: CBC threads",
        "cbc_options": "list of further CBC command-line options, e.g. ['presolve off']",
    }
    status_map: ClassVar[dict[tuple[int, int], Status]] = _status_map()

    @classmethod
    def is_installed(cls) -> bool:
        try:
            import pulp
        except ImportError:
            return False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(pulp.PULP_CBC_CMD(msg=False).available())

    def _check_options(self, form, settings: SolveSettings) -> None:
        super()._check_options(form, settings)
        opts = settings.option("cbc_options", [])
        if not isinstance(opts, (list, tuple)) or not all(isinstance(o, str) for o in opts):
            raise SolverError("backend 'pulp': cbc_options must be a list of strings")
        threads = settings.option("threads")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise SolverError(f"backend 'pulp': threads must be a positive integer, got {threads!r}")

    def _build(self, form: ProgramForm) -> tuple[Any, list[Any], list[tuple[str, int, float]]]:
        """The PuLP problem, its variables, and (constraint name, row, sign) for the duals."""
        import pulp

        n = form.num_vars
        lower = [None if not np.isfinite(b) else float(b) for b in form.lower]
        upper = [None if not np.isfinite(b) else float(b) for b in form.upper]
        integer = form.integrality if form.integrality is not None else np.zeros(n, dtype=bool)
        cats = [pulp.LpInteger if flag else pulp.LpContinuous for flag in integer]
        prob = pulp.LpProblem("dpopt", pulp.LpMinimize)
        # PuLP has no vector variables: one object per variable is its data model.
        # (PuLP >= 3.3 creates them through the problem; older versions directly.)
        new_var = getattr(prob, "add_variable", pulp.LpVariable)
        variables = [new_var(f"v{j}", lower[j], upper[j], cats[j]) for j in range(n)]
        nz = np.flatnonzero(form.c)
        prob += pulp.LpAffineExpression([(variables[j], float(form.c[j])) for j in nz], constant=form.c0)

        A = form.A
        indptr, indices, data = A.indptr, A.indices, A.data
        lo, hi = form.row_lower, form.row_upper
        dual_rows: list[tuple[str, int, float]] = []
        for i in range(form.num_rows):  # one PuLP constraint per row (PuLP's data model)
            cols, vals = indices[indptr[i]:indptr[i + 1]], data[indptr[i]:indptr[i + 1]]
            terms = [(variables[j], float(a)) for j, a in zip(cols, vals)]
            if lo[i] == hi[i]:
                senses = [(f"r{i}_eq", pulp.LpConstraintEQ, lo[i])]
            else:
                senses = []
                if np.isfinite(lo[i]):
                    senses.append((f"r{i}_ge", pulp.LpConstraintGE, lo[i]))
                if np.isfinite(hi[i]):
                    senses.append((f"r{i}_le", pulp.LpConstraintLE, hi[i]))
            for name, sense, rhs in senses:
                prob.addConstraint(
                    pulp.LpConstraint(pulp.LpAffineExpression(terms), sense=sense, rhs=float(rhs), name=name)
                )
                dual_rows.append((name, i, 1.0))
        return prob, variables, dual_rows

    def _solve(self, form: ProgramForm, settings: SolveSettings) -> SolveOutcome:
        import pulp

        prob, variables, dual_rows = self._build(form)
        cbc_options = list(settings.option("cbc_options", []))
        if settings.tolerance is not None:
            cbc_options += [f"primalTolerance {settings.tolerance}", f"dualTolerance {settings.tolerance}"]
            if form.is_integer:
                cbc_options.append(f"integerTolerance {settings.tolerance}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # PULP_CBC_CMD's PuLP-4.0 notice
            cmd = pulp.PULP_CBC_CMD(
                mip=form.is_integer, msg=settings.verbose, timeLimit=settings.time_limit,
                gapRel=float(settings.option("mip_gap", DEFAULT_MIP_GAP)) if form.is_integer else None,
                threads=settings.option("threads"), options=cbc_options,
            )
            prob.solve(cmd)

        raw = (int(prob.status), int(prob.sol_status))
        raw_text = f"{pulp.LpStatus.get(raw[0], raw[0])} / {pulp.LpSolution.get(raw[1], raw[1])}"
        status = self.map_status(raw)
        if settings.time_limit is not None and raw in ((1, 2), (0, 0)):
            status = Status.TIME_LIMIT
        x = None
        if raw[1] in (1, 2):
            x = np.array([np.nan if v.varValue is None else v.varValue for v in variables], dtype=np.float64)
        duals = None
        if status is Status.OPTIMAL and not form.is_integer:
            duals = np.zeros(form.num_rows)
            by_name = getattr(prob, "get_constraint_by_name", None) or prob.constraints.__getitem__
            for name, row, sign in dual_rows:
                pi = by_name(name).pi
                if pi is None:
                    duals = None
                    break
                duals[row] += sign * pi
        objective = None
        if x is not None:
            objective = pulp.value(prob.objective)
            objective = None if objective is None else float(objective)
        return self._outcome(
            status, x=x, objective=objective, message=f"PuLP/CBC: {raw_text}", solver="PuLP/PULP_CBC_CMD",
            raw_status=raw_text, form=form, row_duals=duals,
        )
