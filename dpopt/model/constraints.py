"""Public constraints on the released table, and the check that they can all hold at once.

Every constraint is a public fact about the domain (or a value published exactly on
purpose): non-negativity, structural zeros, invariants, linear inequalities, integrality
and geographic hierarchy. :meth:`ConstraintSet.check` runs before any noise is drawn and
raises :class:`~dpopt.errors.InconsistentConstraintsError` naming the constraints that
contradict each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.errors import DomainError, InconsistentConstraintsError, QueryError
from dpopt.model.domain import Domain
from dpopt.model.predicates import as_predicate
from dpopt.model.queries.base import LinearQuery

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.data import Dataset

#: Above this many cells the feasibility LP of :meth:`ConstraintSet.check` is skipped
#: (the pairwise checks still run) to keep the pre-check cheap.
MAX_CHECK_CELLS = 2_000_000
#: Above this many constraint groups no minimal conflicting subset is searched for.
MAX_CONFLICT_GROUPS = 40


class Constraint:
    """Base class: every constraint has a ``name`` (unique in its set) and a ``kind``."""

    name: str
    kind: str = "constraint"

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class NonNegativity(Constraint):
    """Every cell count is at least zero."""

    name: str = "cells"
    kind = "nonnegative"


@dataclass(frozen=True)
class Integrality(Constraint):
    """Every cell count is an integer (the release is rounded exactly)."""

    name: str = "cells"
    kind = "integer"


@dataclass(frozen=True)
class StructuralZeros(Constraint):
    """Cells where a predicate holds are impossible: their count is exactly zero.

    Parameters
    ----------
    predicate : Predicate, str or dict
        Over attribute values, e.g. ``"age_group == '0-14' and relationship == 'spouse'"``.
    name : str
    reason : str
        Why these combinations cannot occur (shown in reports).
    """

    predicate: object
    name: str = "zeros"
    reason: str = ""
    kind = "structural_zero"

    def pattern(self, domain: Domain) -> tuple[tuple[str, ...], np.ndarray]:
        """``(attrs, mask)``: the zero cells of the marginal over the predicate's attributes."""
        pred = as_predicate(self.predicate, domain)  # bound: attributes in domain order, like the mask
        return tuple(pred.attrs), np.asarray(pred.mask(domain), dtype=bool).ravel()


@dataclass(frozen=True)
class Hierarchy(Constraint):
    """A geography hierarchy: every child unit lies in exactly one parent unit.

    Cells whose ``parent`` value is not the parent of their ``child`` value are
    structural zeros, so that each parent's counts are the sum of its children's.

    Parameters
    ----------
    parent, child : str
        Attribute names (e.g. ``"state"``, ``"county"``).
    parent_of : mapping
        Child value (label or code) to parent value (label or code); every child value
        of the domain must appear.
    """

    parent: str
    child: str
    parent_of: Mapping
    name: str = "geography"
    kind = "hierarchy"

    def pattern(self, domain: Domain) -> tuple[tuple[str, ...], np.ndarray]:
        domain.check_attrs([self.parent, self.child])
        n_child = domain.size_of(self.child)
        parent_code = np.full(n_child, -1, dtype=np.int64)
        for child_value, parent_value in self.parent_of.items():
            parent_code[domain.code_of(self.child, child_value)] = domain.code_of(self.parent, parent_value)
        missing = np.flatnonzero(parent_code < 0)
        if len(missing):
            labels = domain.labels_of(self.child)
            raise InconsistentConstraintsError(
                f"hierarchy {self.name!r}: child values {[labels[i] for i in missing[:5]]} of "
                f"{self.child!r} have no parent in {self.parent!r}"
            )
        attrs = domain.canonical([self.parent, self.child])
        mismatch = np.arange(domain.size_of(self.parent))[:, None] != parent_code[None, :]
        if attrs[0] != self.parent:
            mismatch = mismatch.T
        return attrs, mismatch.ravel()


@dataclass(frozen=True, eq=False)
class Invariant(Constraint):
    """A query whose answers are published exactly: ``Q x = values``.

    Invariants are public. Taking their values from the private data is a decision to
    publish those values without noise; :meth:`ConstraintSet.invariant_from_data` makes
    that explicit and marks it (``from_data=True``) so reports can say so.
    """

    query: LinearQuery
    values: np.ndarray
    name: str = "invariant"
    from_data: bool = False
    kind = "invariant"

    def __post_init__(self) -> None:
        values = np.asarray(self.values, dtype=np.float64).ravel()
        if values.shape != (self.query.num_rows,):
            raise QueryError(
                f"invariant {self.name!r}: {values.size} values for a query with {self.query.num_rows} rows"
            )
        if not np.isfinite(values).all():
            raise QueryError(f"invariant {self.name!r}: values must be finite")
        object.__setattr__(self, "values", values)


@dataclass(frozen=True, eq=False)
class LinearInequality(Constraint):
    """``lower <= Q x <= upper`` (either side may be infinite)."""

    query: LinearQuery
    lower: np.ndarray | float = -np.inf
    upper: np.ndarray | float = np.inf
    name: str = "inequality"
    kind = "inequality"

    def __post_init__(self) -> None:
        m = self.query.num_rows
        lower = np.broadcast_to(np.asarray(self.lower, dtype=np.float64), (m,)).copy()
        upper = np.broadcast_to(np.asarray(self.upper, dtype=np.float64), (m,)).copy()
        if np.isnan(lower).any() or np.isnan(upper).any():
            raise QueryError(f"inequality {self.name!r}: bounds must not be NaN")
        if (lower > upper).any():
            raise InconsistentConstraintsError(
                f"inequality {self.name!r}: lower bound above upper bound in {int((lower > upper).sum())} rows"
            )
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)


@dataclass
class ConstraintSet:
    """The constraints of one release, over one domain.

    Examples
    --------
    >>> cs = ConstraintSet(domain)                                   # doctest: +SKIP
    >>> cs.add(NonNegativity()).add(StructuralZeros("age == '0-14' and rel == 'spouse'"))
    """

    domain: Domain
    constraints: list = field(default_factory=list)

    def __post_init__(self) -> None:
        items, self.constraints = list(self.constraints), []
        for c in items:
            self.add(c)

    # ---- building -----------------------------------------------------------------
    def add(self, constraint: Constraint) -> "ConstraintSet":
        if not isinstance(constraint, Constraint):
            raise QueryError(f"not a constraint: {constraint!r}")
        if any(c.key == constraint.key for c in self.constraints):
            raise InconsistentConstraintsError(f"constraint {constraint.key!r} is declared twice")
        query = getattr(constraint, "query", None)
        if query is not None and query.domain != self.domain:
            raise QueryError(f"constraint {constraint.key!r}: its query is over {query.domain}, not {self.domain}")
        if isinstance(constraint, (StructuralZeros, Hierarchy)):
            constraint.pattern(self.domain)  # validates attributes and values now
        self.constraints.append(constraint)
        return self

    def invariant_from_data(self, query: LinearQuery, data: "Dataset", name: str) -> "ConstraintSet":
        """Publish ``query``'s true answers exactly, as an invariant (not private, on purpose)."""
        return self.add(Invariant(query, query.answer(data), name, from_data=True))

    def zero_cell_records(self, data: "Dataset") -> list[tuple[Constraint, int]]:
        """For each zero rule (structural zeros, hierarchies), how many records of ``data`` fall
        in a cell it forbids. These counts are confidential: show them to the curator only.

        Vectorised: each rule's mask lives on the marginal of its own attributes, indexed by the
        records' codes there (no dense vector over the domain).
        """
        if data.domain != self.domain:
            raise QueryError(f"the data are over {data.domain}, not the constraints' {self.domain}")
        out = []
        for rule in self.zero_rules:
            hit = self._records_in(rule, data)
            count = int(data.weights[hit].sum()) if data.weights is not None else int(hit.sum())
            out.append((rule, count))
        return out

    def without_zero_cell_records(self, data: "Dataset") -> "Dataset":
        """``data`` without the records that fall in a cell a zero rule forbids."""
        from dpopt.model.data import Dataset

        keep = np.ones(data.num_rows, dtype=bool)
        for rule in self.zero_rules:
            keep &= ~self._records_in(rule, data)
        weights = None if data.weights is None else data.weights[keep]
        return Dataset(data.codes[keep], data.domain, weights)

    def _records_in(self, rule: Constraint, data: "Dataset") -> np.ndarray:
        attrs, mask = rule.pattern(self.domain)
        axes = list(self.domain.axes(attrs))
        sizes = tuple(self.domain.size_of(a) for a in attrs)
        if data.num_rows == 0:
            return np.zeros(0, dtype=bool)
        cells = np.ravel_multi_index(tuple(data.codes[:, axes].T), sizes)
        return np.asarray(mask).reshape(-1)[cells]

    def __iter__(self):
        return iter(self.constraints)

    def __len__(self) -> int:
        return len(self.constraints)

    def of_kind(self, cls) -> list:
        return [c for c in self.constraints if isinstance(c, cls)]

    @property
    def nonnegative(self) -> bool:
        return bool(self.of_kind(NonNegativity))

    @property
    def integral(self) -> bool:
        return bool(self.of_kind(Integrality))

    @property
    def invariants(self) -> list[Invariant]:
        return self.of_kind(Invariant)

    @property
    def inequalities(self) -> list[LinearInequality]:
        return self.of_kind(LinearInequality)

    @property
    def zero_rules(self) -> list:
        return [c for c in self.constraints if isinstance(c, (StructuralZeros, Hierarchy))]

    # ---- derived forms --------------------------------------------------------------
    def zero_patterns(self) -> list[tuple[Constraint, tuple[str, ...], np.ndarray]]:
        """``(constraint, attrs, mask)`` for every zero rule, on its marginal (any domain size)."""
        return [(c, *c.pattern(self.domain)) for c in self.zero_rules]

    def zero_mask(self, rules: Iterable[Constraint] | None = None) -> np.ndarray:
        """Boolean mask over every cell: True where a structural zero (or hierarchy) forbids mass."""
        n = self.domain.require_dense("the structural-zero mask")
        mask = np.zeros(self.domain.shape, dtype=bool)
        rules = self.zero_rules if rules is None else list(rules)
        for rule in rules:
            attrs, sub = rule.pattern(self.domain)
            shape = [self.domain.size_of(a) if a in attrs else 1 for a in self.domain.attrs]
            mask |= sub.reshape(shape)
        return mask.reshape(n)

    def equality_rows(self) -> tuple[sp.csr_matrix, np.ndarray, list[str]]:
        """Invariants stacked as sparse rows ``A x = b`` with a name per row."""
        return _stack_rows([(c.query, c.values, c.name) for c in self.invariants], self.domain.size)

    def inequality_rows(self) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, list[str]]:
        """Inequalities stacked as sparse rows ``lower <= A x <= upper``."""
        rows = self.inequalities
        A, lower, names = _stack_rows([(c.query, c.lower, c.name) for c in rows], self.domain.size)
        upper = np.concatenate([c.upper for c in rows]) if rows else np.zeros(0)
        return A, lower, upper, names

    # ---- checking -----------------------------------------------------------------
    def residuals(self, x: np.ndarray, tol: float = 1e-6) -> list[dict]:
        """Every constraint's largest violation by a table ``x`` (for reports and results)."""
        x = np.asarray(x, dtype=np.float64)
        out = []
        for c in self.constraints:
            if isinstance(c, NonNegativity):
                v = float(max(0.0, -x.min())) if x.size else 0.0
            elif isinstance(c, Integrality):
                v = float(np.abs(x - np.round(x)).max()) if x.size else 0.0
            elif isinstance(c, (StructuralZeros, Hierarchy)):
                m = self.zero_mask([c])
                v = float(np.abs(x[m]).max()) if m.any() else 0.0
            elif isinstance(c, Invariant):
                v = float(np.abs(c.query.matvec(x) - c.values).max()) if c.values.size else 0.0
            elif isinstance(c, LinearInequality):
                qx = c.query.matvec(x)
                v = float(max(0.0, (c.lower - qx).max(initial=0.0), (qx - c.upper).max(initial=0.0)))
            else:  # pragma: no cover - every kind is handled above
                raise QueryError(f"unknown constraint kind {c.kind!r}")
            out.append({"constraint": c.key, "max_violation": v, "satisfied": v <= tol})
        return out

    def check(self) -> None:
        """Raise :class:`InconsistentConstraintsError` if the constraints cannot all hold.

        Pairwise checks give precise messages (an invariant needing mass on structurally
        zero cells, a non-integer invariant of an integral table, an invariant forcing a
        negative count); then, on domains up to :data:`MAX_CHECK_CELLS`, a feasibility LP
        over all constraints, and on failure a deletion filter that names a minimal set
        of conflicting constraints. Runs on public information only, before any noise.
        """
        self._check_pairwise()
        if not self.inequalities and self._disjoint_counting_rows():
            return  # rows that share no cell: the pairwise checks above decide feasibility
        if self.domain.size <= MAX_CHECK_CELLS and (self.invariants or self.inequalities):
            groups = [c for c in self.constraints if not isinstance(c, Integrality)]
            if not self._feasible(groups):
                conflict = self._minimal_conflict(groups)
                names = ", ".join(repr(c.key) for c in conflict)
                raise InconsistentConstraintsError(
                    f"the constraints {names} cannot all hold at once (no table satisfies them)"
                )

    def _disjoint_counting_rows(self) -> bool:
        """True when every invariant has 0/1 rows and no cell lies in two rows of any invariants:
        each row then holds or fails on its own (value, sign, reachable cells), which
        :meth:`_check_pairwise` checks."""
        if self.domain.size > MAX_CHECK_CELLS:
            return False
        coverage = np.zeros(self.domain.size)
        for inv in self.invariants:
            q = inv.query
            if not q.is_integer:
                return False
            l1, l2 = q.column_norm_powers(1), q.column_norm_powers(2)
            cover = q.rmatvec(np.ones(q.num_rows))
            if not (np.allclose(cover, l1) and np.allclose(l1, l2)):
                return False
            coverage += cover
        return bool(np.all(coverage <= 1 + 1e-12))

    def _check_pairwise(self) -> None:
        zero_rules = self.zero_rules
        for inv in self.invariants:
            if self.domain.size > MAX_CHECK_CELLS:
                break
            A = inv.query.to_sparse().tocsr()
            support_rows = np.asarray((abs(A) @ np.ones(A.shape[1])) > 0).ravel()
            empty = ~support_rows & (inv.values != 0)
            if empty.any():
                raise InconsistentConstraintsError(
                    f"invariant {inv.name!r}: row {int(np.argmax(empty))} has value "
                    f"{_value(inv, np.argmax(empty))} but involves no cell"
                )
            if zero_rules:
                allowed = ~self.zero_mask()
                reach = np.asarray(abs(A) @ allowed.astype(np.float64)).ravel()
                stuck = (reach == 0) & (inv.values != 0)
                if stuck.any():
                    row = int(np.argmax(stuck))
                    blockers = [r.key for r in zero_rules if _row_hits(A, row, self.zero_mask([r]))]
                    raise InconsistentConstraintsError(
                        f"invariant {inv.name!r} needs {_value(inv, row, 'a non-zero count')} in row "
                        f"{inv.query.row_labels()[row]!r}, but every cell of that row is a structural "
                        f"zero ({', '.join(repr(b) for b in blockers)})"
                    )
            if self.integral and inv.query.is_integer:
                frac = np.abs(inv.values - np.round(inv.values)) > 1e-9
                if frac.any():
                    raise InconsistentConstraintsError(
                        f"invariant {inv.name!r} has the non-integer value {_value(inv, np.argmax(frac))} "
                        f"but 'integer:cells' makes every integer query integral"
                    )
            if self.nonnegative and _is_nonnegative_query(A):
                neg = inv.values < 0
                if neg.any():
                    raise InconsistentConstraintsError(
                        f"invariant {inv.name!r} has the negative value {_value(inv, np.argmax(neg))}, "
                        "which 'nonnegative:cells' forbids"
                    )

    def _feasible(self, group: Sequence[Constraint]) -> bool:
        from scipy.optimize import linprog

        sub = ConstraintSet(self.domain, list(group))
        n = self.domain.size
        lower = np.zeros(n) if sub.nonnegative else np.full(n, -np.inf)
        upper = np.full(n, np.inf)
        if sub.zero_rules:
            zero = sub.zero_mask()
            lower[zero] = 0.0
            upper[zero] = 0.0
        A_eq, b_eq, _ = sub.equality_rows()
        A_in, lo_in, hi_in, _ = sub.inequality_rows()
        A_ub = sp.vstack([A_in[np.isfinite(hi_in)], -A_in[np.isfinite(lo_in)]]).tocsr()
        b_ub = np.concatenate([hi_in[np.isfinite(hi_in)], -lo_in[np.isfinite(lo_in)]])
        res = linprog(
            np.zeros(n),
            A_ub=A_ub if A_ub.shape[0] else None,
            b_ub=b_ub if A_ub.shape[0] else None,
            A_eq=A_eq if A_eq.shape[0] else None,
            b_eq=b_eq if A_eq.shape[0] else None,
            bounds=np.column_stack([lower, upper]),
            method="highs",
        )
        if res.status == 2:
            return False
        if res.status not in (0, 3):  # 3: unbounded is still feasible
            raise InconsistentConstraintsError(
                f"the constraint pre-check could not decide feasibility: {res.message}"
            )
        return True

    def _minimal_conflict(self, groups: list[Constraint]) -> list[Constraint]:
        """A deletion filter: drop each constraint whose removal keeps the set infeasible."""
        if len(groups) > MAX_CONFLICT_GROUPS:
            return groups
        core = list(groups)
        for c in list(core):
            trial = [g for g in core if g is not c]
            if trial and not self._feasible(trial):
                core = trial
        return core

    def describe(self) -> list[dict]:
        """A list of ``{constraint, kind, detail}`` rows for plans and reports."""
        rows = []
        for c in self.constraints:
            if isinstance(c, StructuralZeros):
                detail = f"{as_predicate(c.predicate, self.domain)}" + (f" ({c.reason})" if c.reason else "")
            elif isinstance(c, Hierarchy):
                detail = f"{c.child} within {c.parent}"
            elif isinstance(c, Invariant):
                src = "published from the data, not private" if c.from_data else "public values"
                detail = f"{c.query.name} with {c.query.num_rows} rows ({src})"
            elif isinstance(c, LinearInequality):
                detail = f"{c.query.name} with {c.query.num_rows} rows"
            else:
                detail = "every cell"
            rows.append({"constraint": c.key, "kind": c.kind, "detail": detail})
        return rows


def _value(inv: "Invariant", row, hidden: str = "(a value taken from the data, not shown)") -> str:
    """An invariant's value for a message: a public value as is, one taken from the data never."""
    return hidden if inv.from_data else f"{inv.values[int(row)]:g}"


def _stack_rows(items, n: int):
    if not items:
        return sp.csr_matrix((0, n)), np.zeros(0), []
    mats, vals, names = [], [], []
    for query, values, name in items:
        mats.append(query.to_sparse())
        vals.append(np.asarray(values, dtype=np.float64))
        names.extend(f"{name}[{i}]" for i in range(query.num_rows))
    return sp.vstack(mats).tocsr(), np.concatenate(vals), names


def _row_hits(A: sp.csr_matrix, row: int, mask: np.ndarray) -> bool:
    cols = A.indices[A.indptr[row] : A.indptr[row + 1]]
    return bool(mask[cols].any())


def _is_nonnegative_query(A: sp.csr_matrix) -> bool:
    return A.nnz == 0 or bool(A.data.min() >= 0)


def require_domain(constraints: "ConstraintSet | None", domain: Domain) -> "ConstraintSet":
    """The given constraint set (checked to be over ``domain``) or an empty one."""
    if constraints is None:
        return ConstraintSet(domain)
    if constraints.domain != domain:
        raise DomainError(f"constraints are over {constraints.domain}, not {domain}")
    return constraints
