"""The budget split of a top-down release, chosen before any data by the expected error of its tables.

A spec that names each level's tables but gives no ``share`` leaves the split to dpopt: the
shares ``s_q`` of every level's queries (summing to 1) that minimise

    F(s) = Σ_T w_T · log E_T(s),

where ``E_T(s)`` is the expected total squared error of named table ``T`` (every ``[[measure]]``
table, with its ``weight``, default 1), summed over its units and rows, of the generalised least
squares estimate that the upward pass and the top-down fit compute
(:mod:`~dpopt.algorithms.topdown.upward`; Hay et al., VLDB 2010). The logarithm makes each
table count by its *relative* error, whatever its size or level: the plain sum of squared
errors would be ruled by the detailed tables' many cells and sacrifice a small marginal (on
the census example it left the counties' relationship table three times worse than a bottom-up
release to gain 12 % on the sum). Non-negativity, structural zeros, invariants and rounding are
left out: a public, data-free model.

**The error of a table on the hierarchy.** Take a tree whose units of a level all have the same
number of descendants on each level below (``m_ij = N_i / N_j`` units of level ``i`` below a
unit of level ``j``; the averages are used otherwise). The space of level-``k`` tables splits
into components ``j = 0 .. k``: the nation-wide part (``j = 0``, one dimension per cell) and, for
``j ≥ 1``, the contrasts among siblings of level ``j`` (``D_j = N_j − N_{j−1}`` dimensions per
cell), spread evenly over the level-``k`` units below. A measurement on level ``i ≥ j`` informs
component ``j`` through its sums over each level-``j`` unit's ``m_ij`` descendants, so the
component's precision, in units of a level-``j`` table, is

    P_j = Σ_{q asked on a level i ≥ j} Q_qᵀ Q_q · π_q(s_q) / m_ij,

``π_q`` the precision of each noisy answer of ``q`` at share ``s_q`` (``s² / v_q`` for Laplace
noise, whose variance ``v_q`` at the whole budget scales as ``1/ε²``; ``s / v_q`` for Gaussian
noise under zCDP; for (ε, δ) the split is modelled as zCDP's). The components are independent,
and one of them, spread evenly over the ``m_kj`` level-``k`` units below each level-``j`` unit,
adds ``1/m_kj`` of its error to the level-``k`` table, so

    E_T(s) = Σ_{j = 0}^{k_T} (D_j / m_{k_T j}) · trace(W_T P_j⁺ W_Tᵀ)

(the strategy layer's trace term, :func:`dpopt.strategy.error.trace_term`: Li et al., PODS 2010,
Prop. 4). Detailed tables, marginals and totals are all in the marginals algebra
(:class:`dpopt.strategy.gram.MarginalsGram`): every ``P_j`` is diagonal in one basis, so ``F``
and its gradient are sums over the ``2^d`` attribute subsets, never over cells.

**The optimisation.** Each ``E_T`` is convex in ``s`` for Gaussian noise (``P_j`` linear in
``s``); for Laplace noise ``π ∝ s²`` (precision grows with ``ε²``, so a share concentrated on one
level buys more than the same share spread: the best splits sit near corners), so
:func:`choose_split` runs SLSQP (scipy) with the exact gradient from several starting points
(even, and every level alone) and keeps the best. Shares below
:data:`MIN_SHARE` are dropped (that query is not measured: its level is estimated from the
levels below it), the rest rounded to multiples of 1/:data:`SHARE_GRID` that sum to exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpopt.errors import ParameterError, QueryError
from dpopt.model.domain import Domain
from dpopt.model.geography import Geography
from dpopt.strategy.error import trace_term
from dpopt.strategy.gram import MarginalsGram
from dpopt.strategy.workload import gram_of

__all__ = ["SplitEntry", "SplitChoice", "hierarchy_error", "choose_split", "MIN_SHARE", "SHARE_GRID"]

#: Shares below this are dropped (the query is not measured).
MIN_SHARE = 0.002
#: Chosen shares are multiples of 1/SHARE_GRID.
SHARE_GRID = 1000


@dataclass(frozen=True)
class SplitEntry:
    """One named table: a query asked of every unit of a level, its weight and its noise.

    ``variance`` is the noise variance of one answer at the whole budget and ``power`` how the
    precision grows with the share (2 for Laplace noise, 1 for Gaussian).
    """

    key: str
    level: int
    query: object
    weight: float
    variance: float
    power: int


@dataclass(frozen=True)
class SplitChoice:
    """The chosen shares (exact, summing to 1) and every named table's expected error under them.

    ``rmse[key]`` is the table's expected root mean squared error per answer; ``baseline`` the
    same with the whole budget on the leaf level, split evenly over its queries (what a
    bottom-up release of the leaves' tables would measure), for comparison.
    """

    shares: dict
    rmse: dict
    baseline: dict
    objective: float


def _eigen(query) -> np.ndarray:
    gram = gram_of(query)
    if not isinstance(gram, MarginalsGram):
        raise ParameterError(f"the budget split by expected error needs detailed tables, marginals or totals; "
                             f"{query.name} is none of them: give every [[measure]] a share")
    return gram.eigenvalues()


class _Model:
    """``F(s)`` and its gradient in the marginals algebra (module notes)."""

    def __init__(self, geography: Geography, chars: Domain, entries: list[SplitEntry]) -> None:
        self.entries = entries
        sizes = np.asarray(geography.sizes, dtype=np.float64)
        self.depth = geography.depth
        self.m = sizes[:, None] / sizes[None, :]          # m[i, j]: level-i units below a level-j unit
        self.D = np.diff(np.concatenate([[0.0], sizes]))  # D[j]: dimensions of component j per cell
        self.lam = np.stack([_eigen(e.query).ravel() for e in entries])    # (queries, subsets)
        self.dims = MarginalsGram.of_sets(chars, [()]).dimensions().ravel()
        self.level = np.array([e.level for e in entries])
        self.weight = np.array([e.weight for e in entries], dtype=np.float64)
        self.var = np.array([e.variance for e in entries], dtype=np.float64)
        self.power = np.array([e.power for e in entries], dtype=np.float64)
        # coef[t, j]: D_j / m_{k_t j} for j <= k_t (the table's level), else 0
        k = self.level
        j = np.arange(self.depth)
        self.coef = np.where(j[None, :] <= k[:, None], self.D[None, :] / self.m[k[:, None], j[None, :]], 0.0)
        # reach[q, j]: 1/m_{l(q) j} when q's level l(q) >= j, else 0
        self.reach = np.where(k[:, None] >= j[None, :], 1.0 / self.m[k[:, None], j[None, :]], 0.0)

    def precisions(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = np.clip(s, 0.0, None)
        return s**self.power / self.var, self.power * s ** (self.power - 1) / self.var

    def mu(self, s: np.ndarray) -> np.ndarray:
        """``μ[j, a]``: the eigenvalues of every component's precision ``P_j``."""
        pi, _ = self.precisions(s)
        return (self.reach * pi[:, None]).T @ self.lam

    def errors_and_gradients(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``E_t(s)`` for every table and ``∂E_t/∂s_q`` (tables × queries)."""
        pi, dpi = self.precisions(s)
        mu = (self.reach * pi[:, None]).T @ self.lam       # (levels, subsets)
        mu = np.maximum(mu, 1e-12 * max(float(mu.max(initial=0.0)), 1e-300))
        wl = self.lam * self.dims[None, :]                 # (tables, subsets): dims(a) λ_t(a)
        inv = 1.0 / mu
        # trace(W_t P_j⁺ W_tᵀ) = Σ_a dims(a) λ_t(a) / μ_j(a)
        errors = np.sum(self.coef * (wl @ inv.T), axis=1)
        # ∂E_t/∂s_q = -π'_q Σ_j coef[t, j] reach[q, j] Σ_a wl[t, a] λ_q(a) / μ_j(a)²
        grad = -dpi[None, :] * np.einsum("tj,qj,ta,qa,ja->tq", self.coef, self.reach, wl, self.lam, inv**2,
                                         optimize=True)
        return errors, grad

    def value_and_gradient(self, s: np.ndarray) -> tuple[float, np.ndarray]:
        """``F(s) = Σ_t w_t log E_t(s)`` and its gradient."""
        errors, grad = self.errors_and_gradients(s)
        return float(np.sum(self.weight * np.log(errors))), (self.weight / errors) @ grad

    def table_errors(self, s: np.ndarray, geography: Geography, chars: Domain) -> np.ndarray:
        """Expected total squared error of every table, through the strategy layer's trace term."""
        mu = self.mu(s)
        out = np.zeros(len(self.entries))
        for t, e in enumerate(self.entries):
            total = 0.0
            for j in range(e.level + 1):
                try:
                    strategy = MarginalsGram.from_eigenvalues(chars, mu[j].reshape((2,) * len(chars)))
                    total += self.D[j] / self.m[e.level, j] * trace_term(gram_of(e.query), strategy)
                except QueryError:
                    total = np.inf
                    break
            out[t] = total
        return out


def hierarchy_error(geography: Geography, chars: Domain, entries: list[SplitEntry], shares) -> np.ndarray:
    """Expected total squared error of every entry's table under ``shares`` (one per entry; module notes)."""
    model = _Model(geography, chars, entries)
    return model.table_errors(np.asarray(shares, dtype=np.float64), geography, chars)


def _rounded(s: np.ndarray) -> list[Fraction]:
    """Shares below :data:`MIN_SHARE` dropped, the rest on a grid of 1/SHARE_GRID summing to exactly 1."""
    s = np.where(s >= MIN_SHARE, s, 0.0)
    s = s / s.sum()
    units = np.floor(s * SHARE_GRID).astype(np.int64)
    units[s > 0] = np.maximum(units[s > 0], 1)
    short = SHARE_GRID - int(units.sum())
    order = np.argsort(-(s * SHARE_GRID - units), kind="stable")  # largest remainders first
    for i in order[:abs(short)] if short > 0 else np.argsort(-units, kind="stable")[:abs(short)]:
        units[i] += 1 if short > 0 else -1
    return [Fraction(int(u), SHARE_GRID) for u in units]


def choose_split(geography: Geography, chars: Domain, entries: list[SplitEntry]) -> SplitChoice:
    """The shares minimising the expected total squared error of the named tables (module notes).

    Raises
    ------
    ParameterError
        When a query is not a detailed table, marginal or total, or when no split gives every
        named table a finite error (a table no measurement informs).
    """
    from scipy.optimize import minimize

    model = _Model(geography, chars, entries)
    n = len(entries)
    starts = [np.full(n, 1.0 / n)]
    for k in range(geography.depth):
        on = model.level == k
        if on.any():
            starts.append(np.where(on, 1.0 / on.sum(), 1e-3))
    best = None
    for x0 in starts:
        x0 = x0 / x0.sum()
        result = minimize(lambda s: model.value_and_gradient(s), x0, jac=True, method="SLSQP",
                          bounds=[(0.0, 1.0)] * n, constraints=[{"type": "eq", "fun": lambda s: s.sum() - 1.0,
                                                                 "jac": lambda s: np.ones_like(s)}],
                          options={"maxiter": 500, "ftol": 1e-12})
        s = np.clip(result.x, 0.0, None)
        s = s / s.sum()
        value = model.value_and_gradient(s)[0]
        if best is None or value < best[1]:
            best = (s, value)
    shares = _rounded(best[0])
    exact = np.array([float(f) for f in shares])
    errors = model.table_errors(exact, geography, chars)
    if not np.isfinite(errors).all():
        bad = entries[int(np.argmin(np.isfinite(errors)))]
        raise ParameterError(f"the budget split by expected error left table {bad.key!r} without a measurement that "
                             "informs it; give it a larger weight or give every [[measure]] a share")
    leaf = model.level == geography.depth - 1
    baseline = model.table_errors(np.where(leaf, 1.0 / leaf.sum(), 0.0), geography, chars)
    answers = np.array([geography.sizes[e.level] * e.query.num_rows for e in entries], dtype=np.float64)
    return SplitChoice({e.key: f for e, f in zip(entries, shares)},
                       {e.key: float(np.sqrt(v / a)) for e, v, a in zip(entries, errors, answers)},
                       {e.key: float(np.sqrt(v / a)) for e, v, a in zip(entries, baseline, answers)},
                       float(np.sum(model.weight * np.log(errors))))
