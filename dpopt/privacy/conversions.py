"""Conversions between privacy notions, composition bounds, and validation of privacy parameters.

Pure functions; no state, no randomness. Every function that returns a budget rounds in the
safe direction: a privacy *loss* is rounded up, a *budget allowance* (the largest parameter
that keeps a guarantee) is rounded down.

Numbers
-------
Budgets are exact rationals (:class:`fractions.Fraction`). :func:`as_fraction` turns user input
into one: ``int`` and ``Fraction`` exactly, ``float`` through its shortest decimal repr (so
``0.1`` means exactly 1/10, not the binary double 0.1000000000000000055...), ``Decimal``
exactly, and strings such as ``"1/3"``, ``"0.25"`` or ``"1e-6"``. ``bool``, ``None``, NaN,
infinities and strings that are not numbers raise :class:`~dpopt.errors.PrivacyParameterError`.

References
----------
.. [BS16] M. Bun, T. Steinke. "Concentrated Differential Privacy: Simplifications, Extensions,
   and Lower Bounds." TCC 2016. Proposition 1.3 (ρ-zCDP ⇒ (ρ + 2√(ρ log(1/δ)), δ)-DP) and
   Proposition 1.4 (ε-DP ⇒ (ε²/2)-zCDP).
.. [CKS20] C. Canonne, G. Kamath, T. Steinke. "The Discrete Gaussian for Differential Privacy."
   NeurIPS 2020. Proposition 12 / Corollary 13 (ρ-zCDP ⇒ (ε, δ)-DP, tight conversion).
.. [DRV10] C. Dwork, G. Rothblum, S. Vadhan. "Boosting and Differential Privacy." FOCS 2010,
   Theorem III.3 (advanced composition); the form used by Hardt, Ligett, McSherry (MWEM, 2012)
   and Dwork & Roth (2014), Theorem 3.20.
"""

from __future__ import annotations

import decimal
import math
import numbers
from decimal import Decimal
from fractions import Fraction

import numpy as np
from scipy.optimize import brentq

from dpopt.errors import PrivacyParameterError

__all__ = [
    "as_fraction",
    "readable_amount",
    "validate_epsilon",
    "validate_delta",
    "validate_rho",
    "validate_steps",
    "zcdp_to_approx_dp",
    "approx_dp_to_zcdp",
    "pure_to_zcdp",
    "advanced_composition",
    "advanced_composition_per_step",
    "EPSILON_RANGE",
    "RHO_RANGE",
    "DELTA_RANGE",
    "check_range",
]

# Significant decimal digits kept when a computed (irrational) budget is turned into a Fraction.
_SIGNIFICANT_DIGITS = 13
# Unit roundoff of IEEE double precision.
_ULP = 2.0**-52

#: The budgets a release accepts (checked when a spec is read). Below 2^-56 not even a count
#: (sensitivity 1) measured with the whole ε fits the exact discrete Laplace sampler, whose
#: scale 1/ε must be at most 2^56 (:data:`~dpopt.privacy.samplers.MAX_LAPLACE_SCALE`); above
#: 2^63 a count's noise scale leaves the sampler's int64 path and no noise remains anyway.
EPSILON_RANGE = (Fraction(1, 2**56), Fraction(2**63))
#: Below 2^-113 not even a count fits the exact discrete Gaussian sampler, whose
#: σ² = 1/(2ρ) must be at most 2^112 (:data:`~dpopt.privacy.samplers.MAX_GAUSSIAN_SIGMA2`).
RHO_RANGE = (Fraction(1, 2**113), Fraction(2**63))
#: log(1/δ) and log(1/(1 − δ)) must stay well inside double precision for the conversions.
DELTA_RANGE = (Fraction(1, 2**1000), 1 - Fraction(1, 2**60))

# Where the double-precision conversions below are verified (tests/test_bad_inputs.py runs
# both ends); outside them they raise PrivacyParameterError instead of a solver's failure.
_CONVERSION_EPSILON = (Fraction(1, 2**480), Fraction(2**80))
_CONVERSION_RHO = (Fraction(1, 2**1000), Fraction(2**80))
_CONVERSION_DELTA = (Fraction(1, 2**2000), 1 - Fraction(1, 2**60))


def check_range(value: Fraction, bounds: tuple[Fraction, Fraction], name: str, why: str = "") -> Fraction:
    """``value`` if ``bounds[0] <= value <= bounds[1]``, else a PrivacyParameterError naming ``name``
    (the message starts with "must" when ``name`` is empty) and saying ``why``."""
    low, high = bounds
    if low <= value <= high:
        return value
    raise PrivacyParameterError(
        f"{name + ' ' if name else ''}must lie in [{_power(low)}, {_power(high)}], got {_short(value)}" + (f": {why}" if why else ""))


def _power(q: Fraction) -> str:
    """``2^-56 (1.39e-17)`` for powers of two (and ``1 - 2^-k`` next to them), else the number."""
    for sign, v in (("", q), ("1 - ", 1 - q)):
        if v > 0 and v.numerator == 1 and v.denominator & (v.denominator - 1) == 0:
            k = v.denominator.bit_length() - 1
            return f"{sign}2^-{k}" + ("" if sign else f" ({_decimal_power(-k)})")
        if v > 1 and v.denominator == 1 and v.numerator & (v.numerator - 1) == 0:
            k = v.numerator.bit_length() - 1
            return f"{sign}2^{k} ({_decimal_power(k)})"
    return _short(q)


def _decimal_power(k: int) -> str:
    """2^k as ``1.39e-17`` (computed in logs, so 2^-2000 prints too)."""
    exponent = k * math.log10(2)
    whole = math.floor(exponent)
    return f"{10 ** (exponent - whole):.3g}e{whole:+03d}"


def _short(q: Fraction) -> str:
    if q.denominator == 1 and abs(q.numerator) < 10**12:
        return str(q.numerator)
    if q <= 0:
        return str(q) if len(str(q)) <= 40 else f"{float(q):.6g}"
    exponent = math.log10(q.numerator) - math.log10(q.denominator)  # exact ints: no overflow
    whole = math.floor(exponent)
    if abs(whole) < 300:
        return f"{float(q):.6g}"
    return f"{10 ** (exponent - whole):.6g}e{whole:+03d}"


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def readable_amount(value) -> str:
    """A privacy amount for people: the exact fraction when it is short (``1/20``), else 4
    significant digits. Adaptive plans split shares into fractions of ~40 digits; ledgers and
    report.json keep them exact."""
    exact = str(value)
    return exact if len(exact) <= 16 else f"{float(value):.4g}"


def as_fraction(value: object, name: str) -> Fraction:
    """Convert a user-given number to an exact :class:`~fractions.Fraction`.

    Parameters
    ----------
    value
        ``int``, ``Fraction`` (or any ``numbers.Rational``), ``float`` / numpy float (read
        through ``str``, so ``0.1`` is exactly 1/10), ``Decimal``, or a string such as
        ``"1/3"``, ``"0.1"`` or ``"1e-6"``.
    name
        Name of the parameter, used in error messages.

    Returns
    -------
    Fraction

    Raises
    ------
    PrivacyParameterError
        For ``bool``, ``None``, NaN, infinities, non-numeric strings and other types.
    """
    if isinstance(value, bool) or value is None:
        raise PrivacyParameterError(f"{name} must be a number, got {value!r}")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise PrivacyParameterError(f"{name} must be finite, got {value!r}")
        # str() gives the shortest decimal that round-trips: 0.1 -> "0.1" -> 1/10.
        return Fraction(str(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise PrivacyParameterError(f"{name} must be finite, got {value!r}")
        return Fraction(value)
    if isinstance(value, str):
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            raise PrivacyParameterError(
                f"{name} must be a number such as '0.5' or '1/3', got the string {value!r}"
            ) from None
    raise PrivacyParameterError(
        f"{name} must be an int, float, Fraction, Decimal or numeric string, "
        f"got {type(value).__name__} {value!r}"
    )


def validate_epsilon(value: object, name: str = "epsilon", *, allow_zero: bool = False) -> Fraction:
    """Return ``value`` as a Fraction, checking ε > 0 (or ε ≥ 0 with ``allow_zero``)."""
    eps = as_fraction(value, name)
    if eps < 0 or (eps == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise PrivacyParameterError(f"{name} must be {bound}, got {value!r}")
    return eps


def validate_rho(value: object, name: str = "rho", *, allow_zero: bool = False) -> Fraction:
    """Return ``value`` as a Fraction, checking ρ > 0 (or ρ ≥ 0 with ``allow_zero``)."""
    return validate_epsilon(value, name, allow_zero=allow_zero)


def validate_delta(value: object, name: str = "delta", *, allow_zero: bool = False) -> Fraction:
    """Return ``value`` as a Fraction, checking 0 < δ < 1 (or 0 ≤ δ < 1 with ``allow_zero``)."""
    delta = as_fraction(value, name)
    low_ok = delta >= 0 if allow_zero else delta > 0
    if not (low_ok and delta < 1):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise PrivacyParameterError(f"{name} must lie in {interval}, got {value!r}")
    return delta


def validate_steps(value: object, name: str = "k") -> int:
    """Return ``value`` as an int, checking that it is an integer (not bool, not float) ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PrivacyParameterError(f"{name} must be an integer >= 1, got {value!r}")
    steps = int(value)
    if steps < 1:
        raise PrivacyParameterError(f"{name} must be an integer >= 1, got {value!r}")
    return steps


# --------------------------------------------------------------------------------------------
# Safe-direction rounding of computed reals to Fractions
# --------------------------------------------------------------------------------------------


def _scale_for(x: float, digits: int) -> int:
    """Power of ten that keeps ``digits`` significant digits of ``x > 0``."""
    return 10 ** max(0, digits - 1 - math.floor(math.log10(x)))


def _floor_fraction(x: float, digits: int = _SIGNIFICANT_DIGITS) -> Fraction:
    """Largest Fraction with ``digits`` significant decimals that is <= the double ``x > 0``."""
    scale = _scale_for(x, digits)
    return Fraction(math.floor(Fraction(x) * scale), scale)


def _ceil_decimal_fraction(x: Decimal, digits: int = 15) -> Fraction:
    """Smallest Fraction with ``digits`` significant decimals that is >= ``x``."""
    ctx = decimal.Context(prec=digits, rounding=decimal.ROUND_CEILING)
    return Fraction(ctx.plus(x))


def _neg_log(delta: Fraction) -> float:
    """log(1/δ) for 0 < δ < 1, accurate also for δ near 1 and for δ below the double range."""
    if delta >= Fraction(1, 2):
        return -math.log1p(-float(1 - delta))
    as_float = float(delta)
    if as_float > 1e-300:
        return -math.log(as_float)
    return math.log(delta.denominator) - math.log(delta.numerator)


# --------------------------------------------------------------------------------------------
# zCDP <-> (epsilon, delta)-DP
# --------------------------------------------------------------------------------------------


def _cks_epsilon(s: float, rho: float, log_inv_delta: float) -> float:
    """CKS20 Corollary 13 at α = 1 + s, plus a rounding allowance so the result is an upper bound.

    ε(α) = ρα + log(1/(αδ))/(α−1) + log(1 − 1/α) with α = 1 + s; the last term is written as
    −log1p(1/s), exact in relative terms for both tiny and huge s.
    """
    log_alpha = math.log1p(s)
    first = rho * (1.0 + s)
    second = (log_inv_delta - log_alpha) / s
    third = -math.log1p(1.0 / s)
    # Few-ulp errors per operation, relative to the size of the terms (cancellation included).
    allowance = 16 * _ULP * (first + (log_inv_delta + log_alpha) / s - third)
    return first + second + third + allowance


def zcdp_to_approx_dp(rho: object, delta: object) -> float:
    """ε such that a ρ-zCDP mechanism is (ε, δ)-DP (Canonne, Kamath, Steinke 2020, Cor. 13).

    .. math::

        \\varepsilon = \\inf_{\\alpha > 1}\\; \\rho\\alpha
            + \\frac{\\log(1/(\\alpha\\delta))}{\\alpha - 1} + \\log(1 - 1/\\alpha).

    The objective is unimodal in α: its derivative ρ − log(1/(αδ))/(α−1)² increases on
    (1, 1/δ) and is positive beyond, so the minimiser is the unique root s* = α − 1 of
    ρs² + log(1+s) = log(1/δ), found with Brent's method on log s inside a bracket that
    provably contains it. Any α > 1 gives a valid ε, so the result is the smaller of the
    value at s* and the Bun–Steinke bound ρ + 2√(ρ log(1/δ)) [BS16, Prop. 1.3] (which the
    CKS bound never exceeds), plus a rounding allowance of a few ulps so that the float is
    an upper bound, and clamped at 0 ((ε', δ)-DP with ε' < 0 implies (0, δ)-DP).

    Parameters
    ----------
    rho
        zCDP parameter ρ > 0 (int, float, Fraction or numeric string).
    delta
        0 < δ < 1.

    Returns
    -------
    float
        ε ≥ 0. For ρ = 1/32, δ = 10⁻³ this is 0.68800245548781 (to 1e-15).
    """
    rho_q = check_range(validate_rho(rho, "rho"), _CONVERSION_RHO, "rho",
                        "the zCDP to (epsilon, delta) conversion is computed in double precision")
    delta_q = check_range(validate_delta(delta, "delta"), _CONVERSION_DELTA, "delta",
                          "log(1/delta) must stay inside double precision")
    rho_f = float(rho_q)
    if not (rho_f > 0 and math.isfinite(rho_f)):
        raise PrivacyParameterError(f"rho must be a positive number within double range, got {rho!r}")
    return _zcdp_epsilon(rho_f, _neg_log(delta_q))


def _zcdp_epsilon(rho_f: float, log_inv_delta: float) -> float:
    """:func:`zcdp_to_approx_dp` on validated doubles (ρ > 0, log(1/δ) > 0)."""
    # Root of g(s) = ρs² + log1p(s) − log(1/δ): g(0) < 0; g(s_hi) = log1p(s_hi) > 0 at the
    # Bun–Steinke point; g(s_lo) <= 0 because both of its positive terms are <= log(1/δ)/2.
    s_hi = math.sqrt(log_inv_delta / rho_f)
    s_lo = min(math.sqrt(log_inv_delta / (2.0 * rho_f)), math.expm1(log_inv_delta / 2.0))

    def stationarity(log_s: float) -> float:
        s = math.exp(log_s)
        return rho_f * s * s + math.log1p(s) - log_inv_delta

    candidates = [_cks_epsilon(s_hi, rho_f, log_inv_delta)]
    if s_lo < s_hi:
        log_s = brentq(stationarity, math.log(s_lo), math.log(s_hi), xtol=1e-15, rtol=4 * _ULP)
        candidates.append(_cks_epsilon(math.exp(log_s), rho_f, log_inv_delta))
    bun_steinke = rho_f + 2.0 * math.sqrt(rho_f * log_inv_delta)
    candidates.append(bun_steinke * (1.0 + 8 * _ULP))
    return max(0.0, min(candidates))


def approx_dp_to_zcdp(epsilon: object, delta: object) -> Fraction:
    """Largest ρ (rounded down) with ``zcdp_to_approx_dp(ρ, δ) <= ε``.

    Use it to run a zCDP accountant whose overall guarantee must be (ε, δ)-DP: any
    composition of mechanisms with total ρ-zCDP is then (ε, δ)-DP [CKS20, Cor. 13].

    The conversion ε(ρ) is continuous and increasing in ρ; the answer is bracketed between
    the Bun–Steinke inverse ρ_BS = (√(L + ε) − √L)², L = log(1/δ) (ε(ρ_BS) <= ε), and a
    doubled upper point, then bisected in log ρ to 1e-13 relative. The float is turned into
    a Fraction with 13 significant digits rounded down, and the Fraction itself is
    re-checked (stepping down if a rounding edge ever fails).

    Parameters
    ----------
    epsilon
        ε > 0.
    delta
        0 < δ < 1.

    Returns
    -------
    Fraction
        ρ > 0 with ``zcdp_to_approx_dp(ρ, δ) <= ε``, within 1e-12 relative of the supremum.
    """
    eps_q = check_range(validate_epsilon(epsilon, "epsilon"), _CONVERSION_EPSILON, "epsilon",
                        "the (epsilon, delta) to zCDP conversion is computed in double precision")
    delta_q = check_range(validate_delta(delta, "delta"), _CONVERSION_DELTA, "delta",
                          "log(1/delta) must stay inside double precision")
    eps_f = float(eps_q)
    if not (eps_f > 0 and math.isfinite(eps_f)):
        raise PrivacyParameterError(f"epsilon must be a positive number within double range, got {epsilon!r}")
    log_inv_delta = _neg_log(delta_q)

    def fits(rho_f: float) -> bool:
        return _zcdp_epsilon(rho_f, log_inv_delta) <= eps_f

    # (√(L+ε) − √L)² written without cancellation.
    lo = (eps_f / (math.sqrt(log_inv_delta + eps_f) + math.sqrt(log_inv_delta))) ** 2
    while not fits(lo):  # only the tiny rounding allowance can make the BS point fail
        lo *= 0.5
    hi = 2.0 * lo
    while fits(hi):
        lo, hi = hi, 2.0 * hi
    while hi / lo - 1.0 > 1e-13:
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid

    rho_q = _floor_fraction(lo)
    while not fits(float(rho_q)):
        rho_q = _floor_fraction(float(rho_q) * (1.0 - 1e-13))
    return rho_q


def pure_to_zcdp(epsilon: object) -> Fraction:
    """ρ = ε²/2, exactly: an ε-DP mechanism is (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
    eps_q = validate_epsilon(epsilon, "epsilon")
    return eps_q * eps_q / 2


# --------------------------------------------------------------------------------------------
# Advanced composition
# --------------------------------------------------------------------------------------------


def _decimal(q: Fraction) -> Decimal:
    return Decimal(q.numerator) / Decimal(q.denominator)


def _advanced_epsilon_decimal(eps0: Fraction, k: int, delta_prime: Fraction) -> Decimal:
    """√(2k ln(1/δ')) ε0 + k ε0 (e^{ε0} − 1) in high-precision decimal arithmetic.

    The precision grows with the number of leading zeros of ε0 so that e^{ε0} − 1 keeps
    40+ significant digits; every decimal operation is correctly rounded.
    """
    # Digits of 1/ε0 bound its leading zeros (works below the double range too).
    leading_zeros = max(0, len(str(eps0.denominator)) - len(str(eps0.numerator)) + 1)
    with decimal.localcontext() as ctx:
        ctx.prec = 60 + leading_zeros
        e0 = _decimal(eps0)
        log_inv = Decimal(delta_prime.denominator).ln() - Decimal(delta_prime.numerator).ln()
        first = (2 * k * log_inv).sqrt() * e0
        second = k * e0 * (e0.exp() - 1)
        return first + second


def advanced_composition(
    eps0: object, delta0: object, k: object, delta_prime: object
) -> tuple[Fraction, Fraction]:
    """(ε, δ) of the k-fold adaptive composition of (ε0, δ0)-DP mechanisms.

    Dwork, Rothblum, Vadhan 2010 (Theorem III.3), in the form used by the MWEM paper:

    .. math::

        \\varepsilon = \\sqrt{2k\\ln(1/\\delta')}\\,\\varepsilon_0 + k\\varepsilon_0(e^{\\varepsilon_0} - 1),
        \\qquad \\delta = k\\delta_0 + \\delta'.

    ε is evaluated with correctly rounded decimal arithmetic at ≥ 60 digits and rounded UP
    to 15 significant digits (never under-reported); δ is exact. For small k basic composition
    (kε0, kδ0) is smaller: compare before choosing.

    Parameters
    ----------
    eps0
        Per-step ε0 > 0.
    delta0
        Per-step δ0 in [0, 1) (0 for pure steps).
    k
        Number of steps, an integer >= 1.
    delta_prime
        Slack δ' in (0, 1).

    Returns
    -------
    (Fraction, Fraction)
        (ε rounded up, δ exact). δ >= 1 (a vacuous guarantee) raises PrivacyParameterError.
    """
    eps0_q = validate_epsilon(eps0, "eps0")
    delta0_q = validate_delta(delta0, "delta0", allow_zero=True)
    steps = validate_steps(k, "k")
    delta_prime_q = validate_delta(delta_prime, "delta_prime")
    delta_total = steps * delta0_q + delta_prime_q
    if delta_total >= 1:
        raise PrivacyParameterError(
            f"k*delta0 + delta_prime = {delta_total} >= 1 is vacuous (k={steps}, delta0={delta0!r}, "
            f"delta_prime={delta_prime!r})"
        )
    eps_total = _ceil_decimal_fraction(_advanced_epsilon_decimal(eps0_q, steps, delta_prime_q))
    return eps_total, delta_total


def advanced_composition_per_step(epsilon: object, delta_prime: object, k: object) -> Fraction:
    """Largest per-step ε0 (rounded down) whose k-fold advanced composition stays within ε.

    Solves √(2k ln(1/δ')) ε0 + k ε0 (e^{ε0} − 1) = ε (increasing in ε0) with Brent's method
    in doubles, rounds down to 13 significant digits, and re-checks the Fraction with the
    rounded-up :func:`advanced_composition`, stepping down until it fits.

    Parameters
    ----------
    epsilon
        Total ε > 0 for the k steps.
    delta_prime
        Slack δ' in (0, 1) (the per-step δ0 adds kδ0 to δ separately).
    k
        Number of steps, an integer >= 1.

    Returns
    -------
    Fraction
        ε0 with ``advanced_composition(ε0, 0, k, δ')[0] <= ε``, within 1e-11 relative of the
        supremum.
    """
    eps_q = validate_epsilon(epsilon, "epsilon")
    delta_prime_q = validate_delta(delta_prime, "delta_prime")
    steps = validate_steps(k, "k")
    eps_f = float(eps_q)
    if not (eps_f > 0 and math.isfinite(eps_f)):
        raise PrivacyParameterError(f"epsilon must be a positive number within double range, got {epsilon!r}")
    root = math.sqrt(2.0 * steps * _neg_log(delta_prime_q))

    def excess(x: float) -> float:
        return root * x + steps * x * math.expm1(x) - eps_f

    hi = eps_f / root  # excess(hi) >= 0: the second term is non-negative
    x = brentq(excess, 0.0, hi, xtol=1e-300, rtol=4 * _ULP) if excess(hi) > 0 else hi
    eps0_q = _floor_fraction(x)
    while advanced_composition(eps0_q, 0, steps, delta_prime_q)[0] > eps_q:
        eps0_q = _floor_fraction(float(eps0_q) * (1.0 - 1e-13))
    return eps0_q
