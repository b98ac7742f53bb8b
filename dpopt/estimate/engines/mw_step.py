"""Warm-started multiplicative-weights passes over a growing list of measurements.

The entropy engine (:mod:`dpopt.estimate.engines.entropy`) solves a whole problem from scratch.
MWEM (Hardt, Ligett, McSherry, NIPS 2012, Fig. 1) instead adds one measurement per round
and re-applies the update over all past measurements, starting from the previous
estimate. This module holds that state: a dense table ``x`` with a fixed total, the
measured *terms* and the update of the paper's step 3,

    x  <-  x * exp( eta * Q_R^T (m - Q_R x) ),   eta = 1 / (2 n s),   renormalised to n,

with ``Q_R`` the measured rows of a query, ``s`` the largest column L1 norm of ``Q_R``
(1 for a counting query, a marginal cell, a whole marginal or a parity), ``n`` the total.
For one counting query this is exactly ``exp(q(x)(m - q(A))/(2n))``.

A *term* gathers every measurement of the same query block: ``sums`` holds the sum of the
noisy answers per row and ``counts`` how many times each row was measured, so the update
of a term applies all its measurements at once (``r = sums - counts * Q_R x``). With
``merge=False`` each measurement keeps its own term and the order of the paper's reference
code is reproduced exactly.

Marginal blocks on dense domains take a fast path (:class:`MarginalIndex`). Each marginal has
a *layout*: the table's cells grouped by marginal cell, each group in increasing cell order.
Laid out so, the table reshaped to ``(cells, N / cells)`` has ``Q x`` as its row sums and the
update multiplies each row by one factor, in place. The table stays in the layout of the last
term updated; the next term moves it into its own with one gather (of whole blocks of cells
when the trailing attributes lie outside both marginals), the moves kept once computed. Every
sum adds the same numbers in the same order as the marginal of the table in C order, and every
cell is multiplied by the same factor, so the result is bit for bit that of the plain update
(``tests/reference_mw_step.py`` keeps that update). The loss of a term sums only its measured
rows (the others weigh zero) and is kept until the table or the term changes. Batches of
millions of boxes (:class:`~dpopt.model.queries.RangeQueries`) keep only their measured boxes.

Repeated passes follow the boost schedule shared with the entropy engine
(:class:`~dpopt.estimate.engines.proportional.BoostSchedule`): the step grows by half after a pass
that lowered the squared residual (up to ``max_boost`` times the paper's) and a pass that
raised it is undone with a smaller step. Structural zeros are cells held at zero from the
start; invariants (totals, marginals: counting queries with disjoint rows) are restored by
iterative proportional fitting after every update.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Hashable, Sequence

import numpy as np

from dpopt.errors import SolverError
from dpopt.estimate.engines.proportional import BoostSchedule, counting_invariant, proportional_fit
from dpopt.model.domain import Domain
from dpopt.model.queries import abs_power_rmatvec
from dpopt.model.queries.base import LinearQuery
from dpopt.model.queries.marginal import Marginal
from dpopt.model.queries.ranges import RangeQueries

__all__ = ["MarginalIndex", "MWTerm", "MWState", "boxes"]

#: Largest table updated in the marginals' own layouts (larger ones keep the C order).
LAYOUT_MAX_CELLS = 2**22
#: Memory kept for the permutations between layouts.
LAYOUT_CACHE_BYTES = 256 * 2**20
#: Batches of boxes with more rows keep only their measured boxes in a term.
COMPACT_ROWS = 2**16


class MarginalIndex:
    """A marginal of a dense table, and the *layout* in which it is one contiguous sum per cell.

    ``order`` lists the domain cells grouped by their marginal cell (C order over
    ``domain.project(attrs)``), each group in increasing cell order: the table laid out in
    that order and reshaped to ``(cells, N / cells)`` has the marginal as its row sums, and
    the update of a term multiplies each row by one factor (every marginal cell holds the
    same number of domain cells). ``position`` is the inverse permutation and ``index[j]``
    the marginal cell of domain cell ``j``.
    """

    def __init__(self, domain: Domain, attrs: Sequence[str]) -> None:
        self.attrs = domain.canonical(attrs)
        self.size = domain.project(self.attrs).size
        n = domain.size
        self.width = n // self.size
        axes = [domain.axis(a) for a in self.attrs]
        self.axes = frozenset(axes)
        rest = [i for i in range(len(domain)) if i not in axes]
        # The cells in C order of the axes (marginal axes first): grouped by marginal cell,
        # increasing within a group (a stable sort by marginal cell, without the sort).
        self.order = np.arange(n, dtype=np.intp).reshape(domain.shape).transpose(axes + rest).reshape(-1)
        self._index: np.ndarray | None = None
        self._position: np.ndarray | None = None

    @property
    def index(self) -> np.ndarray:
        """``index[j]``: the marginal cell of domain cell ``j``."""
        if self._index is None:
            index = np.empty(self.order.size, dtype=np.intp)
            index[self.order] = np.repeat(np.arange(self.size, dtype=np.intp), self.width)
            self._index = index
        return self._index

    @property
    def position(self) -> np.ndarray:
        """``position[j]``: where domain cell ``j`` sits in this marginal's layout."""
        if self._position is None:
            position = np.empty(self.order.size, dtype=np.intp)
            position[self.order] = np.arange(self.order.size, dtype=np.intp)
            self._position = position
        return self._position

    def answers(self, x: np.ndarray) -> np.ndarray:
        """``Q x``: the marginal of the flat table ``x``."""
        return np.take(x, self.order).reshape(self.size, -1).sum(axis=1)

    def spread(self, values: np.ndarray) -> np.ndarray:
        """``Q^T v`` over every cell."""
        return np.take(values, self.index)


class _Layouts:
    """Moves of the table between layouts (C order: ``None``; a marginal's: its index).

    Going from one layout to another permutes the table's axes, so cells that follow each
    other in both layouts (the trailing attributes outside both marginals) move as blocks:
    the move is one gather of whole blocks. Each move's block indices are built once and kept
    while the kept ones fit :data:`LAYOUT_CACHE_BYTES`, least recently used first out.
    """

    def __init__(self, sizes: Sequence[int], budget: int) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.budget = budget
        self.used = 0
        self._kept: OrderedDict[tuple, tuple[int, np.ndarray]] = OrderedDict()

    def move(self, table: np.ndarray, src: MarginalIndex | None, dst: MarginalIndex | None,
             rows: np.ndarray | None = None) -> np.ndarray:
        """``table`` (laid out as ``src``) laid out as ``dst``: a new array unless they agree.

        With ``rows``, only those rows of ``dst``'s layout, as a ``(len(rows), width)`` array.
        """
        if rows is None and src is dst:
            return table
        block, index = self._blocks(src, dst, rows)
        moved = np.take(table.reshape(-1, block), index, axis=0) if block > 1 else np.take(table, index)
        return moved.reshape(-1) if rows is None else moved.reshape(rows.size, -1)

    def _blocks(self, src, dst, rows) -> tuple[int, np.ndarray]:
        key = (src, dst, None if rows is None else rows.tobytes())
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            return found
        if dst is None:
            perm = src.position
        else:
            target = dst.order if rows is None else dst.order.reshape(dst.size, -1)[rows]
            perm = target if src is None else src.position[target]
        # Trailing attributes outside both marginals keep their cells together.
        inside = set().union(*(ix.axes for ix in (src, dst) if ix is not None))
        block = 1
        for axis in reversed(range(len(self.sizes))):
            if axis in inside:
                break
            block *= self.sizes[axis]
        found = (block, perm[..., ::block] // block if block > 1 else perm)
        self._kept[key] = found
        self.used += found[1].nbytes
        while self.used > self.budget and len(self._kept) > 1:
            _, (_, old) = self._kept.popitem(last=False)
            self.used -= old.nbytes
        return found


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
        self.block = query
        self.index = index
        # A batch of more than COMPACT_ROWS boxes keeps only its declared boxes, as a batch of
        # their own (block row ids in ``ids``): millions of candidate ranges cost nothing here.
        self.ids = np.unique(np.asarray(rows, dtype=np.int64)) if _compact(query) else None
        self._resize(query if self.ids is None else boxes(query, self.ids))
        self.measured = np.zeros(0, dtype=np.intp)
        self.scale = 1.0
        self.version = 0
        self.kept_loss: tuple = (None, 0.0)  # ((table version, term version), loss)
        self.add(rows, None)

    def _resize(self, query: LinearQuery, keep: np.ndarray | None = None) -> None:
        """This term's rows become ``query``'s; ``keep[i]`` is where old row ``i`` goes."""
        sums, counts = np.zeros(query.num_rows), np.zeros(query.num_rows)
        if keep is not None:
            sums[keep], counts[keep] = self.sums, self.counts
        self.query, self.num_rows, self.sums, self.counts = query, query.num_rows, sums, counts
        self.rows = np.zeros(query.num_rows, dtype=bool) if self.ids is None else np.ones(query.num_rows, dtype=bool)

    def declares(self, rows: np.ndarray) -> bool:
        """Whether every one of the block's ``rows`` is already a row of this term."""
        return bool(self.rows[rows].all()) if self.ids is None else bool(np.isin(rows, self.ids).all())

    def declared(self) -> np.ndarray:
        """The block's rows this term holds."""
        return np.flatnonzero(self.rows) if self.ids is None else self.ids

    def add(self, rows: np.ndarray, values: np.ndarray | None) -> None:
        """Record one measurement of the block's ``rows`` (values None: only declare the rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.ids is not None:
            ids = np.union1d(self.ids, rows)
            if ids.size > self.ids.size:
                keep = np.searchsorted(ids, self.ids)
                self.ids = ids
                self._resize(boxes(self.block, ids), keep)
            rows = np.searchsorted(self.ids, rows)
        self.rows[rows] = True
        if values is not None:
            np.add.at(self.sums, rows, values)
            np.add.at(self.counts, rows, 1.0)
            self.measured = np.flatnonzero(self.counts > 0)
        self.version += 1
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

    def cell_factors(self, answers: np.ndarray, eta: float, total: float) -> np.ndarray:
        """A marginal term's update per marginal cell: ``exp(eta r_c)`` renormalised to ``total``."""
        factor = np.exp(eta * self.residual(answers))
        # Every cell lies in one marginal cell: the new sum is sum_c answers_c factor_c.
        scale = total / float(answers @ factor)
        return factor * scale

    def multiplied(self, x: np.ndarray, answers: np.ndarray, eta: float, total: float) -> np.ndarray:
        """``x * exp(eta Q^T r)`` renormalised to ``total`` (r: this term's residual)."""
        if self.index is not None:
            return x * self.index.spread(self.cell_factors(answers, eta, total))
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
        self.invariants = [counting_invariant(q, v, q.name) for q, v in invariants]
        self._versions = itertools.count()  # a new number for every new table (never reused)
        self.x = proportional_fit(x * (self.total / x.sum()), self.invariants)
        self.terms: list[MWTerm] = []
        self._by_key: dict[Hashable, MWTerm] = {}
        self._indices: dict[tuple[str, ...], MarginalIndex] = {}
        # Marginal terms update the table in their own layout (see the module notes) when the
        # permutations between layouts are cheap to keep; invariants need the C order after
        # every update anyway.
        self._laid_out = n <= LAYOUT_MAX_CELLS and not self.invariants
        self._layouts = _Layouts(domain.sizes, LAYOUT_CACHE_BYTES)
        self.updates = 0

    # ---- the table ------------------------------------------------------------------
    @property
    def x(self) -> np.ndarray:
        """The table in C order over the domain (updates never modify an array returned here)."""
        if self._layout is not None:
            self._table, self._layout = self._layouts.move(self._table, self._layout, None), None
        return self._table

    @x.setter
    def x(self, value: np.ndarray) -> None:
        self._table, self._layout, self._version = value, None, next(self._versions)

    def _laid_out_as(self, index: MarginalIndex) -> np.ndarray:
        """The table in ``index``'s layout (a new array unless it is laid out so already)."""
        return self._layouts.move(self._table, self._layout, index)

    # ---- measurements ---------------------------------------------------------------
    def add_measurement(self, query: LinearQuery, rows: np.ndarray, values: np.ndarray, key: Hashable = None) -> MWTerm:
        """Record noisy ``values`` of ``query``'s ``rows``; returns the term that holds them."""
        values = np.asarray(values, dtype=np.float64).ravel()
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if values.shape != rows.shape:
            raise SolverError(f"{values.size} values for {rows.size} measured rows of {query.name}")
        key = key if key is not None else id(query)
        term = self._by_key.get(key) if self.merge else None
        if term is not None and term.index is None and not term.declares(rows):
            # Rows sharing cells (overlapping ranges, parities) make one merged step shrink
            # by their overlap, which leaves each measurement barely absorbed: merge only
            # rows that do not raise the term's overlap, else start a new term.
            union = np.union1d(term.declared(), rows)
            own = _max_column_l1(term.block, rows, False)
            if _max_column_l1(term.block, union, False) > max(term.scale, own):
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
        if term.index is not None and self._laid_out:
            # One gather into the marginal's layout, one contiguous sum per marginal cell and
            # one multiplication per cell, in place: the same products and sums, in the same
            # order, as the marginal of the C-ordered table and its spread factors.
            table = self._laid_out_as(term.index)
            rows = table.reshape(term.index.size, -1)
            rows *= term.cell_factors(rows.sum(axis=1), eta, self.total)[:, None]
            self._table, self._layout, self._version = table, term.index, next(self._versions)
        else:
            x = term.multiplied(self.x, term.answers(self.x), eta, self.total)
            self.x = proportional_fit(x, self.invariants)
        self.updates += 1

    def update_once(self, query: LinearQuery, rows: np.ndarray, values: np.ndarray) -> None:
        """The update of one measurement alone, whatever the stored terms (Fig. 1, step 3)."""
        term = MWTerm(query, rows, self._index_for(query))
        term.add(rows, values)
        self.update(term)

    def loss(self) -> float:
        """Squared residual over every measurement (up to a constant).

        Each term's part is kept with the table and term versions it was computed for (a new
        measurement leaves the other terms' parts valid); the parts are added in term order.
        """
        total = 0
        for t in self.terms:
            key = (self._version, t.version)
            if t.kept_loss[0] != key:
                t.kept_loss = (key, t.loss(self._measured_answers(t)))
            total += t.kept_loss[1]
        return total

    def _measured_answers(self, term: MWTerm) -> np.ndarray:
        """The term's answers on its measured rows (zero elsewhere, where they weigh nothing).

        A marginal term sums only the cells of its measured rows, read from the current
        layout: each row's sum is the same as in the full marginal (rows are summed apart).
        """
        if term.index is None or not self._laid_out:
            return term.answers(self.x)
        rows = term.measured
        if rows.size == term.num_rows:
            return self._laid_out_as(term.index).reshape(term.index.size, -1).sum(axis=1)
        out = np.zeros(term.num_rows)
        if self._layout is term.index:
            out[rows] = self._table.reshape(term.index.size, -1)[rows].sum(axis=1)
        else:
            out[rows] = self._layouts.move(self._table, self._layout, term.index, rows).sum(axis=1)
        return out

    def passes(self, max_passes: int, tol: float = 0.0, *, max_boost: float = 1.0) -> int:
        """Re-apply the update over every term, at most ``max_passes`` times.

        ``max_boost = 1`` is the paper's plain repetition; a larger value lets the step
        grow (by 1.5 per successful pass) while the squared residual falls. Stops early
        when a pass moves less than ``tol * n`` in L1. Returns the passes done.
        """
        schedule = BoostSchedule(max_boost, self.loss() if max_boost > 1.0 else 0.0)
        done = 0
        while done < max_passes:
            # Updates work in place: keep a copy when the pass may be undone or compared.
            previous = (self._table.copy(), self._layout, self._version) if max_boost > 1.0 or tol > 0 else None
            for term in self.terms:
                self.update(term, schedule.boost)
            done += 1
            if max_boost > 1.0 and not schedule.accept(self.loss()):
                self._table, self._layout, self._version = previous
                continue
            if tol > 0:
                before = self._layouts.move(previous[0], previous[1], None)
                if np.abs(self.x - before).sum() < tol * self.total:
                    break
        return done


def boxes(query: RangeQueries, rows: np.ndarray) -> RangeQueries:
    """The given rows (boxes) of a batch of ranges, as a batch of their own."""
    rows = np.asarray(rows, dtype=np.int64)
    return RangeQueries(query.domain, query.attrs, query.lows[rows], query.highs[rows])


def _compact(query: LinearQuery) -> bool:
    return isinstance(query, RangeQueries) and query.num_rows > COMPACT_ROWS


def _max_column_l1(query: LinearQuery, rows: np.ndarray, is_marginal: bool) -> float:
    """Largest column L1 norm of the measured rows (1 for marginal cells)."""
    if is_marginal:
        return 1.0
    if isinstance(query, RangeQueries):  # the same integers from the measured boxes alone
        unique = np.unique(rows)
        query, rows = boxes(query, unique), np.arange(unique.size)
    indicator = np.zeros(query.num_rows)
    indicator[rows] = 1.0
    # (|Q|^1)^T 1_R: every column's L1 norm over the measured rows, as a support array.
    worst = float(np.max(abs_power_rmatvec(query, indicator, 1.0)[1]))
    return worst if worst > 0 else 1.0
