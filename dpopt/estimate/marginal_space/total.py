"""The record count of a marginal-space estimate: free, or held at its measured estimate.

Why a rule is needed
--------------------
Least squares with non-negativity is biased upwards on sparse marginals. A cell whose true count
is ``c`` and whose measurement is ``c + σZ`` is fitted, when the fit is free to raise the total,
at about ``max(0, c + σZ)``, whose mean exceeds ``c`` by

    σ g(c/σ),    g(t) = E[max(0, Z − t)] = φ(t) − t Φ(−t)   (Z standard normal)           (1)

(``g(0) = 1/√(2π)``: an empty cell gains ``σ/√(2π)`` on average). On a marginal of ``D`` cells
with far fewer records than ``σ D`` this adds up to far more than the records themselves: the
adult chain of triples at zCDP ε = 0.1 (σ ≈ 35, a 990,000-cell triple holding 1,020 non-empty
cells) was released with 66,416 records for 48,842. Holding the total at an unbiased estimate
from the measurements removes that inflation.

The held value
--------------
``n̂ = ĉ_∅``, the least-squares estimate of the empty set's residual (equation (3) of
:mod:`~dpopt.estimate.marginal_space.gls` with ``A = ∅``):

    n̂ = Σ_S (1_Sᵀ y_S) / (σ_S² D_S)  /  W_∅,      W_∅ = Σ_S 1 / (σ_S² D_S),      Var n̂ = 1/W_∅     (2)

the inverse-variance average of every noisy measurement's own total (``1_Sᵀ y_S`` has variance
``D_S σ_S²``). It *is* the total of the consistent least-squares fit without non-negativity: the
normal matrix is block-diagonal over the residuals, so that fit's total is ``ĉ_∅`` whatever the
other residuals are — the two candidates the brief of issue 27 names coincide. It is unbiased
(each ``y_S`` is) and uses the noisy answers only: post-processing. A public total (an invariant
on the total, an exact marginal, ``total=<number>``) keeps priority over it.

The rule (``total="auto"``)
---------------------------
Hold ``n̂`` when the predicted upward bias of the free total exceeds the standard error of ``n̂``,

    B̂ > 1/√W_∅ ,                                                                          (3)

i.e. when the squared error of the free total, ``B² + Var``, would exceed that of the held one,
``1/W_∅`` (the free total's own variance is left out: the rule errs towards the free fit).
``B̂`` uses public quantities only — each measurement's noise law, scale and cell count — and
``n̂`` itself:

* **Per marginal**, the clipping bias ``Σ_cells σ_S g(c_i/σ_S)`` is convex in the counts ``c_i``,
  which sum to ``n`` over ``D_S`` cells, so by Jensen's inequality it is at least

      B_S = D_S σ_S g(n̂ / (D_S σ_S))                                                    (4)

  (the counts spread evenly: a lower bound; the data's skew only adds to it). Under pure
  ε the noise is Laplace, and ``g`` is that law's, ``g(t) = e^{−√2 t} / (2√2)`` in units of the
  standard deviation (convex too). Discrete laws are taken as their continuous law of the same
  variance.
* **Across marginals**, each marginal pulls the shared total towards its own (inflated) sum with
  its least-squares weight ``1/(σ_S² D_S)`` (the weight of (2); under non-negativity a marginal's
  pull is that of its positive cells, between one and two times this), so

      B̂ = Σ_S B_S / (σ_S² D_S)  /  W_∅  =  Σ_S g(n̂/(D_S σ_S)) / σ_S  /  W_∅.           (5)

Where the data are dense against the noise (``n̂ ≫ D_S σ_S`` for some precise marginal) ``B̂`` is
negligible and the free fit is kept: it is then the better estimate, as it uses the sign
information of non-negativity. ``n̂ ≤ 0`` (possible under heavy noise) is read as 0 in (4), and a
negative ``n̂`` is held at 0, its projection on the totals non-negativity allows.

This module is post-processing only: it never sees data or randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from dpopt.errors import ParameterError

__all__ = ["TOTAL_MODES", "TotalChoice", "clipping_bias", "check_total", "choose_total"]

#: ``total=`` of :func:`~dpopt.estimate.marginal_space.estimate_marginals`, besides a public count.
TOTAL_MODES = ("auto", "measured", "free")
#: Noise families read as Laplace by the rule (equation (4)); every other as Gaussian.
LAPLACE_NOISE = ("laplace", "discrete_laplace")


def clipping_bias(t: np.ndarray, laplace: np.ndarray) -> np.ndarray:
    """``g(t)`` of equation (1): the mean positive part of (noise − t·sd), in units of the noise's sd.

    Gaussian noise: ``φ(t) − t Φ(−t)``; Laplace noise (``laplace`` True):
    ``e^{−√2 t} / (2√2)`` (scale ``b = sd/√2``, ``E[max(0, bL − c)] = (b/2) e^{−c/b}`` for
    ``c ≥ 0``). Both are convex and decreasing in ``t ≥ 0``.
    """
    t = np.maximum(np.asarray(t, dtype=np.float64), 0.0)
    gauss = np.exp(-0.5 * t * t) / math.sqrt(2 * math.pi) - t * ndtr(-t)
    lap = np.exp(-math.sqrt(2.0) * t) / (2 * math.sqrt(2.0))
    return np.where(np.asarray(laplace, dtype=bool), lap, gauss)


@dataclass(frozen=True)
class TotalChoice:
    """Which total an estimate used and why.

    Attributes
    ----------
    mode : str
        What was asked: ``"auto"``, ``"measured"``, ``"free"`` or ``"public"`` (a number, or an
        invariant or exact measurement fixing the total).
    held : bool
        The total was held at ``value`` (public or measured).
    value : float
        The held total: the public count, or ``n̂`` of equation (2) (also reported when free; held
        at 0 when ``n̂ < 0`` under non-negativity, the only feasible total nearest to it).
    stddev : float
        Standard error of ``n̂``, ``1/√W_∅`` (0 for a public total).
    bias : float
        ``B̂`` of equation (5), the free total's predicted inflation (NaN when not computed).
    reason : str
        One sentence for reports.
    estimate : float
        ``n̂`` itself (equation (2)), whatever was done with it (NaN for a public total: none is
        estimated).
    """

    mode: str
    held: bool
    value: float
    stddev: float
    bias: float
    reason: str
    estimate: float = float("nan")

    def info(self) -> dict:
        """Plain data for ``info["total"]`` and the report: what was asked, whether the total was
        held and at what, ``n̂`` with its standard error, the predicted bias, the rule, the reason."""
        return {"mode": self.mode, "held": self.held, "value": self.value, "measured": self.estimate,
                "stddev": self.stddev, "predicted_bias": self.bias,
                "rule": "hold when predicted bias > stddev (total.py, (3))", "reason": self.reason}


def check_total(total) -> float | str:
    """``total=`` as given: a finite non-negative public count or one of :data:`TOTAL_MODES`."""
    if isinstance(total, str):
        if total not in TOTAL_MODES:
            raise ParameterError(f"total must be a public count or one of {', '.join(TOTAL_MODES)}, got {total!r}")
        return total
    if isinstance(total, bool) or total is None:
        raise ParameterError(f"total must be a public count or one of {', '.join(TOTAL_MODES)}, got {total!r}")
    try:
        value = float(total)
    except (TypeError, ValueError):
        raise ParameterError(f"total must be a public count or one of {', '.join(TOTAL_MODES)}, "
                             f"got {total!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise ParameterError(f"total must be a finite non-negative count, got {total!r}")
    return value


def choose_total(mode: str, estimate: float, weight: float, cells: np.ndarray, variances: np.ndarray,
                 laplace: np.ndarray, *, public: bool, nonnegative: bool) -> TotalChoice:
    """Equations (2)–(5): hold the total at ``estimate`` (``n̂``, of precision ``weight`` = ``W_∅``)?

    Parameters
    ----------
    mode : {"auto", "measured", "free"}
    estimate, weight : float
        ``n̂`` and ``W_∅`` from the residual least squares.
    cells, variances, laplace : ndarray
        Per noisy measurement: its cells ``D_S``, noise variance ``σ_S²``, whether its noise is
        Laplace. Public quantities only; no noisy answer enters besides ``n̂``.
    public : bool
        The total is already fixed by an invariant, an exact measurement or a public count.
    nonnegative : bool
        Non-negativity is imposed (without it the free fit's total is ``n̂`` already).
    """
    if public:
        return TotalChoice("public", True, estimate, 0.0, float("nan"),
                           "the total is public (an invariant, an exact measurement or total=<count>)")
    stddev = 1.0 / math.sqrt(weight) if weight > 0 else float("inf")
    cells = np.asarray(cells, dtype=np.float64)
    sd = np.sqrt(np.asarray(variances, dtype=np.float64))
    if cells.size and weight > 0:
        t = max(estimate, 0.0) / (cells * sd)
        bias = float(np.sum(clipping_bias(t, laplace) / sd) / weight)
    else:
        bias = float("nan")
    evidence = (f"predicted bias of the free total {bias:.4g} against the standard error {stddev:.4g} of "
                f"n̂ = {estimate:.6g}")
    # Under non-negativity no total below 0 is feasible: a negative n̂ (heavy noise) is held at 0, its
    # projection on the feasible totals (the least squares of the total alone).
    value = max(estimate, 0.0) if nonnegative else estimate
    if mode == "measured":
        return TotalChoice(mode, True, value, stddev, bias, f"held at n̂ as asked (total='measured'); {evidence}",
                           estimate)
    if mode == "free":
        return TotalChoice(mode, False, estimate, stddev, bias, f"free as asked (total='free'); {evidence}",
                           estimate)
    if not nonnegative:
        return TotalChoice(mode, False, estimate, stddev, bias,
                           "free: without non-negativity the fit's total is n̂ already", estimate)
    held = bool(bias > stddev)
    at = "n̂" if value == estimate else "0, the feasible total nearest to n̂ < 0,"
    verdict = f"held at {at} (bias above the standard error)" if held else "free (bias within the standard error)"
    return TotalChoice(mode, held, value if held else estimate, stddev, bias, f"{verdict}: {evidence}", estimate)
