"""Exact i.i.d. draws from a multiplicative-weights distribution ``P(i) ∝ exp(c · u_i)``.

The query player of DualQuery (Gaboardi et al., ICML 2014) samples ``s`` queries per round,
``s`` up to 10^5, from weights ``exp(η Σ_t (q(D) - q(x_t)))``. Its privacy proof bounds the
ratio of these probabilities between neighbouring datasets, so the draws must follow them
exactly: a floating-point alias table quantises each probability to multiples of 2^-53 per
column, which for probabilities far below that breaks the ratio bound (Mironov 2012 shows the
same failure for floating-point Laplace noise). Here the log-weights are ``c · u_i`` with
integer scores ``u_i`` and a rational ``c``, and every draw is exact:

1. ``γ_i = c (u_max - u_i) = k_i + f_i``, ``k_i`` an integer and ``0 <= f_i < 1`` rational
   (integer arithmetic only); the queries sharing ``k_i`` form bucket ``k``.
2. A bucket is drawn with probability ``n_k e^{-k} / Σ_j n_j e^{-j}`` by *certified
   inversion*: the cumulative probabilities are computed in decimal arithmetic at 50+
   digits with a rigorous error bound, turned into integer thresholds on the 2^63 grid of a
   uniform word, and a word that falls within the error bound of a threshold (probability
   about 10^-19 per draw) is refined with further words at higher precision until decided.
3. A query is drawn uniformly in the bucket (exact uniform integers) and accepted with
   probability ``exp(-f_i)`` (the exact Bernoulli of Canonne, Kamath, Steinke 2020); a
   rejected proposal is redrawn from step 2.

The proposal has ``P(i) ∝ e^{-k_i}`` and acceptance ``e^{-f_i}``, so an accepted draw has
``P(i) ∝ e^{-γ_i}`` exactly; acceptance is at least ``e^{-1}``, and each batch of draws is
vectorised (no Python loop over queries or draws). This is the "alias table or equivalent" of
the DualQuery issue: the buckets play the role of the alias table's columns.
"""

from __future__ import annotations

import decimal
from decimal import Decimal
from fractions import Fraction

import numpy as np

from dpopt.errors import PrivacyParameterError
from dpopt.privacy.accountant import as_fraction
from dpopt.privacy.randomness import RandomSource
from dpopt.privacy.samplers import bernoulli_exp

__all__ = ["sample_exp_weights", "exp_weights_probabilities"]

#: Bits of the uniform word used for a bucket draw (the thresholds live on this grid; 63 keeps
#: every threshold, 2^63 included, inside uint64).
GRID_BITS = 63
#: Decimal digits of the cumulative bucket probabilities (plus the digits of the bucket count).
PRECISION = 50


def sample_exp_weights(scores, coef, size: int, rng: RandomSource) -> np.ndarray:
    """``size`` independent indices ``i`` drawn with probability ``∝ exp(coef · scores[i])``, exactly.

    Parameters
    ----------
    scores : integer array, shape (m,)
        Integer scores ``u_i`` (any range; only differences to the largest matter).
    coef : Fraction, int or str
        The rational ``c >= 0`` (``0`` gives the uniform distribution).
    size : int
        Number of draws.
    rng : RandomSource
        The random source (a secure one for a private release).

    Returns
    -------
    ndarray of int64, shape (size,)
    """
    u = _integer_scores(scores)
    c = as_fraction(coef, "coef")
    if c < 0:
        raise PrivacyParameterError(f"coef must be >= 0, got {coef!r}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise PrivacyParameterError(f"size must be a non-negative integer, got {size!r}")
    size = int(size)
    if not isinstance(rng, RandomSource):
        raise PrivacyParameterError(f"rng must be a RandomSource (see make_random), got {type(rng).__name__}")
    if size == 0:
        return np.zeros(0, dtype=np.int64)
    if c == 0:
        return rng.uniform_below(u.size, size)
    buckets = _Buckets(u, c)
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:  # rounds of rejection; each accepts a share >= 1/e of what is left
        bucket = buckets.draw(todo.size, rng)
        member = buckets.starts[bucket] + rng.uniform_below(buckets.counts[bucket])
        index = buckets.order[member]
        accept = bernoulli_exp(buckets.frac[index], buckets.den, rng)
        out[todo[accept]] = index[accept]
        todo = todo[~accept]
    return out


def exp_weights_probabilities(scores, coef) -> np.ndarray:
    """The probabilities ``exp(coef · u_i) / Σ_j exp(coef · u_j)`` in floating point (tests, reports)."""
    u = _integer_scores(scores)
    c = float(as_fraction(coef, "coef"))
    logw = c * (u - u.max()).astype(np.float64)
    w = np.exp(logw)
    return w / w.sum()


def _integer_scores(scores) -> np.ndarray:
    u = np.asarray(scores)
    if u.ndim != 1 or u.size == 0:
        raise PrivacyParameterError(f"scores must be a non-empty 1-D integer array, got shape {u.shape}")
    if u.dtype.kind not in "iu":
        raise PrivacyParameterError(f"scores must be integers (exact log-weights), got dtype {u.dtype}")
    return u.astype(np.int64)


class _Buckets:
    """The queries grouped by the integer part of ``γ_i``, with certified bucket thresholds."""

    def __init__(self, u: np.ndarray, c: Fraction) -> None:
        d = int(u.max()) - u  # >= 0, exact
        a, b = c.numerator, c.denominator
        if int(d.max()) * a >= 2**62 or b >= 2**62:
            prod = d.astype(object) * a
            whole = (prod // b).astype(np.int64)
            self.frac = np.asarray(prod % b, dtype=object)
        else:
            prod = d * a
            whole, self.frac = prod // b, prod % b
        self.den = b
        # Bucket exponents are small non-negative integers (at most about 2 η T): a bincount and
        # a radix sort (stable sort of 16-bit keys) group the queries without a comparison sort.
        per_key = np.bincount(whole)
        self.keys = np.flatnonzero(per_key).astype(np.int64)   # bucket exponents k, ascending from 0
        self.counts = per_key[self.keys].astype(np.int64)       # n_k
        rank = np.zeros(per_key.size, dtype=np.int64)
        rank[self.keys] = np.arange(self.keys.size)
        bucket_of = rank[whole]
        narrow = np.int16 if self.keys.size < 2**15 else np.int64
        self.order = np.argsort(bucket_of.astype(narrow), kind="stable")
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self._thresholds(PRECISION + len(str(self.keys.size)))

    # ---- certified cumulative probabilities ---------------------------------------------------
    def _cumulative(self, prec: int) -> tuple[list[Decimal], Decimal]:
        """``C_j = Σ_{i<=j} n_i e^{-k_i} / Z`` at ``prec`` digits, and a bound on their error."""
        with decimal.localcontext() as ctx:
            ctx.prec = prec
            weights = [Decimal(int(n)) * Decimal(-int(k)).exp() for n, k in zip(self.counts, self.keys)]
            total = sum(weights, Decimal(0))
            running, cum = Decimal(0), []
            for w in weights:  # one term per bucket (at most about 2 η T of them)
                running += w
                cum.append(running / total)
            # Each exp, product, sum and quotient is correctly rounded (relative 10^(1-prec));
            # the cumulative sums carry at most about 3K + 5 such errors.
            err = Decimal(3 * len(weights) + 10) * Decimal(10) ** (1 - prec)
        return cum, err

    def _thresholds(self, prec: int) -> None:
        cum, err = self._cumulative(prec)
        scale = Decimal(2) ** GRID_BITS
        with decimal.localcontext() as ctx:
            ctx.prec = prec + 25
            lo = [int(((c - err) * scale).to_integral_value(rounding=decimal.ROUND_FLOOR)) for c in cum[:-1]]
            hi = [int(((c + err) * scale).to_integral_value(rounding=decimal.ROUND_CEILING)) for c in cum[:-1]]
        cap = 2**GRID_BITS
        # Boundary j (between buckets j and j+1) is certainly passed by a word w >= hi_j and
        # certainly not by one with w + 1 <= lo_j; a word in [lo_j, hi_j) is undecided.
        self.lo = np.asarray([min(max(v, 0), cap) for v in lo], dtype=np.uint64)
        self.hi = np.asarray([min(max(v, 0), cap) for v in hi], dtype=np.uint64)

    # ---- drawing buckets ----------------------------------------------------------------------
    def draw(self, n: int, rng: RandomSource) -> np.ndarray:
        """``n`` bucket indices with probabilities ``n_k e^{-k} / Z``."""
        if self.lo.size == 0:  # one bucket: nothing to draw
            return np.zeros(n, dtype=np.int64)
        w = rng.words(n) >> np.uint64(64 - GRID_BITS)
        idx = np.searchsorted(self.hi, w, side="right")
        undecided = np.flatnonzero((idx < self.lo.size) & (self.lo[np.minimum(idx, self.lo.size - 1)] <= w))
        for i in undecided:  # about 10^-19 per draw: refine with more words, one at a time
            idx[i] = self._refine(int(w[i]), rng)
        return idx.astype(np.int64)

    def _refine(self, word: int, rng: RandomSource) -> int:
        """The bucket of ``U = (word + V) / 2^GRID_BITS``, ``V`` uniform on [0, 1), drawn lazily."""
        numer, bits = word, GRID_BITS
        prec = PRECISION + len(str(len(self.keys)))
        while True:
            numer = (numer << 64) | int(rng.words(1)[0])
            bits += 64
            prec += 25
            cum, err = self._cumulative(prec)
            with decimal.localcontext() as ctx:
                ctx.prec = prec + 25
                low = Decimal(numer) / (Decimal(2) ** bits)
                high = Decimal(numer + 1) / (Decimal(2) ** bits)
            # U lies in [low, high): decided once no boundary C_j (within err) meets that interval.
            below = sum(1 for c in cum[:-1] if c + err <= low)
            if below == len(cum) - 1 or high <= cum[below] - err:
                return below
