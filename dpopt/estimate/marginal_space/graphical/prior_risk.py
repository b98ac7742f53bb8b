"""The per-attribute prior's risk rule when only one-way marginals are measured (rule (9) of
:mod:`~dpopt.estimate.marginal_space.graphical.smooth`).

With one-way marginals and totals only, the smooth estimate is a product over attributes (its
dual ``x(ν) = p ∘ exp(−Cᵀν/λ)`` has one factor per attribute, and a product prior keeps it one),
and with the total held at ``N̂`` the relative entropy of two such products with equal totals is
the sum of their factors' (``D(x‖p) = Σ_a D(x_a‖p_a)``). So each attribute's one-way is its own
``K`` proximal steps on ``n_a`` cells,

    x_k = argmin ½ ‖x − ȳ‖² / s² + λ D(x ‖ x_{k−1}),   Σ x = N̂,   x_0 = p_a,

with ``ȳ`` the inverse-variance average of the measured one-ways on ``a`` and ``s²`` its variance
per cell (the measurements' ``½ Σ_i ‖x − y_i‖²/σ_i²`` is ``½ ‖x − ȳ‖²/s²`` up to a constant).
Stationarity, ``(x_j − ȳ_j)/s² + λ log(x_j/q_j) + ν/s² = 0``, gives each cell in closed form,
``x_j = λ s² ω(log(q_j / λs²) + (ȳ_j − ν)/λs²)`` with Wright's omega function (``ω(z) = W(e^z)``,
finite for any ``z``), and one root ``ν`` holds the total. Differentiating it, a step's Jacobian
in ``ȳ`` is

    dx = (I − h 1ᵀ/Σh) (h ∘ (dȳ/s² + λ dq/q)),   h_j = s² x_j / (x_j + λ s²),

diagonal plus rank one, so ``J = ∂x_K/∂ȳ`` after ``K`` steps is a diagonal plus rank ``K + 1``
(kept as ``diag(d) + U Vᵀ``; its trace costs ``O(n_a K)``). With the fit and its divergence,
Stein's unbiased risk estimate of either prior's fit ``f`` (cells' noise independent, variance
``s²``; Stein 1981, eq. (8)) is

    SURE(f) = ‖f − ȳ‖² − n_a s² + 2 s² tr J.

The uniform factor shrinks towards ``N̂/n_a`` (its bias grows with the cells' distance from it,
which the rule (8) fraction ``κ_j^K`` does not see); the one-way factor ``m_a`` starts at the
projected average (its Jacobian: the projection's, ``I − 11ᵀ/k`` on the ``k`` cells above the
floor). Rule (9) takes the one-way factor for an attribute rule (8) leaves uniform when
``Δ = SURE_u − SURE_o`` exceeds one standard deviation of its own estimate (delta method,
``sd = s ‖∇_ȳ (‖f_u − ȳ‖² − ‖f_o − ȳ‖²)‖``, the divergence term's own variation left out): when
the two fits differ by less than the noise, ``Δ`` is mostly noise, and a choice by its sign
follows the noise (on binary attributes it picked the worse factor more often than not; issue
27, session 10). It never removes the one-way factor rule (8) takes (module notes of
:mod:`~dpopt.estimate.marginal_space.graphical.smooth`: squared error underweighs the L1 cost
of mass spread over near-empty cells).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq
from scipy.special import wrightomega

__all__ = ["proximal_fit", "stein_risk", "risk_difference"]


def _cells(y: np.ndarray, q: np.ndarray, s2: float, lam: float, nu: float) -> np.ndarray:
    """The step's optimum per cell for the multiplier ``ν`` of the total (module notes)."""
    scale = lam * s2
    return scale * np.real(wrightomega(np.log(q / scale) + (y - nu) / scale))


def _step(y: np.ndarray, q: np.ndarray, s2: float, lam: float, total: float) -> np.ndarray:
    """One proximal step from ``q``: the root ``ν`` of ``Σ x(ν) = N̂`` (``Σ x`` falls with ``ν``)."""
    def excess(nu):
        return float(_cells(y, q, s2, lam, nu).sum() - total)
    width = float(total + np.abs(y).max() + lam * s2)
    lo, hi = float(y.min()) - width, float(y.max()) + width
    while excess(lo) < 0:
        lo -= 2 * (hi - lo)
    while excess(hi) > 0:
        hi += 2 * (hi - lo)
    nu = brentq(excess, lo, hi, xtol=1e-12 * width, rtol=1e-15, maxiter=500)
    return _cells(y, q, s2, lam, nu)


def proximal_fit(y: np.ndarray, s2: float, lam: float, steps: int, total: float, prior: np.ndarray,
                 prior_jacobian: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
    """``K`` proximal steps of one attribute's one-way (module notes) and their Jacobian in ``ȳ``.

    Parameters
    ----------
    y : ndarray
        ``ȳ``, the inverse-variance average of the measured one-ways (any sign).
    s2 : float
        Its variance per cell.
    lam : float
        ``λ``, the smoothing weight.
    steps : int
        ``K``.
    total : float
        ``N̂``, held by every step (the prior sums to it).
    prior : ndarray
        ``x_0``, positive.
    prior_jacobian : (d, U, V), optional
        ``∂x_0/∂ȳ = diag(d) + U Vᵀ`` (None: the prior does not depend on ``ȳ``).

    Returns
    -------
    x : ndarray
        The fit.
    jacobian : (d, U, V)
        ``∂x/∂ȳ = diag(d) + U Vᵀ``.
    """
    n = y.size
    d, U, V = prior_jacobian if prior_jacobian is not None else (np.zeros(n), np.zeros((n, 0)), np.zeros((n, 0)))
    q = np.asarray(prior, dtype=np.float64)
    for _ in range(steps):
        # a cell below the smallest positive double (its count ≪ −745 λs²) is kept at it: the
        # next step's log-prior and its pull h λ / q stay finite
        x = np.maximum(_step(y, q, s2, lam, total), np.finfo(np.float64).tiny)
        h = s2 * x / (x + lam * s2)
        pull = h * lam / q  # the step's sensitivity to its prior cell
        e = h / s2 + pull * d
        U2 = pull[:, None] * U
        # (I − h 1ᵀ/Σh)(diag(e) + U2 Vᵀ): the rank grows by one per step
        U = np.column_stack([U2 - np.outer(h, U2.sum(axis=0)) / h.sum(), -h / h.sum()])
        V = np.column_stack([V, e])
        d, q = e, x
    return q, (d, U, V)


def stein_risk(fit: np.ndarray, jacobian, y: np.ndarray, s2: float) -> float:
    """``SURE(f) = ‖f − ȳ‖² − n s² + 2 s² tr J`` (Stein 1981), cells' noise independent, variance ``s²``."""
    d, U, V = jacobian
    trace = float(d.sum() + np.einsum("ij,ij->", U, V))
    return float(np.sum((fit - y) ** 2) - y.size * s2 + 2.0 * s2 * trace)


def _transpose_times(jacobian, v: np.ndarray) -> np.ndarray:
    d, U, V = jacobian
    return d * v + V @ (U.T @ v)


def risk_difference(y: np.ndarray, s2: float, lam: float, steps: int, total: float, one_way: np.ndarray,
                    floor: float) -> tuple[float, float]:
    """``Δ = SURE_u − SURE_o`` of one attribute's two fits and the s.d. of that estimate (rule (9)).

    Parameters
    ----------
    y, s2, lam, steps, total
        As :func:`proximal_fit`.
    one_way : ndarray
        ``m_a``, the projected one-way (the one-way prior), summing to ``total``.
    floor : float
        Its floor ``f_a``: the cells above it are the projection's free cells.

    Returns
    -------
    excess : float
        ``Δ``: positive when the uniform factor's fit has the larger estimated risk.
    sd : float
        ``s ‖∇_ȳ (‖f_u − ȳ‖² − ‖f_o − ȳ‖²)‖`` (delta method).
    """
    n = y.size
    uniform_fit, uniform_jac = proximal_fit(y, s2, lam, steps, total, np.full(n, total / n))
    free = (one_way > floor * (1 + 1e-12)).astype(np.float64)
    if np.allclose(one_way, total / n, rtol=1e-14, atol=0) or not free.any():
        start = None  # the one-way is uniform (n s ≥ N̂) or all at the floor: it does not move with ȳ
    else:
        start = (free, -free[:, None] / free.sum(), free[:, None])
    one_way_fit, one_way_jac = proximal_fit(y, s2, lam, steps, total, one_way, start)
    ru, ro = uniform_fit - y, one_way_fit - y
    gradient = 2.0 * (_transpose_times(uniform_jac, ru) - ru - _transpose_times(one_way_jac, ro) + ro)
    excess = stein_risk(uniform_fit, uniform_jac, y, s2) - stein_risk(one_way_fit, one_way_jac, y, s2)
    return float(excess), float(np.sqrt(s2) * np.linalg.norm(gradient))
