"""Univariate polynomials that approximate symmetric Boolean functions on ``{0, 1, ..., k}``.

Thaler, Ullman, Vadhan, "Faster Algorithms for Privately Releasing Marginals" (ICALP 2012; the
seed text is the arXiv version) approximate a query on a record ``x`` by ``p(<x, y>)``, where
``y`` is the query's indicator vector and ``<x, y>`` takes the integer values ``0..k`` for
queries over at most ``k`` attributes:

* monotone ``k``-way disjunctions (Fact 4.2, Lemma 4.3): ``p(0) = 0`` and
  ``1 - gamma <= p(j) <= 1 + gamma`` for ``1 <= j <= k``;
* ``h``-of-``k`` threshold queries (Lemma 4.5, after Sherstov): ``|p(j)| <= gamma`` for
  ``j < h`` and ``|p(j) - 1| <= gamma`` for ``h <= j <= k``.

Only the values at the integers ``0..k`` matter, so a polynomial is stored exactly (in
rationals) by its **Newton coefficients** ``a_m = Delta^m p(0)`` (forward differences at 0):
``p(j) = sum_m a_m C(j, m)``. These are exactly the coefficients the release needs: on a
Boolean ``y``, ``C(<x, y>, m)`` counts the ``m``-subsets of ``supp(x) ∩ supp(y)``, so the
multilinear form of ``p(<x, y>)`` has coefficient ``a_|T| x_T`` on the monomial ``y_T``
(:mod:`dpopt.model.queries.conjunctions` counts the ``x_T``).

Constructions
-------------
``chebyshev_disjunction``
    The explicit Chebyshev construction behind Fact 4.2 (the seed text cites [17, Theorem 8]
    and [15, Claim 5.4]; its formulas did not survive the text extraction, so the form used
    here is the standard one and is *verified*, not assumed):
    ``p(x) = 1 - T_r(u(x)) / T_r(u(0))`` with ``u(x) = (k + 1 - 2x) / (k - 1)``, which maps
    ``[1, k]`` onto ``[-1, 1]`` and ``0`` to ``1 + 2/(k - 1)``. Then ``p(0) = 0`` and
    ``|p(j) - 1| <= 1 / T_r(1 + 2/(k-1))`` on ``1..k``; the least ``r`` with
    ``T_r(1 + 2/(k-1)) >= 1/gamma`` is ``O(sqrt(k) log(1/gamma))``, the degree of Fact 4.2.
``minimax_polynomial`` / ``min_degree_polynomial``
    The best polynomial of a given degree, by a linear program (Fact 4.2 and Lemma 4.5 both
    name linear programming as a way to build them), solved by HiGHS in the Chebyshev basis of
    ``[0, k]`` (well conditioned), then converted to exact rationals and certified; and the
    least degree whose certified error is at most ``gamma``.
``exact_polynomial``
    The degree-``min(k, ...)`` interpolant of the target itself (``gamma = 0``): with a degree
    of ``k`` nothing is gained by approximating, since only ``0..k`` matter.

Every polynomial carries ``gamma``, the exact maximum of ``|p(j) - target(j)|`` over
``j = 0..k``, recomputed in rational arithmetic from the stored coefficients (the certificate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Sequence

import numpy as np

from dpopt.errors import ParameterError, SolverError

__all__ = [
    "ApproximatingPolynomial", "chebyshev_disjunction", "exact_polynomial", "minimax_polynomial",
    "min_degree_polynomial", "disjunction_polynomial", "threshold_polynomial", "CONSTRUCTIONS",
]

#: How a polynomial is built (see the module notes).
CONSTRUCTIONS = ("minimax", "chebyshev", "exact")


@dataclass(frozen=True)
class ApproximatingPolynomial:
    """A univariate polynomial used at the integers ``0..k``, stored by its Newton coefficients.

    Attributes
    ----------
    newton : tuple of Fraction
        ``a_m = Delta^m p(0)`` for ``m = 0..degree`` (so ``p(j) = sum_m a_m C(j, m)``).
    k : int
        The largest integer the polynomial is used at (queries over at most ``k`` attributes).
    threshold : int
        ``h``: the target is ``1[j >= h]`` (``h = 1``: disjunctions, Fact 4.2).
    construction : str
        ``"chebyshev"``, ``"minimax"`` or ``"exact"``.
    gamma : Fraction
        Certified: the exact ``max_{0 <= j <= k} |p(j) - 1[j >= h]|``.
    """

    newton: tuple[Fraction, ...]
    k: int
    threshold: int
    construction: str
    gamma: Fraction

    def __post_init__(self) -> None:
        newton = tuple(Fraction(a) for a in self.newton)
        while len(newton) > 1 and newton[-1] == 0:
            newton = newton[:-1]
        object.__setattr__(self, "newton", newton)
        if self.threshold == 1 and newton[0] != 0:
            raise SolverError("a disjunction polynomial must have p(0) = 0 exactly (Fact 4.2)")
        if self.gamma != certified_error(newton, self.k, self.threshold):
            raise SolverError("the stated gamma is not the certified error of the coefficients")

    @property
    def degree(self) -> int:
        return len(self.newton) - 1

    @property
    def target(self) -> str:
        return "disjunction" if self.threshold == 1 else f"at least {self.threshold} of k"

    def values(self, points: Sequence[int] | None = None) -> list[Fraction]:
        """Exact ``p(j)`` at integer points (default ``0..k``)."""
        pts = range(self.k + 1) if points is None else points
        return [newton_value(self.newton, int(j)) for j in pts]

    def coefficients_float(self) -> np.ndarray:
        """The Newton coefficients as floats (what the evaluator multiplies by)."""
        return np.array([float(a) for a in self.newton])

    def monomial_coefficients(self) -> tuple[Fraction, ...]:
        """``c_i`` with ``p(x) = sum_i c_i x^i`` (exact): Fact 4.2's item on coefficient size."""
        coeffs = [Fraction(0)] * (self.degree + 1)
        falling = [Fraction(1)]  # x (x - 1) ... (x - m + 1) / m!, built up in m
        for m, a in enumerate(self.newton):
            if m > 0:
                nxt = [Fraction(0)] * (len(falling) + 1)
                for i, c in enumerate(falling):  # multiply by (x - (m - 1)) / m
                    nxt[i + 1] += c / m
                    nxt[i] -= c * (m - 1) / m
                falling = nxt
            for i, c in enumerate(falling):
                coeffs[i] += a * c
        return tuple(coeffs)

    def lemma43_norm(self, d: int) -> Fraction:
        """The L1 bound of Lemma 4.3's proof: ``sum_j |c_j| d^j`` (monomial coefficients ``c_j``).

        The proof expands ``(sum_i x_i y_i)^j`` into at most ``d^j`` terms with non-negative
        integer coefficients summing to at most ``d^j``; it bounds the L1 norm of one record's
        coefficient vector. :meth:`record_l1` is the exact norm of the multilinear form.
        """
        return sum((abs(c) * Fraction(d) ** j for j, c in enumerate(self.monomial_coefficients())), Fraction(0))

    def record_l1(self, d: int) -> Fraction:
        """Exact L1 norm of one record's multilinear coefficient vector at worst: ``sum_m |a_m| C(d, m)``.

        A record with ``s`` ones has ``C(s, m)`` monomials of degree ``m``, each with coefficient
        ``a_m``; the all-ones record is the worst. (In the extended universe of Section 4.1 every
        record satisfies exactly ``C(d, m)`` literal sets of size ``m``, the same count.)
        """
        return sum((abs(a) * math.comb(d, m) for m, a in enumerate(self.newton)), Fraction(0))

    def describe(self) -> str:
        return (f"{self.construction} polynomial for {self.target} over k = {self.k}: degree {self.degree}, "
                f"certified gamma = {float(self.gamma):.3g}")


# ---- exact helpers ---------------------------------------------------------------------------------
def newton_value(newton: Sequence[Fraction], j: int) -> Fraction:
    """``sum_m a_m C(j, m)`` for an integer ``j >= 0``."""
    return sum((a * math.comb(j, m) for m, a in enumerate(newton)), Fraction(0))


def forward_differences(values: Sequence[Fraction]) -> tuple[Fraction, ...]:
    """``Delta^m p(0)`` for ``m = 0..len(values)-1`` from ``p(0), p(1), ...``."""
    row = [Fraction(v) for v in values]
    out = []
    while row:
        out.append(row[0])
        row = [b - a for a, b in zip(row, row[1:])]
    return tuple(out)


def certified_error(newton: Sequence[Fraction], k: int, threshold: int) -> Fraction:
    """Exact ``max_{0 <= j <= k} |p(j) - 1[j >= threshold]|``."""
    return max(abs(newton_value(newton, j) - (1 if j >= threshold else 0)) for j in range(k + 1))


def _check_k(k, threshold) -> tuple[int, int]:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ParameterError(f"k must be a positive integer (the largest number of attributes a query reads), got {k!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)) or not 1 <= threshold <= k:
        raise ParameterError(f"threshold must be an integer in 1..k = {k}, got {threshold!r}")
    return int(k), int(threshold)


def _check_gamma(gamma) -> Fraction:
    try:
        g = Fraction(str(gamma)) if isinstance(gamma, float) else Fraction(gamma)
    except (TypeError, ValueError):
        raise ParameterError(f"gamma must be a number in [0, 1), got {gamma!r}") from None
    if not 0 <= g < 1:
        raise ParameterError(f"gamma must be in [0, 1) (the approximation error of the polynomial), got {gamma!r}")
    return g


def _check_degree(degree) -> int:
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 1:
        raise ParameterError(f"degree must be a positive integer, got {degree!r}")
    return int(degree)


# ---- constructions ---------------------------------------------------------------------------------
def exact_polynomial(k: int, threshold: int = 1) -> ApproximatingPolynomial:
    """The interpolant of ``1[j >= threshold]`` at ``0..k`` (degree at most ``k``, gamma = 0).

    For disjunctions ``a_m = (-1)^{m+1}`` (inclusion–exclusion).
    """
    k, threshold = _check_k(k, threshold)
    newton = forward_differences([1 if j >= threshold else 0 for j in range(k + 1)])
    return ApproximatingPolynomial(newton, k, threshold, "exact", Fraction(0))


def _chebyshev_value(r: int, u: Fraction) -> Fraction:
    """``T_r(u)`` exactly (three-term recurrence)."""
    prev, cur = Fraction(1), u
    if r == 0:
        return prev
    for _ in range(r - 1):
        prev, cur = cur, 2 * u * cur - prev
    return cur


def chebyshev_disjunction(k: int, gamma=None, *, degree: int | None = None) -> ApproximatingPolynomial:
    """Fact 4.2's Chebyshev polynomial for ``k``-way disjunctions (module notes).

    Give ``gamma`` (the least degree ``r`` with ``T_r(1 + 2/(k-1)) >= 1/gamma`` is taken) or
    ``degree``. When the degree reaches ``k`` the exact interpolant is returned instead: on
    ``0..k`` a degree-``k`` polynomial can be exact.
    """
    k, _ = _check_k(k, 1)
    if (gamma is None) == (degree is None):
        raise ParameterError("chebyshev_disjunction: give exactly one of gamma or degree")
    if k == 1:
        return exact_polynomial(1)
    u0 = Fraction(k + 1, k - 1)
    if degree is None:
        g = _check_gamma(gamma)
        if g == 0:
            return exact_polynomial(k)
        r, top = 1, u0
        while top < 1 / g and r < k:
            r += 1
            top = _chebyshev_value(r, u0)
        if top < 1 / g:
            return exact_polynomial(k)
    else:
        r = _check_degree(degree)
        top = _chebyshev_value(r, u0)
    if r >= k:
        return exact_polynomial(k)
    values = [1 - _chebyshev_value(r, Fraction(k + 1 - 2 * j, k - 1)) / top for j in range(r + 1)]
    newton = forward_differences(values)
    return ApproximatingPolynomial(newton, k, 1, "chebyshev", certified_error(newton, k, 1))


@lru_cache(maxsize=256)
def minimax_polynomial(k: int, degree: int, threshold: int = 1) -> ApproximatingPolynomial:
    """The degree-``degree`` polynomial with the least error at ``0..k`` (an LP), certified exactly.

    Variables: the Chebyshev coefficients ``b_0..b_t`` of ``p`` on ``[0, k]``
    (``p(x) = sum_i b_i T_i(2x/k - 1)``; every ``|T_i| <= 1`` there, so the LP is well
    conditioned) and the error ``g``; minimise ``g`` subject to
    ``|p(j) - 1[j >= h]| <= g`` for ``j = 0..k`` (and ``p(0) = 0`` for disjunctions, Fact 4.2).
    The optimal vertex is then re-solved in rational arithmetic from the rows HiGHS reports
    active (:func:`_exact_vertex`), which gives the exact optimum (e.g. ``1/7`` for ``k = 3``,
    degree 2); should that fail, the float solution itself is read as exact rationals with
    ``p(0)`` set to 0 by moving the constant. Either way the error is recomputed exactly at
    ``0..k``: that figure is ``gamma``.
    """
    from scipy.optimize import linprog

    k, threshold = _check_k(k, threshold)
    t = _check_degree(degree)
    if t >= k:
        return exact_polynomial(k, threshold)
    j = np.arange(k + 1)
    u = 2.0 * j / k - 1.0
    cheb = np.cos(np.outer(np.arccos(np.clip(u, -1.0, 1.0)), np.arange(t + 1)))  # T_i(u_j), (k+1, t+1)
    target = (j >= threshold).astype(np.float64)
    # Rows: p(j) - g <= target_j and -p(j) - g <= -target_j.
    ones = np.ones((k + 1, 1))
    a_ub = np.vstack([np.hstack([cheb, -ones]), np.hstack([-cheb, -ones])])
    b_ub = np.concatenate([target, -target])
    cost = np.zeros(t + 2)
    cost[-1] = 1.0
    eq = dict(A_eq=np.hstack([cheb[:1], [[0.0]]]), b_eq=[0.0]) if threshold == 1 else {}
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(None, None)] * (t + 1) + [(0, None)], method="highs", **eq)
    if res.status != 0:
        raise SolverError(f"minimax_polynomial: HiGHS (scipy.optimize.linprog) did not solve the LP for k = {k}, "
                          f"degree {t}: {res.message}")
    b = [Fraction(float(v)) for v in res.x[: t + 1]]
    values = []
    for jj in range(t + 1):  # p(0..t) determine the degree-t polynomial
        uj = Fraction(2 * jj - k, k)
        values.append(sum((bi * _chebyshev_value(i, uj) for i, bi in enumerate(b)), Fraction(0)))
    if threshold == 1:
        values = [v - values[0] for v in values]
    newton = forward_differences(values)
    best = ApproximatingPolynomial(newton, k, threshold, "minimax", certified_error(newton, k, threshold))
    vertex = _exact_vertex(k, t, threshold, res.ineqlin.marginals)
    if vertex is not None:
        exact = ApproximatingPolynomial(vertex, k, threshold, "minimax", certified_error(vertex, k, threshold))
        if exact.gamma <= best.gamma:
            best = exact
    return best


def _exact_vertex(k: int, t: int, threshold: int, duals: np.ndarray) -> tuple[Fraction, ...] | None:
    """The LP's optimal vertex in exact rationals, from the constraints HiGHS reports active.

    An optimal basic solution satisfies ``p(j) - 1[j >= h] = s_j g`` with equality on as many
    active rows (non-zero duals; ``s_j = +1`` for an upper row, ``-1`` for a lower one) as
    there are unknowns: the Newton coefficients (``a_0 = 0`` for disjunctions) and ``g``. That
    square system is solved in rational arithmetic; None when the rows do not give a
    non-singular system of the right size (the float solution is kept then).
    """
    duals = np.asarray(duals, dtype=np.float64)
    n_points = k + 1
    active = [(j, 1) for j in range(n_points) if abs(duals[j]) > 1e-9]
    active += [(j, -1) for j in range(n_points) if abs(duals[n_points + j]) > 1e-9]
    first = 1 if threshold == 1 else 0
    unknowns = t + 1 - first + 1
    if len(active) != unknowns:
        return None
    rows = [[Fraction(math.comb(j, m)) for m in range(first, t + 1)] + [Fraction(-sign)] for j, sign in active]
    rhs = [Fraction(1 if j >= threshold else 0) for j, _ in active]
    solution = _solve_rational(rows, rhs)
    if solution is None:
        return None
    return tuple([Fraction(0)] * first + solution[:-1])


def _solve_rational(matrix: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction] | None:
    """Gauss–Jordan elimination in exact rationals; None when the matrix is singular."""
    n = len(matrix)
    aug = [row[:] + [r] for row, r in zip(matrix, rhs)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if aug[r][col] != 0), None)
        if pivot is None:
            return None
        aug[col], aug[pivot] = aug[pivot], aug[col]
        inv = 1 / aug[col][col]
        aug[col] = [v * inv for v in aug[col]]
        for r in range(n):
            if r != col and aug[r][col] != 0:
                factor = aug[r][col]
                aug[r] = [a - factor * c for a, c in zip(aug[r], aug[col])]
    return [aug[r][n] for r in range(n)]


def min_degree_polynomial(k: int, gamma, threshold: int = 1) -> ApproximatingPolynomial:
    """The least degree whose certified minimax error is at most ``gamma`` (the LP at each degree).

    The minimax error does not increase with the degree, so the degrees are searched by
    bisection; the exact interpolant (degree ``<= k``) is the last resort, with ``gamma = 0``.
    """
    k, threshold = _check_k(k, threshold)
    g = _check_gamma(gamma)
    if g == 0:
        return exact_polynomial(k, threshold)
    lo, hi = 1, k  # minimax_polynomial(k, k) is the exact interpolant
    best = exact_polynomial(k, threshold)
    while lo < hi:
        mid = (lo + hi) // 2
        poly = minimax_polynomial(k, mid, threshold)
        if poly.gamma <= g:
            best, hi = poly, mid
        else:
            lo = mid + 1
    if best.degree > lo or best.gamma > g:  # lo == hi: check that degree once
        poly = minimax_polynomial(k, lo, threshold)
        if poly.gamma <= g:
            best = poly
    return best


def disjunction_polynomial(k: int, *, gamma=None, degree: int | None = None,
                           construction: str = "minimax") -> ApproximatingPolynomial:
    """The polynomial for ``k``-way disjunctions from ``gamma`` or ``degree`` (one of them).

    ``construction="chebyshev"`` is Fact 4.2's explicit polynomial; ``"minimax"`` the LP's
    (the least degree for ``gamma``, or the least error for ``degree``); ``"exact"`` the
    interpolant (neither ``gamma`` nor ``degree``).
    """
    return _polynomial(k, 1, gamma, degree, construction)


def threshold_polynomial(k: int, threshold: int, *, gamma=None, degree: int | None = None,
                         construction: str = "minimax") -> ApproximatingPolynomial:
    """The polynomial for ``h``-of-``k`` queries (Lemma 4.5), from ``gamma`` or ``degree``.

    Sherstov's explicit construction is in the paper's appendix, which the seed text does not
    contain; Lemma 4.5 itself names linear programming as a construction, which is what
    ``"minimax"`` does (and it gives the least possible degree). ``"chebyshev"`` is offered for
    ``h = 1`` only.
    """
    return _polynomial(k, threshold, gamma, degree, construction)


def _polynomial(k, threshold, gamma, degree, construction) -> ApproximatingPolynomial:
    k, threshold = _check_k(k, threshold)
    if construction not in CONSTRUCTIONS:
        raise ParameterError(f"construction must be one of {list(CONSTRUCTIONS)}, got {construction!r}")
    if construction == "exact":
        if gamma is not None or degree is not None:
            raise ParameterError("construction 'exact' takes neither gamma nor degree")
        return exact_polynomial(k, threshold)
    if gamma is not None and degree is not None:
        raise ParameterError("give gamma or degree, not both")
    if gamma is None and degree is None:
        raise ParameterError(f"construction {construction!r} needs gamma or degree")
    if construction == "chebyshev":
        if threshold != 1:
            raise ParameterError("construction 'chebyshev' is Fact 4.2's disjunction polynomial; "
                                 "use 'minimax' (Lemma 4.5's LP) for thresholds above 1")
        return chebyshev_disjunction(k, gamma, degree=degree)
    if degree is not None:
        return minimax_polynomial(k, _check_degree(degree), threshold)
    return min_degree_polynomial(k, gamma, threshold)
