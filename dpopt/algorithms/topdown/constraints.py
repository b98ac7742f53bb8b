"""A release's public constraints, read level by level: invariants of units and structural zeros.

A constraint over the full domain (geography × characteristics) becomes, for a top-down
release, rows on the tables of single units: an invariant row whose coefficients depend only
on the characteristics within one unit of some level (a state's total, the nation's
voting-age count) is imposed when that unit's table is solved, i.e. in its parent's problem.
:func:`invariants_by_unit` finds, for every row, the coarsest level at which it is such a
row; a row that mixes units of different parents cannot be kept by a top-down solve and is
refused, naming it.

Invariants are then summed up the tree (:func:`sum_up`): when every child of a parent has the
same invariant row, the parent's table must have the sum, so that the parent's own solve leaves
room for its children (otherwise the children's problem would be infeasible and need the
failsafe). Structural zeros (edit rules, and hierarchy rules) become a mask over the
characteristics shared by every unit, plus per-leaf masks for rules that name geography
attributes (:class:`ZeroRules`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from dpopt.errors import InconsistentConstraintsError, ParameterError
from dpopt.model.constraints import ConstraintSet
from dpopt.model.domain import Domain
from dpopt.model.geography import Geography
from dpopt.model.queries.base import LinearQuery

__all__ = ["UnitInvariant", "ZeroRules", "invariants_by_unit", "sum_up", "zero_rules", "invariant_from_data"]


@dataclass(frozen=True, eq=False)
class UnitInvariant:
    """Rows ``matrix @ x_u = values[j]`` on the table of every unit ``u = units[j]`` of ``level``.

    Attributes
    ----------
    name : str
    level : int
    matrix : scipy.sparse.csr_matrix, shape (rows, cells)
        Over the characteristics.
    units : ndarray of int
        Positions in the level.
    values : ndarray, shape (len(units), rows)
    derived : bool
        Summed up from the children's invariants (:func:`sum_up`).
    """

    name: str
    level: int
    matrix: sp.csr_matrix
    units: np.ndarray
    values: np.ndarray
    derived: bool = False

    def __post_init__(self) -> None:
        units = np.asarray(self.units, dtype=np.int64).ravel()
        values = np.asarray(self.values, dtype=np.float64).reshape(units.size, self.matrix.shape[0])
        if not np.isfinite(values).all():
            raise ParameterError(f"invariant {self.name!r}: values must be finite")
        object.__setattr__(self, "units", units)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "matrix", sp.csr_matrix(self.matrix, dtype=np.float64))

    @classmethod
    def of_query(cls, name: str, geography: Geography, level: str | int, query: LinearQuery,
                 values: np.ndarray) -> "UnitInvariant":
        """``query`` (over the characteristics) published exactly for every unit of ``level``.

        ``values`` has one row per unit of the level (e.g. each state's voting-age counts).
        """
        k = geography.level(level)
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (geography.sizes[k], query.num_rows):
            raise ParameterError(f"invariant {name!r}: values must have shape ({geography.sizes[k]}, "
                                 f"{query.num_rows}) (units of {geography.names[k]!r} x query rows), got {values.shape}")
        return cls(name, k, query.to_sparse(), np.arange(geography.sizes[k]), values)

    def lookup(self, size: int) -> np.ndarray:
        """Position in ``units`` of every unit of the level (-1 where it has no row)."""
        out = np.full(size, -1, dtype=np.int64)
        out[self.units] = np.arange(self.units.size)
        return out


@dataclass(frozen=True, eq=False)
class ZeroRules:
    """Cells no unit may hold (``shared``) and, per leaf, the cells its own rules forbid (``leaf``)."""

    shared: np.ndarray
    leaf: sp.csr_matrix | None = None

    def forbidden(self, geography: Geography, k: int) -> np.ndarray | None:
        """Per unit of level ``k``: cells forbidden to all of its leaves (None without per-leaf rules)."""
        if self.leaf is None:
            return None
        hits = np.asarray((geography.aggregation(k) @ self.leaf.astype(np.int64)).todense())
        return hits == geography.leaves_per_unit(k)[:, None]


def zero_rules(constraints: ConstraintSet, geography: Geography, chars: Domain) -> ZeroRules:
    """The structural zeros (and hierarchy rules) of ``constraints`` on the characteristics."""
    domain = constraints.domain
    shared = np.zeros(chars.size, dtype=bool)
    leaf = None
    for rule, attrs, mask in constraints.zero_patterns():
        geo = [a for a in attrs if a in geography.attrs]
        grid = mask.reshape([domain.size_of(a) for a in attrs])
        rest = [a for a in attrs if a not in geo]
        full = [chars.size_of(a) if a in rest else 1 for a in chars.attrs]
        if not geo:
            shared |= np.broadcast_to(grid.reshape(full), chars.shape).ravel()
            continue
        if geography.sizes[-1] * chars.size > 5 * 10**7:
            raise ParameterError(f"structural zeros {rule.name!r} name geography attributes {geo}; per-leaf zero "
                                 f"masks over {geography.sizes[-1]:,} leaves are not supported")
        # Geography axes first, indexed by each leaf's codes: (leaves, remaining attributes...).
        moved = np.moveaxis(grid, [attrs.index(a) for a in geo], list(range(len(geo))))
        picked = moved[tuple(geography.leaf_codes[:, geography.attrs.index(a)] for a in geo)]
        per_leaf = np.broadcast_to(picked.reshape(-1, *full), (geography.sizes[-1], *chars.shape))
        per_leaf = per_leaf.reshape(geography.sizes[-1], chars.size)
        leaf = per_leaf.copy() if leaf is None else leaf | per_leaf
    if leaf is not None:
        leaf = leaf & ~shared
        leaf = sp.csr_matrix(leaf) if leaf.any() else None
    return ZeroRules(shared, None if leaf is None else leaf.astype(bool))


def invariants_by_unit(constraints: ConstraintSet, geography: Geography, chars: Domain) -> list[UnitInvariant]:
    """Every invariant of ``constraints`` as rows on single units (see the module notes).

    Raises
    ------
    ParameterError
        Naming the invariant and row that mixes units of different parents.
    """
    domain = constraints.domain
    out: list[UnitInvariant] = []
    anc = geography.ancestors()
    per_unit = [geography.leaves_per_unit(k) for k in range(geography.depth)]
    for inv in constraints.invariants:
        A = inv.query.to_sparse().tocoo()
        codes = domain.unravel(A.col)
        leaf = _leaves_or_minus_one(geography, codes, domain)
        cell = np.ravel_multi_index(tuple(codes[:, list(domain.axes(chars.attrs))].T), chars.sizes)
        keep = leaf >= 0  # cells of no leaf are zero in every release: their coefficient is moot
        rows_, leaf_, cell_, coef_ = A.row[keep], leaf[keep], cell[keep], A.data[keep]
        frame = pd.DataFrame({"row": rows_, "leaf": leaf_, "cell": cell_, "coef": coef_})
        level_of = np.full(A.shape[0], -1, dtype=np.int64)
        unit_of = np.full(A.shape[0], -1, dtype=np.int64)
        empty = np.setdiff1d(np.arange(A.shape[0]), rows_)
        level_of[empty], unit_of[empty] = 0, 0  # rows on no cell: checked by the root (value must be 0)
        for k in range(geography.depth):
            todo = level_of < 0
            if not todo.any():
                break
            sel = todo[rows_]
            f = pd.DataFrame({"row": rows_[sel], "unit": anc[k][leaf_[sel]], "cell": cell_[sel], "coef": coef_[sel]})
            g = f.groupby(["row", "unit", "cell"], sort=False)["coef"].agg(["size", "min", "max"]).reset_index()
            ok = (g["size"].to_numpy() == per_unit[k][g["unit"].to_numpy()]) & (g["min"] == g["max"]).to_numpy()
            rows = g.assign(ok=ok).groupby("row").agg(ok=("ok", "all"), units=("unit", "nunique"), unit=("unit", "first"))
            done = rows.index[(rows["ok"] & (rows["units"] == 1)).to_numpy()].to_numpy()
            level_of[done], unit_of[done] = k, rows.loc[done, "unit"].to_numpy()
        if (level_of < 0).any():
            r = int(np.argmax(level_of < 0))
            raise ParameterError(f"invariant {inv.name!r}: row {inv.query.row_labels()[r]!r} adds up cells of several "
                                 f"units of level {geography.names[-1]!r} with different weights; a top-down release "
                                 "keeps invariants on single units only")
        out.extend(_families(inv.name, frame, level_of, unit_of, inv.values, chars.size))
    return out


def _families(name, frame, level_of, unit_of, values, cells) -> list[UnitInvariant]:
    """Rows with the same level and the same coefficients on the characteristics, grouped."""
    first = frame.drop_duplicates(["row", "cell"]).sort_values(["row", "cell"])
    patterns: dict[tuple, list[int]] = {}
    by_row = {r: (g["cell"].to_numpy(), g["coef"].to_numpy()) for r, g in first.groupby("row")}
    for r in range(level_of.size):
        cols, coefs = by_row.get(r, (np.zeros(0, dtype=np.int64), np.zeros(0)))
        key = (int(level_of[r]), cols.tobytes(), coefs.tobytes())
        patterns.setdefault(key, []).append(r)
    out = []
    for (k, _, _), rows in patterns.items():
        cols, coefs = by_row.get(rows[0], (np.zeros(0, dtype=np.int64), np.zeros(0)))
        matrix = sp.csr_matrix((coefs, (np.zeros(cols.size, dtype=np.int64), cols)), shape=(1, cells))
        label = name if len(patterns) == 1 else f"{name} [{len(out) + 1}]"
        out.append(UnitInvariant(label, k, matrix, unit_of[rows], np.asarray(values)[rows][:, None]))
    return out


def _leaves_or_minus_one(geography: Geography, codes: np.ndarray, domain: Domain) -> np.ndarray:
    """The leaf of each cell's geography codes, -1 for combinations that are no leaf."""
    from dpopt.model.geography import _keys

    sizes = [domain.size_of(a) for a in geography.attrs]
    keys = _keys(codes[:, list(domain.axes(geography.attrs))], sizes)
    leaf_keys = _keys(geography.leaf_codes, sizes)
    order = np.argsort(leaf_keys, kind="stable")
    pos = np.minimum(np.searchsorted(leaf_keys[order], keys), order.size - 1)
    leaf = order[pos]
    return np.where(leaf_keys[leaf] == keys, leaf, -1)


def sum_up(invariants: list[UnitInvariant], geography: Geography) -> list[UnitInvariant]:
    """The invariants plus their sums on every parent all of whose children carry the same rows.

    Rows with the same coefficients on units of one level are pooled first, whichever invariant
    they came from (a county total given for every county of a state, in two invariants, still
    fixes the state's total).

    Raises
    ------
    InconsistentConstraintsError
        When two invariants give one unit different values for the same rows, e.g. a declared
        state total that disagrees with the sum of its counties'.
    """
    out = list(invariants)
    for k in range(geography.depth - 1, 0, -1):
        groups: dict[bytes, list[UnitInvariant]] = {}
        for inv in out:
            if inv.level == k:
                groups.setdefault(_matrix_key(inv.matrix), []).append(inv)
        for families in groups.values():
            units, values = _pooled(families, geography.names[k])
            _, starts = geography.children(k - 1)
            counts = np.bincount(geography.parents[k][units], minlength=geography.sizes[k - 1])
            full = np.flatnonzero(counts == np.diff(starts))
            if full.size == 0:
                continue
            sums = np.zeros((geography.sizes[k - 1], families[0].matrix.shape[0]))
            np.add.at(sums, geography.parents[k][units], values)
            name = families[0].name.split(" [")[0]
            derived = UnitInvariant(f"{name} (summed to {geography.names[k - 1]})", k - 1, families[0].matrix, full,
                                    sums[full], derived=True)
            same = [inv for inv in out if inv.level == k - 1 and _matrix_key(inv.matrix) == _matrix_key(derived.matrix)]
            if same:
                _pooled(same + [derived], geography.names[k - 1])  # raises on a disagreement
                known = np.concatenate([inv.units for inv in same])
                keep = ~np.isin(derived.units, known)
                if not keep.any():
                    continue
                derived = UnitInvariant(derived.name, k - 1, derived.matrix, derived.units[keep], derived.values[keep],
                                        derived=True)
            out.append(derived)
    return out


def _matrix_key(matrix: sp.csr_matrix) -> bytes:
    m = sp.csr_matrix(matrix)
    m.sort_indices()
    return b"|".join([np.asarray(m.shape).tobytes(), m.indptr.tobytes(), m.indices.tobytes(), m.data.tobytes()])


def _pooled(families: list[UnitInvariant], level: str) -> tuple[np.ndarray, np.ndarray]:
    """Units and values of families with the same rows; a unit given two different values is an error."""
    units = np.concatenate([f.units for f in families])
    values = np.concatenate([f.values for f in families])
    names = [f.name for f in families for _ in f.units]
    order = np.argsort(units, kind="stable")
    units, values = units[order], values[order]
    repeat = np.flatnonzero(units[1:] == units[:-1])
    differ = repeat[np.abs(values[repeat + 1] - values[repeat]).max(axis=1) > 1e-9] if repeat.size else repeat
    if differ.size:
        i = differ[0]
        raise InconsistentConstraintsError(
            f"invariants {names[order[i]]!r} and {names[order[i + 1]]!r} give unit {int(units[i])} of level "
            f"{level!r} different values for the same rows ({values[i].tolist()} and {values[i + 1].tolist()})")
    keep = np.ones(units.size, dtype=bool)
    keep[repeat + 1] = False
    return units[keep], values[keep]


def invariant_from_data(name: str, geography: Geography, level: str | int, query: LinearQuery,
                        leaf_counts: sp.spmatrix) -> UnitInvariant:
    """``query``'s true answers for every unit of ``level``, published exactly (NOT private, on purpose).

    The top-down counterpart of :meth:`~dpopt.model.constraints.ConstraintSet.invariant_from_data`
    for invariants given per unit (e.g. each state's population by voting age).
    """
    k = geography.level(level)
    counts = sp.csr_matrix(geography.aggregation(k) @ sp.csr_matrix(leaf_counts))
    values = np.asarray((query.to_sparse() @ counts.T.astype(np.float64)).T.todense())
    return UnitInvariant.of_query(name, geography, k, query, values)
