"""Residual statistics: every measurement in the marginals algebra, summarised per residual space.

Marginals, the identity, the total, residual queries and scalar multiples and stacks of them all
have a Gram ``QᵀQ`` that acts on each residual space ``U_a`` (:mod:`dpopt.model.queries.residual`)
as a scalar ``μ_Q(a)``. Measured with independent noise of variance ``σ_Q²``, their generalised
least-squares estimate decouples: on ``U_a`` it is

    û_a = B_a (Σ_Q Qᵀ y_Q / σ_Q²) / μ(a),        μ(a) = Σ_Q μ_Q(a) / σ_Q²,

with ``B_a`` an orthonormal basis of ``U_a``; the coordinates of ``û_a`` are unbiased, mutually
uncorrelated, and each has variance ``1 / μ(a)`` (the normal equations are diagonal in the
residual basis). The whole noisy information of the measurements is in the ``û_a`` of the sets
they measure: any least-squares or penalised fit to the measurements equals the same fit to
these coordinates, up to a constant in the objective. :class:`ResidualStatistics` holds them
and gives them back as one whitened :class:`~dpopt.model.measurement.Measurement`
(noise family ``"derived"``, unit variance) for any family of sets, which is what the estimator
choice (:mod:`dpopt.estimate.choice.rule`) fits and what its risk estimates are written in.

With Gaussian noise the coordinates are exactly Gaussian; with Laplace noise they are linear
combinations of independent Laplace draws: the same means and covariances, a law close to
Gaussian when many draws enter a coordinate (the identity on 64 cells puts 64 in each).
This is post-processing: only the noisy answers and public noise laws are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, Marginal, MarginalWorkload, Stack, Total, Weighted
from dpopt.model.queries.residual import Residuals, residual_row_norm2

__all__ = ["ResidualStatistics", "algebra_precision", "residual_statistics"]


def _subsets(attrs: tuple[str, ...]):
    for r in range(len(attrs) + 1):
        yield from combinations(attrs, r)


def algebra_precision(query, domain: Domain) -> dict[tuple[str, ...], float] | None:
    """``{a: μ_Q(a)}`` for every residual set ``a`` on which ``QᵀQ`` is not zero, or None when the
    query is not in the marginals algebra (per-row weights, ranges, ...). ``()`` is the total's set;
    the identity's value applies to every set (key ``"*"``)."""
    n = float(domain.size)
    if isinstance(query, Identity):
        return {"*": 1.0}
    if isinstance(query, Total):
        return {(): n}
    if isinstance(query, Marginal):
        outside = n / float(query.num_rows)
        return {a: outside for a in _subsets(query.attrs)}
    if isinstance(query, MarginalWorkload):
        return _summed([algebra_precision(m, domain) for m in query.marginals])
    if isinstance(query, Residuals):
        return {a: float(w) ** 2 * residual_row_norm2(domain, a) for a, w in zip(query.sets, query.weights)}
    if isinstance(query, Weighted) and np.ndim(query.weights) == 0:
        inner = algebra_precision(query.query, domain)
        return None if inner is None else {a: float(query.weights) ** 2 * v for a, v in inner.items()}
    if isinstance(query, Stack):
        return _summed([algebra_precision(q, domain) for q in query.parts])
    return None


def _summed(parts) -> dict | None:
    if any(p is None for p in parts):
        return None
    out: dict = {}
    for p in parts:
        for a, v in p.items():
            out[a] = out.get(a, 0.0) + v
    return out


@dataclass(eq=False)
class ResidualStatistics:
    """The least-squares residual coordinates of a set of measurements (module notes).

    Attributes
    ----------
    domain : Domain
    sets : tuple of tuples
        The residual sets measured (positive precision), by size then domain order.
    coordinates : ndarray
        ``û_a`` for every set, concatenated (orthonormal coordinates; :class:`Residuals` row order).
    variances : ndarray
        ``1 / μ(a)`` per set.
    total_set : bool
        Whether the total (set ``()``) is measured.
    """

    domain: Domain
    sets: tuple[tuple[str, ...], ...]
    coordinates: np.ndarray
    variances: np.ndarray

    def __post_init__(self) -> None:
        self._basis = Residuals(self.domain, self.sets)
        self._index = {a: i for i, a in enumerate(self.sets)}

    @property
    def num_coordinates(self) -> int:
        return int(self.coordinates.size)

    def index(self, a: tuple[str, ...]) -> int | None:
        return self._index.get(a)

    def rows(self, sets: Sequence[tuple[str, ...]]) -> np.ndarray:
        """The coordinate indices of ``sets``' residual blocks, concatenated in their order."""
        return np.concatenate([np.arange(self.num_coordinates)[self._basis.rows_of(self._index[a])] for a in sets])

    def coordinates_of(self, a: tuple[str, ...]) -> np.ndarray:
        return self.coordinates[self._basis.rows_of(self._index[a])]

    def variance_of(self, a: tuple[str, ...]) -> float:
        return float(self.variances[self._index[a]])

    def total(self) -> tuple[float, float] | None:
        """``(N̂, its standard error)`` from the total's coordinate, or None when it is not measured."""
        i = self._index.get(())
        if i is None:
            return None
        root_n = np.sqrt(float(self.domain.size))
        return float(self.coordinates[self._basis.rows_of(i)][0] * root_n), float(np.sqrt(self.variances[i]) * root_n)

    def of_table(self, x: np.ndarray, sets: Sequence[tuple[str, ...]] | None = None) -> np.ndarray:
        """The orthonormal residual coordinates of a table ``x`` on ``sets`` (default: all measured)."""
        basis = self._basis if sets is None else Residuals(self.domain, sets)
        return basis.coordinates(basis.matvec(np.asarray(x, dtype=np.float64)))

    def family(self, keep) -> list[tuple[str, ...]]:
        """The measured sets for which ``keep(a)`` is true."""
        return [a for a in self.sets if keep(a)]

    def measurement(self, sets: Sequence[tuple[str, ...]] | None = None, label: str = "residual statistics"
                    ) -> Measurement:
        """The coordinates of ``sets`` (default: every measured set) as one whitened measurement:
        the rows of set ``a`` are ``sqrt(μ(a)) B_a``, the values ``sqrt(μ(a)) û_a``, every row with
        unit variance (noise family ``"derived"``)."""
        sets = list(self.sets if sets is None else sets)
        missing = [a for a in sets if a not in self._index]
        if missing:
            raise QueryError(f"residual statistics: set {list(missing[0])} was not measured")
        precision = np.array([1.0 / self.variance_of(a) for a in sets])
        kappa = np.sqrt([residual_row_norm2(self.domain, a) for a in sets])
        query = Residuals(self.domain, sets, np.sqrt(precision) / kappa)
        values = np.concatenate([np.sqrt(p) * self.coordinates_of(a) for a, p in zip(sets, precision)])
        return Measurement(query, values, "derived", 1.0, 1.0, None, label,
                           {"sets": len(sets), "derived_from": "least-squares residual coordinates"})


def residual_statistics(measurements: Sequence[Measurement], sets: Sequence[tuple[str, ...]] | None = None
                        ) -> ResidualStatistics | None:
    """The residual statistics of ``measurements`` (module notes), or None when one of them is not
    in the marginals algebra or has no noise.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy (variance > 0), all over one domain.
    sets : sequence of tuples, optional
        The residual sets wanted (default: every set some measurement sees; with an identity
        among them, every set of the domain, which needs at most ``2^20`` sets).
    """
    if not measurements:
        return None
    domain = measurements[0].domain
    precisions = []
    for m in measurements:
        if m.domain != domain or not m.variance > 0:
            return None
        p = algebra_precision(m.query, domain)
        if p is None:
            return None
        precisions.append((p, m))
    if sets is None:
        seen: dict = {}
        for p, _ in precisions:
            if "*" in p:
                if len(domain) > 20:
                    raise QueryError("residual statistics: an identity over more than 20 attributes has too many "
                                     "residual sets; name the sets wanted")
                for a in _subsets(domain.attrs):
                    seen.setdefault(a, None)
            else:
                for a in p:
                    seen.setdefault(a, None)
        sets = sorted(seen, key=lambda a: (len(a), domain.axes(a)))
    sets = [domain.canonical(a) for a in sets]
    mu = np.zeros(len(sets))
    g = np.zeros(domain.size)
    for p, m in precisions:
        share = np.array([p.get("*", p.get(a, 0.0)) for a in sets]) / m.variance
        if not share.any():
            continue
        mu += share
        g += m.query.rmatvec(np.asarray(m.values, dtype=np.float64)) / m.variance
    keep = mu > 0
    sets = [a for a, k in zip(sets, keep) if k]
    mu = mu[keep]
    if not sets:
        return None
    basis = Residuals(domain, sets)
    raw = basis.coordinates(basis.matvec(g))
    coords = raw / np.repeat(mu, basis.dims)
    return ResidualStatistics(domain, tuple(sets), coords, 1.0 / mu)
