"""Polynomial release (Thaler, Ullman, Vadhan, "Faster Algorithms for Privately Releasing Marginals", ICALP 2012).

A plan of four steps over the shared model::

    p = disjunction_polynomial(k, gamma=...)         # Fact 4.2 / LP: p(0) = 0, |p(j) - 1| <= gamma on 1..k
    counts = ConjunctionCounts(..., size=m)          # the coefficients: literal-set counts, |set| <= deg p
    measure(counts, data, calibrate(counts, share))  # exact discrete noise, charged first (Theorem 3.1)
    answers = marginal_counts(table, p, workload)    # the evaluator (dpopt.model.polynomial_queries)

**The summary** (Theorem 3.1 with Lemma 4.3). For a record ``x`` and a query ``y`` over at most
``k`` literals, ``p(<x, y>)`` is a multilinear polynomial in ``y`` whose coefficient on ``y_T``
is ``a_|T| x_T`` (``a_m`` the Newton coefficients of ``p``). Summed over the records, the
coefficients are ``a_|T| c_T`` with ``c_T`` the count of records satisfying every literal of
``T``: dpopt measures the counts ``c_T`` of every literal set of the workload's downward
closure with ``|T| <= t = deg p``, grouped by size ``m``, and the evaluator multiplies by the
public ``a_m``. Group ``m`` has L1 (and squared L2) sensitivity ``M_m``, its number of
subsets (each record matches one pattern of each; :class:`ConjunctionCounts`). With
``split = "paper"`` group ``m`` gets the share ``|w_m| M_m / sum_j |w_j| M_j`` of epsilon, so
each coefficient ``w_m c_T`` carries Laplace noise of scale ``(sum_j |w_j| M_j) / epsilon`` --
Theorem 3.1's single Laplace vector, with the exact L1 norm of a record's coefficient vector
in place of the bound ``T`` of Lemma 4.3 (reported beside it). ``split = "variance"`` instead
minimises the variance of a workload answer, ``sum_m w_m^2 C(k, m) Var_m``: shares
proportional to ``(w_m^2 C(k, m) M_m^2)^{1/3}`` under Laplace noise and to
``(w_m^2 C(k, m) M_m)^{1/2}`` under Gaussian noise. Both are exact rational shares summing
to the budget.

**Neighbours.** The paper's databases have a public size ``n`` (Definition 2.1 replaces a row);
dpopt's neighbours add or remove a record, so when a query needs ``n`` (conjunctions and marginal
cells through ``AND(L) = n - OR(not L)``; thresholds with ``p(0) != 0``) the total is measured
as one more group (sensitivity 1).

**Privacy.** Pure epsilon (Theorem 3.1): discrete Laplace; (epsilon, delta) and zCDP: discrete
Gaussian (:func:`~dpopt.privacy.mechanisms.calibrate`). The paper's Theorem 3.2 uses Laplace
noise under (epsilon, delta) through its Lemma 2.4, whose noise magnitude did not survive the
seed text's extraction; the Gaussian plays the same role here.

**Accuracy** (Theorem 3.1, part 3, and its proof). Every answer is within ``gamma n`` (the
polynomial) plus ``sum_m |w_m| C(k, m) x_m`` of the truth, where ``x_m`` bounds the noise of
every released count at once with probability ``1 - beta`` (a union bound over the counts with
the exact discrete Laplace tail ``P(|Z| >= x) = 2 e^{-x/b} / (1 + e^{-1/b})``, or the
sub-Gaussian tail ``2 e^{-x^2 / (2 sigma^2)}`` of the discrete Gaussian, Canonne, Kamath,
Steinke 2020). The plan prints this bound; :meth:`PolynomialRelease.errors` puts it beside the
measured error.

**The degree** (``gamma``, ``degree``, ``construction``). ``gamma`` gives the least degree
(``"minimax"``, an LP, certified exactly) or Fact 4.2's Chebyshev degree (``"chebyshev"``);
``degree`` the least error at that degree; with neither, and a public expected number of
records ``records``, ``(t, gamma)`` minimises the bound above over ``t = 1..k`` (minimax
polynomial at each degree); with neither and no ``records``, the exact polynomial
(``t = k``, ``gamma = 0``: inclusion–exclusion).

**Consistency** (``consistency = "l2" | "l1" | "linf"``, optional, reported separately). The
released workload marginals are projected, through :func:`dpopt.estimate.reconstruct`, onto
the marginals of one non-negative table over the workload's attributes (weights from each
answer's exact variance). It needs that table to be small enough to hold densely.

Non-binary attributes are binary-encoded (:func:`~dpopt.model.queries.binary.binary_encoding`);
bit patterns that spell an unused code are public zeros and are not measured.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from dpopt.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    AlgorithmPlan,
    PlannedMeasure,
    Release,
    make_release,
    register,
)
from dpopt.errors import DataError, ParameterError, QueryError, at_key
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, NonNegativity
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.polynomial_queries import (
    Answers,
    ConjunctionTable,
    conjunction_counts,
    disjunction_counts,
    marginal_counts,
    threshold_counts,
)
from dpopt.model.polynomials import (
    CONSTRUCTIONS,
    ApproximatingPolynomial,
    chebyshev_disjunction,
    exact_polynomial,
    minimax_polynomial,
    threshold_polynomial,
)
from dpopt.model.queries.basic import Total
from dpopt.model.queries.binary import BinaryEncoding, binary_encoding
from dpopt.model.queries.conjunctions import (
    ConjunctionCounts,
    colex_rank,
    conjunction_moments,
    unique_rows,
    unused_code_patterns,
)
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import NoiseLaw, calibrate, measure

__all__ = ["Polynomial", "PolynomialParams", "PolynomialPlan", "PolynomialRelease", "QUERY_FAMILIES",
           "UNIVERSES", "SPLITS", "noise_bound"]

#: What the release answers for each workload set.
QUERY_FAMILIES = ("marginals", "disjunctions", "conjunctions", "thresholds")
#: Literal sets released: every pattern (Section 4.1) or the all-ones pattern (monotone).
UNIVERSES = ("literals", "monotone")
#: Budget split over the coefficient groups (module notes).
SPLITS = ("variance", "paper")
#: Consistency objectives offered for the projection of the released marginals.
CONSISTENCY = ("l2", "l1", "linf")
#: Keys of the ``[polynomial]`` spec table (the fields of :class:`PolynomialParams`).
SPEC_KEYS = ("workload", "queries", "k", "gamma", "degree", "construction", "universe", "threshold", "split",
             "records", "consistency", "bound_beta")
#: Largest table the consistency projection builds (cells over the workload's attributes).
MAX_PROJECTION_CELLS = 1 << 24
#: Largest number of released counts held in memory (entries of the conjunction table).
MAX_TABLE_ENTRIES = 60_000_000


# ---- parameters ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolynomialParams(AlgorithmParams):
    """Options of the polynomial release (see the module notes).

    Attributes
    ----------
    workload : int or tuple of tuple of str
        The attribute sets answered: ``k`` for every ``k``-way marginal, or explicit sets.
    queries : {"marginals", "disjunctions", "conjunctions", "thresholds"}
        For each set: its marginal table, or the number of records with some / every / at
        least ``threshold`` of its attributes set (binary attributes only).
    k : int, optional
        Width (binary attributes) the polynomial covers; default: the widest workload set.
    gamma : number, optional
        Approximation error of the polynomial (Fact 4.2); give it or ``degree`` or neither.
    degree : int, optional
        Degree of the polynomial.
    construction : {"minimax", "chebyshev", "exact"}
        LP (least degree / least error), Fact 4.2's Chebyshev polynomial, or the exact
        interpolant (``t = k``).
    universe : {"literals", "monotone"}
        Every literal pattern (Section 4.1; needed for marginals and conjunctions) or
        monotone conjunctions only (disjunctions and thresholds).
    threshold : int, optional
        ``h`` of ``queries = "thresholds"``.
    split : {"variance", "paper"}
    records : int, optional
        A public expected number of records, used only to choose ``(t, gamma)`` when neither
        is given (it is not read from the data).
    consistency : {"l2", "l1", "linf"}, optional
        Project the released marginals onto consistent non-negative ones (reported separately).
    bound_beta : number
        Failure probability of the printed worst-case bound.
    """

    workload: Any = 3
    queries: str = "marginals"
    k: int | None = None
    gamma: Any = None
    degree: int | None = None
    construction: str = "minimax"
    universe: str = "literals"
    threshold: int | None = None
    split: str = "variance"
    records: int | None = None
    consistency: str | None = None
    bound_beta: Any = Fraction(1, 20)

    def validate(self) -> None:
        w = self.workload
        if isinstance(w, bool) or not (isinstance(w, (int, np.integer)) or isinstance(w, (tuple, list))):
            raise ParameterError(f"workload must be an integer k (every k-way marginal) or a list of attribute "
                                 f"lists, got {w!r}")
        if isinstance(w, (int, np.integer)) and w < 1:
            raise ParameterError(f"workload = {w}: the marginal order must be at least 1")
        if isinstance(w, (tuple, list)):
            if not w:
                raise ParameterError("workload is an empty list")
            sets = tuple((s,) if isinstance(s, str) else tuple(s) for s in w)
            for i, s in enumerate(sets):
                if not s or not all(isinstance(a, str) for a in s):
                    raise ParameterError(f"workload[{i + 1}] must be a non-empty list of attribute names, got {s!r}")
            object.__setattr__(self, "workload", sets)
        _choice("queries", self.queries, QUERY_FAMILIES)
        _choice("construction", self.construction, CONSTRUCTIONS)
        _choice("universe", self.universe, UNIVERSES)
        _choice("split", self.split, SPLITS)
        if self.consistency is not None:
            _choice("consistency", self.consistency, CONSISTENCY)
        for name in ("k", "degree", "threshold", "records"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise ParameterError(f"{name} must be a positive integer, got {v!r}")
        if self.gamma is not None:
            g = _fraction(self.gamma, "gamma")
            if not 0 <= g < 1:
                raise ParameterError(f"gamma must be in [0, 1), got {self.gamma!r}")
            object.__setattr__(self, "gamma", g)
        if self.gamma is not None and self.degree is not None:
            raise ParameterError("give gamma or degree, not both")
        if self.construction == "exact" and (self.gamma is not None or self.degree is not None):
            raise ParameterError("construction = \"exact\" takes neither gamma nor degree")
        if (self.queries == "thresholds") != (self.threshold is not None):
            raise ParameterError("threshold goes with queries = \"thresholds\" (and only with it)")
        if self.construction == "chebyshev" and self.queries == "thresholds":
            raise ParameterError("construction = \"chebyshev\" is Fact 4.2's disjunction polynomial; thresholds use "
                                 "\"minimax\" (Lemma 4.5's LP) or \"exact\"")
        if self.universe == "monotone" and self.queries in ("marginals", "conjunctions"):
            raise ParameterError(f"queries = \"{self.queries}\" need negated literals: universe = \"literals\" "
                                 "(Section 4.1)")
        if self.consistency is not None and self.queries != "marginals":
            raise ParameterError("consistency projects marginal tables: it needs queries = \"marginals\"")
        beta = _fraction(self.bound_beta, "bound_beta")
        if not 0 < beta < 1:
            raise ParameterError(f"bound_beta must be in (0, 1), got {self.bound_beta!r}")
        object.__setattr__(self, "bound_beta", beta)


    @classmethod
    def from_spec(cls, reader) -> "PolynomialParams":
        """``[polynomial]``: the workload and the polynomial (the docs page's options table)."""
        from dpopt.spec.queries import parse_marginals

        t = reader.table("polynomial", required=True)
        try:
            return cls(
                workload=parse_marginals(t, "workload") if t.has("workload") else 3,
                queries=t.str("queries", default="marginals", choices=QUERY_FAMILIES),
                k=t.int("k", minimum=1), gamma=t.budget("gamma", unit=True), degree=t.int("degree", minimum=1),
                construction=t.str("construction", default="minimax", choices=CONSTRUCTIONS),
                universe=t.str("universe", default="literals", choices=UNIVERSES),
                threshold=t.int("threshold", minimum=1),
                split=t.str("split", default="variance", choices=SPLITS), records=t.int("records", minimum=1),
                consistency=t.str("consistency", choices=CONSISTENCY),
                bound_beta=t.budget("bound_beta", unit=True) or Fraction(1, 20))
        except ParameterError as exc:  # a combination of keys: name the first key the message names
            named = [key for key in SPEC_KEYS if re.search(rf"\b{key}\b", str(exc)) and t.has(key)]
            raise t.error((named[0],) if named else (), str(exc), ParameterError) from None


def _choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ParameterError(f"{name} must be one of {list(choices)}, got {value!r}")


def _fraction(value, name: str) -> Fraction:
    try:
        return Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    except (TypeError, ValueError, ZeroDivisionError):
        raise ParameterError(f"{name} must be a number, got {value!r}") from None


# ---- the public plan --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class CoefficientGroup:
    """One measured group: the counts of every released literal set of one size."""

    size: int
    query: Any  # ConjunctionCounts, or Total for size 0
    label: str
    weight: float  # |w_m| of the target family
    terms: float  # released sets of this size in one answer (C(k, m))
    share: Fraction
    law: NoiseLaw
    noise_bound: float  # x_m: bound on |noise| of every count at once (with the plan's beta)


@dataclass(frozen=True, eq=False)
class PolynomialPlan:
    """The public part of a polynomial release (no data was read to make it).

    Attributes
    ----------
    source, domain : Domain
        The data's domain and its binary encoding (``source`` itself when binary).
    encoding : BinaryEncoding or None
    positions : dict of str to ndarray
        Bit positions (in ``domain``) of each source attribute.
    workload : tuple of tuple of str
        Source attribute sets answered, in domain order.
    polynomial : ApproximatingPolynomial
        The family's polynomial (disjunctions, or the threshold's).
    chebyshev_degree : int or None
        Fact 4.2's Chebyshev degree for the same gamma (disjunctions), for the report.
    groups : tuple of CoefficientGroup
    subsets : dict of int to ndarray
        Released subsets (bit positions, colex order) by size.
    weights : tuple of Fraction
        ``w_m`` of the target family (module notes).
    beta : Fraction
    degree_choice : str
        How ``(t, gamma)`` was chosen.
    candidates : DataFrame or None
        The bound at every degree when ``(t, gamma)`` was chosen automatically.
    """

    source: Domain
    domain: Domain
    encoding: BinaryEncoding | None
    positions: dict
    workload: tuple
    polynomial: ApproximatingPolynomial
    chebyshev_degree: int | None
    groups: tuple
    subsets: dict
    weights: tuple
    beta: Fraction
    k: int
    degree_choice: str
    candidates: pd.DataFrame | None = None

    @property
    def widths(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Workload sets grouped by width in bits: ``{width: (indices, bit positions (Q, width))}``."""
        cached = self.__dict__.get("_widths")
        if cached is None:
            groups: dict[int, list[int]] = {}
            bits = [self.bits_of(s) for s in self.workload]
            for i, b in enumerate(bits):
                groups.setdefault(b.size, []).append(i)
            cached = {w: (np.array(idx), np.stack([bits[i] for i in idx])) for w, idx in groups.items()}
            self.__dict__["_widths"] = cached
        return cached

    @property
    def degree(self) -> int:
        """``t``: the largest literal set released."""
        return max(g.size for g in self.groups)

    @property
    def num_coefficients(self) -> int:
        return sum(g.query.num_rows for g in self.groups)

    def noise_bound(self, width: int) -> float:
        """Bound on the noise part of the error of one answer over ``width`` bits (probability 1 - beta)."""
        return sum(g.weight * math.comb(width, g.size) * g.noise_bound for g in self.groups)

    def bits_of(self, attrs) -> np.ndarray:
        """Bit positions of a source attribute set (increasing)."""
        return np.concatenate([self.positions[a] for a in attrs])


def noise_bound(law: NoiseLaw, entries: int, beta: float) -> float:
    """A bound on ``|z|`` holding for ``entries`` draws of ``law`` at once with probability ``>= 1 - beta``.

    Union bound with the exact discrete Laplace tail ``P(|Z| >= x) = 2 e^{-x/b} / (1 + e^{-1/b})``
    (integer ``x >= 1``, scale ``b``), or the discrete Gaussian's sub-Gaussian tail
    ``P(|Z| >= x) <= 2 e^{-x^2 / (2 sigma^2)}`` (Canonne, Kamath, Steinke 2020).
    """
    per_entry = beta / max(int(entries), 1)
    if law.family == "discrete_laplace":
        b = float(law.parameter)
        x = math.ceil(b * math.log(2.0 / ((1.0 + math.exp(-1.0 / b)) * per_entry)))
        return float(max(x, 1) - 1) * float(law.grid) if x > 1 else 0.0
    sigma = math.sqrt(float(law.parameter))
    return sigma * math.sqrt(2.0 * math.log(2.0 / per_entry)) * float(law.grid)


# ---- pieces of the plan -----------------------------------------------------------------------------
def _binary_layout(domain: Domain) -> tuple[Domain, BinaryEncoding | None, dict]:
    if all(s == 2 for s in domain.sizes):
        return domain, None, {a: np.array([i]) for i, a in enumerate(domain.attrs)}
    enc = binary_encoding(domain)
    where = {b: i for i, b in enumerate(enc.domain.attrs)}
    return enc.domain, enc, {a: np.array([where[b] for b in enc.bits[a]]) for a in domain.attrs}


def _workload_sets(domain: Domain, workload) -> tuple[tuple[str, ...], ...]:
    if isinstance(workload, (int, np.integer)):
        if workload > len(domain):
            raise at_key(ParameterError(f"workload = {workload}: the domain has only {len(domain)} attributes"),
                         ("polynomial", "workload"))
        return tuple(combinations(domain.attrs, int(workload)))
    out: list[tuple[str, ...]] = []
    for i, s in enumerate(workload):
        try:
            canon = domain.canonical(s)
        except Exception as exc:  # DomainError names the attribute
            raise at_key(ParameterError(f"workload[{i + 1}] {list(s)!r}: {exc}"), ("polynomial", "workload", i)) from None
        if len(canon) != len(s):
            raise at_key(ParameterError(f"workload[{i + 1}] {list(s)!r} names an attribute twice"),
                         ("polynomial", "workload", i))
        if canon not in out:
            out.append(canon)
    return tuple(out)


def _closure(plan_sets: list[np.ndarray], d: int, top: int) -> dict[int, np.ndarray]:
    """Every subset of at most ``top`` bits of some workload set, by size, in colex order."""
    out: dict[int, np.ndarray] = {}
    by_width: dict[int, list[np.ndarray]] = {}
    for bits in plan_sets:
        by_width.setdefault(bits.size, []).append(bits)
    for m in range(1, top + 1):
        parts = []
        for width, sets in by_width.items():
            if width < m:
                continue
            arr = np.stack(sets)
            combos = np.array(list(combinations(range(width), m)), dtype=np.int64)
            parts.append(arr[:, combos].reshape(-1, m))
        if not parts:
            continue
        subs = np.concatenate(parts)
        _, first = np.unique(colex_rank(subs, d), return_index=True)
        out[m] = subs[first]  # sorted by rank: colex order
    return out


def _target_weights(queries: str, poly: ApproximatingPolynomial) -> tuple[Fraction, ...]:
    """``w_m`` (exact) of one answer as a symmetric sum of released counts (dpopt.model.polynomial_queries)."""
    a = list(poly.newton)
    if queries in ("marginals", "conjunctions"):  # n - disjunction(not L)
        return tuple([Fraction(1)] + [-x for x in a[1:]])
    return tuple(a)


def _choose_polynomial(params: PolynomialParams, k: int) -> tuple[list[ApproximatingPolynomial], str]:
    """Candidate polynomials (one, or one per degree for the automatic choice) and how they were chosen."""
    h = params.threshold or 1
    if params.construction == "exact":
        return [exact_polynomial(k, h)], "exact interpolant (construction = \"exact\")"
    if params.gamma is not None or params.degree is not None:
        if params.construction == "chebyshev":
            return [chebyshev_disjunction(k, params.gamma, degree=params.degree)], "Fact 4.2's Chebyshev polynomial"
        poly = threshold_polynomial(k, h, gamma=params.gamma, degree=params.degree)
        how = "least degree with certified error <= gamma (LP)" if params.gamma is not None else \
            "least certified error at the given degree (LP)"
        return [poly], how
    if params.records is None:
        return [exact_polynomial(k, h)], "exact interpolant (no gamma, degree or records given)"
    if params.construction == "chebyshev":
        raise at_key(ParameterError("the automatic choice of (t, gamma) uses the LP's polynomials: give gamma or "
                                    "degree with construction = \"chebyshev\""), ("polynomial", "construction"))
    return [minimax_polynomial(k, t, h) for t in range(1, k + 1)], \
        f"(t, gamma) minimising the Theorem 3.1 bound at records = {params.records}"


def _shares(weights: list[Fraction], terms: list[int], sens: list[int], gaussian: bool, split: str) -> list:
    """Budget weights of the groups (module notes): exact for ``"paper"``; for ``"variance"`` the
    optimum's weights in thousandths of the largest (readable shares, at most 0.05% off)."""
    if split == "paper":  # Theorem 3.1's single Laplace (or Gaussian) vector on the coefficients
        return [w * w * s if gaussian else abs(w) * s for w, s in zip(weights, sens)]
    w2 = np.array([float(w * w) for w in weights])
    n, m = np.array(terms, dtype=float), np.array(sens, dtype=float)
    raw = np.sqrt(w2 * n * m) if gaussian else np.cbrt(w2 * n * m**2)
    return [int(v) for v in np.maximum(1, np.rint(1000 * raw / raw.max()))]


# ---- the algorithm ---------------------------------------------------------------------------------
@register
class Polynomial(Algorithm):
    """Every k-way marginal (disjunction, conjunction, threshold) from noisy low-order conjunction counts."""

    name = "polynomial"
    title = "polynomial release: noisy conjunction counts evaluated through approximating polynomials"
    reference = ("J. Thaler, J. Ullman, S. Vadhan, Faster Algorithms for Privately Releasing Marginals, "
                 "ICALP 2012: Theorem 3.1 with Fact 4.2 / Lemma 4.3 (disjunctions, marginals via Section 4.1) "
                 "and Lemma 4.6 (t-of-k)")
    supports = frozenset()
    dense_domain = False
    sections = {"polynomial": SPEC_KEYS}
    Params = PolynomialParams

    # ---- plan ------------------------------------------------------------------------------------
    def plan(self, domain: Domain, constraints: ConstraintSet, budget: Budget) -> AlgorithmPlan:
        p = self.params
        bdom, encoding, positions = _binary_layout(domain)
        sets = _workload_sets(domain, p.workload)
        if p.queries != "marginals" and encoding is not None:
            raise at_key(ParameterError(f"queries = \"{p.queries}\" are over binary attributes; this domain has "
                                        "non-binary ones (use queries = \"marginals\")"), ("polynomial", "queries"))
        bit_sets = [np.concatenate([positions[a] for a in s]) for s in sets]
        widest = max(b.size for b in bit_sets)
        k = p.k if p.k is not None else widest
        if k < widest:
            raise at_key(ParameterError(f"k = {k} is below the widest workload set ({widest} binary attributes)"),
                         ("polynomial", "k"))
        if p.threshold is not None and p.threshold > k:
            raise at_key(ParameterError(f"threshold = {p.threshold} exceeds k = {k}"), ("polynomial", "threshold"))
        candidates, how = _choose_polynomial(p, k)
        gaussian = budget.noise() == "gaussian"
        beta = p.bound_beta
        designs = [self._design(poly, bdom, encoding, bit_sets, k, budget, gaussian, beta) for poly in candidates]
        table = None
        if len(designs) > 1:
            bounds = [float(poly.gamma) * p.records + sum(g.weight * math.comb(k, g.size) * g.noise_bound
                                                          for g in groups)
                      for poly, (groups, _) in zip(candidates, designs)]
            table = pd.DataFrame({"degree": [c.degree for c in candidates],
                                  "gamma": [float(c.gamma) for c in candidates], "bound": bounds})
            best = int(np.argmin(bounds))
            candidates, designs = [candidates[best]], [designs[best]]
        poly, (groups, subsets) = candidates[0], designs[0]
        cheb = None
        if poly.threshold == 1 and 0 < poly.gamma:
            cheb = chebyshev_disjunction(k, poly.gamma).degree
        details = PolynomialPlan(domain, bdom, encoding, positions, sets, poly, cheb, tuple(groups), subsets,
                                 _target_weights(p.queries, poly), beta, k, how, table)
        if p.consistency is not None:
            self._check_projection(details)
        steps = [PlannedMeasure(g.label, g.query, g.law.mechanism, g.share, g.law.cost, g.law,
                                what=_group_text(g), answers=g.query.num_rows) for g in groups]
        return self.new_plan(domain, constraints, budget, steps=steps, details=details,
                             lines=self._plan_lines(details))

    def _design(self, poly, bdom, encoding, bit_sets, k, budget, gaussian, beta):
        """The measured groups for one polynomial: queries, shares, noise laws, noise bounds."""
        p = self.params
        weights = _target_weights(p.queries, poly)
        top = min(poly.degree, k)
        subsets = _closure(bit_sets, len(bdom), top)
        sizes = [m for m in range(top + 1) if weights[m] != 0 and (m == 0 or m in subsets)]
        entries = sum(math.comb(len(bdom), m) * (2**m if p.universe == "literals" else 1) for m in sizes)
        if entries > MAX_TABLE_ENTRIES:
            raise at_key(ParameterError(f"degree {top} over {len(bdom)} binary attributes means {entries:.3g} counts, "
                                        f"above {MAX_TABLE_ENTRIES:.0e}: choose a larger gamma or a smaller degree"),
                         ("polynomial", "degree" if p.degree is not None else "gamma"))
        queries = {}
        for m in sizes:
            if m == 0:
                queries[m] = Total(bdom)
            else:
                excluded = unused_code_patterns(encoding, subsets[m]) if p.universe == "literals" else None
                queries[m] = ConjunctionCounts(bdom, m, p.universe == "literals", subsets[m], excluded)
        sens = [int(queries[m].sensitivity(1)) for m in sizes]  # integer counts: exact
        raw = _shares([weights[m] for m in sizes], [math.comb(k, m) for m in sizes], sens, gaussian, p.split)
        labels = [("total" if m == 0 else f"conjunctions:{m}") for m in sizes]
        costs = budget.shares(dict(zip(labels, raw)))
        total_raw = sum(raw, Fraction(0))
        laws = {m: calibrate(queries[m], costs[lab], budget.noise()) for m, lab in zip(sizes, labels)}
        rows = sum(queries[m].num_rows for m in sizes)
        groups = [CoefficientGroup(m, queries[m], lab, abs(float(weights[m])), float(math.comb(k, m)),
                                   Fraction(r) / total_raw, laws[m], noise_bound(laws[m], rows, float(beta)))
                  for m, lab, r in zip(sizes, labels, raw)]
        return groups, subsets

    def _check_projection(self, plan: PolynomialPlan) -> None:
        attrs = plan.source.canonical({a for s in plan.workload for a in s})
        cells = plan.source.project(attrs).size
        if cells > MAX_PROJECTION_CELLS:
            raise at_key(ParameterError(f"consistency projects onto one table over the workload's {len(attrs)} "
                                        f"attributes ({cells:.3g} cells, above {MAX_PROJECTION_CELLS:,}); use a "
                                        "smaller workload or no consistency"), ("polynomial", "consistency"))

    def _plan_lines(self, plan: PolynomialPlan) -> list[str]:
        poly = plan.polynomial
        lines = [f"polynomial: {poly.describe()} ({plan.degree_choice})"]
        if plan.chebyshev_degree is not None:
            lines.append(f"  Fact 4.2's Chebyshev construction needs degree {plan.chebyshev_degree} for the same gamma; "
                         f"the LP's least degree is {poly.degree}")
        d = len(plan.domain)
        lines.append(f"  L1 norm of one record's coefficients: exact {float(poly.record_l1(d)):.4g} "
                     f"(Lemma 4.3's bound sum |c_j| d^j = {float(poly.lemma43_norm(d)):.4g})")
        lines.append(f"released: {plan.num_coefficients:,} conjunction counts of up to {plan.degree} literals over "
                     f"{d} binary attributes, {len(plan.workload):,} workload sets")
        lines.append(f"Theorem 3.1 bound: every answer within {float(poly.gamma):.4g} n + "
                     f"{plan.noise_bound(plan.k):.4g} with probability >= {float(1 - plan.beta):g}")
        return lines

    # ---- run ---------------------------------------------------------------------------------------
    def run(self, plan: AlgorithmPlan, data: Dataset, accountant: Accountant, rng) -> "PolynomialRelease":
        details: PolynomialPlan = plan.details
        if not isinstance(data, Dataset) or data.domain != plan.domain:
            raise DataError(f"data must be a Dataset over the plan's domain {plan.domain}")
        codes = data.codes if details.encoding is None else details.encoding.encode_codes(data.codes)
        moments = conjunction_moments(codes, data.weights, details.degree)
        bdata = Dataset(codes, details.domain, data.weights)
        measurements = {}
        for g in details.groups:
            answers = np.array([moments[0][0]]) if g.size == 0 else g.query.rows_from_moments(moments)
            measurements[g.size] = measure(g.query, bdata, g.law, accountant, rng, label=g.label, answers=answers)
        table = self._table(details, measurements)
        answers, evaluated = self._answers(details, table)
        reconstruction, consistent = None, {}
        notes = [f"{details.polynomial.describe()}; answers are within gamma n plus noise of the truth "
                 "(Theorem 3.1); they are not a synthetic table and need not be non-negative or consistent"]
        if self.params.consistency is not None:
            reconstruction, consistent = self._project(details, evaluated)
            notes.append(f"consistency ({self.params.consistency}) projection: {reconstruction.status.name}; "
                         "reported separately: info['consistent'] and the answers labelled 'consistent: ...'")
        info = {"plan": details, "table": table, "evaluated": evaluated, "consistent": consistent,
                "coefficients": details.num_coefficients, "degree": details.degree,
                "gamma": float(details.polynomial.gamma),
                # Data-free: gamma, the noise bound and beta come from the plan (n stays symbolic).
                "accuracy_statement": f"Theorem 3.1: with probability >= {float(1 - details.beta):g}, every released "
                                      f"answer is within {float(details.polynomial.gamma):.4g} n + "
                                      f"{details.noise_bound(details.k):.4g} of the truth (n: the number of records)"}
        release = make_release(self, plan, accountant, status=Status.COMPLETED,
                               message=f"released {details.num_coefficients:,} noisy conjunction counts; "
                                       f"{len(evaluated):,} workload sets evaluated",
                               measurements=list(measurements.values()), reconstruction=reconstruction,
                               notes=notes, info=info, cls=PolynomialRelease)
        if consistent:  # the projection's marginals, under their own labels (reported separately)
            labelled = {f"consistent: {key}": frame for key, frame in consistent.items()}
            answers = MarginalFrames(details, evaluated, extra=labelled)
        release.answers = answers  # a lazy mapping for marginals: frames are built when read
        return release

    def _table(self, plan: PolynomialPlan, measurements: dict) -> ConjunctionTable:
        """The released counts in the evaluator's layout: NaN where nothing was released."""
        literals = self.params.universe == "literals"
        d = len(plan.domain)
        counts, noisy, variances, bounds = [], [], [], []
        by_size = {g.size: g for g in plan.groups}
        for m in range(plan.degree + 1):
            shape = (1, 1) if m == 0 else (math.comb(d, m), 2**m if literals else 1)
            c = np.full(shape, np.nan)
            z = np.zeros(shape, dtype=bool)
            g = by_size.get(m)
            if g is not None:
                meas = measurements[m]
                if m == 0:
                    c[0, 0], z[0, 0] = meas.values[0], True
                else:
                    rank = colex_rank(g.query.subsets, d)
                    block = np.zeros(g.query.keep.shape)  # excluded patterns are exact zeros
                    block.ravel()[np.flatnonzero(g.query.keep.ravel())] = meas.values
                    c[rank] = block
                    z[rank] = g.query.keep
            counts.append(c)
            noisy.append(z)
            variances.append(g.law.variance if g is not None else 0.0)
            bounds.append(g.noise_bound if g is not None else 0.0)
        return ConjunctionTable(d, literals, tuple(counts), tuple(noisy), tuple(variances), tuple(bounds))

    def _answers(self, plan: PolynomialPlan, table: ConjunctionTable) -> tuple[dict, dict]:
        """Released frames (``count`` and ``stddev`` columns) and the raw evaluations by workload set."""
        queries = self.params.queries
        evaluated = _evaluate(plan, table, plan.polynomial, queries)
        if queries == "marginals":
            frames = MarginalFrames(plan, evaluated)
        else:
            frames = {queries: pd.DataFrame({
                "attributes": [", ".join(s) for s in plan.workload],
                "count": [float(evaluated[s].values) for s in plan.workload],
                "stddev": [float(np.sqrt(evaluated[s].variance)) for s in plan.workload]})}
        return frames, evaluated

    def _project(self, plan: PolynomialPlan, evaluated: dict):
        """Project the released marginals onto consistent non-negative ones (module notes)."""
        from dpopt.estimate import reconstruct

        attrs = plan.source.canonical({a for s in plan.workload for a in s})
        sub = plan.source.project(attrs)
        ms = []
        for s in plan.workload:
            values, var = _source_cells(plan, s, evaluated[s])
            mean_var = float(np.mean(var))
            ms.append(Measurement(Marginal(sub, s), values, "derived", math.sqrt(mean_var), mean_var, None,
                                  f"released marginal {', '.join(s)}"))
        result = reconstruct(ms, ConstraintSet(sub, [NonNegativity()]), self.params.consistency)
        consistent = {}
        if result.success and result.x is not None:
            x = np.asarray(result.x, dtype=np.float64)
            builder = _FrameBuilder(plan.source)
            for s, m in zip(plan.workload, ms):
                consistent[", ".join(s)] = builder.marginal(s, m.query.matvec(x))
        return result, consistent

    # ---- small defaults for the conformance suite and the audit -------------------------------------
    @classmethod
    def example(cls, domain: Domain) -> PolynomialParams | None:
        """All 2-way marginals when the two widest attributes take at most 10 bits together,
        else all 1-way marginals when the widest takes at most 10; otherwise None."""
        bits = sorted((max(1, (s - 1).bit_length()) for s in domain.sizes), reverse=True)
        if len(bits) >= 2 and bits[0] + bits[1] <= 10:
            return PolynomialParams(workload=2)
        if bits[0] <= 10:
            return PolynomialParams(workload=1)
        return None


def _group_text(g: CoefficientGroup) -> str:
    if g.size == 0:
        return "total (number of records)"
    kind = "literal patterns" if g.query.literals else "monotone conjunctions"
    return f"{kind} of {g.size} binary attributes ({g.query.num_subsets:,} subsets)"


# ---- frames ---------------------------------------------------------------------------------------
def _source_cells(plan: PolynomialPlan, attrs, ans: Answers) -> tuple[np.ndarray, np.ndarray]:
    """A marginal over the bits of ``attrs`` as one over the source attributes (unused codes dropped)."""
    values, var = np.asarray(ans.values), np.asarray(ans.variance)
    if plan.encoding is None:
        return values, var
    padded = tuple(2 ** plan.positions[a].size for a in attrs)
    keep = tuple(slice(0, plan.source.size_of(a)) for a in attrs)
    return values.reshape(padded)[keep].ravel(), var.reshape(padded)[keep].ravel()


def _evaluate(plan: PolynomialPlan, table: ConjunctionTable, poly: ApproximatingPolynomial,
              queries: str) -> dict[tuple, Answers]:
    """Answers of every workload set, evaluated in one batch per width."""
    family = {"marginals": marginal_counts, "disjunctions": disjunction_counts,
              "conjunctions": conjunction_counts, "thresholds": threshold_counts}[queries]
    out: dict[tuple, Answers] = {}
    for idx, attrs in plan.widths.values():
        ans = family(table, poly, attrs)
        if not np.isfinite(ans.values).all():
            raise QueryError("a workload answer needs a count that was not released (internal error)")
        for row, i in enumerate(idx):
            out[plan.workload[i]] = Answers(ans.values[row], ans.variance[row], ans.noise_bound[row], ans.gamma)
    return out


class MarginalFrames(Mapping):
    """The released marginals as a read-only mapping ``"a, b, c" -> DataFrame`` built on access.

    Each frame has the source attributes (labelled), ``count`` and ``stddev`` (the noise's
    exact standard deviation). Frames are made when read and kept: a workload of 34,220
    marginals costs nothing until its frames are used. ``extra`` frames (the consistency
    projection's, labelled ``"consistent: a, b, c"``) follow the workload's.
    """

    def __init__(self, plan: PolynomialPlan, evaluated: dict, extra: dict | None = None) -> None:
        self._plan = plan
        self._evaluated = evaluated
        self._keys = {", ".join(s): s for s in plan.workload}
        self._frames: dict[str, pd.DataFrame] = dict(extra or {})
        self._order = list(self._keys) + list(extra or {})
        self._builder = _FrameBuilder(plan.source)

    def __getitem__(self, key: str) -> pd.DataFrame:
        frame = self._frames.get(key)
        if frame is None:
            if key not in self._keys:
                raise KeyError(key)
            attrs = self._keys[key]
            frame = self._frames[key] = self._builder.marginal(attrs, *_source_cells(self._plan, attrs,
                                                                                        self._evaluated[attrs]))
        return frame

    def __iter__(self):
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __repr__(self) -> str:
        return f"MarginalFrames({len(self)} marginals)"


class _FrameBuilder:
    """Labelled marginal frames, fast: one cell grid per shape, one Categorical per attribute."""

    def __init__(self, domain: Domain) -> None:
        self.domain = domain
        self._grids: dict[tuple, np.ndarray] = {}
        self._columns: dict[tuple, object] = {}

    def marginal(self, attrs, values, variance=None) -> pd.DataFrame:
        sizes = tuple(self.domain.size_of(a) for a in attrs)
        grid = self._grids.get(sizes)
        if grid is None:
            grid = self._grids[sizes] = np.stack(np.unravel_index(np.arange(int(np.prod(sizes))), sizes), axis=1)
        columns = {}
        for j, a in enumerate(attrs):
            col = self._columns.get((a, sizes, j))
            if col is None:
                labels = self.domain.labels.get(a)
                col = grid[:, j] if labels is None else pd.Categorical.from_codes(grid[:, j], categories=list(labels))
                self._columns[(a, sizes, j)] = col
            columns[a] = col
        columns["count"] = np.asarray(values, dtype=np.float64)
        if variance is not None:
            columns["stddev"] = np.sqrt(np.asarray(variance, dtype=np.float64))
        return pd.DataFrame(columns)


class PolynomialRelease(Release):
    """A :class:`~dpopt.algorithms.base.Release` of the polynomial algorithm.

    ``answers`` holds one frame per workload marginal (source attributes, ``count``, ``stddev``)
    or one frame of counts per attribute set; ``info["table"]`` is the released
    :class:`~dpopt.model.polynomial_queries.ConjunctionTable`, from which
    :mod:`dpopt.model.polynomial_queries` answers any other query of width at most ``k``.
    """

    def errors(self, data: Dataset) -> pd.DataFrame:
        """Per workload set: the measured worst and mean absolute error against ``data`` next to
        the Theorem 3.1 bound ``gamma n + noise bound`` (NOT private: for evaluation only).

        With a consistency projection, its errors are in ``consistent_max_error`` and
        ``consistent_mean_error``.
        """
        plan: PolynomialPlan = self.info["plan"]
        if not isinstance(data, Dataset) or data.domain != plan.source:
            raise DataError(f"errors: data must be a Dataset over {plan.source}")
        n = float(data.total)
        codes = data.codes if plan.encoding is None else plan.encoding.encode_codes(data.codes)
        rows_x, w = unique_rows(codes, data.weights)
        threshold = self.parameters.get("threshold")
        consistent = self.info.get("consistent", {})
        rows = []
        for idx, attrs in plan.widths.values():
            truths = _true_answers(self.parameters["queries"], threshold, rows_x, w, attrs)
            for i, truth in zip(idx, truths):
                s = plan.workload[i]
                ans = self.info["evaluated"][s]
                released, _ = _source_cells(plan, s, ans)
                truth, bound_cells = _source_cells(plan, s, Answers(truth, ans.noise_bound, ans.noise_bound, 0.0))
                err = np.abs(np.asarray(released, dtype=np.float64) - truth)
                bound = float(np.max(ans.gamma * n + np.asarray(bound_cells)))
                key = ", ".join(s)
                row = {"attributes": key, "max_error": float(err.max()), "mean_error": float(err.mean()),
                       "bound": bound, "within_bound": bool(err.max() <= bound)}
                if key in consistent:
                    proj = np.abs(consistent[key]["count"].to_numpy() - truth)
                    row["consistent_max_error"] = float(proj.max())
                    row["consistent_mean_error"] = float(proj.mean())
                rows.append(row)
        return pd.DataFrame(rows)


def _true_answers(queries: str, threshold, rows: np.ndarray, weights: np.ndarray, attrs: np.ndarray) -> np.ndarray:
    """Exact answers of workload sets of one width from distinct 0/1 rows and their weights:
    ``(Q, 2^k)`` cells for marginals, ``(Q,)`` counts otherwise (chunks of about 2^24 entries)."""
    q, k = attrs.shape
    u = rows.shape[0]
    need = {"disjunctions": 1, "conjunctions": k, "thresholds": threshold}.get(queries)
    out = np.zeros((q, 2**k)) if queries == "marginals" else np.zeros(q)
    step = max(1, (1 << 24) // max(1, u * k))
    powers = np.int64(1) << np.arange(k - 1, -1, -1)
    for lo in range(0, q, step):
        x = rows[:, attrs[lo:lo + step]].astype(np.int64)  # (u, chunk, k)
        chunk = x.shape[1]
        if queries == "marginals":
            flat = (x @ powers) + (np.arange(chunk) * 2**k)[None, :]
            counts = np.bincount(flat.ravel(), weights=np.broadcast_to(weights[:, None], flat.shape).ravel(),
                                 minlength=chunk * 2**k)
            out[lo:lo + step] = counts.reshape(chunk, 2**k)
        else:
            out[lo:lo + step] = weights @ (x.sum(axis=2) >= need)
    return out
