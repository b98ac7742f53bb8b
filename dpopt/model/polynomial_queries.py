"""Answering queries from conjunction counts through approximating polynomials (the evaluator).

Thaler, Ullman and Vadhan (ICALP 2012, Theorem 3.1's evaluator with Lemmas 4.3 and 4.6): a
query over a set ``L`` of at most ``k`` literals whose answer on a record depends only on
``s = #{true literals of L}`` -- a disjunction (``s >= 1``) or an ``h``-of-``k`` threshold
(``s >= h``) -- is approximated by ``p(s)`` for a univariate polynomial ``p``
(:mod:`dpopt.model.polynomials`). With ``p(s) = sum_m a_m C(s, m)`` (Newton coefficients),
summing over the records gives

    sum_x p(s_x) = sum_m a_m sum_{J ⊆ L, |J| = m} c_J,

where ``c_J`` is the number of records satisfying every literal of ``J`` (``c_∅ = n``): the
released conjunction counts. Every query of this module is such a *symmetric sum* with
public weights ``w_m``:

* disjunction of ``L``: ``w = a`` (``a_0 = p(0) = 0``);
* conjunction of ``L`` (Section 4.1, "via the identity" ``AND(L) = 1 - OR(not L)``):
  ``n - sum_m a_m sum_{J ⊆ not L} c_J``, i.e. ``w_0 = 1`` and ``w_m = -a_m`` over ``not L``;
* a cell ``v`` of the marginal over attributes ``S``: the conjunction of the literals
  ``x_S = v``;
* ``h``-of-``k``: ``w = b``, the Newton coefficients of the threshold polynomial.

Accuracy (the proof of Theorem 3.1): if ``|p(s) - f(s)| <= gamma`` on ``0..k``, the exact
symmetric sum is within ``gamma n`` of the true count; released counts ``c_J + z_J`` add
``sum_m w_m sum_J z_J``, at most ``sum_m |w_m| C(|L|, m) max|z|`` in absolute value (every
monomial is 0 or 1 at a query point) and of variance ``sum_m w_m^2 C(|L|, m) Var z_m``.

Non-monotone literals need the literal table (Section 4.1's universe of ``2d`` literals: the
counts of every pattern of every subset); the monotone table (all-ones patterns only) answers
monotone disjunctions and thresholds, and conjunctions and marginals only when its degree
covers the query (then by inclusion–exclusion, without approximation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from dpopt.errors import QueryError
from dpopt.model.polynomials import ApproximatingPolynomial
from dpopt.model.queries.conjunctions import (
    all_subsets,
    binomial_table,
    gather_subsets,
    pattern_counts,
    superset_sums,
)

__all__ = ["ConjunctionTable", "Answers", "symmetric_sums", "disjunction_counts", "conjunction_counts",
           "marginal_counts", "threshold_counts"]

#: Entries gathered per chunk (queries x subsets) in the vectorised kernel.
CHUNK_ENTRIES = 1 << 22


@dataclass(frozen=True, eq=False)
class ConjunctionTable:
    """Conjunction counts of every literal set of at most ``degree`` literals over ``d`` bits.

    Attributes
    ----------
    d : int
        Number of binary attributes.
    literals : bool
        True: ``counts[m]`` has shape ``(C(d, m), 2^m)`` (every pattern; Section 4.1).
        False: shape ``(C(d, m), 1)`` (the all-ones pattern: monotone conjunctions).
    counts : tuple of ndarray
        ``counts[0]`` is ``[[n]]``; subsets in colex order (:mod:`~dpopt.model.queries.conjunctions`).
    noisy : tuple of bool ndarray
        Same shapes: True where the entry carries noise (False: exact, e.g. a pattern no record
        can match).
    variances : tuple of float
        Noise variance of every noisy entry of size ``m``.
    noise_bounds : tuple of float
        A bound on ``|noise|`` of every noisy entry of size ``m`` holding for all entries at
        once with the probability stated by whoever built the table (0 without noise).
    """

    d: int
    literals: bool
    counts: tuple
    noisy: tuple
    variances: tuple
    noise_bounds: tuple
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.noisy) or len(self.counts) != len(self.variances) \
                or len(self.counts) != len(self.noise_bounds) or not self.counts:
            raise QueryError("ConjunctionTable: counts, noisy, variances and noise_bounds need one entry per size")
        per = (lambda m: 2**m) if self.literals else (lambda m: 1)
        for m, (c, z) in enumerate(zip(self.counts, self.noisy)):
            shape = (math.comb(self.d, m), per(m)) if m else (1, 1)
            if np.shape(c) != shape or np.shape(z) != shape:
                raise QueryError(f"ConjunctionTable: size {m} needs arrays of shape {shape}, got "
                                 f"{np.shape(c)} and {np.shape(z)}")

    @property
    def degree(self) -> int:
        return len(self.counts) - 1

    @property
    def total(self) -> float:
        return float(self.counts[0][0, 0])

    @classmethod
    def exact(cls, moments: list[np.ndarray], d: int, literals: bool = True) -> "ConjunctionTable":
        """The noise-free table from :func:`~dpopt.model.queries.conjunctions.conjunction_moments`."""
        counts = [np.array([[moments[0][0]]], dtype=np.float64)]
        for m in range(1, len(moments)):
            if literals:
                counts.append(pattern_counts(moments, all_subsets(d, m), d))
            else:
                counts.append(np.asarray(moments[m], dtype=np.float64)[:, None])
        t = len(counts)
        return cls(d, literals, tuple(counts), tuple(np.zeros(c.shape, dtype=bool) for c in counts),
                   (0.0,) * t, (0.0,) * t)


@dataclass(frozen=True)
class Answers:
    """Answers of a batch of queries with their error description.

    ``values`` are counts; ``variance`` is the noise variance of each; ``noise_bound`` bounds
    the noise part of each error (with the table's probability); the approximation part is at
    most ``gamma`` times the number of records (Theorem 3.1's proof).
    """

    values: np.ndarray
    variance: np.ndarray
    noise_bound: np.ndarray
    gamma: float

    def bound(self, n: float) -> np.ndarray:
        """Worst-case error bound with ``n`` records: ``gamma n + noise_bound``."""
        return self.gamma * float(n) + self.noise_bound


# ---- the kernel ----------------------------------------------------------------------------------
def _check_literal_sets(table: ConjunctionTable, attrs, signs) -> tuple[np.ndarray, np.ndarray]:
    attrs = np.asarray(attrs)
    if attrs.ndim != 2 or not np.issubdtype(attrs.dtype, np.integer):
        raise QueryError(f"attribute positions must be an integer array of shape (queries, k), got {attrs.shape}")
    attrs = attrs.astype(np.int64)
    if attrs.size and (attrs.min() < 0 or attrs.max() >= table.d):
        raise QueryError(f"attribute positions must lie in 0..{table.d - 1}")
    if attrs.shape[1] > 1 and np.any(np.diff(attrs, axis=1) <= 0):
        raise QueryError("each query must list distinct attribute positions in increasing order")
    if signs is None:
        signs = np.ones_like(attrs)
    signs = np.asarray(signs)
    if signs.shape != attrs.shape or (signs.size and not np.isin(signs, (0, 1)).all()):
        raise QueryError(f"signs must be a 0/1 array of the attributes' shape {attrs.shape}")
    signs = signs.astype(np.int64)
    if not table.literals and signs.size and signs.min() == 0:
        raise QueryError("negated literals need the literal table (universe = \"literals\", Section 4.1); "
                         "this release holds monotone conjunction counts only")
    return attrs, signs


def symmetric_sums(table: ConjunctionTable, attrs, signs, weights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum_m w_m sum_{J ⊆ L, |J| = m} c_J`` for every literal set ``L`` (rows of ``attrs``/``signs``).

    Returns the sums, their noise variances and the bounds on their noise. Vectorised: for
    every size ``m`` the ``C(k, m)`` sub-literal-sets of all queries are ranked (colex) and
    gathered at once, in chunks of :data:`CHUNK_ENTRIES` entries.
    """
    attrs, signs = _check_literal_sets(table, attrs, signs)
    q, k = attrs.shape
    w = [float(x) for x in weights]
    top = min(len(w) - 1, k)
    if top > table.degree and any(w[m] != 0 for m in range(table.degree + 1, top + 1)):
        raise QueryError(f"the weights need conjunctions of up to {top} literals; the table holds {table.degree}")
    values, variance, bound = np.zeros(q), np.zeros(q), np.zeros(q)
    for m in range(top + 1):
        if w[m] == 0:
            continue
        if m == 0:
            values += w[0] * table.total
            variance += w[0] ** 2 * table.variances[0] * float(table.noisy[0][0, 0])
            bound += abs(w[0]) * table.noise_bounds[0] * float(table.noisy[0][0, 0])
            continue
        combos = np.array(list(combinations(range(k), m)), dtype=np.int64)  # (C, m)
        binom = binomial_table(table.d, m)
        bits = np.int64(1) << np.arange(m - 1, -1, -1, dtype=np.int64)
        step = max(1, CHUNK_ENTRIES // combos.shape[0])
        for lo in range(0, q, step):
            sub = attrs[lo:lo + step][:, combos]  # (chunk, C, m), increasing along the last axis
            rank = binom[sub, np.arange(1, m + 1)].sum(axis=2)
            col = (signs[lo:lo + step][:, combos] @ bits) if table.literals else np.zeros_like(rank)
            values[lo:lo + step] += w[m] * table.counts[m][rank, col].sum(axis=1)
            noisy = table.noisy[m][rank, col].sum(axis=1)
            variance[lo:lo + step] += w[m] ** 2 * table.variances[m] * noisy
            bound[lo:lo + step] += abs(w[m]) * table.noise_bounds[m] * noisy
    return values, variance, bound


# ---- query families -----------------------------------------------------------------------------
def disjunction_counts(table: ConjunctionTable, poly: ApproximatingPolynomial, attrs, signs=None) -> Answers:
    """Records satisfying some literal of each row (Lemma 4.3; non-monotone via Section 4.1)."""
    _check_poly(poly, 1, np.shape(attrs)[-1])
    values, var, bound = symmetric_sums(table, attrs, signs, poly.coefficients_float())
    return Answers(values, var, bound, float(poly.gamma))


def threshold_counts(table: ConjunctionTable, poly: ApproximatingPolynomial, attrs, signs=None) -> Answers:
    """Records satisfying at least ``poly.threshold`` literals of each row (Lemma 4.6)."""
    _check_poly(poly, poly.threshold, np.shape(attrs)[-1])
    values, var, bound = symmetric_sums(table, attrs, signs, poly.coefficients_float())
    return Answers(values, var, bound, float(poly.gamma))


def conjunction_counts(table: ConjunctionTable, poly: ApproximatingPolynomial, attrs, signs=None) -> Answers:
    """Records satisfying every literal of each row.

    Literal table: ``n - disjunction(not L)`` (Section 4.1's identity), within
    ``gamma n`` plus the noise of ``n`` and of the disjunction. Monotone table: only when its
    degree covers the conjunction, which is then read off exactly (inclusion–exclusion of
    the exact disjunction polynomial leaves the one count ``c_L``).
    """
    attrs = np.asarray(attrs)
    k = attrs.shape[-1]
    if table.literals:
        _check_poly(poly, 1, k)
        flipped = 1 - (np.ones_like(attrs) if signs is None else np.asarray(signs))
        weights = -poly.coefficients_float()
        weights[0] = 1.0
        values, var, bound = symmetric_sums(table, attrs, flipped, weights)
        return Answers(values, var, bound, float(poly.gamma))
    _monotone_cover(table, k, "conjunctions")
    weights = np.zeros(k + 1)
    weights[k] = 1.0
    values, var, bound = symmetric_sums(table, attrs, signs, weights)
    return Answers(values, var, bound, 0.0)


def marginal_counts(table: ConjunctionTable, poly: ApproximatingPolynomial, attrs) -> Answers:
    """Every cell of the marginal over each row of attribute positions: arrays ``(queries, 2^k)``.

    Cells in C order (the first attribute most significant), as
    :class:`~dpopt.model.queries.marginal.Marginal`. Each cell is the conjunction of its
    literals (:func:`conjunction_counts`).
    """
    attrs = np.asarray(attrs, dtype=np.int64)
    q, k = attrs.shape
    if table.literals:
        patterns = ((np.arange(2**k)[:, None] >> np.arange(k - 1, -1, -1)) & 1).astype(np.int64)  # (2^k, k)
        rep_attrs = np.repeat(attrs, 2**k, axis=0)
        rep_signs = np.tile(patterns, (q, 1))
        ans = conjunction_counts(table, poly, rep_attrs, rep_signs)
        shape = (q, 2**k)
        return Answers(ans.values.reshape(shape), ans.variance.reshape(shape), ans.noise_bound.reshape(shape),
                       ans.gamma)
    _monotone_cover(table, k, "marginals")
    _check_literal_sets(table, attrs, None)
    moments = [c[:, 0] for c in table.counts]
    values = pattern_counts(moments, attrs, table.d)
    var_m = [np.where(z[:, 0], v, 0.0) for z, v in zip(table.noisy, table.variances)]
    bound_m = [np.where(z[:, 0], b, 0.0) for z, b in zip(table.noisy, table.noise_bounds)]
    # Each cell is a signed sum of sub-subset counts: variances and bounds add without signs.
    variance = superset_sums(gather_subsets(var_m, attrs, table.d), k)
    bound = superset_sums(gather_subsets(bound_m, attrs, table.d), k)
    return Answers(values, variance, bound, 0.0)


def _monotone_cover(table: ConjunctionTable, k: int, what: str) -> None:
    if table.degree < k:
        raise QueryError(f"{what} over {k} attributes from a monotone table need its degree >= {k} "
                         f"(it has {table.degree}); release the literal table (universe = \"literals\") instead")


def _check_poly(poly: ApproximatingPolynomial, threshold: int, k: int) -> None:
    if not isinstance(poly, ApproximatingPolynomial):
        raise QueryError(f"expected an ApproximatingPolynomial, got {type(poly).__name__}")
    if poly.threshold != threshold:
        raise QueryError(f"the polynomial approximates {poly.target}, not the threshold {threshold}")
    if k > poly.k:
        raise QueryError(f"queries over {k} literals need a polynomial built for k >= {k}; it has k = {poly.k}")
