"""A geography hierarchy of any depth: levels, unit ids, and the parent of every unit.

The units of a census release nest: a nation holds states, a state holds counties, a county
holds tracts. A :class:`Geography` holds that tree level by level, root first: level 0 has
one unit (the nation), and every unit of level ``k >= 1`` has exactly one parent in level
``k - 1``. All leaves sit on the last level (the tree has uniform depth), which is what a
top-down release solves level by level.

The tree is public. It is read from the domain, never from the records:

* :meth:`Geography.from_columns` — one domain attribute per level (``state``, ``county``),
  the parents given by the labels themselves (``"S01-C1"`` lies in ``"S01"`` with
  ``parents="separator"``), by ``{child: parent}`` tables (e.g. a spec's
  ``[[constraints.hierarchy]]``), or nested (``parents="nested"``: a unit is its tuple of
  codes, so that every combination is a unit, as with county codes repeated in every state);
* :meth:`Geography.from_code` — one attribute holding a code whose prefixes name the
  ancestors (a GEOID ``"01001020100"``: state ``"01"``, county ``"01001"``);
* :meth:`Geography.from_table` — a crosswalk with one column per level, one row per leaf;
* :meth:`Geography.from_edges` — a ``(unit, parent)`` edge list (cycles are refused).

Every constructor validates: unique ids within a level, exactly one parent per unit, no
cycles, uniform depth; each error is one line naming the level and the unit. The records are
checked against the tree when they are counted: a record whose columns name units that do not
nest (a county of one state recorded in another) is a :class:`~dpopt.errors.DataError`.
:meth:`Geography.leaf_histograms` counts records per leaf and cell by one group-by (sorting
integer keys), returning a sparse matrix: empty units cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp

from dpopt.errors import HIDDEN_VALUES, DataError, DomainError, showing_confidential
from dpopt.model.domain import Domain

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.data import Dataset

__all__ = ["Geography", "PARENT_RULES"]

#: How :meth:`Geography.from_columns` finds each unit's parent.
PARENT_RULES = ("separator", "nested", "tables")


@dataclass(frozen=True, eq=False)
class Geography:
    """Levels of nested units, root first, optionally bound to attributes of a domain.

    Parameters
    ----------
    names : sequence of str
        Level names, root first (e.g. ``("nation", "state", "county")``).
    units : sequence of sequences of str
        The unit ids of each level; level 0 holds exactly one unit.
    parents : sequence of int arrays
        ``parents[k][i]`` is the position in ``units[k - 1]`` of the parent of unit ``i`` of
        level ``k``; ``parents[0]`` is ``[-1]``.
    attrs : tuple of str
        The domain attributes that locate a record in the tree (empty when unbound).
    leaf_codes : int array, shape (leaves, len(attrs))
        The codes each leaf has on ``attrs``: a record lies in the leaf whose codes it has.

    Use the ``from_*`` constructors, which validate their input.
    """

    names: tuple[str, ...]
    units: tuple[np.ndarray, ...]
    parents: tuple[np.ndarray, ...]
    attrs: tuple[str, ...] = ()
    leaf_codes: np.ndarray | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = tuple(str(n) for n in self.names)
        if len(names) < 2:
            raise DomainError(f"geography: give at least two levels (a root and its children), got {list(names)}")
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise DomainError(f"geography: level name {dup!r} is used twice")
        if len(self.units) != len(names) or len(self.parents) != len(names):
            raise DomainError(f"geography: {len(names)} level names but {len(self.units)} unit lists "
                              f"and {len(self.parents)} parent arrays")
        units = tuple(np.asarray([str(u) for u in level], dtype=object) for level in self.units)
        parents = tuple(np.asarray(p, dtype=np.int64).ravel() for p in self.parents)
        if units[0].size != 1:
            raise DomainError(f"geography: the root level {names[0]!r} must hold exactly one unit, "
                              f"got {units[0].size}")
        for k, (name, ids, par) in enumerate(zip(names, units, parents)):
            if ids.size == 0:
                raise DomainError(f"geography: level {name!r} has no unit")
            uniq, counts = np.unique(ids.astype(str), return_counts=True)
            if (counts > 1).any():
                raise DomainError(f"geography: unit {str(uniq[counts > 1][0])!r} appears twice in level {name!r}")
            if par.shape != ids.shape:
                raise DomainError(f"geography: level {name!r} has {ids.size} units but {par.size} parents")
            if k == 0:
                continue
            bad = (par < 0) | (par >= units[k - 1].size)
            if bad.any():
                raise DomainError(f"geography: unit {str(ids[np.argmax(bad)])!r} of level {name!r} has no parent "
                                  f"in level {names[k - 1]!r}")
            childless = np.setdiff1d(np.arange(units[k - 1].size), par)
            if childless.size:
                raise DomainError(f"geography: unit {str(units[k - 1][childless[0]])!r} of level {names[k - 1]!r} "
                                  f"has no child in level {name!r}; every leaf must be on the last level")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "units", units)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "attrs", tuple(self.attrs))
        if self.leaf_codes is not None:
            codes = np.asarray(self.leaf_codes, dtype=np.int64).reshape(units[-1].size, len(self.attrs))
            object.__setattr__(self, "leaf_codes", codes)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_columns(
        cls,
        domain: Domain,
        columns: Sequence[str],
        *,
        parents: str | Sequence[Mapping] = "separator",
        separator: str = "-",
        root: str = "nation",
    ) -> "Geography":
        """One domain attribute per level below the root, coarsest first.

        Parameters
        ----------
        domain : Domain
            Its labels of ``columns`` are the unit ids (public: no data is read).
        columns : sequence of str
            The attributes of the levels, e.g. ``["state", "county"]``.
        parents : {"separator", "nested"} or sequence of mappings
            ``"separator"``: a label's parent is its text before the last ``separator``
            (``"S01-C1"`` → ``"S01"``); ``"nested"``: a unit is the tuple of its codes on the
            columns up to its level, so every combination is a unit; or one mapping
            ``{child label: parent label}`` per level below the first column.
        separator : str
            With ``parents="separator"``.
        root : str
            The name of the top level (one unit, named like the level).
        """
        columns = tuple(domain.check_attrs(columns))
        if not columns:
            raise DomainError("geography: give at least one level column")
        if root in columns:
            raise DomainError(f"geography: the root level {root!r} cannot also be a column")
        labels = [[str(v) for v in domain.labels_of(c)] for c in columns]
        if isinstance(parents, str) and parents == "nested":
            return cls._nested(domain, columns, labels, root)
        if isinstance(parents, str):
            if parents != "separator":
                raise DomainError(f"geography: parents must be one of {list(PARENT_RULES[:2])} or a list of "
                                  f"{{child: parent}} tables, got {parents!r}")
            if not isinstance(separator, str) or not separator:
                raise DomainError(f"geography: separator must be a non-empty string, got {separator!r}")
            tables = []
            for k in range(1, len(columns)):
                tables.append({lab: lab.rsplit(separator, 1)[0] if separator in lab else None for lab in labels[k]})
        else:
            tables = [{str(c): str(p) for c, p in dict(t).items()} for t in parents]
            if len(tables) != len(columns) - 1:
                raise DomainError(f"geography: {len(columns)} level columns need {len(columns) - 1} parent "
                                  f"tables, got {len(tables)}")
        units = [np.array([root], dtype=object)] + [np.asarray(lab, dtype=object) for lab in labels]
        par = [np.array([-1]), np.zeros(len(labels[0]), dtype=np.int64)]
        for k in range(1, len(columns)):
            index = {lab: i for i, lab in enumerate(labels[k - 1])}
            table = tables[k - 1]
            extra = sorted(set(table) - set(labels[k]))
            if extra:
                raise DomainError(f"geography: the parent table of level {columns[k]!r} names {extra[0]!r}, "
                                  f"which is not a value of {columns[k]!r}")
            codes = np.empty(len(labels[k]), dtype=np.int64)
            for i, lab in enumerate(labels[k]):
                parent = table.get(lab)
                if parent is None:
                    how = (f"has no {separator!r} before which its parent is named" if isinstance(parents, str)
                           else "has no parent in the parent table")
                    raise DomainError(f"geography: unit {lab!r} of level {columns[k]!r} {how}")
                if parent not in index:
                    raise DomainError(f"geography: unit {lab!r} of level {columns[k]!r} names parent {parent!r}, "
                                      f"which is not a unit of level {columns[k - 1]!r}")
                codes[i] = index[parent]
            par.append(codes)
        leaf_codes = _ancestor_codes(par)
        return cls((root, *columns), units, par, attrs=columns, leaf_codes=leaf_codes)

    @classmethod
    def _nested(cls, domain: Domain, columns, labels, root: str) -> "Geography":
        sizes = [len(lab) for lab in labels]
        units = [np.array([root], dtype=object)]
        par = [np.array([-1])]
        ids = np.array([""], dtype=object)
        for k, lab in enumerate(labels):
            lab_arr = np.asarray(lab, dtype=object)
            ids = (np.repeat(ids, sizes[k]) + ("/" if k else "") + np.tile(lab_arr, ids.size)).astype(object)
            units.append(ids)
            par.append(np.repeat(np.arange(units[-2].size if k else 1), sizes[k]))
        leaf_codes = np.stack(np.unravel_index(np.arange(units[-1].size), sizes), axis=1)
        return cls((root, *columns), units, par, attrs=tuple(columns), leaf_codes=leaf_codes)

    @classmethod
    def from_code(
        cls,
        domain: Domain,
        column: str,
        widths: Sequence[int],
        names: Sequence[str],
        *,
        root: str = "nation",
    ) -> "Geography":
        """One attribute whose labels are codes; the first ``widths[k]`` characters name level ``k``.

        ``from_code(domain, "geoid", [2, 5, 11], ["state", "county", "tract"])`` reads a tract
        ``"01001020100"`` as county ``"01001"`` of state ``"01"``. Every label must have
        exactly ``widths[-1]`` characters.
        """
        domain.check_attrs([column])
        widths = [int(w) for w in widths]
        names = [str(n) for n in names]
        if len(widths) != len(names) or not widths:
            raise DomainError(f"geography: {len(names)} level names for {len(widths)} code widths")
        if any(w < 1 for w in widths) or any(b <= a for a, b in zip(widths, widths[1:])):
            raise DomainError(f"geography: code widths must be positive and increasing, got {widths}")
        labels = np.asarray([str(v) for v in domain.labels_of(column)], dtype=object)
        lengths = np.fromiter((len(v) for v in labels), dtype=np.int64, count=labels.size)
        if (lengths != widths[-1]).any():
            bad = str(labels[np.argmax(lengths != widths[-1])])
            raise DomainError(f"geography: code {bad!r} of {column!r} has {len(bad)} characters, "
                              f"not the {widths[-1]} of level {names[-1]!r}")
        units = [np.array([root], dtype=object)]
        par = [np.array([-1])]
        prev_inverse = np.zeros(labels.size, dtype=np.int64)
        for k, w in enumerate(widths):
            prefixes = np.asarray([v[:w] for v in labels], dtype=object)
            uniq, first, inverse = np.unique(prefixes.astype(str), return_index=True, return_inverse=True)
            units.append(uniq.astype(object))
            par.append(prev_inverse[first])
            prev_inverse = inverse
        # the leaves are the labels, sorted; map each leaf back to the label's code
        order = np.unique(labels.astype(str), return_index=True)[1]
        return cls((root, *names), units, par, attrs=(column,), leaf_codes=order[:, None])

    @classmethod
    def from_table(
        cls,
        table: pd.DataFrame,
        levels: Sequence[str],
        *,
        root: str = "nation",
        domain: Domain | None = None,
    ) -> "Geography":
        """A crosswalk: one column per level (coarsest first), one row per leaf.

        With ``domain``, the levels that are domain attributes locate records; every value of
        such an attribute must be a unit of the table.
        """
        if not isinstance(table, pd.DataFrame):
            raise DomainError(f"geography: the table must be a pandas DataFrame, got {type(table).__name__}")
        levels = [str(v) for v in levels]
        missing = [c for c in levels if c not in table.columns]
        if missing:
            raise DomainError(f"geography table: columns {missing} are missing (columns: {list(table.columns)})")
        empty = [c for c in levels if table[c].isna().any()]
        if empty:
            raise DomainError(f"geography table: column {empty[0]!r} has {int(table[empty[0]].isna().sum())} "
                              "empty entries")
        frame = table[levels].astype(str)
        dup = frame[levels[-1]].duplicated()
        if dup.any():
            raise DomainError(f"geography table: leaf {str(frame[levels[-1]][dup].iloc[0])!r} of level {levels[-1]!r} "
                              "is on two rows")
        units = [np.array([root], dtype=object)]
        par = [np.array([-1])]
        prev = np.zeros(len(frame), dtype=np.int64)
        for k, col in enumerate(levels):
            ids, inverse = np.unique(frame[col].to_numpy(dtype=str), return_inverse=True)
            parent_of = np.full(ids.size, -1, dtype=np.int64)
            parent_of[inverse] = prev
            clash = np.zeros(ids.size, dtype=bool)
            np.logical_or.at(clash, inverse, parent_of[inverse] != prev)
            if clash.any():
                u = int(np.argmax(clash))
                seen = sorted(set(units[-1][prev[inverse == u]]))
                raise DomainError(f"geography table: unit {str(ids[u])!r} of level {col!r} has two parents "
                                  f"({seen[0]!r} and {seen[1]!r})")
            units.append(ids.astype(object))
            par.append(parent_of)
            prev = inverse
        geo = cls((root, *levels), units, par)
        return geo.bind(domain) if domain is not None else geo

    @classmethod
    def from_edges(
        cls,
        edges: pd.DataFrame,
        names: Sequence[str],
        *,
        unit: str = "unit",
        parent: str = "parent",
    ) -> "Geography":
        """A ``(unit, parent)`` edge list; the root is the one unit without a parent (empty or missing).

        ``names`` names the levels, root first; every leaf must be ``len(names) - 1`` steps
        below the root. A cycle, a unit listed twice or a parent that is not a unit is an error.
        """
        for col in (unit, parent):
            if col not in edges.columns:
                raise DomainError(f"geography edges: column {col!r} is missing (columns: {list(edges.columns)})")
        ids = edges[unit].astype(str).to_numpy()
        raw_parent = edges[parent]
        no_parent = raw_parent.isna().to_numpy() | (raw_parent.astype(str).to_numpy() == "")
        uniq, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise DomainError(f"geography edges: unit {str(uniq[counts > 1][0])!r} is listed twice (one parent each)")
        roots = ids[no_parent]
        if roots.size != 1:
            raise DomainError(f"geography edges: exactly one unit must have no parent (the root), found {roots.size}"
                              + (f": {list(roots[:3])}" if roots.size else ""))
        position = {u: i for i, u in enumerate(ids)}
        pid = np.full(ids.size, -1, dtype=np.int64)
        for i in np.flatnonzero(~no_parent):
            p = str(raw_parent.iloc[i])
            if p not in position:
                raise DomainError(f"geography edges: unit {str(ids[i])!r} names parent {p!r}, which is not a unit")
            pid[i] = position[p]
        depth = np.zeros(ids.size, dtype=np.int64)
        cursor = pid.copy()
        for _ in range(ids.size + 1):  # follow all chains one step at a time, vectorised
            moving = cursor >= 0
            if not moving.any():
                break
            depth[moving] += 1
            cursor[moving] = pid[cursor[moving]]
        else:
            raise DomainError(f"geography edges: unit {str(ids[np.argmax(cursor >= 0)])!r} lies on a cycle")
        if (cursor >= 0).any():
            raise DomainError(f"geography edges: unit {str(ids[np.argmax(cursor >= 0)])!r} lies on a cycle")
        names = [str(n) for n in names]
        if depth.max() != len(names) - 1:
            raise DomainError(f"geography edges: the tree is {int(depth.max()) + 1} levels deep but "
                              f"{len(names)} level names were given")
        has_child = np.zeros(ids.size, dtype=bool)
        has_child[pid[pid >= 0]] = True
        shallow = ~has_child & (depth != len(names) - 1)
        if shallow.any():
            raise DomainError(f"geography edges: unit {str(ids[np.argmax(shallow)])!r} is a leaf at level "
                              f"{names[depth[np.argmax(shallow)]]!r}; every leaf must be on level {names[-1]!r}")
        units, par, local = [], [], np.full(ids.size, -1, dtype=np.int64)
        for k in range(len(names)):
            members = np.flatnonzero(depth == k)
            members = members[np.argsort(ids[members], kind="stable")]
            local[members] = np.arange(members.size)
            units.append(ids[members].astype(object))
            par.append(local[pid[members]] if k else np.array([-1]))
        return cls(tuple(names), units, par)

    def bind(self, domain: Domain, levels: Sequence[str] | None = None) -> "Geography":
        """The same tree, locating records by the domain attributes named like its levels.

        ``levels`` (default: every level that is a domain attribute) are matched by label:
        each value of such an attribute must be a unit of that level.
        """
        levels = [n for n in self.names[1:] if n in domain.attrs] if levels is None else list(levels)
        if not levels:
            raise DomainError(f"geography: none of the levels {list(self.names[1:])} is an attribute of {domain}")
        anc = self.ancestors()
        columns = []
        for name in levels:
            k = self.level(name)
            labels = [str(v) for v in domain.labels_of(name)]
            index = {u: i for i, u in enumerate(self.units[k])}
            missing = [v for v in labels if v not in index]
            if missing:
                raise DomainError(f"geography: value {missing[0]!r} of attribute {name!r} is not a unit of "
                                  f"level {name!r}")
            code_of_unit = np.full(self.units[k].size, -1, dtype=np.int64)
            code_of_unit[[index[v] for v in labels]] = np.arange(len(labels))
            columns.append(code_of_unit[anc[k]])
        codes = np.stack(columns, axis=1)
        if (codes < 0).any():
            leaf = int(np.argmax((codes < 0).any(axis=1)))
            raise DomainError(f"geography: leaf {str(self.units[-1][leaf])!r} lies in a unit that is not a value of "
                              f"the domain's attributes {levels}")
        return Geography(self.names, self.units, self.parents, attrs=tuple(levels), leaf_codes=codes)

    # ---- structure -------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Number of levels, the root included."""
        return len(self.names)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Units per level."""
        return tuple(int(u.size) for u in self.units)

    def level(self, name: str | int) -> int:
        """The index of a level given by name (or index)."""
        if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
            if not 0 <= int(name) < self.depth:
                raise DomainError(f"geography: level index {name} outside 0..{self.depth - 1}")
            return int(name)
        if name not in self.names:
            raise DomainError(f"geography: unknown level {name!r}; levels: {list(self.names)}")
        return self.names.index(name)

    def memo(self, key, build):
        """``build()``, made once per ``key`` and kept on the geography: for values that depend on
        it (and on what the key names) and are asked for again and again, as an audit's releases do."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def children(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(order, starts)``: the units of level ``k + 1`` grouped by parent in level ``k``.

        The children of parent ``p`` are ``order[starts[p]:starts[p + 1]]`` (in unit order).
        """
        key = ("children", k)
        if key not in self._cache:
            par = self.parents[k + 1]
            order = np.argsort(par, kind="stable")
            starts = np.concatenate([[0], np.cumsum(np.bincount(par, minlength=self.sizes[k]))])
            self._cache[key] = (order, starts)
        return self._cache[key]

    def ancestors(self) -> list[np.ndarray]:
        """``anc[k][leaf]``: the unit of level ``k`` that holds each leaf."""
        if "anc" not in self._cache:
            anc = [np.arange(self.sizes[-1])]
            for k in range(self.depth - 1, 0, -1):
                anc.append(self.parents[k][anc[-1]])
            self._cache["anc"] = anc[::-1]
        return self._cache["anc"]

    def aggregation(self, k: int) -> sp.csr_matrix:
        """The 0/1 matrix (units of level ``k`` × leaves) that sums leaves into their level-``k`` unit."""
        anc = self.ancestors()[k]
        n = self.sizes[-1]
        return sp.csr_matrix((np.ones(n, dtype=np.int64), (anc, np.arange(n))), shape=(self.sizes[k], n))

    def leaves_per_unit(self, k: int) -> np.ndarray:
        return np.bincount(self.ancestors()[k], minlength=self.sizes[k])

    def frame(self) -> pd.DataFrame:
        """One row per leaf with its unit on every level (the crosswalk :meth:`from_table` reads)."""
        anc = self.ancestors()
        return pd.DataFrame({name: self.units[k][anc[k]] for k, name in enumerate(self.names)})

    def describe(self) -> str:
        """One line: the levels and their unit counts."""
        parts = []
        for k, name in enumerate(self.names):
            if k == 0:
                parts.append(f"{name} (1)")
                continue
            per = np.bincount(self.parents[k], minlength=self.sizes[k - 1])
            parts.append(f"{name} ({self.sizes[k]:,}; {int(per.min())}-{int(per.max())} per {self.names[k - 1]})")
        return " → ".join(parts)

    # ---- records ---------------------------------------------------------------------------------
    def _require_bound(self) -> None:
        if not self.attrs or self.leaf_codes is None:
            raise DomainError("geography: not bound to domain attributes (use from_columns, from_code or bind)")

    def characteristics(self, domain: Domain) -> Domain:
        """The domain without the geography attributes: the cells of every unit's table."""
        self._require_bound()
        rest = [a for a in domain.attrs if a not in self.attrs]
        if not rest:
            raise DomainError(f"geography: the domain {domain} has no attribute besides the geography {list(self.attrs)}")
        return domain.project(rest)

    def offsets(self, domain: Domain) -> tuple[np.ndarray, np.ndarray]:
        """``(leaf_offset, cell_offset)``: cell ``c`` of leaf ``i`` is cell ``leaf_offset[i] + cell_offset[c]``
        of ``domain`` (C order is linear in the codes)."""
        self._require_bound()
        strides = np.ones(len(domain), dtype=np.int64)
        for j in range(len(domain) - 2, -1, -1):
            strides[j] = strides[j + 1] * domain.sizes[j + 1]
        geo_axes = domain.axes(self.attrs)
        leaf_offset = self.leaf_codes @ strides[list(geo_axes)]
        chars = self.characteristics(domain)
        char_codes = chars.unravel(np.arange(chars.size))
        cell_offset = char_codes @ strides[list(domain.axes(chars.attrs))]
        return leaf_offset.astype(np.int64), cell_offset.astype(np.int64)

    def leaf_of_records(self, codes: np.ndarray, domain: Domain) -> np.ndarray:
        """The leaf of each record (codes over ``domain``); records whose units do not nest are an error."""
        self._require_bound()
        codes = np.asarray(codes, dtype=np.int64)
        sizes = [domain.size_of(a) for a in self.attrs]
        geo = codes[:, list(domain.axes(self.attrs))]
        keys = _keys(geo, sizes)
        leaf_keys = _keys(self.leaf_codes, sizes)
        order = np.argsort(leaf_keys, kind="stable")
        pos = np.searchsorted(leaf_keys[order], keys)
        pos = np.minimum(pos, order.size - 1)
        leaf = order[pos]
        bad = leaf_keys[leaf] != keys
        if bad.any():
            row = geo[np.argmax(bad)]
            named = ", ".join(f"{a} {domain.labels_of(a)[c]!r}" for a, c in zip(self.attrs, row))
            example = f" (e.g. {named})" if showing_confidential() else f" ({HIDDEN_VALUES})"
            raise DataError(f"geography: records name units that do not nest in the hierarchy "
                            f"{' → '.join(self.names)}{example}")
        return leaf

    def leaf_histograms(self, data: "Dataset") -> sp.csr_matrix:
        """Counts per leaf (rows) and characteristics cell (columns), by one group-by.

        Only the (leaf, cell) pairs that hold records are stored: empty units are never
        materialised. Columns follow :meth:`characteristics` in C order.
        """
        domain = data.domain
        chars = self.characteristics(domain)
        leaf = self.leaf_of_records(data.codes, domain)
        if len(data.codes):
            cell = np.ravel_multi_index(tuple(data.codes[:, list(domain.axes(chars.attrs))].T), chars.sizes)
        else:
            cell = np.zeros(0, dtype=np.int64)
        weights = np.ones(leaf.size, dtype=np.int64) if data.weights is None else data.weights
        return unit_cell_counts(leaf, cell, weights, (self.sizes[-1], chars.size))

    def level_histograms(self, leaf_hist: sp.spmatrix) -> list[sp.csr_matrix]:
        """The leaf histograms summed up to every level (root first)."""
        leaf_hist = sp.csr_matrix(leaf_hist)
        return [sp.csr_matrix(self.aggregation(k) @ leaf_hist) for k in range(self.depth - 1)] + [leaf_hist]

    def __repr__(self) -> str:
        return f"Geography({self.describe()})"


def unit_cell_counts(unit: np.ndarray, cell: np.ndarray, weights: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """Group-by ``(unit, cell)`` summing ``weights``, as a sparse ``shape`` matrix (no empty unit stored)."""
    key = np.asarray(unit, dtype=np.int64) * shape[1] + np.asarray(cell, dtype=np.int64)
    uniq, inverse = np.unique(key, return_inverse=True)
    sums = np.bincount(inverse, weights=np.asarray(weights, dtype=np.float64), minlength=uniq.size)
    keep = sums != 0
    rows, cols = np.divmod(uniq[keep], shape[1])
    return sp.csr_matrix((sums[keep].astype(np.int64), (rows, cols)), shape=shape)


def _keys(codes: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """One int64 key per row of codes (C order over ``sizes``)."""
    total = 1
    for s in sizes:
        total *= int(s)
    if total >= 2**62:
        raise DomainError(f"geography: the product of the geography attributes' sizes ({total:.3g}) is too large "
                          "to index; use a single code attribute (from_code)")
    return np.ravel_multi_index(tuple(np.asarray(codes, dtype=np.int64).T), tuple(sizes)).astype(np.int64)


def _ancestor_codes(parents: list[np.ndarray]) -> np.ndarray:
    """For each leaf, its position in every level below the root (the codes of its level columns)."""
    cols = [np.arange(parents[-1].size)]
    for k in range(len(parents) - 1, 1, -1):
        cols.append(parents[k][cols[-1]])
    return np.stack(cols[::-1], axis=1)
