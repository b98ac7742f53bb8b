"""One record as an integer program: the data player's best response of DualQuery, and more.

:class:`RecordProgram` models a single record of a :class:`~dpopt.model.domain.Domain` with one
binary per attribute value, exactly one value per attribute (one-hot), and every
single-record constraint of a :class:`~dpopt.model.constraints.ConstraintSet` (structural
zeros and hierarchies) as linear rows, so every feasible point decodes to an allowed record.
Any algorithm that needs "the best record under a linear score" can reuse it.

:func:`best_response` solves the data player's problem of DualQuery (Gaboardi, Gallego Arias,
Hsu, Roth, Wu, ICML 2014, Algorithm 1): given sampled conjunctions (positive or negated, with
multiplicities), find the record satisfying the largest number of them. The program, with
``z_{a,v}`` the value binaries and one indicator ``y_j in [0, 1]`` per distinct sampled
conjunction ``j`` with literals ``L_j``::

    maximise   C + Σ_j w_j y_j
    s.t.       Σ_v z_{a,v} = 1                       for every attribute a        (one-hot)
               y_j <= z_l          for l in L_j       when w_j > 0   (a conjunction's indicator)
               y_j >= Σ_{l in L_j} z_l - (|L_j| - 1)  when w_j < 0
               structural-zero rows (below)

where a conjunction sampled ``c+`` times positively and ``c-`` times negated gets
``w_j = c+ - c-`` and ``C = Σ c-``. This is the issue's formulation with the negated copy's
indicator ``u = 1 - y`` (``u <= Σ_l (1 - z_l)``, ``u <= 1``) substituted and the two copies of a
conjunction merged, which leaves the optimum and the objective unchanged. The ``y`` need no
integrality: at integral ``z`` each is pushed to ``min_l z_l`` or ``max(0, Σ z_l - |L|+1)``,
which are 0 or 1. Conjunctions of one literal put their weight on ``z`` directly.

Every returned record is checked here, never taken on trust: exactly one value per attribute,
no structural zero, and its score recomputed by evaluating the sampled conjunctions on it. The
gap is ``(bound - score) / max(1, bound)`` with the solver's dual bound (HiGHS reports it; CBC
through PuLP does not, so its time-outs have an unknown gap).

Structural zeros over attributes ``a_1..a_r`` with forbidden cells ``F``: a rule of one
attribute fixes the forbidden values' binaries to 0; a product ``S_1 x ... x S_r`` is one row
``Σ_i Σ_{v in S_i} z_{a_i,v} <= r - 1``; any other pattern is grouped by the values ``g`` of all
attributes but one (the one giving fewest rows): ``Σ_{i<r} z_{a_i,g_i} + Σ_{v: (g,v) in F}
z_{a_r,v} <= r - 1``, which forbids exactly ``F`` given one-hot rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from dpopt.errors import InconsistentConstraintsError, QueryError, SolverError
from dpopt.estimate.backends import get_backend
from dpopt.estimate.form import ProgramForm
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet
from dpopt.model.domain import Domain
from dpopt.model.queries.literal_conjunctions import Conjunctions

__all__ = ["RecordProgram", "BestResponse", "best_response", "improve_record", "MIP_BACKENDS"]

#: Backends that solve the record program (MILP capability).
MIP_BACKENDS = ("highs", "pulp")


@dataclass(frozen=True, eq=False)
class BestResponse:
    """The outcome of one best-response solve.

    Attributes
    ----------
    codes : ndarray or None
        The record (codes in domain order), checked to be allowed; None when the solver
        returned no usable point (the caller's fallback applies).
    score : float
        Number of sampled queries (with multiplicity) the record satisfies, recomputed.
    bound : float
        Upper bound on the best score (the solver's dual bound; ``nan`` when unknown).
    gap : float
        ``(bound - score) / max(1, bound)``; 0 for a verified optimum, ``nan`` when unknown.
    status : Status
        ``OPTIMAL`` (score equals the bound within the MIP gap), ``TIME_LIMIT`` (incumbent or
        none), or the solver's failure status.
    time : float
        Seconds in the solver (building included).
    backend, solver, message : str
    """

    codes: np.ndarray | None
    score: float
    bound: float
    gap: float
    status: Status
    time: float
    backend: str
    solver: str
    message: str
    info: dict = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.codes is not None


class RecordProgram:
    """One record of ``domain`` as binaries ``z_{a,v}`` with one-hot and single-record constraint rows.

    Parameters
    ----------
    domain : Domain
    constraints : ConstraintSet, optional
        Its structural zeros and hierarchies become rows; other kinds concern tables, not a
        record, and are ignored here.
    """

    def __init__(self, domain: Domain, constraints: ConstraintSet | None = None) -> None:
        self.domain = domain
        self.sizes = np.asarray(domain.sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.num_values = int(self.sizes.sum())
        patterns = [] if constraints is None else [(domain.axes(attrs), np.asarray(mask, dtype=bool))
                                                    for _, attrs, mask in constraints.zero_patterns()]
        self.patterns = [(tuple(int(a) for a in axes), mask.reshape(tuple(int(self.sizes[a]) for a in axes)))
                         for axes, mask in patterns if mask.any()]
        self.value_upper = np.ones(self.num_values)
        rows, lo, hi, names = [], [], [], []
        for axes, mask in self.patterns:
            self._zero_rows(axes, mask, rows, lo, hi, names)
        d = len(domain)
        onehot = sp.csr_matrix((np.ones(self.num_values), (np.repeat(np.arange(d), self.sizes),
                                                             np.arange(self.num_values))), shape=(d, self.num_values))
        self.base_A = sp.vstack([onehot] + rows).tocsr() if rows else onehot
        self.base_lower = np.concatenate([np.ones(d)] + lo)
        self.base_upper = np.concatenate([np.ones(d)] + hi)
        self.base_names = [f"one-hot[{a}]" for a in domain.attrs] + names
        for a in range(d):
            if not self.value_upper[self.offsets[a]:self.offsets[a] + self.sizes[a]].any():
                raise InconsistentConstraintsError(
                    f"the structural zeros forbid every value of {domain.attrs[a]!r}: no record is allowed")

    # ---- structural zeros as rows --------------------------------------------------------------
    def column(self, axis, code) -> np.ndarray:
        """Column of the binary ``z_{a,v}`` (vectorised over arrays of axes and codes)."""
        return self.offsets[np.asarray(axis)] + np.asarray(code)

    def _zero_rows(self, axes, mask, rows, lo, hi, names) -> None:
        r = len(axes)
        label = "zero:" + ",".join(self.domain.attrs[a] for a in axes)
        if r == 1:
            self.value_upper[self.column(axes[0], np.flatnonzero(mask))] = 0.0
            return
        projections = [mask.any(axis=tuple(j for j in range(r) if j != i)) for i in range(r)]
        product = projections[0]
        for p in projections[1:]:
            product = np.multiply.outer(product, p)
        if np.array_equal(product, mask):  # one row forbids the whole box
            cols = np.concatenate([self.column(a, np.flatnonzero(p)) for a, p in zip(axes, projections)])
            rows.append(sp.csr_matrix((np.ones(cols.size), (np.zeros(cols.size, dtype=np.int64), cols)),
                                      shape=(1, self.num_values)))
            lo.append(np.array([-np.inf]))
            hi.append(np.array([r - 1.0]))
            names.append(f"{label}[box]")
            return
        cells = np.argwhere(mask)  # forbidden cells, one row each: (f, r)
        best = None
        for last in range(r):  # the attribute whose forbidden values are listed per group
            prefix = np.delete(cells, last, axis=1)
            groups, inverse = np.unique(prefix, axis=0, return_inverse=True)
            if best is None or len(groups) < len(best[1]):
                best = (last, groups, inverse.ravel())
        last, groups, inverse = best
        others = [j for j in range(r) if j != last]
        g = len(groups)
        pre_rows = np.repeat(np.arange(g), r - 1)
        pre_cols = self.column(np.tile([axes[j] for j in others], g), groups.ravel())
        suf_cols = self.column(np.full(len(cells), axes[last]), cells[:, last])
        data_rows = np.concatenate([pre_rows, inverse])
        data_cols = np.concatenate([pre_cols, suf_cols])
        rows.append(sp.csr_matrix((np.ones(data_rows.size), (data_rows, data_cols)), shape=(g, self.num_values)))
        lo.append(np.full(g, -np.inf))
        hi.append(np.full(g, r - 1.0))
        names.extend(f"{label}[{i}]" for i in range(g))

    # ---- records ---------------------------------------------------------------------------------
    def allows(self, codes: np.ndarray) -> np.ndarray:
        """Whether each record (rows of ``codes``) avoids every structural zero."""
        codes = np.atleast_2d(np.asarray(codes, dtype=np.int64))
        ok = np.ones(len(codes), dtype=bool)
        for axes, mask in self.patterns:
            ok &= ~mask[tuple(codes[:, a] for a in axes)]
        return ok

    def decode(self, z: np.ndarray, tol: float = 1e-6) -> np.ndarray | None:
        """The record of a 0/1 value vector, or None unless each attribute has exactly one 1."""
        z = np.asarray(z, dtype=np.float64)[: self.num_values]
        if (np.abs(z - np.round(z)) > tol).any():
            return None
        ones = np.round(z).astype(np.int64)
        per_attr = np.add.reduceat(ones, self.offsets)
        if not np.array_equal(per_attr, np.ones(len(self.domain), dtype=np.int64)):
            return None
        hot = np.flatnonzero(ones)
        return (hot - self.offsets).astype(np.int64)

    # ---- programs --------------------------------------------------------------------------------
    def form(self, value_cost: np.ndarray, extra_cols: sp.spmatrix | None = None, extra_cost=None,
             extra_rows=None, c0: float = 0.0) -> ProgramForm:
        """The MILP ``min value_cost·z + extra_cost·y + c0`` over the record rows plus ``extra_rows``.

        ``extra_rows`` is ``(A_z, A_y, lower, upper, names)``: rows over ``z`` and the extra
        continuous ``y`` in ``[0, 1]`` (``extra_cost`` their costs).
        """
        ny = 0 if extra_cost is None else len(extra_cost)
        A = sp.hstack([self.base_A, sp.csr_matrix((self.base_A.shape[0], ny))]).tocsr()
        lower, upper, names = [self.base_lower], [self.base_upper], list(self.base_names)
        if extra_rows is not None:
            A_z, A_y, lo, hi, extra_names = extra_rows
            A = sp.vstack([A, sp.hstack([A_z, A_y])]).tocsr()
            lower.append(lo)
            upper.append(hi)
            names.extend(extra_names)
        c = np.concatenate([value_cost, np.zeros(ny) if extra_cost is None else extra_cost])
        return ProgramForm(
            c=c, A=A, row_lower=np.concatenate(lower), row_upper=np.concatenate(upper), row_names=names,
            lower=np.zeros(self.num_values + ny), upper=np.concatenate([self.value_upper, np.ones(ny)]),
            integrality=np.concatenate([np.ones(self.num_values, dtype=bool), np.zeros(ny, dtype=bool)]), c0=c0,
        )

    def any_record(self, backend: str = "highs", time_limit: float | None = None) -> np.ndarray:
        """An allowed record (a feasibility solve); InconsistentConstraintsError when there is none."""
        outcome = get_backend(backend).solve(self.form(np.zeros(self.num_values)), time_limit=time_limit)
        codes = None if outcome.x is None else self.decode(outcome.x)
        if outcome.status is Status.INFEASIBLE:
            groups = ", ".join(outcome.conflicting_rows or []) or "the structural zeros"
            raise InconsistentConstraintsError(f"no record satisfies the single-record constraints ({groups})")
        if codes is None or not self.allows(codes)[0]:
            raise SolverError(f"backend {backend!r} found no allowed record ({outcome.status.name}: {outcome.message})")
        return codes


def merge_sampled(queries: Conjunctions, multiplicity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Distinct conjunctions of a sample with net weights ``c+ - c-`` and the constant ``Σ c-``."""
    mult = np.asarray(multiplicity, dtype=np.int64)
    if mult.shape != (queries.num_rows,) or (mult < 0).any():
        raise QueryError(f"multiplicity must hold {queries.num_rows} non-negative counts")
    signed = np.where(queries.negated, -mult, mult)
    constant = float(mult[queries.negated].sum())
    key = np.concatenate([queries.positions, queries.values], axis=1)
    uniq, inverse = np.unique(key, axis=0, return_inverse=True)
    weight = np.bincount(inverse.ravel(), weights=signed, minlength=len(uniq))
    k = queries.positions.shape[1]
    keep = weight != 0
    return uniq[keep, :k], uniq[keep, k:], weight[keep], constant


def best_response(
    program: RecordProgram,
    queries: Conjunctions,
    multiplicity: np.ndarray | None = None,
    *,
    backend: str = "highs",
    time_limit: float | None = None,
    mip_gap: float = 1e-6,
    work_limit: int | None = None,
    start: np.ndarray | None = None,
    options: dict | None = None,
) -> BestResponse:
    """The allowed record satisfying the most sampled queries (module notes), solved and checked.

    Parameters
    ----------
    program : RecordProgram
        The domain and its single-record constraints.
    queries : Conjunctions
        The sampled rows (positive and negated conjunctions).
    multiplicity : int array, optional
        How many times each row was sampled (default once each).
    backend : {"highs", "pulp"}
        A MILP backend of :mod:`dpopt.estimate.backends`.
    time_limit : float, optional
        Seconds for the solver; on a time-out the incumbent (if any) is returned with its gap.
    mip_gap : float
        Relative gap at which the solver stops; a score within it of the bound is OPTIMAL.
    work_limit : int, optional
        HiGHS only: a budget of solver work (calls of its MIP interrupt callback: root cut
        rounds and nodes) after which the incumbent is returned (status ``ITERATION_LIMIT``).
        Unlike a time limit it stops at the same point on an idle or a loaded machine.
    start : int array of shape (k, d), optional
        Allowed records to start from (earlier best responses, the most recent last). The
        best-scoring one and the last are improved by :func:`improve_record`; the better
        result is the solver's starting incumbent (HiGHS) and is returned if the solver ends
        with nothing better.
    options : dict, optional
        Further backend options.

    Returns
    -------
    BestResponse
    """
    if queries.domain != program.domain:
        raise QueryError(f"the sampled queries are over {queries.domain}, not the program's {program.domain}")
    if backend not in MIP_BACKENDS:
        raise SolverError(f"the best response needs a MILP backend, one of {list(MIP_BACKENDS)}; got {backend!r}")
    began = time.perf_counter()
    mult = np.ones(queries.num_rows, dtype=np.int64) if multiplicity is None else multiplicity
    pos, val, weight, constant = merge_sampled(queries, mult)
    arity = (pos >= 0).sum(axis=1)
    value_cost = np.zeros(program.num_values)
    single = arity == 1
    np.add.at(value_cost, program.column(pos[single, 0], val[single, 0]), -weight[single])
    multi = np.flatnonzero(~single)
    w = weight[multi]
    ny = multi.size
    # y_j <= z_l for every literal of a positive-weight conjunction.
    plus = np.flatnonzero(w > 0)
    lit = pos[multi[plus]] >= 0
    p_rows = np.repeat(np.arange(plus.size), lit.sum(axis=1))
    p_cols = program.column(pos[multi[plus]][lit], val[multi[plus]][lit])
    n_plus_rows = int(lit.sum())
    # y_j >= Σ_l z_l - (|L_j| - 1) for a negative-weight conjunction.
    minus = np.flatnonzero(w < 0)
    lit_m = pos[multi[minus]] >= 0
    m_rows = np.repeat(np.arange(minus.size), lit_m.sum(axis=1))
    m_cols = program.column(pos[multi[minus]][lit_m], val[multi[minus]][lit_m])
    n_rows = n_plus_rows + minus.size
    A_z = sp.csr_matrix((np.concatenate([-np.ones(p_cols.size), -np.ones(m_cols.size)]),
                         (np.concatenate([np.arange(n_plus_rows), n_plus_rows + m_rows]),
                          np.concatenate([p_cols, m_cols]))), shape=(n_rows, program.num_values))
    y_of_row = np.concatenate([plus[p_rows], minus])
    A_y = sp.csr_matrix((np.ones(n_rows), (np.arange(n_rows), y_of_row)), shape=(n_rows, ny))
    lower = np.concatenate([np.full(n_plus_rows, -np.inf), 1.0 - arity[multi[minus]]])
    upper = np.concatenate([np.zeros(n_plus_rows), np.full(minus.size, np.inf)])
    names = [f"query[{i}]" for i in y_of_row]
    form = program.form(value_cost, extra_cost=-w.astype(np.float64), extra_rows=(A_z, A_y, lower, upper, names),
                        c0=-constant)
    solver_options = dict(options or {})
    if work_limit is not None:
        solver_options["work_limit"] = work_limit
    warm = None if start is None else _warm_start(program, pos, val, weight, start)
    if warm is not None and backend == "highs":
        z = np.zeros(program.num_values)
        z[program.column(np.arange(len(program.domain)), warm)] = 1.0
        solver_options["mip_start"] = np.concatenate([z, _holds(pos[multi], val[multi], warm[None, :])[0]])
    outcome = get_backend(backend).solve(form, time_limit=time_limit, mip_gap=mip_gap, conflicts=False,
                                         **solver_options)
    codes = None if outcome.x is None else program.decode(outcome.x)
    if codes is not None and not program.allows(codes)[0]:
        codes = None
    score = float("nan")
    if codes is not None:
        score = float(mult[queries.satisfied(codes)].sum())
        # The point's own objective must not exceed the score recomputed here, nor, for an
        # optimum, the objective the solver reports (HiGHS interrupted with presolve on was seen
        # to report the objective of another incumbent than the point it returned: the point counts).
        claimed = -float(form.c @ outcome.x + form.c0)
        if outcome.status is Status.OPTIMAL and outcome.objective is not None:
            claimed = max(claimed, -float(outcome.objective))
        if score < claimed - 1e-6 * max(1.0, abs(claimed)):
            raise SolverError(f"backend {backend!r} claims a score of {claimed:g} for a record that satisfies "
                              f"{score:g} sampled queries")
    from_start = False
    if warm is not None:
        warm_score = float(mult[queries.satisfied(warm)].sum())
        if codes is None or warm_score > score:
            codes, score, from_start = warm, warm_score, True
    bound = float("nan")
    if "mip_dual_bound" in outcome.extra and np.isfinite(outcome.extra["mip_dual_bound"]):
        bound = -float(outcome.extra["mip_dual_bound"])
    elif outcome.status is Status.OPTIMAL and codes is not None:
        bound = score  # the solver proved optimality but reports no bound (CBC through PuLP)
    gap = float("nan")
    if codes is not None and np.isfinite(bound):
        # Scores are integers: a bound below score + 1 proves the record optimal.
        gap = 0.0 if np.floor(bound + 1e-7) <= score else (bound - score) / max(1.0, abs(bound))
    status = outcome.status
    if from_start and status is Status.OPTIMAL:
        status = Status.NUMERICAL_ERROR  # the solver's "optimum" scored below the starting record
    elif codes is None and status is Status.OPTIMAL:
        status = Status.NUMERICAL_ERROR  # an "optimal" point that does not decode to an allowed record
    elif status is Status.OPTIMAL and np.isfinite(gap) and gap > max(mip_gap, 1e-9) + 1e-9:
        status = Status.NUMERICAL_ERROR
    return BestResponse(codes=codes, score=score, bound=bound, gap=float(gap), status=status,
                        time=time.perf_counter() - began, backend=backend, solver=outcome.solver,
                        message=outcome.message,
                        info={"distinct_queries": int(weight.size), "rows": int(form.num_rows),
                              "nodes": outcome.extra.get("mip_node_count"), "work": outcome.extra.get("work"),
                              "start_score": None if warm is None else warm_score, "from_start": from_start})


# ---- warm starts ----------------------------------------------------------------------------------
def _holds(pos: np.ndarray, val: np.ndarray, records: np.ndarray) -> np.ndarray:
    """``(records, conjunctions)``: whether each record satisfies each conjunction (``pos`` -1 pads)."""
    lit = (records[:, np.maximum(pos, 0)] == val[None]) | (pos < 0)[None]
    return lit.all(axis=2)


def improve_record(sizes: np.ndarray, pos: np.ndarray, val: np.ndarray, weight: np.ndarray, record: np.ndarray,
                   sweeps: int = 10) -> np.ndarray:
    """Coordinate ascent on ``Σ_j weight_j [record satisfies j]``: each attribute in turn takes the
    value that scores most with the others fixed, until a sweep changes nothing (or ``sweeps``).

    The score of attribute ``a`` taking value ``v`` counts the conjunctions whose other literals
    hold and whose literal on ``a`` (if any) is ``v``: one ``bincount`` per attribute.
    """
    record = np.array(record, dtype=np.int64)
    on = [pos == a for a in range(len(sizes))]
    involved = [np.flatnonzero(m.any(axis=1)) for m in on]
    for _ in range(sweeps):
        changed = False
        for a, size in enumerate(sizes):
            rows = involved[a]
            if rows.size == 0:
                continue
            held = (record[np.maximum(pos[rows], 0)] == val[rows]) | (pos[rows] < 0) | on[a][rows]
            rows = rows[held.all(axis=1)]  # every literal but the one on a holds
            gain = np.bincount(val[rows, on[a][rows].argmax(axis=1)], weights=weight[rows], minlength=int(size))
            best = int(np.argmax(gain))
            if gain[best] > gain[record[a]]:
                record[a], changed = best, True
        if not changed:
            break
    return record


def _warm_start(program: RecordProgram, pos, val, weight, start) -> np.ndarray | None:
    """The better of the improved best-scoring and last records of ``start`` that is allowed."""
    records = np.atleast_2d(np.asarray(start, dtype=np.int64))
    if records.size == 0:
        return None
    if records.shape[1] != len(program.domain):
        raise QueryError(f"start records have {records.shape[1]} codes, the domain {len(program.domain)} attributes")
    scores = _holds(pos, val, records) @ weight
    seeds = records[np.unique([int(np.argmax(scores)), len(records) - 1])]
    best, best_score = None, -np.inf
    for seed in seeds:
        for record in (improve_record(program.sizes, pos, val, weight, seed), seed):
            if program.allows(record)[0]:
                score = float(_holds(pos, val, record[None, :])[0] @ weight)
                if score > best_score:
                    best, best_score = record, score
                break
    return best

