"""Marginals: counts over a subset of the attributes (the cuboids ``C^beta`` of Barak et al.)."""

from __future__ import annotations

from itertools import combinations
from typing import Iterable

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries._common import (
    SupportArray,
    StructuredQuery,
    cell_labels,
    check_domain,
    expand,
    marginalize,
    projection_matrix,
)
from dpopt.model.queries.basic import Identity


class Marginal(StructuredQuery):
    """Counts over every cell of ``domain.project(attrs)``: ``Q = M_S``.

    Each record falls in exactly one marginal cell, so every column holds a single 1 and
    the L1 and L2 sensitivities are both 1.

    Parameters
    ----------
    domain : Domain
    attrs : iterable of str
        The attributes kept; stored in domain order (``domain.canonical``), and the answers
        follow C order over ``domain.project(self.attrs)``.

    Examples
    --------
    >>> dom = Domain.from_dict({"sex": ["F", "M"], "age": 3})
    >>> Marginal(dom, ["sex"]).matvec(np.arange(6))
    array([ 3, 12])
    """

    is_integer = True

    def __init__(self, domain: Domain, attrs: Iterable[str]) -> None:
        self.domain = check_domain(domain, "Marginal")
        if isinstance(attrs, str):
            attrs = (attrs,)
        attrs = self.domain.canonical(attrs)
        if not attrs:
            raise QueryError("Marginal: attrs is empty; use Total for the overall count")
        self.attrs: tuple[str, ...] = attrs
        self.marginal_domain = self.domain.project(attrs)

    @property
    def name(self) -> str:
        return f"Marginal({', '.join(self.attrs)})"

    @property
    def num_rows(self) -> int:
        return self.marginal_domain.size

    @property
    def depends_on(self) -> tuple[str, ...]:
        return self.attrs

    def _restrict_to(self, attrs: tuple[str, ...]) -> StructuredQuery:
        if attrs == self.attrs:
            return Identity(self.marginal_domain)
        return Marginal(self.domain.project(attrs), self.attrs)

    def restrict(self) -> StructuredQuery:
        """The identity over ``domain.project(attrs)``."""
        return Identity(self.marginal_domain)

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return marginalize(x, self.domain, self.attrs)

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return expand(y, self.domain, self.attrs)

    def to_sparse(self) -> sp.csr_matrix:
        return projection_matrix(self.domain, self.attrs)

    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        return self.attrs, np.asarray(v, dtype=np.float64).reshape(self.marginal_domain.shape)

    def _support_norm_powers(self, p: float) -> SupportArray:
        return (), np.asarray(1.0)

    def row_labels(self) -> list[str]:
        return cell_labels(self.domain, self.attrs)


def all_marginals(domain: Domain, k: int) -> list[Marginal]:
    """Every ``k``-way marginal of ``domain``, attribute subsets in lexicographic domain order."""
    check_domain(domain, "all_marginals")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= len(domain):
        raise QueryError(f"all_marginals: k must be an integer in 1..{len(domain)}, got k={k!r}")
    return [Marginal(domain, attrs) for attrs in combinations(domain.attrs, int(k))]
