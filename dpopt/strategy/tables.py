"""A workload as the tables a user names: marginals and ranges, each with a weight.

A :class:`Workload` is what a workload-first spec declares (``[workload]``): the tables the user
wants answered, never how to measure them. Each :class:`WorkloadTable` is one marginal (the
counts over a set of attributes) or the range queries over one ordered attribute, with a
weight in the objective ``Σ_T ω_T E‖T x̂ − T x‖²`` that the plan minimises
(:mod:`dpopt.strategy.candidates`). Everything here is public: no data, no noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np

from dpopt.errors import ParameterError, QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries import AllRanges, LinearQuery, Marginal, Stack, Total, Weighted
from dpopt.strategy.gram import MarginalsGram, SumGram, WorkloadGram, scaled
from dpopt.strategy.workload import gram_of

__all__ = ["WorkloadTable", "Workload"]


@dataclass(frozen=True)
class WorkloadTable:
    """One table of a workload.

    Attributes
    ----------
    label : str
        ``"a, b"`` for a marginal (as the release's marginal tables are keyed), ``"ranges of a"``.
    kind : {"marginal", "ranges", "total"}
    attrs : tuple of str
        The marginal's attributes (domain order), or the ranged attribute.
    weight : float
        ``ω_T > 0``.
    """

    label: str
    kind: str
    attrs: tuple[str, ...]
    weight: float = 1.0

    def query(self, domain: Domain) -> LinearQuery:
        """The table as a query over ``domain``."""
        if self.kind == "total":
            return Total(domain)
        if self.kind == "ranges":
            return AllRanges(domain, self.attrs[0])
        return Marginal(domain, self.attrs)


class Workload:
    """The tables a release must answer (module notes).

    Parameters
    ----------
    domain : Domain
    tables : sequence of WorkloadTable
        Distinct labels, positive finite weights.
    """

    def __init__(self, domain: Domain, tables: Sequence[WorkloadTable]) -> None:
        self.domain = domain
        self.tables = tuple(tables)
        if not self.tables:
            raise ParameterError("workload: name at least one table")
        labels = set()
        for t in self.tables:
            if not (np.isfinite(t.weight) and t.weight > 0):
                raise ParameterError(f"workload: table {t.label!r} needs a positive weight, got {t.weight!r}")
            if t.label in labels:
                raise ParameterError(f"workload: table {t.label!r} is named twice")
            labels.add(t.label)
            domain.check_attrs(t.attrs)

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def marginals(cls, domain: Domain, sets: Sequence[Sequence[str]], weights: Sequence[float] | None = None
                  ) -> "Workload":
        """Marginals over the given attribute sets (weights default to 1)."""
        w = [1.0] * len(sets) if weights is None else [float(v) for v in weights]
        if len(w) != len(sets):
            raise ParameterError(f"workload: {len(w)} weights for {len(sets)} marginals")
        tables = []
        for attrs, wk in zip(sets, w):
            try:
                canon = domain.canonical(attrs)
            except Exception as exc:  # the domain names the attribute at fault
                raise ParameterError(f"workload: {exc}") from None
            if not canon:
                raise ParameterError("workload: a marginal needs at least one attribute")
            tables.append(WorkloadTable(", ".join(canon), "marginal", canon, wk))
        return cls(domain, tables)

    @classmethod
    def all_k_way(cls, domain: Domain, k: int) -> "Workload":
        """Every ``k``-way marginal."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= len(domain):
            raise ParameterError(f"workload: all k-way marginals need 1 <= k <= {len(domain)} (the number of "
                                 f"attributes), got k = {k!r}")
        return cls.marginals(domain, list(combinations(domain.attrs, int(k))))

    def with_tables(self, extra: Sequence[WorkloadTable]) -> "Workload":
        """This workload and ``extra`` tables."""
        return Workload(self.domain, list(self.tables) + list(extra))

    # ---- structure -------------------------------------------------------------------------------
    @property
    def is_marginal(self) -> bool:
        """True when every table is a marginal (or the total): the marginals algebra applies."""
        return all(t.kind in ("marginal", "total") for t in self.tables)

    def marginal_sets(self) -> list[tuple[str, ...]]:
        """The attribute sets of the marginal tables (``()`` for the total)."""
        return [t.attrs if t.kind == "marginal" else () for t in self.tables if t.kind in ("marginal", "total")]

    def closure(self) -> list[tuple[str, ...]]:
        """Every subset of a marginal table's attributes (the residual sets the workload needs), by
        size then domain order."""
        out: dict[tuple[str, ...], None] = {}
        for attrs in self.marginal_sets():
            for r in range(len(attrs) + 1):
                for sub in combinations(attrs, r):
                    out.setdefault(sub, None)
        return sorted(out, key=lambda a: (len(a), self.domain.axes(a)))

    def top_sets(self) -> list[tuple[str, ...]]:
        """The marginal tables' sets that are no other table's proper subset (the workload's top)."""
        sets = list(dict.fromkeys(self.marginal_sets()))
        below = set()  # every proper subset of a table's set (the closure, at most 2^|S| per table)
        for attrs in sets:
            for r in range(len(attrs)):
                below.update(combinations(attrs, r))
        return [s for s in sets if s not in below]

    def demand(self, sets: Sequence[tuple[str, ...]]) -> np.ndarray:
        """``D_a = dim U_a · Σ_T ω_T [a ⊆ S_T] prod_{i∉S_T} n_i`` for each set ``a``: the workload's
        squared-error weight on the residual ``a`` (module :mod:`dpopt.strategy.residual_planner`)."""
        from dpopt.model.queries.residual import residual_dimension

        n = float(self.domain.size)
        out = np.zeros(len(sets))
        index = {a: i for i, a in enumerate(sets)}
        for t in self.tables:
            if t.kind not in ("marginal", "total"):
                raise QueryError("workload demand: only marginal tables have residual demands")
            attrs = t.attrs if t.kind == "marginal" else ()
            outside = n / float(np.prod([self.domain.size_of(a) for a in attrs])) if attrs else n
            for r in range(len(attrs) + 1):
                for sub in combinations(attrs, r):
                    if sub in index:
                        out[index[sub]] += t.weight * outside
        dims = np.array([residual_dimension(self.domain, a) for a in sets], dtype=np.float64)
        return dims * out

    def query(self) -> LinearQuery:
        """Every table stacked, each row scaled by ``sqrt(ω_T)`` (so its Gram is the weighted sum)."""
        parts = []
        for t in self.tables:
            q = t.query(self.domain)
            parts.append(q if t.weight == 1.0 else Weighted(q, float(np.sqrt(t.weight))))
        return parts[0] if len(parts) == 1 else Stack(parts)

    def gram(self) -> WorkloadGram:
        """``Σ_T ω_T T ᵀT`` in the fastest structured form."""
        if self.is_marginal:
            return MarginalsGram.of_sets(self.domain, self.marginal_sets(), [t.weight for t in self.tables])
        terms = [scaled(gram_of(t.query(self.domain)), t.weight) for t in self.tables]
        return terms[0] if len(terms) == 1 else SumGram(self.domain, terms)

    def table_gram(self, table: WorkloadTable) -> WorkloadGram:
        """``T ᵀT`` of one table (unweighted)."""
        return gram_of(table.query(self.domain))

    def describe(self) -> str:
        kinds = [t.kind for t in self.tables]
        parts = []
        if kinds.count("marginal"):
            orders = sorted({len(t.attrs) for t in self.tables if t.kind == "marginal"})
            parts.append(f"{kinds.count('marginal')} marginal{'s' if kinds.count('marginal') > 1 else ''} "
                         f"(order {', '.join(map(str, orders))})")
        if kinds.count("ranges"):
            parts.append(f"the ranges of {', '.join(t.attrs[0] for t in self.tables if t.kind == 'ranges')}")
        if kinds.count("total"):
            parts.append("the total")
        weighted = any(t.weight != 1.0 for t in self.tables)
        return " and ".join(parts) + (" (weighted)" if weighted else "")
