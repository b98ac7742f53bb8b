"""The ResidualPlanner: the optimal measurement of a marginal workload, in closed form.

Xiao, Ding, Ding, Hu and Wang, "An optimal and scalable matrix mechanism for noisy marginals
under convex loss functions" (NeurIPS 2023; He et al. 2024 extend it as ResidualPlanner+).
A marginal workload ``W`` (tables ``T`` on attribute sets ``S_T``, weights ``ω_T``) acts on the
residual spaces ``U_a`` (:mod:`dpopt.model.queries.residual`) as scalars:
``WᵀW = Σ_a μ_W(a) P_a`` with ``μ_W(a) = Σ_T ω_T [a ⊆ S_T] prod_{i∉S_T} n_i``. Measure each
``U_a`` of the workload's downward closure in an orthonormal basis with independent noise of
variance ``s_a²`` per coordinate; the least-squares answers are unbiased and

    E Σ_T ω_T ‖T x̂ − T x‖² = Σ_a D_a s_a²,        D_a = dim U_a · μ_W(a),

one table's share being ``Σ_{a ⊆ S_T} dim U_a · prod_{i∉S_T} n_i · s_a²``. With the rows of
:class:`~dpopt.model.queries.residual.Residuals` (set ``a`` weighted ``w_a``, squared row norm
``κ_a²``) and noise of variance ``v`` per row, ``s_a² = v / (w_a κ_a)²``. The weights are chosen
to minimise the expected error for the noise the budget buys:

**Gaussian noise** (zCDP, ``v = Δ₂² / (2ρ)``; every column of set ``a``'s unit rows has the same
squared norm ``δ_a = prod_{i∈a} c_i``, ``c_i`` the squared column norm of attribute ``i``'s
contrasts: 1 for ``[1, −1]``, ``(n_i − 1)/n_i`` for Helmert): ``Δ₂² = Σ_a w_a² δ_a`` and the error
``Σ_a D_a/(w_a κ_a)² · Σ_b w_b² δ_b / (2ρ)`` is least at ``w_a⁴ ∝ D_a / (κ_a² δ_a)`` (Cauchy–Schwarz),
where it equals

    (Σ_a sqrt(D_a δ_a / κ_a²))² / (2ρ)  =  (Σ_a dim U_a sqrt(μ_W(a)))² / (n · 2ρ),

the SVD bound of Li and Miklau (:mod:`dpopt.strategy.bound`): no matrix mechanism does better,
which is the ResidualPlanner's optimality theorem for the sum of variances.

**Laplace noise** (pure ε, ``v = 2 Δ₁² / ε²``): with ``ℓ_a`` the largest column L1 norm of set
``a``'s unit rows (1 for parities), ``Δ₁ ≤ Σ_a w_a ℓ_a`` (equal on binary domains, where every
column has the same norms), and the error ``2 Σ_a D_a/(w_a κ_a)² (Σ_b w_b ℓ_b)² / ε²`` is least at
``w_a³ ∝ D_a / (κ_a² ℓ_a)`` (Hölder), where it equals ``2 (Σ_a (D_a ℓ_a² / κ_a²)^{1/3})³ / ε²``.
The L1 geometry makes many residuals expensive: on 16 binary attributes the all-3-way closure
costs ``(Σ_a ...)³``, far above the full histogram's error, and the plan compares both
(:mod:`dpopt.strategy.candidates`).

Nothing here reads data; the plan's printed errors use the exact variance of the discrete law
that :func:`~dpopt.privacy.mechanisms.calibrate` derives for the weighted query
(:func:`residual_variances`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries.residual import Residuals, contrast_basis, residual_dimension, residual_row_norm2
from dpopt.strategy.tables import Workload

__all__ = ["ResidualDesign", "design_residuals", "residual_variances", "table_errors", "unit_error"]


@dataclass(frozen=True, eq=False)
class ResidualDesign:
    """A residual measurement designed for a workload.

    Attributes
    ----------
    query : Residuals
        The weighted residual rows of ``sets`` (weights normalised so that the largest is 1).
    sets : tuple of tuples
    demand : ndarray
        ``D_a`` per set (module notes).
    norm : {"l1", "l2"}
        The sensitivity the weights were chosen for (Laplace, Gaussian).
    unit_error : float
        The expected weighted error per unit of the noise constant (``2/ε²`` for Laplace,
        ``1/(2ρ)`` for Gaussian) by the closed form; the plan recomputes it from the noise law.
    """

    query: Residuals
    sets: tuple[tuple[str, ...], ...]
    demand: np.ndarray
    norm: str
    unit_error: float


def _column_square(n: int) -> float:
    return 1.0 if n == 2 else (n - 1.0) / n


def _column_l1(n: int) -> float:
    return float(np.abs(contrast_basis(n)).sum(axis=0).max())


def design_residuals(workload: Workload, norm: str, sets: Sequence[tuple[str, ...]] | None = None) -> ResidualDesign:
    """The optimal weights of the residual measurement of ``sets`` (default: the workload's
    downward closure) for Laplace (``norm="l1"``) or Gaussian (``"l2"``) noise (module notes).

    Sets with no demand (``D_a = 0``) are left out. When ``sets`` omits part of the closure the
    design does not support the whole workload: it is the optimal measurement of the part it
    covers (the lower-order model of :mod:`dpopt.strategy.candidates`).
    """
    if norm not in ("l1", "l2"):
        raise QueryError(f"design_residuals: norm must be 'l1' or 'l2', got {norm!r}")
    domain = workload.domain
    sets = list(workload.closure() if sets is None else sets)
    demand = workload.demand(sets)
    keep = demand > 0
    sets = [a for a, k in zip(sets, keep) if k]
    demand = demand[keep]
    if not sets:
        raise QueryError("design_residuals: no residual of these sets enters the workload")
    kappa2 = np.array([residual_row_norm2(domain, a) for a in sets])
    if norm == "l2":
        per_col = np.array([np.prod([_column_square(domain.size_of(x)) for x in a]) for a in sets])
        weights = (demand / (kappa2 * per_col)) ** 0.25
        unit = float(np.sum(np.sqrt(demand * per_col / kappa2)) ** 2)
    else:
        per_col = np.array([np.prod([_column_l1(domain.size_of(x)) for x in a]) for a in sets])
        weights = (demand / (kappa2 * per_col)) ** (1.0 / 3.0)
        unit = float(np.sum((demand * per_col**2 / kappa2) ** (1.0 / 3.0)) ** 3)
    weights = weights / weights.max()
    return ResidualDesign(Residuals(domain, sets, weights), tuple(sets), demand, norm, unit)


def residual_variances(query: Residuals, variance: float) -> np.ndarray:
    """``s_a² = v / (w_a κ_a)²``: the variance of every orthonormal coordinate of each set's
    residual when the rows are measured with independent noise of variance ``v``."""
    per_set = query.weights**2 * np.array([residual_row_norm2(query.domain, a) for a in query.sets])
    return float(variance) / per_set


def table_errors(workload: Workload, sets: Sequence[tuple[str, ...]], coordinate_variance: np.ndarray
                 ) -> list[float]:
    """The expected total squared error of each workload table (unweighted) answered from unbiased
    residual estimates with the given per-coordinate variances; ``inf`` for a table some of whose
    residuals are not among ``sets`` (the table is then not supported)."""
    domain = workload.domain
    index = {a: i for i, a in enumerate(sets)}
    n = float(domain.size)
    out = []
    for t in workload.tables:
        if t.kind not in ("marginal", "total"):
            out.append(float("inf"))
            continue
        attrs = t.attrs if t.kind == "marginal" else ()
        outside = n / float(np.prod([domain.size_of(a) for a in attrs])) if attrs else n
        total = 0.0
        from itertools import combinations

        for r in range(len(attrs) + 1):
            for sub in combinations(attrs, r):
                i = index.get(sub)
                if i is None:
                    total = float("inf")
                    break
                total += residual_dimension(domain, sub) * outside * float(coordinate_variance[i])
            if not np.isfinite(total):
                break
        out.append(total)
    return out


def unit_error(domain: Domain, workload: Workload) -> float:
    """The optimal Gaussian error per unit noise constant, ``(Σ_a dim U_a sqrt(μ_W(a)))² / n`` (the
    SVD bound of a marginal workload; module notes)."""
    sets = workload.closure()
    demand = workload.demand(sets)
    dims = np.array([residual_dimension(domain, a) for a in sets], dtype=np.float64)
    mu = np.where(dims > 0, demand / np.maximum(dims, 1), 0.0)
    return float(np.sum(dims * np.sqrt(mu)) ** 2 / float(domain.size))
