"""Exact discrete Laplace and discrete Gaussian samplers, vectorised over draws.

Implements Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy"
(NeurIPS 2020), Algorithms 1-3, with integer arithmetic only: every random decision is a
Bernoulli draw of an exact rational probability made from uniform 64-bit words of a
:class:`~dpopt.privacy.randomness.RandomSource`. No float enters the sampling path, so
the output laws are exactly

* discrete Laplace, ``P(x) ∝ exp(-|x| / scale)`` on the integers (Algorithm 2);
* discrete Gaussian, ``P(x) ∝ exp(-x² / (2 σ²))`` on the integers (Algorithm 3).

Vectorisation: each rejection loop runs on numpy arrays of all pending draws at once,
shrinking as draws finish; Python loops only run over loop *iterations*.

Overflow: quantities such as ``(|Y| q t - p)²`` and ``2 p q t² K`` (``σ² = p/q``) can exceed
int64. Every product is bounded before it is formed; when the bound exceeds ``2**63 - 1``
the affected elements switch to numpy object arrays of Python ints (exact, slower). Draws
never overflow silently. Parameters are used exactly unless ``max_denominator`` asks to
round them *up* (more noise, still private) to a smaller denominator; ``return_info=True``
reports what was used and whether the big-integer path ran.

Closed forms (variance, pmf) live here too, for the tests and for the mechanisms.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpopt.errors import PrivacyParameterError
from dpopt.privacy.randomness import INT64_MAX, RandomSource, make_random

__all__ = [
    "SamplerInfo",
    "bernoulli_exp",
    "discrete_laplace",
    "discrete_gaussian",
    "discrete_laplace_pmf",
    "discrete_laplace_variance",
    "discrete_gaussian_pmf",
    "discrete_gaussian_variance",
    "MAX_LAPLACE_SCALE",
    "MAX_GAUSSIAN_SIGMA2",
]

#: Largest accepted discrete Laplace scale: P(|X| > 2**63 - 1) < exp(-128) below it.
MAX_LAPLACE_SCALE = Fraction(2**56)
#: Largest accepted discrete Gaussian variance: σ <= 2**56, so P(|X| > 2**63 - 1) < exp(-8000).
MAX_GAUSSIAN_SIGMA2 = Fraction(2**112)

_SQRT_INT64_MAX = math.isqrt(INT64_MAX)
#: Up to this σ² the Gaussian normaliser and variance are direct sums over the support;
#: above it, the equivalent Poisson-summation (Jacobi theta) series (see _theta_sums).
_DIRECT_SUM_MAX_SIGMA2 = 10**6


@dataclass(frozen=True)
class SamplerInfo:
    """What a sampler call actually used.

    Attributes
    ----------
    family : str
        ``"discrete_laplace"`` or ``"discrete_gaussian"``.
    parameter : str
        ``"scale"`` or ``"sigma2"``.
    requested, used : Fraction
        The parameter as given (floats converted exactly) and as sampled; ``used >=
        requested`` always, equal unless ``rounded``.
    rounded : bool
        Whether ``max_denominator`` rounded the parameter up.
    big_integer_fallback : bool
        Whether some products exceeded int64 and were computed with Python ints.
    random_source : str
        The source's description (says "NOT private" for a seeded source).
    private : bool
        The source's ``is_private``.
    """

    family: str
    parameter: str
    requested: Fraction
    used: Fraction
    rounded: bool
    big_integer_fallback: bool
    random_source: str
    private: bool

    @property
    def arithmetic(self) -> str:
        """``"int64"`` or ``"int64 + exact Python-int fallback"``."""
        return "int64 + exact Python-int fallback" if self.big_integer_fallback else "int64"


class _Trace:
    """Records whether any step needed the big-integer path."""

    def __init__(self) -> None:
        self.big = False


# ---- public samplers -------------------------------------------------------------------
def bernoulli_exp(num, den, rng: RandomSource | None = None) -> np.ndarray:
    """Exact Bernoulli(exp(-num/den)) draws, element by element (CKS 2020, Algorithm 1).

    For ``γ = num/den <= 1``: draw ``A_k ~ Bernoulli(γ/k)`` for ``k = 1, 2, ...`` until the
    first failure at ``K``; return ``K odd`` (``P = exp(-γ)``). For ``γ > 1``: ``floor(γ)``
    draws of Bernoulli(exp(-1)) must all succeed, then one Bernoulli(exp(-(γ - floor γ))).

    Parameters
    ----------
    num, den : int or integer arrays (broadcast together)
        ``num >= 0``, ``den >= 1``. Python ints beyond int64 (object arrays) are allowed.
    rng : RandomSource, optional
        Default: a fresh :class:`~dpopt.privacy.randomness.SecureRandom`.

    Returns
    -------
    numpy.ndarray of bool
    """
    rng = _check_rng(rng)
    n_arr = _as_nonneg_int_array(num, "num")
    d_arr = _as_nonneg_int_array(den, "den")
    try:
        n_arr, d_arr = np.broadcast_arrays(n_arr, d_arr)
    except ValueError as exc:
        raise PrivacyParameterError(f"num {n_arr.shape} and den {d_arr.shape} do not broadcast") from exc
    if d_arr.size and (d_arr < 1).any():
        raise PrivacyParameterError(f"den must be at least 1; got {min(d_arr.flat)}")
    if n_arr.dtype == object or d_arr.dtype == object:
        n_arr, d_arr = n_arr.astype(object), d_arr.astype(object)
    out = _bernoulli_exp(n_arr.ravel(), d_arr.ravel(), rng, _Trace())
    return out.reshape(d_arr.shape)


def discrete_laplace(
    scale,
    size,
    rng: RandomSource | None = None,
    *,
    max_denominator: int | None = None,
    return_info: bool = False,
):
    """Exact discrete Laplace draws, ``P(x) ∝ exp(-|x| / scale)`` on the integers.

    CKS 2020, Algorithm 2 with ``scale = t/s``: ``U`` uniform on ``{0..t-1}`` kept with
    probability ``exp(-U/t)``; ``V`` Geometric (failures of Bernoulli(exp(-1)));
    ``Y = floor((U + tV)/s)``; a fair sign, rejecting ``-0``.

    Parameters
    ----------
    scale : int, Fraction or float
        Positive; a float is converted exactly (``Fraction(float)``). At most
        ``MAX_LAPLACE_SCALE``.
    size : int or tuple of int
        Output shape.
    rng : RandomSource, optional
        Default: a fresh :class:`~dpopt.privacy.randomness.SecureRandom`.
    max_denominator : int, optional
        If given and the scale's denominator exceeds it, the scale is rounded *up* to
        ``ceil(scale * max_denominator) / max_denominator``. Default: exact.
    return_info : bool
        Also return a :class:`SamplerInfo`.

    Returns
    -------
    numpy.ndarray of int64, or (array, SamplerInfo) with ``return_info``.
    """
    return _sample("discrete_laplace", "scale", scale, MAX_LAPLACE_SCALE, _laplace, size, rng,
                   max_denominator, return_info)


def discrete_gaussian(
    sigma2,
    size,
    rng: RandomSource | None = None,
    *,
    max_denominator: int | None = None,
    return_info: bool = False,
):
    """Exact discrete Gaussian draws, ``P(x) ∝ exp(-x² / (2 σ²))`` on the integers.

    CKS 2020, Algorithm 3: with ``t = floor(σ) + 1``, draw ``Y`` discrete Laplace of scale
    ``t`` and keep it with probability ``exp(-(|Y| - σ²/t)² / (2σ²))``. With ``σ² = p/q`` that
    exponent is the rational ``(|Y| q t - p)² / (2 p q t²)``.

    Parameters
    ----------
    sigma2 : int, Fraction or float
        The variance parameter σ² (positive; a float is converted exactly). At most
        ``MAX_GAUSSIAN_SIGMA2``. The actual variance is slightly smaller, see
        :func:`discrete_gaussian_variance`.
    size : int or tuple of int
        Output shape.
    rng : RandomSource, optional
        Default: a fresh :class:`~dpopt.privacy.randomness.SecureRandom`.
    max_denominator : int, optional
        If given and σ²'s denominator exceeds it, σ² is rounded *up* to
        ``ceil(σ² * max_denominator) / max_denominator`` (more noise; keeps the fast int64
        path for float inputs, whose exact denominators are near 2**52). Default: exact.
    return_info : bool
        Also return a :class:`SamplerInfo`.

    Returns
    -------
    numpy.ndarray of int64, or (array, SamplerInfo) with ``return_info``.
    """
    return _sample("discrete_gaussian", "sigma2", sigma2, MAX_GAUSSIAN_SIGMA2, _gaussian, size, rng,
                   max_denominator, return_info)


def _sample(family, parameter, value, limit, algorithm, size, rng, max_denominator, return_info):
    """Validate the parameter, round it up if asked, run ``algorithm`` on its numerator and
    denominator, and shape the int64 draws (with a :class:`SamplerInfo` if asked)."""
    requested = _as_positive_rational(value, parameter, limit)
    used = _round_up(requested, max_denominator)
    shape, n = _as_shape(size)
    rng = _check_rng(rng)
    trace = _Trace()
    out = _to_int64(algorithm(used.numerator, used.denominator, n, rng, trace)).reshape(shape)
    if not return_info:
        return out
    return out, _info(family, parameter, requested, used, trace, rng)


# ---- Algorithm 1: Bernoulli(exp(-γ)) -------------------------------------------------------
def _bernoulli_exp(num: np.ndarray, den: np.ndarray, rng: RandomSource, trace: _Trace) -> np.ndarray:
    """Bernoulli(exp(-num/den)) for 1-D arrays, any γ >= 0 (split off floor(γ) first)."""
    whole = num // den
    frac = num - whole * den
    alive = np.ones(num.size, dtype=bool)
    # floor(γ) Bernoulli(exp(-1)) draws must all succeed; run them as rounds.
    idx = np.flatnonzero(whole > 0)
    left = whole[idx]
    while idx.size:
        ok = _bernoulli_exp_minus_one(idx.size, rng)
        alive[idx[~ok]] = False
        idx, left = idx[ok], left[ok] - 1
        more = left > 0
        idx, left = idx[more], left[more]
    keep = np.flatnonzero(alive)
    alive[keep] = _bernoulli_exp_at_most_one(frac[keep], den[keep], rng, trace)
    return alive


def _bernoulli_exp_at_most_one(num: np.ndarray, den: np.ndarray, rng: RandomSource, trace: _Trace) -> np.ndarray:
    """Bernoulli(exp(-num/den)) for 0 <= num <= den: Algorithm 1 proper.

    Round ``k`` draws Bernoulli(num/(den k)) for the draws still running; those that fail
    stop with output ``k odd``. ``den * k`` is bounded before it is formed.
    """
    out = np.zeros(num.size, dtype=bool)
    active = np.arange(num.size)
    den_max = int(den.max()) if den.size else 0
    k = 1
    while active.size:
        d = den[active]
        if d.dtype != object and den_max * k > INT64_MAX:
            d = d.astype(object)
        if d.dtype == object:
            trace.big = True
        success = rng._bernoulli_unchecked(num[active], d * k)
        if k % 2 == 1:
            out[active[~success]] = True
        active = active[success]
        k += 1
    return out


def _bernoulli_exp_minus_one(n: int, rng: RandomSource) -> np.ndarray:
    """``n`` Bernoulli(exp(-1)) draws: Algorithm 1 at γ = 1, so round k is Bernoulli(1/k)."""
    out = np.zeros(n, dtype=bool)
    active = np.arange(n)
    k = 1
    while active.size:
        success = rng.uniform_below(k, size=int(active.size)) == 0
        if k % 2 == 1:
            out[active[~success]] = True
        active = active[success]
        k += 1
    return out


def _geometric_exp_minus_one(n: int, rng: RandomSource) -> np.ndarray:
    """Number of Bernoulli(exp(-1)) successes before the first failure, ``n`` times."""
    v = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        active = active[_bernoulli_exp_minus_one(active.size, rng)]
        v[active] += 1
    return v


# ---- Algorithm 2: discrete Laplace ---------------------------------------------------------
def _laplace(t: int, s: int, n: int, rng: RandomSource, trace: _Trace) -> np.ndarray:
    """``n`` discrete Laplace draws of scale t/s (1-D; int64, or object if needed)."""
    big_t = t > INT64_MAX
    parts: list[np.ndarray] = []
    need = n
    while need:
        if big_t:
            trace.big = True
            u = rng.uniform_below_big(t, size=need)
            t_arr = np.full(need, t, dtype=object)
        else:
            u = rng.uniform_below(t, size=need)
            t_arr = np.full(need, t, dtype=np.int64)
        u = u[_bernoulli_exp_at_most_one(u, t_arr, rng, trace)]  # keep U w.p. exp(-U/t)
        v = _geometric_exp_minus_one(u.size, rng)
        v_max = int(v.max()) if v.size else 0
        if u.dtype != object and t * v_max + (t - 1) <= INT64_MAX:
            x = u + t * v
        else:
            trace.big = True
            x = u.astype(object) + v.astype(object) * t
        if s > INT64_MAX and x.dtype != object:
            trace.big = True
            x = x.astype(object)
        y = x // s if s != 1 else x
        negative = rng.uniform_below(2, size=y.size) == 1
        keep = ~(negative & (y == 0))  # -0 and +0 would double-count zero
        z = np.where(negative, -y, y)[keep]
        parts.append(z[:need])
        need -= parts[-1].size
    return _concat(parts)


# ---- Algorithm 3: discrete Gaussian --------------------------------------------------------
def _gaussian(p: int, q: int, n: int, rng: RandomSource, trace: _Trace) -> np.ndarray:
    """``n`` discrete Gaussian draws of σ² = p/q (1-D; int64, or object if needed)."""
    t = math.isqrt(p // q) + 1  # floor(σ) + 1, exactly: floor(sqrt(x)) = isqrt(floor(x))
    qt = q * t
    den = 2 * p * q * t * t  # accept w.p. exp(-(|Y| q t - p)² / den)
    # |Y| up to y_lim keeps every product in int64: |(|Y| qt - p)| <= max(|Y| qt, p) <= sqrt(2**63).
    int64_ok = p <= _SQRT_INT64_MAX and den <= INT64_MAX
    y_lim = _SQRT_INT64_MAX // qt if int64_ok else -1
    parts: list[np.ndarray] = []
    need = n
    while need:
        y = _laplace(t, 1, need, rng, trace)
        ay = np.abs(y)
        in_range = (ay <= y_lim) if y.dtype != object else np.zeros(y.size, dtype=bool)
        small, large = np.flatnonzero(in_range), np.flatnonzero(~in_range)
        accept = np.zeros(y.size, dtype=bool)
        if small.size:
            diff = ay[small] * qt - p
            accept[small] = _bernoulli_exp(diff * diff, np.full(small.size, den, dtype=np.int64), rng, trace)
        if large.size:
            trace.big = True
            diff = ay[large].astype(object) * qt - p
            accept[large] = _bernoulli_exp(diff * diff, np.full(large.size, den, dtype=object), rng, trace)
        parts.append(y[accept][:need])
        need -= parts[-1].size
    return _concat(parts)


# ---- closed forms -----------------------------------------------------------------------------
def discrete_laplace_variance(scale) -> float:
    """Variance of the discrete Laplace law of ``scale``: ``2 e^{-1/s} / (1 - e^{-1/s})²``.

    Parameters
    ----------
    scale : int, Fraction or float
        Positive.
    """
    s = _as_positive_rational(scale, "scale", None)
    if s > 10**8:
        # 2e^{-a}/(1 - e^{-a})^2 = 1/(2 sinh^2(a/2)) = 2s^2 - 1/6 + O(1/s^2) with a = 1/s; the
        # closed form would divide by an underflowed square for s beyond ~1e154.
        return float(2 * s * s - Fraction(1, 6)) if s < 10**150 else math.inf
    a = 1.0 / float(s)
    return 2.0 * math.exp(-a) / math.expm1(-a) ** 2


def discrete_laplace_pmf(x, scale) -> np.ndarray:
    """``P(X = x) = tanh(1/(2s)) exp(-|x|/s)`` for the discrete Laplace law of scale ``s``.

    (``tanh(a/2) = (1 - e^{-a}) / (1 + e^{-a})`` is the normalising constant.)

    Parameters
    ----------
    x : integer array-like
        Points.
    scale : int, Fraction or float
        Positive.
    """
    a = 1.0 / float(_as_positive_rational(scale, "scale", None))
    xs = _as_integer_points(x)
    return math.tanh(a / 2.0) * np.exp(-np.abs(xs) * a)


def discrete_gaussian_pmf(x, sigma2) -> np.ndarray:
    """``P(X = x) = exp(-x²/(2σ²)) / Z`` for the discrete Gaussian law of variance parameter σ².

    ``Z = Σ_{k ∈ Z} exp(-k²/(2σ²))`` is summed over ``|k| <= 39 σ + 1`` (terms beyond are
    below 1e-330) when ``σ² <= 10**6``, and otherwise by its Poisson-summation form
    ``sqrt(2π σ²) Σ_j exp(-2π² σ² j²)`` (an exact identity; here one term suffices).

    Parameters
    ----------
    x : integer array-like
        Points.
    sigma2 : int, Fraction or float
        Positive.
    """
    s2 = float(_as_positive_rational(sigma2, "sigma2", None))
    xs = _as_integer_points(x)
    return np.exp(-(xs * xs) / (2.0 * s2)) / _gaussian_normaliser(s2)


def discrete_gaussian_variance(sigma2) -> float:
    """Variance of the discrete Gaussian law: ``Σ x² e^{-x²/2σ²} / Σ e^{-x²/2σ²}`` (<= σ²).

    For ``σ² < 1`` the two sums are taken directly over the support. For ``σ² >= 1`` the
    same ratio is evaluated by Poisson summation, an exact identity whose series converges
    after a few terms:
    ``Var = σ² Σ_j (1 - 4π²σ²j²) e^{-2π²σ²j²} / Σ_j e^{-2π²σ²j²}``. Every ``j != 0`` term
    lowers the numerator and raises the denominator, so ``Var < σ²`` (as CKS 2020 prove),
    and the float result never exceeds σ² either (unlike a rounded direct sum).

    Parameters
    ----------
    sigma2 : int, Fraction or float
        Positive.
    """
    s2 = float(_as_positive_rational(sigma2, "sigma2", None))
    if s2 < 1.0:
        x = _direct_support(s2)
        w = np.exp(-(x * x) / (2.0 * s2))
        return float(np.sum(x * x * w) / np.sum(w))
    s0, s1 = _theta_sums(s2)
    return s2 * s1 / s0


def _direct_support(s2: float) -> np.ndarray:
    half = math.ceil(39.0 * math.sqrt(s2)) + 1  # exp(-39²/2) ≈ 1e-330: below float range
    return np.arange(-half, half + 1, dtype=np.float64)


def _theta_sums(s2: float) -> tuple[float, float]:
    """``Σ_j e^{-2π²σ²j²}`` and ``Σ_j (1 - 4π²σ²j²) e^{-2π²σ²j²}`` over all integers j."""
    c = 2.0 * math.pi**2 * s2
    j = np.arange(1, math.ceil(math.sqrt(750.0 / c)) + 2, dtype=np.float64)
    e = np.exp(-c * j * j)
    return 1.0 + 2.0 * float(e.sum()), 1.0 + 2.0 * float(((1.0 - 2.0 * c * j * j) * e).sum())


def _gaussian_normaliser(s2: float) -> float:
    if s2 <= _DIRECT_SUM_MAX_SIGMA2:
        x = _direct_support(s2)
        return float(np.sum(np.exp(-(x * x) / (2.0 * s2))))
    return math.sqrt(2.0 * math.pi * s2) * _theta_sums(s2)[0]


# ---- validation and small helpers -----------------------------------------------------------------
def _as_positive_rational(value, name: str, upper: Fraction | None) -> Fraction:
    """An exact positive rational; floats are converted exactly."""
    if isinstance(value, (bool, np.bool_)):
        raise PrivacyParameterError(f"{name} must be a positive number; got {value!r}")
    if isinstance(value, numbers.Rational):
        r = Fraction(int(value.numerator), int(value.denominator))
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise PrivacyParameterError(f"{name} must be finite; got {value!r}")
        r = Fraction(float(value))
    else:
        raise PrivacyParameterError(f"{name} must be an int, Fraction or float; got {type(value).__name__}")
    if r <= 0:
        raise PrivacyParameterError(f"{name} must be positive; got {value!r}")
    if upper is not None and r > upper:
        raise PrivacyParameterError(f"{name} must be at most {upper} (int64 output); got {value!r}")
    return r


def _round_up(value: Fraction, max_denominator: int | None) -> Fraction:
    if max_denominator is None:
        return value
    if isinstance(max_denominator, (bool, np.bool_)) or not isinstance(max_denominator, numbers.Integral) \
            or max_denominator < 1:
        raise PrivacyParameterError(f"max_denominator must be a positive integer or None; got {max_denominator!r}")
    if value.denominator <= max_denominator:
        return value
    d = int(max_denominator)
    return Fraction(-((-value.numerator * d) // value.denominator), d)  # ceil(value * d) / d


def _as_shape(size) -> tuple[tuple[int, ...], int]:
    dims = (size,) if isinstance(size, numbers.Integral) else size
    ok = isinstance(dims, tuple) and all(
        isinstance(d, numbers.Integral) and not isinstance(d, (bool, np.bool_)) and d >= 0 for d in dims
    )
    if isinstance(size, (bool, np.bool_)) or not ok:
        raise PrivacyParameterError(f"size must be a non-negative integer or a tuple of them; got {size!r}")
    shape = tuple(int(d) for d in dims)
    return shape, math.prod(shape)


def _check_rng(rng) -> RandomSource:
    if rng is None:
        return make_random()
    if not isinstance(rng, RandomSource):
        raise PrivacyParameterError(f"rng must be a RandomSource (see make_random); got {type(rng).__name__}")
    return rng


def _as_nonneg_int_array(value, name: str) -> np.ndarray:
    if isinstance(value, (bool, np.bool_)):
        raise PrivacyParameterError(f"{name} must be a non-negative integer or integer array; got {value!r}")
    arr = np.asarray(value) if not isinstance(value, numbers.Integral) else np.asarray(int(value), dtype=object)
    if arr.dtype == object:
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in arr.flat):
            raise PrivacyParameterError(f"{name} must hold integers only")
        arr = np.vectorize(int, otypes=[object])(arr) if arr.size else arr
        if not arr.size or (min(arr.flat) >= -INT64_MAX - 1 and max(arr.flat) <= INT64_MAX):
            arr = arr.astype(np.int64)
    elif arr.dtype.kind == "u":
        arr = arr.astype(object) if arr.size and int(arr.max()) > INT64_MAX else arr.astype(np.int64)
    elif arr.dtype.kind != "i":
        raise PrivacyParameterError(f"{name} must be an integer or integer array; got dtype {arr.dtype}")
    if arr.size and (arr < 0).any():
        raise PrivacyParameterError(f"{name} must be non-negative; got {min(arr.flat)}")
    return arr


def _as_integer_points(x) -> np.ndarray:
    xs = np.asarray(x)
    if xs.dtype.kind not in "iu":
        if xs.dtype.kind != "f" or not np.all(np.isfinite(xs)) or not np.all(xs == np.round(xs)):
            raise PrivacyParameterError("x must hold integers (the laws live on the integers)")
    return xs.astype(np.float64)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.int64)
    if any(p.dtype == object for p in parts):
        return np.concatenate([p.astype(object) for p in parts])
    return np.concatenate(parts)


def _to_int64(draws: np.ndarray) -> np.ndarray:
    if draws.dtype != object:
        return draws.astype(np.int64, copy=False)
    if draws.size and (min(draws) < -INT64_MAX or max(draws) > INT64_MAX):
        # Unreachable in practice under the MAX_* bounds (probability below exp(-128)).
        raise PrivacyParameterError("a draw exceeded int64; lower the scale")
    return draws.astype(np.int64)


def _info(family: str, parameter: str, requested: Fraction, used: Fraction, trace: _Trace,
          rng: RandomSource) -> SamplerInfo:
    return SamplerInfo(family, parameter, requested, used, used != requested, trace.big,
                       rng.description, bool(rng.is_private))
