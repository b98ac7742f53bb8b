"""The ``[workload]`` section: the tables a release must answer, and nothing about how.

::

    [workload]
    marginals = "all 3-way"                 # or a list of attribute lists: [["sex", "age"], ["state"]]
    ranges = ["age_group"]                  # every range [lo, hi] of each ordered attribute (optional)
    total = false                           # the table's total as a table of its own (optional)
    weights = { "sex, age" = 2.0 }          # per-table weights by label (optional, default 1)

A marginal's label is its attributes in domain order joined by ", "; a range table's is
``"ranges of <attr>"``; the total's ``"total"``. The parsed :class:`WorkloadDeclaration` is
domain-free; :meth:`WorkloadDeclaration.build` makes the :class:`~dpopt.strategy.tables.Workload`
over the plan's domain (errors name the key and, in a spec, the line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpopt.errors import ParameterError
from dpopt.model.domain import Domain

__all__ = ["WorkloadDeclaration", "parse_workload", "WORKLOAD_KEYS"]

#: Keys of the ``[workload]`` table.
WORKLOAD_KEYS = ("marginals", "ranges", "total", "weights")
_ALL_K = re.compile(r"^\s*all\s+(\d+)\s*-\s*way(\s+marginals)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class WorkloadDeclaration:
    """The tables a workload-first spec names (module notes).

    Attributes
    ----------
    sets : tuple of tuples of str
        Marginals by attribute sets (empty when ``k`` is given or there are none).
    k : int or None
        All ``k``-way marginals.
    ranges : tuple of str
        Ordered attributes whose every range is a table.
    total : bool
        The total as a table.
    weights : tuple of (label, weight)
    """

    sets: tuple[tuple[str, ...], ...] = ()
    k: int | None = None
    ranges: tuple[str, ...] = ()
    total: bool = False
    weights: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sets", tuple(tuple(s) for s in self.sets))
        object.__setattr__(self, "ranges", (self.ranges,) if isinstance(self.ranges, str) else tuple(self.ranges))
        weights = self.weights.items() if isinstance(self.weights, dict) else self.weights
        object.__setattr__(self, "weights", tuple((str(a), float(b)) for a, b in weights))
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1):
            raise ParameterError(f"workload: k must be an integer >= 1, got {self.k!r}")
        if self.k is not None and self.sets:
            raise ParameterError("workload: give marginals as \"all k-way\" or as attribute lists, not both")
        if not (self.sets or self.k or self.ranges or self.total):
            raise ParameterError("workload: name at least one table (marginals, ranges or total)")
        for i, s in enumerate(self.sets):
            if not s or len(set(s)) != len(s):
                raise ParameterError(f"workload: marginals[{i + 1}] must be a non-empty list of distinct attributes, "
                                     f"got {list(s)}")
        for label, w in self.weights:
            if not w > 0 or w != w or w == float("inf"):
                raise ParameterError(f"workload: the weight of {label!r} must be a positive number, got {w!r}")

    def build(self, domain: Domain):
        """The :class:`~dpopt.strategy.tables.Workload` over ``domain``."""
        from dpopt.strategy.tables import Workload, WorkloadTable

        if self.k is not None:
            base = Workload.all_k_way(domain, self.k)
            tables = list(base.tables)
        else:
            tables = list(Workload.marginals(domain, self.sets).tables) if self.sets else []
        for attr in self.ranges:
            if attr not in domain.attrs:
                raise ParameterError(f"workload: ranges names {attr!r}, which is not an attribute of the domain "
                                     f"({', '.join(domain.attrs)})")
            tables.append(WorkloadTable(f"ranges of {attr}", "ranges", (attr,)))
        if self.total:
            tables.append(WorkloadTable("total", "total", ()))
        labels = {t.label: i for i, t in enumerate(tables)}
        for label, w in self.weights:
            key = _normal_label(label, domain)
            if key not in labels:
                shown = ", ".join(repr(lab) for lab in list(labels)[:8]) + (", ..." if len(labels) > 8 else "")
                raise ParameterError(f"workload: weights names {label!r}, which is not a table of the workload "
                                     f"(tables: {shown})")
            t = tables[labels[key]]
            tables[labels[key]] = WorkloadTable(t.label, t.kind, t.attrs, w)
        return Workload(domain, tables)

    def describe(self) -> str:
        parts = []
        if self.k is not None:
            parts.append(f"all {self.k}-way marginals")
        elif self.sets:
            parts.append(f"{len(self.sets)} marginal{'s' if len(self.sets) > 1 else ''}")
        if self.ranges:
            parts.append(f"ranges of {', '.join(self.ranges)}")
        if self.total:
            parts.append("the total")
        return " and ".join(parts) + (" (weighted)" if self.weights else "")


def _normal_label(label: str, domain: Domain) -> str:
    """A marginal's label with its attributes in domain order (``"b, a"`` names ``"a, b"``)."""
    if label == "total" or label.startswith("ranges of "):
        return label
    names = tuple(p.strip() for p in label.split(","))
    if all(n in domain.attrs for n in names):
        return ", ".join(domain.canonical(names))
    return label


def parse_workload(t) -> WorkloadDeclaration:
    """``[workload]`` of a spec (a :class:`~dpopt.spec.table.SpecTable`), every error at its key."""
    sets, k = (), None
    if t.has("marginals"):
        raw = t.raw["marginals"]
        if isinstance(raw, str):
            match = _ALL_K.match(raw)
            if not match:
                raise t.error(("marginals",), f"must be \"all k-way\" (e.g. \"all 3-way\") or a list of attribute "
                              f"lists, got {raw!r}")
            k = int(match.group(1))
        elif isinstance(raw, list) and raw:
            out = []
            for i, s in enumerate(raw):
                if isinstance(s, str):
                    s = [s]
                if not isinstance(s, list) or not s or not all(isinstance(a, str) for a in s):
                    raise t.error(("marginals", i), f"must be a list of attribute names, got {s!r}")
                if len(set(s)) != len(s):
                    raise t.error(("marginals", i), f"names an attribute twice: {s}")
                out.append(tuple(s))
            sets = tuple(out)
        else:
            raise t.error(("marginals",), f"must be \"all k-way\" or a non-empty list of attribute lists, got {raw!r}")
    ranges = tuple(t.str_list("ranges")) if t.has("ranges") else ()
    total = t.bool("total", default=False)
    weights = ()
    if t.has("weights"):
        w = t.table("weights")
        pairs = []
        for label, value in w.raw.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise w.error((label,), f"must be a positive number, got {value!r}")
            pairs.append((label, float(value)))
        weights = tuple(pairs)
    try:
        return WorkloadDeclaration(sets, k, ranges, total, weights)
    except ParameterError as exc:
        raise t.error((), str(exc).removeprefix("workload: ")) from None
