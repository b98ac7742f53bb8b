"""Name the constraint groups that make a form infeasible (an IIS over groups).

A *group* is a row name up to its first ``"["`` (``"invariant:state_totals[3]"`` →
``"invariant:state_totals"``); the variable bounds form one more group, ``"bounds"``.
:func:`find_conflicting_rows` returns a set of groups that is infeasible on its own and
*irreducible*: dropping any one of them makes the rest feasible. It is the group-level
version of Chinneck & Dravnieks' IIS filters (ORSA J. Computing 3(2), 1991):

1. *elastic filter* (only when there are many groups): solve
   ``min Σ s⁺ + s⁻  s.t.  row_lower ≤ A v + s⁺ − s⁻ ≤ row_upper``; every group with a
   positive slack is made hard, and the elastic problem is solved again, until it is
   infeasible. The hard groups (with the bounds) are then infeasible on their own, which
   usually narrows the candidates to a few groups in a few solves.
2. *deletion filter*: drop each candidate group in turn; if the rest is still infeasible
   it stays dropped, otherwise the group is part of the conflict. One feasibility solve per
   candidate group.

Integrality is kept in every check (so for a MILP the checks are MILPs).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from dpopt.errors import SolverError
from dpopt.estimate.form import ProgramForm, constraint_group
from dpopt.estimate.status import Status

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.estimate.backends.base import Backend

__all__ = ["find_conflicting_rows", "BOUNDS_GROUP"]

#: The pseudo-group standing for all variable bounds.
BOUNDS_GROUP = "bounds"

#: Above this many groups the elastic filter narrows the candidates first.
ELASTIC_GROUPS = 16

#: A slack above this (relative to 1 + |bound|) counts as positive in the elastic filter.
_SLACK_TOL = 1e-7


def _group_labels(form: ProgramForm) -> tuple[list[str], np.ndarray]:
    """The distinct groups in order of appearance and each row's group index."""
    names = form.groups
    index = {g: i for i, g in enumerate(names)}
    labels = np.fromiter((index[constraint_group(r)] for r in form.row_names), dtype=np.int64, count=form.num_rows)
    return names, labels


class _Checker:
    """Feasibility solves of subsets of groups through one backend."""

    def __init__(self, form: ProgramForm, backend: "Backend", time_limit: float | None) -> None:
        self.form = form.feasibility()
        self.backend = backend
        self.time_limit = time_limit
        self.names, self.labels = _group_labels(form)
        self.inconclusive: list[str] = []
        self.solves = 0

    def status(self, groups: set[int], bounds: bool) -> Status:
        keep = np.isin(self.labels, np.fromiter(groups, dtype=np.int64, count=len(groups)))
        sub = self.form.restricted(keep, drop_bounds=not bounds)
        self.solves += 1
        out = self.backend.solve(sub, time_limit=self.time_limit, conflicts=False)
        if out.status not in (Status.OPTIMAL, Status.INFEASIBLE):
            self.inconclusive.append(f"{out.status.name}: {out.message}")
        return out.status

    def elastic(self, hard: set[int]) -> tuple[Status, set[int]]:
        """Solve the elastic problem with the groups ``hard`` enforced; groups with slack."""
        form = self.form
        m, n = form.num_rows, form.num_vars
        soft = ~np.isin(self.labels, np.fromiter(hard, dtype=np.int64, count=len(hard)))
        eye = sp.eye_array(m, format="csr")
        A = sp.hstack([form.A, eye, -eye], format="csr")
        slack_upper = np.where(soft, np.inf, 0.0)
        integ = None
        if form.integrality is not None:
            integ = np.concatenate([form.integrality, np.zeros(2 * m, dtype=bool)])
        elastic = ProgramForm(
            c=np.concatenate([np.zeros(n), np.ones(2 * m)]), A=A,
            row_lower=form.row_lower, row_upper=form.row_upper, row_names=form.row_names,
            lower=np.concatenate([form.lower, np.zeros(2 * m)]),
            upper=np.concatenate([form.upper, slack_upper, slack_upper]),
            integrality=integ,
        )
        self.solves += 1
        out = self.backend.solve(elastic, time_limit=self.time_limit, conflicts=False)
        if out.status is not Status.OPTIMAL:
            if out.status is not Status.INFEASIBLE:
                self.inconclusive.append(f"elastic {out.status.name}: {out.message}")
            return out.status, set()
        slack = out.x[n:n + m] + out.x[n + m:]
        scale = 1.0 + np.minimum(np.abs(np.where(np.isfinite(form.row_lower), form.row_lower, 0.0))
                                 + np.abs(np.where(np.isfinite(form.row_upper), form.row_upper, 0.0)), 1e12)
        return out.status, set(np.unique(self.labels[slack > _SLACK_TOL * scale]).tolist())


def find_conflicting_rows(
    form: ProgramForm,
    backend: "Backend | str | None" = None,
    *,
    time_limit: float | None = None,
    elastic: bool | None = None,
) -> list[str]:
    """A minimal set of constraint groups of ``form`` that cannot hold together.

    Parameters
    ----------
    form : ProgramForm
        The (infeasible) form; its objective is ignored.
    backend : Backend, str or None
        The backend for the feasibility solves (an instance or a registry name); default
        the first installed backend that supports the form's kind.
    time_limit : float, optional
        Seconds allowed for each feasibility solve.
    elastic : bool, optional
        Narrow the candidates with the elastic filter first; default when the form has
        more than 16 groups.

    Returns
    -------
    list of str
        Group names in order of first appearance, ``"bounds"`` last when the variable
        bounds take part; empty when ``form`` is feasible. If some check ended without a
        verdict (time limit, numerical trouble) the groups it concerned are kept, so the
        set is still infeasible but may not be irreducible; a ``RuntimeWarning`` says so.

    Raises
    ------
    SolverError
        No installed backend supports the form, or a check crashed.
    """
    from dpopt.estimate.backends.registry import get_backend, installed_backends

    if not isinstance(form, ProgramForm):
        raise SolverError(f"find_conflicting_rows: form must be a ProgramForm, got {type(form).__name__}")
    feasibility_kind = "MILP" if form.is_integer else "LP"
    if backend is None:
        candidates = [get_backend(b) for b in installed_backends()]
        usable = [b for b in candidates if feasibility_kind in b.kinds]
        if not usable:
            raise SolverError(f"find_conflicting_rows: no installed backend solves {feasibility_kind} forms")
        backend = usable[0]
    elif isinstance(backend, str):
        backend = get_backend(backend)

    check = _Checker(form, backend, time_limit)
    all_groups = set(range(len(check.names)))
    has_bounds = bool(np.isfinite(form.lower).any() or np.isfinite(form.upper).any())

    full = check.status(all_groups, bounds=True)
    if full is Status.OPTIMAL:
        return []
    if full is not Status.INFEASIBLE:
        warnings.warn(
            f"find_conflicting_rows: the full form was not shown infeasible ({check.inconclusive[-1]}); "
            "reporting every group",
            RuntimeWarning,
            stacklevel=2,
        )
        return check.names + ([BOUNDS_GROUP] if has_bounds else [])

    candidates = all_groups
    use_elastic = len(all_groups) > ELASTIC_GROUPS if elastic is None else bool(elastic)
    if use_elastic:
        hard: set[int] = set()
        while True:
            status, slacked = check.elastic(hard)
            if status is Status.INFEASIBLE:
                candidates = hard
                break
            if status is not Status.OPTIMAL or not (slacked - hard):
                break  # no verdict, or (numerically) no slack: keep every group
            hard |= slacked

    # Deletion filter; the bounds are tried first so that named rows explain the conflict
    # whenever they can.
    keep_bounds = has_bounds
    if has_bounds and check.status(candidates, bounds=False) is Status.INFEASIBLE:
        keep_bounds = False
    kept = set(candidates)
    for g in sorted(candidates):
        trial = kept - {g}
        if check.status(trial, bounds=keep_bounds) is Status.INFEASIBLE:
            kept = trial

    if check.inconclusive:
        warnings.warn(
            f"find_conflicting_rows: {len(check.inconclusive)} of {check.solves} feasibility checks ended "
            f"without a verdict (first: {check.inconclusive[0]}); the conflict may not be minimal",
            RuntimeWarning,
            stacklevel=2,
        )
    return [check.names[g] for g in sorted(kept)] + ([BOUNDS_GROUP] if keep_bounds else [])
