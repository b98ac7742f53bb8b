"""Factored multiplicative-weights estimates: ``n`` times a product of small tables over groups.

MWEM's scalable form (Hardt, Ligett, McSherry, NIPS 2012, Section 4): the estimate is kept as

    A(x) = n * prod_g P_g(x_g),

a product over *disjoint* groups ``g`` of attributes of dense probability tables ``P_g``.
Groups start as single attributes (uniform) and are merged (outer product) only when a
measured query spans several of them, so the table never needs the full domain. A merge
beyond ``max_group_cells`` raises; :meth:`FactoredTable.within_cap` tells, for many
candidate attribute sets at once, which merges would stay within that cap.

The MW update of the paper's Fig. 1, step 3,

    A_i(x)  ∝  A_{i-1}(x) exp( q(x) (m - q(A_{i-1})) / (2n) ),

for a query ``q`` on attributes ``S`` inside one group ``g`` multiplies only ``P_g``: the
other factors cancel in the renormalisation. Repeated passes over past measurements
therefore act group by group (a group's passes use only its own measurements), and updates
of different groups commute; passing over every measurement in creation order gives
exactly the dense :class:`~dpopt.estimate.engines.mw_step.MWState` result. The total ``n`` holds by
construction (each ``P_g`` sums to 1).

For binary domains, :class:`BinaryMarginalCells` keeps every cell of every ``k``-way
marginal (``k <= 3``) of the estimate up to date from its moments ``E[x_i]``,
``E[x_i x_j]``, ``E[x_i x_j x_k]`` (a product across groups) by inclusion-exclusion,
recomputing only the marginals that touch a changed group.

Public constraints: :meth:`FactoredTable.pin_zeros` holds a structural-zero pattern at zero
(the cells are zero in their group's table, and multiplicative updates keep them there) and
:meth:`FactoredTable.fit_invariants` imposes invariants on totals and marginals by iterative
proportional fitting of the groups that carry them (each invariant's attributes are merged
into one group first).

This module is pure post-processing: it never sees private data nor a random source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce
from itertools import combinations
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np

from dpopt.errors import DomainError, QueryError, SolverError
from dpopt.estimate.engines.proportional import counting_invariant, proportional_fit
from dpopt.model.binary_marginals import (
    attribute_combinations,
    cells_from_subset_moments,
    inclusion_exclusion_matrix,
    superset_sums,
)
from dpopt.model.domain import Domain
from dpopt.model.queries import restrict_query

__all__ = [
    "FactoredTable", "FactoredTerm", "FactoredMWState", "BinaryMarginalCells",
    "attribute_combinations", "inclusion_exclusion_matrix", "cells_from_subset_moments", "superset_sums",
]

#: Default limit on the cells of one group of a :class:`FactoredTable`.
MAX_GROUP_CELLS = 2**20


@dataclass
class _Group:
    axes: tuple[int, ...]  # domain axes, increasing
    table: np.ndarray  # probabilities, shape = the axes' sizes, sums to 1


class FactoredTable:
    """``n`` times a product of probability tables over disjoint groups of attributes.

    Parameters
    ----------
    domain : Domain
        Any size: only the groups' tables are ever stored.
    total : float
        ``n``, the table's total (kept exactly by construction).
    tables : mapping of attribute tuple to array, optional
        Initial groups: ``tables[(a, b)]`` is a non-negative table of shape
        ``(size_a, size_b)`` (axes in the order given), normalised here. Attributes not
        mentioned start as uniform single-attribute groups.
    max_group_cells : int
        A merge that would create a group with more cells raises :class:`DomainError`
        (never approximated).

    Notes
    -----
    Groups hold their attributes in domain order; marginal cells follow C order over the
    requested attributes in domain order, as :class:`~dpopt.model.queries.Marginal` does.
    """

    def __init__(
        self,
        domain: Domain,
        total: float,
        *,
        tables: Mapping[Sequence[str], np.ndarray] | None = None,
        max_group_cells: int = MAX_GROUP_CELLS,
    ) -> None:
        if not isinstance(domain, Domain):
            raise DomainError(f"FactoredTable: expected a Domain, got {type(domain).__name__}")
        total = float(total)
        if not (math.isfinite(total) and total > 0):
            raise SolverError(f"FactoredTable needs a positive finite total, got total={total!r}")
        if isinstance(max_group_cells, bool) or not isinstance(max_group_cells, (int, np.integer)) or max_group_cells < 1:
            raise SolverError(f"max_group_cells must be a positive integer, got max_group_cells={max_group_cells!r}")
        self.domain, self.total, self.max_group_cells = domain, total, int(max_group_cells)
        d = len(domain)
        self.owner = np.zeros(d, dtype=np.int64)  # group key of each attribute
        self.position = np.zeros(d, dtype=np.int64)  # axis of each attribute within its group
        self.attr_cells = np.zeros(d, dtype=np.int64)  # cells of the group holding each attribute
        self._groups: dict[int, _Group] = {}
        self._revision: dict[int, int] = {}
        self._clock = 0
        self._next_key = 0
        given = np.zeros(d, dtype=bool)
        for attrs, table in (tables or {}).items():
            attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
            axes = domain.axes(domain.check_attrs(attrs))
            if given[list(axes)].any():
                twice = [a for a, ax in zip(attrs, axes) if given[ax]]
                raise DomainError(f"FactoredTable: attributes {twice} belong to two initial tables")
            given[list(axes)] = True
            arr = np.asarray(table, dtype=np.float64)
            shape = tuple(domain.sizes[ax] for ax in axes)
            if arr.shape != shape:
                raise SolverError(f"initial table over {list(attrs)} must have shape {shape}, got {arr.shape}")
            if not np.isfinite(arr).all() or (arr < 0).any() or not arr.sum() > 0:
                raise SolverError(f"initial table over {list(attrs)} must be finite, non-negative and not all zero")
            if arr.size > self.max_group_cells:
                raise DomainError(
                    f"initial table over {list(attrs)} has {arr.size} cells, above max_group_cells={self.max_group_cells}"
                )
            order = np.argsort(axes)
            self._add_group(tuple(int(axes[i]) for i in order), np.transpose(arr, order) / arr.sum())
        for ax in np.flatnonzero(~given):
            size = domain.sizes[ax]
            if size > self.max_group_cells:
                raise DomainError(
                    f"attribute {domain.attrs[ax]!r} has {size} values, above max_group_cells={self.max_group_cells}"
                )
            self._add_group((int(ax),), np.full(size, 1.0 / size))

    # ---- structure ------------------------------------------------------------------
    def _add_group(self, axes: tuple[int, ...], table: np.ndarray) -> int:
        key = self._next_key
        self._next_key += 1
        self._groups[key] = _Group(axes, np.ascontiguousarray(table, dtype=np.float64))
        self.owner[list(axes)] = key
        self.position[list(axes)] = np.arange(len(axes))
        self.attr_cells[list(axes)] = self._groups[key].table.size
        self._touch(key)
        return key

    def _touch(self, key: int) -> None:
        self._clock += 1
        self._revision[key] = self._clock

    @property
    def groups(self) -> list[tuple[str, ...]]:
        """The groups' attributes (domain order), ordered by their first attribute."""
        names = self.domain.attrs
        return [tuple(names[a] for a in g.axes) for g in sorted(self._groups.values(), key=lambda g: g.axes[0])]

    @property
    def group_cells(self) -> list[int]:
        """Cells of each group, in the order of :attr:`groups`."""
        return [int(g.table.size) for g in sorted(self._groups.values(), key=lambda g: g.axes[0])]

    @property
    def largest_group_cells(self) -> int:
        return max(int(g.table.size) for g in self._groups.values())

    def group_of(self, attr: str) -> tuple[str, ...]:
        """The attributes of the group holding ``attr``."""
        g = self._groups[int(self.owner[self.domain.axis(attr)])]
        return tuple(self.domain.attrs[a] for a in g.axes)

    def group_table(self, attr: str) -> np.ndarray:
        """A copy of the probability table of the group holding ``attr`` (axes as :meth:`group_of`)."""
        return self._groups[int(self.owner[self.domain.axis(attr)])].table.copy()

    def revisions(self) -> dict[int, int]:
        """``{group key: revision}``; a group's revision changes whenever its table does."""
        return dict(self._revision)

    def group_axes(self, key: int) -> tuple[int, ...]:
        return self._groups[key].axes

    def group_probabilities(self, key: int) -> np.ndarray:
        """The table of group ``key`` itself (read-only view)."""
        view = self._groups[key].table.view()
        view.flags.writeable = False
        return view

    def copy(self) -> "FactoredTable":
        out = FactoredTable.__new__(FactoredTable)
        out.domain, out.total, out.max_group_cells = self.domain, self.total, self.max_group_cells
        out.owner, out.position, out.attr_cells = self.owner.copy(), self.position.copy(), self.attr_cells.copy()
        out._groups = {k: _Group(g.axes, g.table.copy()) for k, g in self._groups.items()}
        out._revision, out._clock, out._next_key = dict(self._revision), self._clock, self._next_key
        return out

    def _axes_of(self, attrs: Iterable[str], who: str) -> tuple[int, ...]:
        if isinstance(attrs, str):
            attrs = (attrs,)
        attrs = tuple(attrs)
        if not attrs:
            raise QueryError(f"{who}: attrs is empty")
        return tuple(sorted(self.domain.axes(self.domain.check_attrs(attrs))))

    def key_of(self, attrs: Iterable[str]) -> int:
        """The key of the one group holding every attribute of ``attrs`` (QueryError if several)."""
        axes = self._axes_of(attrs, "key_of")
        keys = np.unique(self.owner[list(axes)])
        if keys.size != 1:
            raise QueryError(
                f"attributes {[self.domain.attrs[a] for a in axes]} span {keys.size} groups; merge them first"
            )
        return int(keys[0])

    def merged_cells(self, attrs: Iterable[str]) -> int:
        """Cells of the group that merging the groups spanned by ``attrs`` would create."""
        keys = np.unique(self.owner[list(self._axes_of(attrs, "merged_cells"))])
        return math.prod(int(self._groups[int(k)].table.size) for k in keys)

    def within_cap(self, axes: np.ndarray) -> np.ndarray:
        """For each row of attribute indices, whether merging the groups it spans stays within the cap.

        Row ``i`` of ``axes`` (shape ``(M, k)``, attribute indices, distinct within a row)
        is allowed when its attributes lie in one group or the product of the cell counts
        of the *distinct* groups holding them is at most ``max_group_cells``, i.e. exactly
        when ``merge(row)`` would not raise. Vectorised over the rows (a loop over the ``k``
        columns only); the running product is compared as ``p <= cap // c``, so no
        intermediate product exceeds the cap (no int64 overflow for any cap).
        """
        axes = np.asarray(axes, dtype=np.int64)
        if axes.ndim != 2 or axes.shape[1] < 1:
            raise QueryError(f"within_cap: axes must be a 2-d array with at least one column, got shape {axes.shape}")
        if axes.size and (axes.min() < 0 or axes.max() >= len(self.owner)):
            raise QueryError(f"within_cap: attribute indices must lie in 0..{len(self.owner) - 1}")
        cap = min(self.max_group_cells, int(np.iinfo(np.int64).max))  # group sizes are int64 anyway
        keys = self.owner[axes]
        sizes = self.attr_cells[axes]
        product = sizes[:, 0].copy()  # a single group never exceeds the cap
        ok = product <= cap
        for col in range(1, axes.shape[1]):
            # a group already counted (held by an earlier attribute of the row) adds no factor
            new = (keys[:, col:col + 1] != keys[:, :col]).all(axis=1)
            factor = np.where(new, sizes[:, col], 1)
            ok &= product <= cap // factor
            product[ok] *= factor[ok]  # stays <= cap; rows already refused are never needed again
        return ok | (keys == keys[:, :1]).all(axis=1)  # inside one group: no merge, always allowed

    def merge(self, attrs: Iterable[str]) -> tuple[str, ...]:
        """Merge the groups that ``attrs`` spans into one (outer product of their tables).

        The distribution is unchanged. Returns the attributes of the group now holding
        ``attrs``. Raises :class:`DomainError` naming the attributes and the size when the
        new group would exceed ``max_group_cells``.
        """
        axes = self._axes_of(attrs, "merge")
        keys = [int(k) for k in np.unique(self.owner[list(axes)])]
        if len(keys) > 1:
            cells = math.prod(int(self._groups[k].table.size) for k in keys)
            if cells > self.max_group_cells:
                spanned = [[self.domain.attrs[a] for a in self._groups[k].axes] for k in keys]
                raise DomainError(
                    f"merging the groups spanned by {[self.domain.attrs[a] for a in axes]} "
                    f"({len(keys)} groups: {_preview_groups(spanned)}) would create a group of "
                    f"{cells} cells, above max_group_cells={self.max_group_cells}"
                )
            parts = [self._groups.pop(k) for k in keys]
            for k in keys:
                self._revision.pop(k)
            joint = reduce(np.multiply.outer, [p.table for p in parts])
            order_axes = [a for p in parts for a in p.axes]
            perm = np.argsort(order_axes)
            self._add_group(tuple(int(order_axes[i]) for i in perm), np.transpose(joint, perm))
        return self.group_of(self.domain.attrs[axes[0]])

    # ---- answers --------------------------------------------------------------------
    def _group_marginal(self, group: _Group, axes: Sequence[int]) -> np.ndarray:
        """Probabilities of ``group`` over ``axes`` (a subset of its axes, increasing)."""
        keep = {int(self.position[a]) for a in axes}
        drop = tuple(i for i in range(len(group.axes)) if i not in keep)
        return group.table.sum(axis=drop) if drop else group.table

    def probabilities(self, attrs: Iterable[str]) -> np.ndarray:
        """Marginal probabilities over ``attrs`` (domain order), shaped by their sizes."""
        axes = self._axes_of(attrs, "marginal")
        parts: list[np.ndarray] = []
        part_axes: list[int] = []
        for key in dict.fromkeys(int(k) for k in self.owner[list(axes)]):  # first-seen order
            mine = [a for a in axes if self.owner[a] == key]
            parts.append(self._group_marginal(self._groups[key], mine))
            part_axes.extend(mine)
        joint = reduce(np.multiply.outer, parts) if len(parts) > 1 else np.array(parts[0], copy=True)
        return np.transpose(joint, np.argsort(part_axes))

    def marginal(self, attrs: Iterable[str]) -> np.ndarray:
        """Counts over ``attrs``, flat in C order over ``domain.project(attrs in domain order)``.

        Equal to ``Marginal(domain, attrs).matvec(self.to_dense())`` without the dense table.
        """
        return self.total * self.probabilities(attrs).reshape(-1)

    def to_dense(self) -> np.ndarray:
        """The full table over the domain (C order, first attribute most significant)."""
        self.domain.require_dense("FactoredTable.to_dense")
        return self.marginal(self.domain.attrs)

    # ---- the MW primitive -----------------------------------------------------------
    def multiply(self, attrs: Iterable[str], factor: np.ndarray) -> None:
        """Multiply the group holding ``attrs`` by ``factor`` (flat over their marginal cells), renormalise.

        ``attrs`` must lie in one group (see :meth:`merge`); the other groups are untouched.
        """
        axes = self._axes_of(attrs, "multiply")
        key = self.key_of([self.domain.attrs[a] for a in axes])
        group = self._groups[key]
        positions = {int(self.position[a]) for a in axes}
        shape = tuple(s if i in positions else 1 for i, s in enumerate(group.table.shape))
        factor = np.asarray(factor, dtype=np.float64)
        if factor.size != math.prod(shape):
            raise SolverError(f"multiply: factor has {factor.size} entries for {math.prod(shape)} marginal cells")
        table = group.table * factor.reshape(shape)
        mass = table.sum()
        if not (math.isfinite(mass) and mass > 0):
            raise SolverError(f"multiply over {[self.domain.attrs[a] for a in axes]}: the update left no finite mass")
        group.table = table / mass
        self._touch(key)


    # ---- public constraints -----------------------------------------------------------
    def pin_zeros(self, attrs: Sequence[str], mask: np.ndarray) -> None:
        """Hold the cells of the marginal on ``attrs`` where ``mask`` is True at zero.

        The attributes are merged into one group; its table is multiplied by 0 on those
        cells, so every later multiplicative update keeps them at zero.
        """
        attrs = self.domain.canonical(attrs)
        self.merge(attrs)
        self.multiply(attrs, (~np.asarray(mask, dtype=bool)).astype(np.float64).ravel())

    def fit_invariants(self, invariants: Sequence[tuple], *, tol: float = 1e-10, max_sweeps: int = 500) -> int:
        """Proportional fitting of the groups that carry invariants ``(attrs, query, values)``.

        ``query`` is a counting query of the domain with 0/1 entries and disjoint rows (a total
        or a marginal) depending only on ``attrs``, which must lie in one group (:meth:`merge`
        them first). Each such group's table is fitted by
        :func:`~dpopt.estimate.engines.proportional.proportional_fit` (the KL projection), kept at the
        table's total, until every invariant holds within ``tol`` times ``1 + max |value|``.
        Returns the most sweeps a group needed; raises :class:`SolverError` when ``max_sweeps``
        do not get there (the invariants then contradict the structural zeros or each other).
        """
        by_group: dict[int, list] = {}
        for attrs, query, values in invariants:
            by_group.setdefault(self.key_of(attrs), []).append((query, values))
        most = 0
        for key, members in by_group.items():
            group = self._groups[key]
            names = tuple(self.domain.attrs[a] for a in group.axes)
            fits = [counting_invariant(restrict_query(q, names), v, q.name) for q, v in members]
            scale = 1.0 + max(float(np.abs(f.values).max(initial=0.0)) for f in fits)
            x = group.table.reshape(-1) * self.total
            for sweep in range(1, max_sweeps + 1):
                x = proportional_fit(x, fits, sweeps=1)
                x *= self.total / x.sum()
                worst = max(float(np.abs(f.query.matvec(x) - f.values).max(initial=0.0)) for f in fits)
                if worst <= tol * scale:
                    break
            else:
                raise SolverError(f"proportional fitting did not reach the invariants within {max_sweeps} sweeps "
                                  f"(largest violation {worst:.3g}); they may contradict the structural zeros")
            group.table = (x / self.total).reshape(group.table.shape)
            self._touch(key)
            most = max(most, sweep)
        return most


def _preview_groups(groups: list[list[str]], k: int = 4) -> str:
    shown = "; ".join(f"{len(g)} attrs [{', '.join(g[:6])}{', ...' if len(g) > 6 else ''}]" for g in groups[:k])
    return shown + ("; ..." if len(groups) > k else "")


# ---- multiplicative weights on a factored table -----------------------------------------------
@dataclass
class FactoredTerm:
    """Every measurement of one marginal: the sums and counts of the noisy answers per cell.

    As :class:`~dpopt.estimate.engines.mw_step.MWTerm` for a marginal block: the update of a term
    applies all its measurements at once, ``r = sums - counts * q(A)``.
    """

    attrs: tuple[str, ...]  # domain order
    sums: np.ndarray
    counts: np.ndarray
    order: int  # creation order: the order of the dense state's passes
    measured: np.ndarray = field(init=False)  # cells measured at least once

    def __post_init__(self) -> None:
        self.measured = np.zeros(self.sums.size, dtype=bool)

    def add(self, rows: np.ndarray, values: np.ndarray | None) -> None:
        self.measured[rows] = True
        if values is not None:
            np.add.at(self.sums, rows, values)
            np.add.at(self.counts, rows, 1.0)


class FactoredMWState:
    """MW over a :class:`FactoredTable` with marginal-cell and whole-marginal measurements.

    The factored counterpart of :class:`~dpopt.estimate.engines.mw_step.MWState` (same terms,
    same step ``eta = 1/(2n)`` for marginal cells, whose columns have L1 norm 1), so that
    the same sequence of measurements and passes gives the same estimate.

    Parameters
    ----------
    table : FactoredTable
        Updated in place.
    merge : bool
        Gather measurements of the same marginal into one term (as ``MWState(merge=True)``);
        False keeps one term per measurement.
    """

    def __init__(self, table: FactoredTable, *, merge: bool = True) -> None:
        self.table, self.merge = table, merge
        self.terms: list[FactoredTerm] = []
        self._first_axis: list[int] = []  # an attribute of each term: its group is the term's group
        self._by_key: dict[Hashable, FactoredTerm] = {}
        self.updates = 0

    @property
    def total(self) -> float:
        return self.table.total

    def _term(self, attrs: tuple[str, ...]) -> FactoredTerm:
        cells = math.prod(self.table.domain.size_of(a) for a in attrs)
        return FactoredTerm(attrs, np.zeros(cells), np.zeros(cells), len(self.terms))

    def _checked(self, attrs, rows, values) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        attrs = self.table.domain.canonical((attrs,) if isinstance(attrs, str) else attrs)
        if not attrs:
            raise QueryError("a factored MW measurement needs at least one attribute")
        cells = math.prod(self.table.domain.size_of(a) for a in attrs)
        rows = np.asarray(rows, dtype=np.int64).ravel()
        values = np.asarray(values, dtype=np.float64).ravel()
        if rows.size == 0 or rows.min() < 0 or rows.max() >= cells:
            raise QueryError(f"measured rows of the marginal on {list(attrs)} must lie in 0..{cells - 1}")
        if values.shape != rows.shape:
            raise SolverError(f"{values.size} values for {rows.size} measured cells of the marginal on {list(attrs)}")
        if not np.isfinite(values).all():
            raise SolverError(f"measured values of the marginal on {list(attrs)} must be finite")
        return attrs, rows, values

    def add_measurement(self, attrs: Sequence[str], rows: np.ndarray, values: np.ndarray,
                        key: Hashable = None) -> FactoredTerm:
        """Record noisy ``values`` of cells ``rows`` of the marginal on ``attrs``.

        Merges the groups the marginal spans first (which may raise the group-size guard).
        """
        attrs, rows, values = self._checked(attrs, rows, values)
        self.table.merge(attrs)
        key = key if key is not None else attrs
        term = self._by_key.get(key) if self.merge else None
        if term is None:
            term = self._term(attrs)
            self.terms.append(term)
            self._first_axis.append(self.table.domain.axis(attrs[0]))
            self._by_key[key] = term
        elif term.attrs != attrs:
            raise SolverError(f"measurement key {key!r} holds the marginal on {list(term.attrs)}, not {list(attrs)}")
        term.add(rows, values)
        return term

    def update(self, term: FactoredTerm, boost: float = 1.0) -> None:
        """One MW step on ``term``: the group holding it times ``exp(eta (sums - counts q(A)))``."""
        answers = self.table.marginal(term.attrs)
        eta = boost / (2.0 * self.table.total)
        self.table.multiply(term.attrs, np.exp(eta * (term.sums - term.counts * answers)))
        self.updates += 1

    def update_once(self, attrs: Sequence[str], rows: np.ndarray, values: np.ndarray) -> None:
        """The update of one measurement alone, whatever the stored terms (Fig. 1, step 3)."""
        attrs, rows, values = self._checked(attrs, rows, values)
        self.table.merge(attrs)
        term = self._term(attrs)
        term.add(rows, values)
        self.update(term)

    def terms_of_group(self, attr: str) -> list[FactoredTerm]:
        """The terms held by the group of ``attr``, in creation order."""
        owner = self.table.owner
        mine = np.flatnonzero(owner[np.asarray(self._first_axis, dtype=np.int64)] == owner[self.table.domain.axis(attr)])
        return [self.terms[i] for i in mine]

    def passes(self, max_passes: int, group: str | None = None) -> int:
        """Re-apply the update over past measurements ``max_passes`` times.

        With ``group`` (an attribute name) only the terms of the group holding it are
        passed over, and only that group changes; without it every term is, in creation
        order, which equals the dense state's passes (updates of different groups commute).
        Returns the passes done.
        """
        terms = self.terms if group is None else self.terms_of_group(group)
        for _ in range(int(max_passes)):
            for term in terms:
                self.update(term)
        return int(max_passes)


# ---- every cell of every k-way marginal of a binary table ------------------------------------
class BinaryMarginalCells:
    """Probabilities of every cell of every ``k``-way marginal of a binary :class:`FactoredTable`.

    ``cells[i]`` holds the ``2^k`` cells (C order) of the marginal on attribute indices
    ``combos[i]`` (all ``k``-subsets in lexicographic order, the order of
    :func:`~dpopt.model.queries.all_marginals`). They come from the moments of the
    product distribution, ``E[prod_{l in T} x_l] = prod_g E_g[prod_{l in T ∩ g} x_l]``,
    by :func:`cells_from_subset_moments`. :meth:`refresh` recomputes only the marginals
    that touch a group whose table changed since the last refresh.

    Parameters
    ----------
    table : FactoredTable
        Every attribute must have two values.
    k : {1, 2, 3}
    """

    def __init__(self, table: FactoredTable, k: int) -> None:
        dom = table.domain
        for a, s in zip(dom.attrs, dom.sizes):
            if s != 2:
                raise DomainError(f"moment-based marginals need binary attributes; attribute {a!r} has {s} values")
        if isinstance(k, bool) or k not in (1, 2, 3) or k > len(dom):
            raise QueryError(f"k must be 1, 2 or 3 (and at most {len(dom)}, the attributes), got k={k!r}")
        self.table, self.k = table, int(k)
        d = len(dom)
        self.combos = attribute_combinations(d, self.k)
        self.cells = np.empty((len(self.combos), 2**self.k))
        self.m1 = np.zeros(d)
        self.m2 = np.zeros((d, d)) if self.k >= 2 else None
        self._moments: dict[int, np.ndarray] = {}  # superset sums of the groups with 2+ attributes
        self._seen: dict[int, int] = {}
        self._ie = inclusion_exclusion_matrix(self.k).T.copy()
        self.refresh()

    def refresh(self) -> np.ndarray:
        """Recompute the marginals touching changed groups; returns their indices."""
        revisions = self.table.revisions()
        changed = [key for key, rev in revisions.items() if self._seen.get(key) != rev]
        self._seen = revisions
        self._moments = {key: z for key, z in self._moments.items() if key in revisions}
        if not changed:
            return np.zeros(0, dtype=np.int64)
        axes_changed = []
        for key in changed:
            axes = np.asarray(self.table.group_axes(key), dtype=np.int64)
            z = superset_sums(self.table.group_probabilities(key))
            bit = 1 << (len(axes) - 1 - np.arange(len(axes)))  # the mask of each axis of the group
            self.m1[axes] = z[bit]
            if self.m2 is not None and len(axes) > 1:
                self._moments[key] = z
            axes_changed.append(axes)
        ax = np.concatenate(axes_changed)
        if self.m2 is not None:
            # Across groups the moments are products; within a changed group its own moments.
            self.m2[ax, :] = np.outer(self.m1[ax], self.m1)
            self.m2[:, ax] = self.m2[ax, :].T
            for key in changed:
                axes = np.asarray(self.table.group_axes(key), dtype=np.int64)
                if len(axes) > 1:
                    bit = 1 << (len(axes) - 1 - np.arange(len(axes)))
                    self.m2[np.ix_(axes, axes)] = self._moments[key][bit[:, None] | bit[None, :]]
        if ax.size == len(self.m1):
            idx = np.arange(len(self.combos))
        else:
            touched = np.zeros(len(self.m1), dtype=bool)
            touched[ax] = True
            idx = np.flatnonzero(touched[self.combos].any(axis=1))
        if idx.size:
            self.cells[idx] = self._subset_moments(self.combos[idx]) @ self._ie
        return idx

    def _subset_moments(self, combos: np.ndarray) -> np.ndarray:
        """``E[prod_{l in T} x_{c_l}]`` for every subset mask ``T`` (bit ``k-1-l`` for ``c_l``)."""
        k = self.k
        out = np.empty((len(combos), 2**k))
        out[:, 0] = 1.0
        for l in range(k):
            out[:, 1 << (k - 1 - l)] = self.m1[combos[:, l]]
        if k >= 2:
            for l, m in combinations(range(k), 2):
                out[:, (1 << (k - 1 - l)) | (1 << (k - 1 - m))] = self.m2[combos[:, l], combos[:, m]]
        if k == 3:
            out[:, 7] = self._triple_moments(combos)
        return out

    def _triple_moments(self, combos: np.ndarray) -> np.ndarray:
        a, b, c = combos[:, 0], combos[:, 1], combos[:, 2]
        owner = self.table.owner
        ga, gb, gc = owner[a], owner[b], owner[c]
        ab, ac, bc = ga == gb, ga == gc, gb == gc
        m1, m2 = self.m1, self.m2
        out = m1[a] * m1[b] * m1[c]  # three groups
        # Two in one group, the third elsewhere: that group's pair moment times the single.
        sel = ab & ~ac
        out[sel] = m2[a[sel], b[sel]] * m1[c[sel]]
        sel = ac & ~ab
        out[sel] = m2[a[sel], c[sel]] * m1[b[sel]]
        sel = bc & ~ab
        out[sel] = m2[b[sel], c[sel]] * m1[a[sel]]
        same = np.flatnonzero(ab & ac)  # all three in one group: its own third moment
        if same.size:
            pos = self.table.position
            for key in np.unique(ga[same]):
                rows = same[ga[same] == key]
                top = len(self.table.group_axes(int(key))) - 1
                mask = (1 << (top - pos[a[rows]])) | (1 << (top - pos[b[rows]])) | (1 << (top - pos[c[rows]]))
                out[rows] = self._moments[int(key)][mask]
        return out
