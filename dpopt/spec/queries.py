"""The query vocabulary of specs: ``query = "marginal"`` with its parameters, and the model query it
names; and the workload vocabulary (``workload = "all_ranges"``, products of per-attribute workloads,
...) that algorithms answering a workload read (:func:`parse_workload`, :class:`WorkloadSpec`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Callable, Iterable

from dpopt.errors import DpoptError

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.domain import Domain
    from dpopt.model.queries.base import LinearQuery
    from dpopt.spec.table import SpecTable

__all__ = ["QUERY_KINDS", "QUERY_PARAMS", "QuerySpec", "parse_query", "build_query", "parse_marginals",
           "ATTRIBUTE_WORKLOADS", "WORKLOAD_KINDS", "WORKLOAD_KEYS", "Product", "WorkloadSpec", "parse_workload"]

#: Query kinds a spec can name, with the keys each one takes.
QUERY_KINDS: dict[str, tuple[str, ...]] = {
    "marginal": ("attrs",),
    "total": (),
    "identity": (),
    "all_marginals": ("k",),
    "prefix": ("attr",),
}
#: Every key a query kind can take.
QUERY_PARAMS = ("attrs", "k", "attr")


@dataclass(frozen=True)
class QuerySpec:
    """A query named in a spec: its kind and parameters (``attrs``, ``k`` or ``attr``)."""

    kind: str
    attrs: tuple[str, ...] = ()
    k: int | None = None
    attr: str | None = None
    path: tuple = ()

    def describe(self) -> str:
        if self.kind == "marginal":
            return f"marginal({', '.join(self.attrs)})"
        if self.kind == "all_marginals":
            return f"all_marginals(k={self.k})"
        if self.kind == "prefix":
            return f"prefix({self.attr})"
        return self.kind


def parse_query(t: "SpecTable", kinds: Iterable[str]) -> QuerySpec:
    """The query a table names (``query`` and the parameters of its kind)."""
    kinds = tuple(kinds)
    kind = t.str("query", required=True, choices=kinds)
    needs = QUERY_KINDS[kind]
    for key in QUERY_PARAMS:
        if key in t.raw and key not in needs:
            takes = f"takes {', '.join(needs)}" if needs else "takes no parameter"
            raise t.error((key,), f"does not apply to query = {kind!r} (it {takes})")
    if kind == "marginal":
        return QuerySpec(kind, attrs=tuple(t.str_list("attrs", required=True)), path=t.path_)
    if kind == "all_marginals":
        return QuerySpec(kind, k=t.int("k", required=True, minimum=1), path=t.path_)
    if kind == "prefix":
        return QuerySpec(kind, attr=t.str("attr", required=True), path=t.path_)
    return QuerySpec(kind, path=t.path_)


def build_query(q: QuerySpec, domain: "Domain",
                error: Callable[..., DpoptError]) -> list[tuple[str, "LinearQuery"]]:
    """The model query (or, for ``all_marginals``, the queries) a spec entry names, with label suffixes.

    ``error(path, message)`` makes the error raised for a query that does not fit the domain
    (e.g. :meth:`ReleaseSpec.error`).
    """
    from dpopt.model.queries.basic import Identity, Total
    from dpopt.model.queries.marginal import Marginal, all_marginals
    from dpopt.model.queries.ranges import Prefix

    key = {"marginal": "attrs", "all_marginals": "k", "prefix": "attr"}.get(q.kind, "query")
    try:
        if q.kind == "marginal":
            return [("", Marginal(domain, q.attrs))]
        if q.kind == "total":
            return [("", Total(domain))]
        if q.kind == "identity":
            return [("", Identity(domain))]
        if q.kind == "all_marginals":
            return [(f": {', '.join(m.attrs)}", m) for m in all_marginals(domain, q.k)]
        if q.kind == "prefix":
            return [("", Prefix(domain, q.attr))]
    except (DpoptError, ValueError) as exc:
        raise error(q.path + (key,), str(exc).strip() or type(exc).__name__) from None
    raise error(q.path + ("query",), f"unknown query kind {q.kind!r}")  # pragma: no cover


def parse_marginals(t: "SpecTable", key: str = "marginals") -> int | tuple[tuple[str, ...], ...]:
    """``marginals``: an order k >= 1, or a non-empty list of non-empty attribute lists."""
    from dpopt.spec.table import type_name

    value = t._get(key, True, None)
    if isinstance(value, int) and not isinstance(value, bool):
        return t.int(key, minimum=1)
    if not isinstance(value, list) or not value:
        raise t.error((key,), "must be an order k (integer >= 1) or a non-empty list of attribute "
                      f"lists such as [[\"a\", \"b\"], [\"c\"]], got {type_name(value)} {value!r}")
    out = []
    for i, attrs in enumerate(value):
        if not isinstance(attrs, list) or not attrs or not all(isinstance(a, str) for a in attrs):
            raise t.error((key, i), f"must be a non-empty list of attribute names, got {attrs!r}")
        if len(set(attrs)) != len(attrs):
            raise t.error((key, i), f"names an attribute twice: {attrs}")
        out.append(tuple(attrs))
    return tuple(out)


# ---- workloads: what an algorithm is asked to answer ---------------------------------------------
#: Per-attribute workloads a product combines (``product = {age = "all_ranges", sex = "identity"}``):
#: every range ``[l, h]`` of an ordered attribute, every prefix ``[0, h]``, every value (a marginal
#: on it), or the sum over all its values (an attribute a product does not name).
ATTRIBUTE_WORKLOADS = ("all_ranges", "prefix", "identity", "total")
#: Workload kinds a :class:`WorkloadSpec` can describe.
WORKLOAD_KINDS = ("marginals", "all_marginals", "prefix", "all_ranges", "random_ranges", "product", "identity",
                  "total")
#: Keys of a workload in a spec table (besides ``workload`` itself).
WORKLOAD_KEYS = ("attrs", "k", "count", "workload_seed", "product")


@dataclass(frozen=True)
class Product:
    """A Kronecker product of per-attribute workloads: ``(attribute, kind)`` pairs, each kind one
    of :data:`ATTRIBUTE_WORKLOADS`; an attribute it does not name is summed over (``total``).

    Its queries are every combination of one query per attribute: ``all_ranges`` on two ordered
    attributes is every box of their grid, ``all_ranges`` x ``identity`` every range of one
    attribute within each value of the other, ``prefix`` x ``identity`` a CDF per group.
    """

    factors: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        from dpopt.errors import ParameterError

        pairs = tuple((a, k) for a, k in (self.factors.items() if isinstance(self.factors, dict) else self.factors))
        object.__setattr__(self, "factors", pairs)
        if not pairs:
            raise ParameterError("a product names no attribute")
        names = [a for a, _ in pairs]
        if len(set(names)) != len(names):
            raise ParameterError(f"a product names an attribute twice: {names}")
        for attr, kind in pairs:
            if kind not in ATTRIBUTE_WORKLOADS:
                raise ParameterError(f"attribute {attr!r}: unknown workload {kind!r}; choose one of "
                                     f"{list(ATTRIBUTE_WORKLOADS)}")

    def describe(self) -> str:
        return " x ".join(f"{kind}({attr})" for attr, kind in self.factors if kind != "total")

    def build(self, domain: "Domain") -> "LinearQuery":
        """The product over ``domain`` (a :class:`~dpopt.model.queries.Kronecker` with one factor per
        attribute, in domain order; rows in C order over the factors)."""
        from dpopt.model.queries import AllRanges, Identity, Kronecker, Prefix, Total

        kinds = dict(self.factors)
        domain.check_attrs(list(kinds))
        make = {"all_ranges": lambda sub, a: AllRanges(sub, a), "prefix": lambda sub, a: Prefix(sub, a),
                "identity": lambda sub, a: Identity(sub), "total": lambda sub, a: Total(sub)}
        return Kronecker([make[kinds.get(a, "total")](domain.project([a]), a) for a in domain.attrs], domain)

    def crossed(self, attrs: Iterable[str]) -> "Product":
        """The same product with ``identity`` on ``attrs`` too (crossed with their marginal)."""
        return Product(self.factors + tuple((a, "identity") for a in attrs))


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload described independently of the domain, built by :meth:`build` over the plan's.

    Attributes
    ----------
    kind : str
        One of :data:`WORKLOAD_KINDS`: ``"marginals"`` (``sets``), ``"all_marginals"`` (every
        marginal of each order in ``k``), ``"prefix"`` / ``"all_ranges"`` (over one ordered
        attribute in ``attrs``; over several, every box whose sides are prefixes / ranges: the
        product of the per-attribute workloads), ``"random_ranges"`` (``count`` random boxes over
        ``attrs``, drawn from a public generator seeded with ``seed``), ``"product"`` (the
        :class:`Product` workloads in ``products``, stacked; with ``k``, each crossed with every
        ``k``-way marginal of the attributes it does not name), ``"identity"``, ``"total"``.
    """

    kind: str
    attrs: tuple[str, ...] = ()
    sets: tuple[tuple[str, ...], ...] = ()
    k: tuple[int, ...] = ()
    count: int | None = None
    seed: int = 0
    products: tuple[Product, ...] = ()

    def __post_init__(self) -> None:
        from dpopt.errors import ParameterError

        if self.kind not in WORKLOAD_KINDS:
            raise ParameterError(f"workload kind must be one of {list(WORKLOAD_KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "attrs", (self.attrs,) if isinstance(self.attrs, str) else tuple(self.attrs))
        object.__setattr__(self, "sets", tuple(tuple(s) for s in self.sets))
        object.__setattr__(self, "k", (self.k,) if isinstance(self.k, int) else tuple(self.k))
        products = (self.products,) if isinstance(self.products, (Product, dict)) else tuple(self.products)
        object.__setattr__(self, "products", tuple(p if isinstance(p, Product) else Product(p) for p in products))
        needs = {"marginals": "sets", "all_marginals": "k", "prefix": "attrs", "all_ranges": "attrs",
                 "random_ranges": "attrs", "product": "products"}.get(self.kind)
        if needs and not getattr(self, needs):
            raise ParameterError(f"workload kind {self.kind!r} needs {needs}")
        if len(set(self.attrs)) != len(self.attrs):
            raise ParameterError(f"workload attrs name an attribute twice: {list(self.attrs)}")
        if self.kind == "random_ranges" and (isinstance(self.count, bool) or not isinstance(self.count, int)
                                             or self.count < 1):
            raise ParameterError(f"workload kind 'random_ranges' needs count >= 1, got {self.count!r}")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.k):
            raise ParameterError(f"workload k must hold orders >= 1, got {list(self.k)}")

    def build(self, domain: "Domain") -> "LinearQuery":
        """The workload over ``domain`` (a :class:`ParameterError` names what does not fit)."""
        import numpy as np

        from dpopt.errors import DpoptError, ParameterError
        from dpopt.model.domain import MAX_DENSE_CELLS
        from dpopt.model.queries import (AllRanges, Identity, Marginal, MarginalWorkload, Prefix, Stack, Total,
                                         random_ranges)

        try:
            if self.kind == "identity":
                return Identity(domain)
            if self.kind == "total":
                return Total(domain)
            if self.kind in ("prefix", "all_ranges"):
                if len(self.attrs) == 1:
                    return (Prefix if self.kind == "prefix" else AllRanges)(domain, self.attrs[0])
                return Product(tuple((a, self.kind) for a in self.attrs)).build(domain)
            if self.kind == "random_ranges":
                return random_ranges(domain, self.attrs, self.count, np.random.default_rng(self.seed))
            if self.kind == "product":
                parts = [p.build(domain) for p in self._products(domain)]
                return parts[0] if len(parts) == 1 else Stack(parts)
            if self.kind == "marginals":
                sets = [domain.canonical(s) for s in self.sets]
            else:
                if max(self.k) > len(domain):
                    raise ParameterError(f"workload: marginals of order {max(self.k)} need that many attributes; "
                                         f"the domain has {len(domain)}")
                sets = [c for k in self.k for c in combinations(domain.attrs, k)]
            if domain.size <= MAX_DENSE_CELLS and len(sets) > 1:
                return MarginalWorkload(domain, sets)
            return Marginal(domain, sets[0]) if len(sets) == 1 else Stack([Marginal(domain, s) for s in sets])
        except ParameterError:
            raise
        except DpoptError as exc:
            raise ParameterError(f"workload {self.describe()}: {exc}") from None

    def blocks(self, domain: "Domain") -> list["LinearQuery"]:
        """The workload as blocks of queries (a stacked workload's parts; MWEM selects among them)."""
        from dpopt.model.queries import Stack

        query = self.build(domain)
        return list(query.parts) if isinstance(query, Stack) else [query]

    def _products(self, domain: "Domain") -> list[Product]:
        from dpopt.errors import ParameterError

        if not self.k:
            return list(self.products)
        out = []
        for p in self.products:
            rest = [a for a in domain.attrs if a not in dict(p.factors)]
            if max(self.k) > len(rest):
                raise ParameterError(f"workload: product {p.describe()} leaves {len(rest)} attributes, too few for "
                                     f"marginals of order {max(self.k)}")
            out.extend(p.crossed(c) for k in self.k for c in combinations(rest, k))
        return out

    def describe(self) -> str:
        if self.kind == "marginals":
            return f"marginals {[list(s) for s in self.sets]}"
        if self.kind == "all_marginals":
            return f"all {'- and '.join(map(str, self.k))}-way marginals"
        if self.kind in ("prefix", "all_ranges"):
            if len(self.attrs) > 1:
                return f"every box of {' x '.join(self.attrs)} ({self.kind.replace('_', ' ')})"
            return f"{self.kind.replace('_', ' ')} of {self.attrs[0]}"
        if self.kind == "random_ranges":
            return f"{self.count} random ranges over {', '.join(self.attrs)} (seed {self.seed})"
        if self.kind == "product":
            text = " + ".join(p.describe() for p in self.products)
            return text + (f", each x every {'- and '.join(map(str, self.k))}-way marginal of the other attributes"
                           if self.k else "")
        return self.kind


def parse_workload(t: "SpecTable", kinds: Iterable[str] = WORKLOAD_KINDS, key: str = "workload") -> WorkloadSpec:
    """A workload named in a spec table: ``workload`` is an order k (all k-way marginals), a list of
    attribute lists, or a kind of :data:`WORKLOAD_KINDS` with its keys (``attrs``, ``k``, ``count``,
    ``workload_seed``, ``product``). Every error is one line naming the file, line and key."""
    from dpopt.errors import ParameterError

    kinds = tuple(kinds)
    value = t._get(key, True, None)
    if isinstance(value, bool) or not isinstance(value, (int, list, str)):
        raise t.error((key,), "must be an order k, a list of attribute lists or one of "
                      f"{list(kinds)}, got {value!r}")
    if isinstance(value, str):
        kind = t.str(key, choices=kinds)
        if kind == "marginals":
            raise t.error((key,), "give the marginals as a list of attribute lists, e.g. [[\"a\", \"b\"]]")
    else:
        kind = "all_marginals" if isinstance(value, int) else "marginals"
        if kind not in kinds:
            raise t.error((key,), f"must be one of {list(kinds)}, got {value!r}")
        if isinstance(value, int) and value < 1:
            raise t.error((key,), f"an order k must be >= 1, got {value}")
    takes = {"all_marginals": ("k",) if isinstance(value, str) else (), "prefix": ("attrs",), "all_ranges": ("attrs",),
             "random_ranges": ("attrs", "count", "workload_seed"), "product": ("product", "k")}.get(kind, ())
    for other in WORKLOAD_KEYS:
        if other in t.raw and other not in takes:
            said = f"takes {', '.join(takes)}" if takes else "takes no other key"
            shown = "a list of marginals" if isinstance(value, list) else repr(value)
            raise t.error((other,), f"does not apply to {key} = {shown} (it {said})")
    if isinstance(value, int):
        return WorkloadSpec("all_marginals", k=(value,))
    if isinstance(value, list):
        return WorkloadSpec("marginals", sets=parse_marginals(t, key))
    k = ()
    if t.has("k"):
        raw = t.raw["k"]
        k = (raw,) if isinstance(raw, int) and not isinstance(raw, bool) else raw
        if not isinstance(k, list | tuple) or not k or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in k):
            raise t.error(("k",), f"must be an order >= 1 or a list of them, got {raw!r}")
    products = _parse_products(t, "product") if kind == "product" else ()
    attrs = tuple(t.str_list("attrs")) if t.has("attrs") else ()
    try:
        return WorkloadSpec(kind, attrs=attrs, k=tuple(k), count=t.int("count", minimum=1), products=products,
                            seed=t.int("workload_seed", default=0, minimum=0))
    except ParameterError as exc:
        missing = next((name for name in ("count", "attrs", "k", "product") if re.search(rf"\b{name}\b", str(exc))),
                       key)
        raise t.error((missing,), str(exc)) from None


def _parse_products(t: "SpecTable", key: str) -> tuple[Product, ...]:
    """``product``: a table ``{attribute = kind}`` or an array of them (a stack of products)."""
    from dpopt.errors import ParameterError
    from dpopt.spec.table import type_name

    value = t._get(key, True, None)
    items = [(value, (key,))] if isinstance(value, dict) else (
        [(v, (key, i)) for i, v in enumerate(value)] if isinstance(value, list) and value else None)
    if items is None:
        raise t.error((key,), "must be a table such as {age = \"all_ranges\", sex = \"identity\"} or an array of "
                      f"them, got {type_name(value)} {value!r}")
    out = []
    for table, path in items:
        if not isinstance(table, dict) or not table:
            raise t.error(path, "must be a non-empty table of attribute = workload (one of "
                          f"{list(ATTRIBUTE_WORKLOADS)}), got {type_name(table)} {table!r}")
        for attr, kind in table.items():
            if not isinstance(kind, str) or kind not in ATTRIBUTE_WORKLOADS:
                raise t.error(path + (attr,), f"unknown workload {kind!r}; choose one of {list(ATTRIBUTE_WORKLOADS)}")
        try:
            out.append(Product(tuple(table.items())))
        except ParameterError as exc:
            raise t.error(path, str(exc)) from None
    return tuple(out)
