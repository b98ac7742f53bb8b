"""The audit domain: a few values of each attribute, chosen so the spec keeps its structure.

``dpopt audit`` runs a spec on datasets of a few records, over a domain small enough to
enumerate them. :func:`shrink` picks, for every attribute, which values of the spec's domain
to keep. The rules, in order:

1. **The limit counts possible cells.** At most ``limit`` cells may hold a record: cells that
   a public structural zero or a hierarchy rules out do not count. The audit domain itself
   (impossible cells included) has at most :data:`~dpopt.audit.targets.MAX_AUDIT_CELLS` cells.
2. **Every parent keeps children.** For each hierarchy (``state`` → ``county``), a parent
   value is only kept with one of its children, and a child only with its parent. A parent
   never ends up empty, so a top-down geography stays well formed.
3. **Structural zeros are kept where they fit.** Before the domain grows evenly, a hierarchy
   gets a second parent (with a child), and each zero rule that has no zero cell yet gets a
   witness: the zero cell of the rule that needs the fewest new values, with the values of a
   possible cell for each new value that would otherwise have none (a degree is possible only
   beside an adult age), kept if the limit allows. A rule the limit cannot hold is reported.
4. **Even growth.** Then the attribute with the fewest values kept gains its next value,
   while the limit holds. A value with no possible cell (every cell ruled out) is skipped.
5. **Attributes left with one value are dropped** (:meth:`AuditDomain.without_single_valued`)
   when the spec still plans without them: a workload of every k-way marginal then covers the
   kept attributes only, instead of many copies of the total. A spec whose queries, invariants
   or geography name such an attribute keeps it (:func:`dpopt.audit.spec.audit_spec` tries).

Attributes without labels keep their first codes, so a code means the same value in the
spec's domain and in the audit domain. Labelled attributes keep their labels, in the spec's
order. The zero rules and hierarchies are restricted to the kept values exactly
(:func:`restricted_constraints`): a cell of the audit domain is a structural zero exactly
when it is one in the spec's domain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpopt.errors import SpecError
from dpopt.model.constraints import Hierarchy, StructuralZeros
from dpopt.model.domain import Domain
from dpopt.model.predicates import Predicate, as_predicate

__all__ = ["AuditDomain", "ZeroRule", "shrink", "restricted_rules"]

#: Rules over a marginal larger than this are dropped (their masks over it are not built).
MAX_RULE_CELLS = 4_000_000
#: Cells a search for a possible cell visits at most (it gives up beyond).
MAX_SEARCH_NODES = 20_000
#: Values tried past a value with no possible cell, per attribute and round.
MAX_SKIPS = 16


@dataclass(frozen=True, eq=False)
class ZeroRule:
    """A public rule of the spec's domain that makes cells impossible.

    Attributes
    ----------
    constraint : StructuralZeros or Hierarchy
    attrs : tuple of str
        The attributes it reads, in domain order.
    mask : ndarray of bool
        Over the spec's marginal of ``attrs`` (shape = their sizes): True where impossible.
    """

    constraint: object
    attrs: tuple[str, ...]
    mask: np.ndarray

    @property
    def name(self) -> str:
        return self.constraint.name

    def on(self, kept: dict) -> np.ndarray:
        """The rule's mask over the kept values (the audit domain's marginal of ``attrs``)."""
        return self.mask[np.ix_(*[np.asarray(kept[a], dtype=np.int64) for a in self.attrs])]


@dataclass(frozen=True)
class _Tree:
    """One hierarchy: the parent code of every child code."""

    parent: str
    child: str
    parent_of: np.ndarray


@dataclass
class AuditDomain:
    """The values kept of each attribute and what they keep of the spec's rules.

    Attributes
    ----------
    full, domain : Domain
        The spec's domain and the audit domain.
    kept : dict of str to tuple of int
        The spec's codes kept, per attribute (in order).
    rules : list of ZeroRule
        The spec's zero rules and hierarchies.
    possible : int
        Cells of the audit domain a record can lie in.
    notes : list of str
        What could not be kept (zero rules without a zero cell on the audit domain).
    """

    full: Domain
    domain: Domain
    kept: dict
    rules: list = field(default_factory=list)
    possible: int = 0
    notes: list = field(default_factory=list)

    dropped: tuple = ()

    @property
    def changed(self) -> bool:
        return self.domain.size != self.full.size or bool(self.dropped)

    @property
    def single_valued(self) -> tuple[str, ...]:
        """Attributes that kept one value only (candidates for :meth:`without_single_valued`)."""
        return tuple(a for a in self.domain.attrs if len(self.kept[a]) == 1)

    def without_single_valued(self) -> "AuditDomain":
        """The same values, without the attributes that kept only one (module notes, rule 5)."""
        drop = self.single_valued
        if not drop or len(drop) == len(self.domain.attrs):
            return self
        small = Domain.from_dict({a: v for a, v in self.domain.to_dict().items() if a not in drop},
                                 codes=[a for a in self.domain.codes if a not in drop])
        return AuditDomain(self.full, small, self.kept, self.rules, self.possible, list(self.notes),
                           self.dropped + drop)

    def describe(self) -> str | None:
        """One sentence: what was kept (None when the spec's domain is used as it is)."""
        if not self.changed:
            return None
        kept = ", ".join(f"{a} {len(self.kept[a])} of {n}" for a, n in zip(self.full.attrs, self.full.sizes)
                         if a not in self.dropped)
        text = (f"down-scaled from {self.full.size:,} to {self.domain.size} cells, {self.possible} of them possible "
                f"(values kept: {kept})")
        if self.dropped:
            shown = ", ".join(self.dropped[:6]) + (f" and {len(self.dropped) - 6} more" if len(self.dropped) > 6
                                                   else "")
            text += f"; attributes left with one value dropped: {shown}"
        return text


def shrink(domain: Domain, constraints=(), limit: int = 16, max_cells: int = 256) -> AuditDomain:
    """The audit domain of ``domain`` under its public ``constraints`` (module notes).

    Parameters
    ----------
    domain : Domain
        The spec's domain (it may be far too large to enumerate: only the rules' marginals are).
    constraints : iterable of Constraint
        The structural zeros and hierarchies are read; the rest is ignored here.
    limit : int
        At most this many possible cells.
    max_cells : int
        At most this many cells in all.

    Raises
    ------
    SpecError
        When not one possible cell fits (raise ``--domain-limit``).
    """
    if limit < 2:
        raise SpecError(f"--domain-limit: must be at least 2 cells, got {limit}")
    rules, trees, skipped = _rules(domain, constraints)
    everything = {a: tuple(range(n)) for a, n in zip(domain.attrs, domain.sizes)}
    if domain.size <= max_cells and _possible(domain, rules, everything)[0] <= limit:
        kept, small = everything, domain
    else:
        grower = _Grower(domain, rules, trees, limit, max_cells)
        while grower.witnesses() | grower.grow_once():
            pass
        kept = grower.prune()
        small = _small_domain(domain, kept)
    possible, _ = _possible(domain, rules, kept)
    if possible == 0:
        raise SpecError(f"--domain-limit {limit}: no cell of the audit domain can hold a record (the structural "
                        "zeros rule out every cell found); raise --domain-limit")
    notes = [f"structural zeros over more than {MAX_RULE_CELLS:,} cells of their attributes dropped: "
             f"{', '.join(skipped)}"] if skipped else []
    if small is domain:
        return AuditDomain(domain, domain, kept, rules, possible, notes)
    missing = [r.name for r in rules if isinstance(r.constraint, StructuralZeros) and not r.on(kept).any()]
    if missing:
        notes.append("structural zeros without a cell in the audit domain (their zero cells need more values than "
                     f"--domain-limit {limit} allows): {', '.join(missing)}")
    return AuditDomain(domain, small, kept, rules, possible, notes)


def restricted_rules(audit: AuditDomain) -> list:
    """The spec's zero rules and hierarchies restated over the audit domain, exactly (module notes).

    A structural zero becomes one over the kept values (the same cells, named as before); a
    rule without a zero cell there is left out. A hierarchy keeps the kept children.
    """
    small, kept = audit.domain, audit.kept
    out = []
    for rule in audit.rules:
        c = rule.constraint
        if isinstance(c, Hierarchy):
            if c.parent in audit.dropped or c.child in audit.dropped:
                continue  # one parent and its one child: nothing left to nest
            labels = [audit.full.labels_of(c.child)[i] for i in kept[c.child]]
            parent_of = {k: v for k, v in c.parent_of.items() if k in labels or
                         (isinstance(k, (int, np.integer)) and int(k) in kept[c.child])}
            if c.child not in audit.full.labels:  # codes of a child without labels are kept as a prefix
                parent_of = {k: v for k, v in parent_of.items() if int(k) < len(kept[c.child])}
            out.append(Hierarchy(c.parent, c.child, parent_of, name=c.name))
            continue
        mask = rule.on(kept)
        attrs = tuple(a for a in rule.attrs if a not in audit.dropped)
        mask = mask.reshape([n for a, n in zip(rule.attrs, mask.shape) if a not in audit.dropped])
        if attrs and mask.any():
            out.append(StructuralZeros(_predicate(small, attrs, mask), name=c.name, reason=c.reason))
    return out


# ---- the rules --------------------------------------------------------------------------------
def _rules(domain: Domain, constraints) -> tuple[list[ZeroRule], list[_Tree], list[str]]:
    """The zero rules and hierarchies over the spec's domain, and rules too large to restrict."""
    rules, trees, skipped = [], [], []
    for c in constraints:
        if not isinstance(c, (StructuralZeros, Hierarchy)):
            continue
        names = (c.parent, c.child) if isinstance(c, Hierarchy) else as_predicate(c.predicate, domain).attrs
        if math.prod(domain.size_of(a) for a in names) > MAX_RULE_CELLS:
            skipped.append(c.name)
            continue
        attrs, mask = c.pattern(domain)
        shape = tuple(domain.size_of(a) for a in attrs)
        rules.append(ZeroRule(c, tuple(attrs), np.asarray(mask, dtype=bool).reshape(shape)))
        if isinstance(c, Hierarchy):
            parent_of = np.full(domain.size_of(c.child), -1, dtype=np.int64)
            for k, v in c.parent_of.items():
                parent_of[domain.code_of(c.child, k)] = domain.code_of(c.parent, v)
            trees.append(_Tree(c.parent, c.child, parent_of))
    return rules, trees, skipped


def _possible(domain: Domain, rules: list[ZeroRule], kept: dict) -> tuple[int, np.ndarray]:
    """``(count, mask)``: the cells of the kept values that no rule rules out."""
    shape = tuple(len(kept[a]) for a in domain.attrs)
    impossible = np.zeros(shape, dtype=bool)
    for rule in rules:
        where = [1] * len(shape)
        sub = rule.on(kept)
        for a, n in zip(rule.attrs, sub.shape):
            where[domain.attrs.index(a)] = n
        impossible |= sub.reshape(where)
    possible = ~impossible
    return int(possible.sum()), possible


class _Grower:
    """The greedy choice of values of :func:`shrink` (module notes, rules 2 to 4)."""

    def __init__(self, domain: Domain, rules, trees, limit: int, max_cells: int) -> None:
        self.domain, self.rules, self.limit, self.max_cells = domain, rules, limit, max_cells
        self.parents = {t.parent: t for t in trees}
        self.children = {t.child: t for t in trees}
        self.kept = {a: [c] for a, c in zip(domain.attrs, self._first_possible_cell())}
        self.possible = _possible(domain, rules, self._sorted(self.kept))[0]
        hierarchy = [r for r in rules if isinstance(r.constraint, Hierarchy)]
        self.implied = {r for r in rules if any(r.attrs == h.attrs and not (r.mask & ~h.mask).any()
                                                for h in hierarchy)}

    def _first_possible_cell(self) -> tuple[int, ...]:
        """The first cell (in domain order, a few values per attribute) that no rule rules out.

        Falls back to the first value of every attribute when the search finds nothing.
        """
        return self._possible_cell(lambda a: range(min(self.domain.size_of(a), MAX_SKIPS))
                                   if a in self.domain.labels else (0,)) or (0,) * len(self.domain.attrs)

    def _possible_cell_with(self, attr: str, value: int, kept: dict) -> tuple[int, ...] | None:
        """A cell no rule rules out with ``attr = value``, preferring the values in ``kept``."""
        def choices(a):
            if a == attr:
                return (value,)
            if a not in self.domain.labels:
                return range(min(len(kept[a]) + 1, self.domain.size_of(a)))
            others = [c for c in range(min(self.domain.size_of(a), MAX_SKIPS)) if c not in kept[a]]
            return list(kept[a]) + others
        return self._possible_cell(choices)

    def _possible_cell(self, choices) -> tuple[int, ...] | None:
        """A depth-first search over the attributes for a cell no rule rules out, trying
        ``choices(attr)`` in order; a rule is checked once all its attributes have a value."""
        attrs = self.domain.attrs
        last = {r: max(attrs.index(a) for a in r.attrs) for r in self.rules}
        cell: list[int] = []
        visits = [0]

        def search(i: int) -> bool:
            if i == len(attrs):
                return True
            for c in choices(attrs[i]):
                visits[0] += 1
                if visits[0] > MAX_SEARCH_NODES:
                    return False
                cell.append(c)
                ok = all(not r.mask[tuple(cell[attrs.index(b)] for b in r.attrs)]
                         for r in self.rules if last[r] == i)
                if ok and search(i + 1):
                    return True
                cell.pop()
            return False

        return tuple(cell) if search(0) else None

    def _fits(self, trial: dict) -> bool:
        if int(np.prod([len(v) for v in trial.values()])) > self.max_cells:
            return False
        return _possible(self.domain, self.rules, self._sorted(trial))[0] <= self.limit

    def _sorted(self, trial: dict) -> dict:
        return {a: tuple(sorted(v)) for a, v in trial.items()}

    def _with(self, additions: dict) -> dict:
        trial = {a: list(v) for a, v in self.kept.items()}
        for a, codes in additions.items():
            for c in codes:
                if c not in trial[a]:
                    trial[a].append(int(c))
        return self._closed(trial)

    def _closed(self, trial: dict) -> dict:
        """Every kept child's parent kept, every kept parent with a kept child."""
        for t in self.children.values():
            for c in list(trial[t.child]):
                if int(t.parent_of[c]) not in trial[t.parent]:
                    trial[t.parent].append(int(t.parent_of[c]))
        for t in self.parents.values():
            for p in trial[t.parent]:
                if not any(int(t.parent_of[c]) == p for c in trial[t.child]):
                    own = np.flatnonzero(t.parent_of == p)
                    if own.size:
                        trial[t.child].append(int(own[0]))
        return trial

    def _try(self, additions: dict, alive: bool = True) -> bool:
        """Keep ``additions`` (with their hierarchy closure) if the limits hold and every added
        value has a possible cell."""
        trial = self._with(additions)
        if trial == self.kept or not self._fits(trial):
            return False
        if alive and self.possible > 0:  # (before the first possible cell, any value may help)
            kept = self._sorted(trial)
            _, possible = _possible(self.domain, self.rules, kept)
            for a, codes in additions.items():
                axis = self.domain.attrs.index(a)
                if not all(np.take(possible, kept[a].index(c), axis=axis).any() for c in codes):
                    return False
        self.kept = trial
        self.possible = _possible(self.domain, self.rules, self._sorted(trial))[0]
        return True

    def witnesses(self) -> bool:
        """A zero cell of each structural-zero rule that has none yet, when it fits (rule 3).

        A rule whose zero cells all lie outside a hierarchy (a county outside its state) gets
        none: the hierarchy's own zeros are there as soon as two parents are.
        """
        changed = False
        for t in self.parents.values():  # a hierarchy first: two parents, each with a child
            if len(self.kept[t.parent]) < 2:
                for value in self._next_values(t.parent)[:1]:
                    changed |= self._try({t.parent: [value]})
        for rule in self.rules:
            if not isinstance(rule.constraint, StructuralZeros):
                continue
            if rule in self.implied or rule.on(self._sorted(self.kept)).any():
                continue
            for cell in self._cheapest_zero_cells(rule):
                if self._try(self._enabled({a: [c] for a, c in zip(rule.attrs, cell)})):
                    changed = True
                    break
        return changed

    def _enabled(self, additions: dict) -> dict:
        """``additions`` with, for each added value that no possible cell would hold, the values of
        a possible cell that holds it (a zero cell's values are often impossible on their own: a
        degree is only possible beside an adult age)."""
        trial = self._sorted(self._with(additions))
        _, possible = _possible(self.domain, self.rules, trial)
        out = {a: list(v) for a, v in additions.items()}
        for a, codes in additions.items():
            axis = self.domain.attrs.index(a)
            for c in codes:
                if np.take(possible, trial[a].index(c), axis=axis).any():
                    continue
                cell = self._possible_cell_with(a, c, trial)
                if cell is not None:
                    for b, v in zip(self.domain.attrs, cell):
                        out.setdefault(b, []).append(v)
        return out

    def _cheapest_zero_cells(self, rule: ZeroRule, tries: int = 8) -> list[tuple]:
        """Zero cells of ``rule`` by the number of values they add (codes of unlabelled attributes
        only as the next one: such attributes keep their first codes)."""
        cost = np.zeros(rule.mask.shape)
        for axis, a in enumerate(rule.attrs):
            n = rule.mask.shape[axis]
            new = np.ones(n)
            new[list(self.kept[a])] = 0
            if a not in self.domain.labels:
                new[len(self.kept[a]) + 1:] = np.inf  # codes beyond the next one: never
            where = [1] * rule.mask.ndim
            where[axis] = n
            cost = cost + new.reshape(where)
        cost = np.where(rule.mask, cost, np.inf)
        order = np.argsort(cost, axis=None, kind="stable")[:tries]
        return [tuple(int(i) for i in np.unravel_index(k, cost.shape)) for k in order if np.isfinite(cost.flat[k])]

    def _next_values(self, a: str) -> list[int]:
        """Candidates for ``a``'s next value, in order (rule 4)."""
        n = self.domain.size_of(a)
        kept = set(self.kept[a])
        if a not in self.domain.labels:
            k = len(kept)
            return [k] if k < n else []
        if a in self.children:  # the next child of the kept parent with the fewest kept children
            t = self.children[a]
            counts = {p: sum(int(t.parent_of[c]) == p for c in kept) for p in self.kept[t.parent]}
            out = []
            for p in sorted(counts, key=lambda p: (counts[p], p)):
                out += [int(c) for c in np.flatnonzero(t.parent_of == p) if int(c) not in kept][:1]
            return out
        return [c for c in range(n) if c not in kept][:MAX_SKIPS]

    def grow_once(self) -> bool:
        """The attribute with the fewest values kept that can grow gains its next value (rule 4)."""
        order = sorted(self.domain.attrs, key=lambda a: (len(self.kept[a]), self.domain.attrs.index(a)))
        for a in order:
            for value in self._next_values(a):  # a value without a possible cell: the next one
                if self._try({a: [value]}):
                    return True
        return False

    def prune(self) -> dict:
        """The kept values (sorted), without values that have no possible cell."""
        kept = self._sorted(self.kept)
        _, possible = _possible(self.domain, self.rules, kept)
        if possible.any():
            out = {}
            for axis, a in enumerate(self.domain.attrs):
                others = tuple(i for i in range(possible.ndim) if i != axis)
                alive = possible.any(axis=others) if others else possible
                codes = tuple(c for c, ok in zip(kept[a], alive) if ok)
                if a not in self.domain.labels:  # keep a prefix of the codes
                    codes = kept[a][: next((i for i, ok in enumerate(alive) if not ok), len(alive))] or kept[a][:1]
                out[a] = codes
            kept = out
        return kept


def _small_domain(domain: Domain, kept: dict) -> Domain:
    spec = {}
    for a in domain.attrs:
        if a in domain.labels:
            spec[a] = [domain.labels[a][c] for c in kept[a]]
        else:
            spec[a] = len(kept[a])
    return Domain.from_dict(spec, codes=[a for a in domain.codes if a in domain.labels])


def _predicate(small: Domain, attrs: tuple, mask: np.ndarray) -> Predicate:
    """``(a == x and b == y) or ...`` over the zero cells of ``mask`` (small marginal of ``attrs``)."""
    labels = [small.labels_of(a) for a in attrs]
    terms = [Predicate.from_dict({a: labels[j][int(c)] for j, (a, c) in enumerate(zip(attrs, cell))})
             for cell in np.argwhere(mask)]
    out = terms[0]
    for t in terms[1:]:
        out = out | t
    return out.bind(small)
