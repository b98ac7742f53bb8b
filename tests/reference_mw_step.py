"""The MWEM update as it was before issue 30 (dpopt 2a9ccf2), frozen: the reference that the
fast update of :mod:`dpopt.estimate.engines.mw_step` must match bit for bit.

Verbatim but for this docstring: the table in C order, every marginal read with a gather of
the cells sorted by marginal cell and one contiguous sum per marginal cell, and a new table
``x * factors[index]`` per update. Tests run :func:`dpopt.algorithms.mwem.mwem` with
:class:`MWState` from here and from dpopt on the same seeds and compare the bytes.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np

from dpopt.errors import SolverError
from dpopt.estimate.engines.proportional import BoostSchedule, counting_invariant, proportional_fit
from dpopt.model.domain import Domain
from dpopt.model.queries import abs_power_rmatvec
from dpopt.model.queries.base import LinearQuery
from dpopt.model.queries.marginal import Marginal

__all__ = ["MarginalIndex", "MWTerm", "MWState"]


class MarginalIndex:
    """A marginal of a dense table by one gather and one contiguous sum.

    ``index[j]`` is the marginal cell (C order over ``domain.project(attrs)``) of domain
    cell ``j``; ``order`` lists the domain cells sorted by that index. Every marginal cell
    holds the same number of domain cells, so ``x[order]`` reshaped to
    ``(cells, N / cells)`` sums row-wise to the marginal, and ``Q^T v`` is ``v[index]``.
    (Both are gathers: measured faster here than ``bincount``'s scatter or strided
    reductions, and free of BLAS threading.)
    """

    def __init__(self, domain: Domain, attrs: Sequence[str]) -> None:
        self.attrs = domain.canonical(attrs)
        self.size = domain.project(self.attrs).size
        grid = np.indices(domain.shape, sparse=True)
        flat = np.zeros((1,) * len(domain), dtype=np.intp)
        stride = 1
        for a in reversed(self.attrs):
            flat = flat + grid[domain.axis(a)] * stride
            stride *= domain.size_of(a)
        self.index = np.broadcast_to(flat, domain.shape).reshape(-1).astype(np.intp)
        self.order = np.argsort(self.index, kind="stable").astype(np.intp)

    def answers(self, x: np.ndarray) -> np.ndarray:
        """``Q x``: the marginal of the flat table ``x``."""
        return np.take(x, self.order).reshape(self.size, -1).sum(axis=1)

    def spread(self, values: np.ndarray) -> np.ndarray:
        """``Q^T v`` over every cell."""
        return np.take(values, self.index)


class MWTerm:
    """The measured rows of one query block and the sums and counts of their answers.

    Parameters
    ----------
    query : LinearQuery
        The block (a whole :class:`Marginal`, a batch of ranges, parities, ...).
    rows : array of int
        Which rows of ``query`` are measured (all for a cuboid measurement).
    index : MarginalIndex, optional
        Fast path for a marginal on a dense domain.
    """

    def __init__(self, query: LinearQuery, rows: np.ndarray, index: MarginalIndex | None = None) -> None:
        self.query = query
        self.index = index
        self.num_rows = query.num_rows
        self.sums = np.zeros(query.num_rows)
        self.counts = np.zeros(query.num_rows)
        self.rows = np.zeros(query.num_rows, dtype=bool)
        self.scale = 1.0
        self.add(rows, None)

    def add(self, rows: np.ndarray, values: np.ndarray | None) -> None:
        """Record one measurement of ``rows`` (values None: only declare the rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        self.rows[rows] = True
        if values is not None:
            np.add.at(self.sums, rows, values)
            np.add.at(self.counts, rows, 1.0)
        self.scale = _max_column_l1(self.query, np.flatnonzero(self.rows), self.index is not None)

    def answers(self, x: np.ndarray) -> np.ndarray:
        """All rows of the block on ``x`` (``Q x``)."""
        return self.index.answers(x) if self.index is not None else self.query.matvec(x)

    def residual(self, answers: np.ndarray) -> np.ndarray:
        """``sum_k (m_k - q(x))`` per row; zero on rows never measured."""
        return self.sums - self.counts * answers

    def loss(self, answers: np.ndarray) -> float:
        """``sum_k (m_k - q(x))^2`` up to a constant that does not depend on ``x``."""
        return float(np.sum(self.counts * answers * answers - 2.0 * self.sums * answers))

    def multiplied(self, x: np.ndarray, answers: np.ndarray, eta: float, total: float) -> np.ndarray:
        """``x * exp(eta Q^T r)`` renormalised to ``total`` (r: this term's residual)."""
        if self.index is not None:
            factor = np.exp(eta * self.residual(answers))
            # Every cell lies in one marginal cell: the new sum is sum_c answers_c factor_c.
            scale = total / float(answers @ factor)
            return x * self.index.spread(factor * scale)
        out = x * np.exp(eta * self.query.rmatvec(self.residual(answers)))
        return out * (total / out.sum())


class MWState:
    """A dense MW estimate with a fixed total, its measured terms, zeros and invariants.

    Parameters
    ----------
    domain : Domain
        Must be small enough for a dense vector.
    total : float
        ``n``, kept after every update (the invariants' total when they fix one).
    zeros : bool array over the cells, optional
        Structural zeros: held at zero.
    invariants : sequence of (LinearQuery, values)
        Counting queries with disjoint 0/1 rows, imposed exactly by proportional fitting.
    initial : array, optional
        Starting table (non-negative); default uniform over the free cells.
    merge : bool
        Gather measurements of the same block into one term (fast) as long as their rows do
        not overlap more than the term's already do; False reproduces the paper's
        per-measurement order.
    """

    def __init__(
        self,
        domain: Domain,
        total: float,
        *,
        zeros: np.ndarray | None = None,
        invariants: Sequence[tuple[LinearQuery, np.ndarray]] = (),
        initial: np.ndarray | None = None,
        merge: bool = True,
    ) -> None:
        n = domain.require_dense("the MWEM estimate")
        if not np.isfinite(total) or total <= 0:
            raise SolverError(f"MW needs a positive total, got total={total!r}")
        self.domain, self.total, self.merge = domain, float(total), merge
        self.free = np.ones(n, dtype=bool) if zeros is None else ~np.asarray(zeros, dtype=bool)
        if not self.free.any():
            raise SolverError("every cell is a structural zero: nothing to estimate")
        x = np.zeros(n)
        if initial is None:
            x[self.free] = 1.0
        else:
            init = np.asarray(initial, dtype=np.float64)
            if init.shape != (n,) or not np.isfinite(init).all():
                raise SolverError(f"initial must be a finite vector of length {n}, got shape {init.shape}")
            x[self.free] = np.maximum(init[self.free], 0.0) + 1e-9 * self.total / n
        self.x = x * (self.total / x.sum())
        self.invariants = [counting_invariant(q, v, q.name) for q, v in invariants]
        self.x = proportional_fit(self.x, self.invariants)
        self.terms: list[MWTerm] = []
        self._by_key: dict[Hashable, MWTerm] = {}
        self._indices: dict[tuple[str, ...], MarginalIndex] = {}
        self.updates = 0

    # ---- measurements ---------------------------------------------------------------
    def add_measurement(self, query: LinearQuery, rows: np.ndarray, values: np.ndarray, key: Hashable = None) -> MWTerm:
        """Record noisy ``values`` of ``query``'s ``rows``; returns the term that holds them."""
        values = np.asarray(values, dtype=np.float64).ravel()
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if values.shape != rows.shape:
            raise SolverError(f"{values.size} values for {rows.size} measured rows of {query.name}")
        key = key if key is not None else id(query)
        term = self._by_key.get(key) if self.merge else None
        if term is not None and term.index is None and not term.rows[rows].all():
            # Rows sharing cells (overlapping ranges, parities) make one merged step shrink
            # by their overlap, which leaves each measurement barely absorbed: merge only
            # rows that do not raise the term's overlap, else start a new term.
            union = term.rows.copy()
            union[rows] = True
            own = _max_column_l1(term.query, rows, False)
            if _max_column_l1(term.query, np.flatnonzero(union), False) > max(term.scale, own):
                term = None
        if term is None:
            term = MWTerm(query, rows, self._index_for(query))
            self.terms.append(term)
            self._by_key[key] = term
        term.add(rows, values)
        return term

    def _index_for(self, query: LinearQuery) -> MarginalIndex | None:
        if not isinstance(query, Marginal):
            return None
        if query.attrs not in self._indices:
            self._indices[query.attrs] = MarginalIndex(self.domain, query.attrs)
        return self._indices[query.attrs]

    # ---- updates --------------------------------------------------------------------
    def update(self, term: MWTerm, boost: float = 1.0) -> None:
        """One multiplicative-weights step on ``term`` (the paper's step 3, times ``boost``)."""
        eta = boost / (2.0 * self.total * term.scale)
        x = term.multiplied(self.x, term.answers(self.x), eta, self.total)
        self.x = proportional_fit(x, self.invariants)
        self.updates += 1

    def update_once(self, query: LinearQuery, rows: np.ndarray, values: np.ndarray) -> None:
        """The update of one measurement alone, whatever the stored terms (Fig. 1, step 3)."""
        term = MWTerm(query, rows, self._index_for(query))
        term.add(rows, values)
        self.update(term)

    def loss(self) -> float:
        """Squared residual over every measurement (up to a constant)."""
        return sum(t.loss(t.answers(self.x)) for t in self.terms)

    def passes(self, max_passes: int, tol: float = 0.0, *, max_boost: float = 1.0) -> int:
        """Re-apply the update over every term, at most ``max_passes`` times.

        ``max_boost = 1`` is the paper's plain repetition; a larger value lets the step
        grow (by 1.5 per successful pass) while the squared residual falls. Stops early
        when a pass moves less than ``tol * n`` in L1. Returns the passes done.
        """
        schedule = BoostSchedule(max_boost, self.loss() if max_boost > 1.0 else 0.0)
        done = 0
        while done < max_passes:
            previous = self.x
            for term in self.terms:
                self.update(term, schedule.boost)
            done += 1
            if max_boost > 1.0 and not schedule.accept(self.loss()):
                self.x = previous
                continue
            if tol > 0 and np.abs(self.x - previous).sum() < tol * self.total:
                break
        return done


def _max_column_l1(query: LinearQuery, rows: np.ndarray, is_marginal: bool) -> float:
    """Largest column L1 norm of the measured rows (1 for marginal cells)."""
    if is_marginal:
        return 1.0
    indicator = np.zeros(query.num_rows)
    indicator[rows] = 1.0
    # (|Q|^1)^T 1_R: every column's L1 norm over the measured rows, as a support array.
    worst = float(np.max(abs_power_rmatvec(query, indicator, 1.0)[1]))
    return worst if worst > 0 else 1.0
