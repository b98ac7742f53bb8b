"""Generalised least squares of marginal measurements, one residual at a time.

For measurements ``y_S = mu_S + z_S`` of marginals ``S`` with independent noise of variance
``sigma_S^2`` on every cell, the weighted least-squares objective splits over the residuals
(the orthogonal parts of :mod:`~dpopt.estimate.marginal_space.layout`, equation (1)):

    sum_S ||y_S - mu_S||² / sigma_S²  =  const + sum_A W_A ||r_A - r^_A||²               (3)

    W_A   =  sum_{S ⊇ A}  1 / (sigma_S² n_{S∖A})
    r^_A  =  (1 / W_A) sum_{S ⊇ A}  C_A marg_A(y_S) / (sigma_S² n_{S∖A})

because ``C_A marg_A`` maps the part of ``y_S - mu_S`` on residual ``A`` to ``r^(S)_A - r_A``
times ``n_{S∖A}`` in norm squared. The normal matrix of the least squares is therefore
block-diagonal over the residuals (ResidualPlanner, Xiao et al. NeurIPS 2023; its
reconstruction as local least squares in Mullins et al., "Efficient and Private Marginal
Reconstruction with Local Non-Negativity", NeurIPS 2024, and Fuentes et al., "Fast Private
Adaptive Query Answering for Large Data Domains", 2026): each residual's estimate is the
inverse-variance average of every measurement's projection onto it, with variance ``1/W_A``
per coordinate. Residuals no measurement covers are not identified (``W_A = 0``).

Measurements with variance 0 are exact (invariants): they fix every residual below them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpopt.errors import InconsistentConstraintsError
from dpopt.estimate.marginal_space.layout import ResidualIndex, SetFamily

__all__ = ["ResidualFit", "fit_residuals"]


@dataclass
class ResidualFit:
    """The unconstrained least-squares residuals.

    Attributes
    ----------
    target : ndarray
        ``r^`` (flat, :class:`ResidualIndex` layout); fixed residuals at their exact values,
        unidentified ones at 0.
    weight : ndarray
        ``W_A`` per residual set (0 where no noisy measurement covers the set).
    fixed : ndarray of bool
        Residual sets fixed by exact measurements.
    measured : ndarray of bool
        Residual sets covered by a noisy or exact measurement.
    """

    target: np.ndarray
    weight: np.ndarray
    fixed: np.ndarray
    measured: np.ndarray


def fit_residuals(index: ResidualIndex, sets: list[tuple[int, ...]], values: list[np.ndarray],
                  variances: np.ndarray, labels: list[str], *, exact_tol: float = 1e-9) -> ResidualFit:
    """Equation (3) for the measurements ``values[i]`` of marginals ``sets[i]`` (sorted axes).

    Exact measurements (variance 0) must agree on every residual they share (to ``exact_tol``
    relative to their totals); a disagreement raises :class:`InconsistentConstraintsError`
    naming both.
    """
    variances = np.asarray(variances, dtype=np.float64)
    noisy = np.flatnonzero(variances > 0)
    exact = np.flatnonzero(variances == 0)
    target = np.zeros(index.size)
    weight = np.zeros(index.num_sets)
    if noisy.size:
        family = SetFamily(index, [sets[i] for i in noisy])
        y = family.pack([values[i] for i in noisy])
        w = 1.0 / variances[noisy]
        weight = family.diagonal(w)
        numerator = family.adjoint(y, w)
        covered = weight > 0
        target = numerator / index.per_set(np.where(covered, weight, 1.0))
    measured = weight > 0
    fixed = np.zeros(index.num_sets, dtype=bool)
    if exact.size:
        seen = np.full(index.num_sets, -1, dtype=np.int64)  # which exact measurement fixed each set
        for i in exact:
            family = SetFamily(index, [sets[i]])
            y = family.pack([values[i]])
            diagonal = family.diagonal()  # 1/n_{S∖A} on the subsets of S: r_A = C_A marg_A(y_S)
            hit = diagonal > 0
            exact_residuals = family.adjoint(y) * index.per_set(_inverse(diagonal))
            clash = hit & fixed
            if clash.any():
                flat_clash = index.per_set(clash) > 0
                scale = 1.0 + float(np.abs(values[i]).sum())
                gap = np.abs(exact_residuals - target)[flat_clash].max(initial=0.0)
                if gap > exact_tol * scale:
                    other = labels[int(seen[np.flatnonzero(clash)[0]])]
                    raise InconsistentConstraintsError(
                        f"the exact marginals {other!r} and {labels[i]!r} disagree on the attributes they share "
                        f"(by {gap:.3g}): no table has both")
            flat_hit = index.per_set(hit) > 0
            target[flat_hit] = exact_residuals[flat_hit]
            seen[hit & ~fixed] = i
            fixed |= hit
        measured |= fixed
    return ResidualFit(target, weight, fixed, measured)


def _inverse(diagonal: np.ndarray) -> np.ndarray:
    """``1/d`` where ``d > 0``, else 0."""
    out = np.zeros_like(diagonal)
    np.divide(1.0, diagonal, out=out, where=diagonal > 0)
    return out
