"""The query vocabulary of specs: ``query = "marginal"`` with its parameters, and the model query it names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from dpopt.errors import DpoptError

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.domain import Domain
    from dpopt.model.queries.base import LinearQuery
    from dpopt.spec.table import SpecTable

__all__ = ["QUERY_KINDS", "QUERY_PARAMS", "QuerySpec", "parse_query", "build_query", "parse_marginals"]

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
