"""What to measure for a workload, chosen before any data by the expected error the budget buys.

For a :class:`~dpopt.strategy.tables.Workload` and the noise a budget buys (Laplace under pure ε,
Gaussian under zCDP or (ε, δ)), :func:`compare_candidates` computes, for every candidate
strategy, the exact expected total squared error of each workload table when the strategy is
measured with all of the budget and the tables are answered by least squares (Li et al., PODS
2010, Prop. 4: ``v · trace(G_T (AᵀA)⁺)``, with ``v`` the variance of the discrete law that
:func:`~dpopt.privacy.mechanisms.calibrate` derives from the strategy's sensitivity). The
candidates:

``identity``
    The full histogram (domains up to :data:`IDENTITY_MAX_CELLS` cells).
``workload``
    The workload's own marginals, each with its budget share optimised (HDMM's OPT_M restricted
    to the workload's sets).
``residuals``
    The ResidualPlanner over the workload's downward closure
    (:mod:`dpopt.strategy.residual_planner`): the optimal matrix mechanism for marginals under
    Gaussian noise (it attains the SVD bound), with the Laplace allocation in closed form too.
``lower orders``
    The ResidualPlanner over the closure *without the workload's top sets*: every table's
    lower-order structure measured with all of the budget, the top-order interactions left to
    the estimate (a log-linear model of the lower orders). It does not support the workload, so
    its expected error on the top residuals is unknown; the plan charges them at the best
    unbiased candidate's error on them (see the rule).
``hdmm``
    HDMM's optimised p-Identity (one attribute) or Kronecker p-Identity (several) strategy, for
    workloads with ranges (:mod:`dpopt.strategy.optimize`).
``tree``
    The adaptive plan of :mod:`dpopt.strategy.tree_selection` (MST: the one-way marginals, a
    spanning tree of pairs chosen by the exponential mechanism, those pairs), under pure ε or
    zCDP. What it measures depends on the data, so before any data it is scored like ``lower
    orders``: each residual it may leave unmeasured charged at the best unbiased candidate's
    variance, each pair counted as measured with the chance ``2/d`` that a spanning tree holds it
    (:func:`~dpopt.strategy.tree_selection.tree_charge`). Not compared by default
    (:data:`DEFAULT_CANDIDATES`): the charge prices a residual left to the model at a variance,
    which falls with ε, where the model's real error is a bias, which grows with the table's size
    and does not fall with ε; the charge cannot see that size (it is not public). On generated
    Bayesian networks (14 binary attributes, 5,000 records, all 3-way marginals, pure ε;
    ``bench_auto.py --adaptive-bn``) the tree beats the lower orders at ε = 0.1 (3-way mean error
    0.0283 against 0.0332) and loses at ε = 1 (0.0074 against 0.0063), while the charge takes it
    at both. Name it in ``candidates`` to have it weighed, or force it with ``strategy``.

**The rule.** The best candidate that supports every table (least weighted expected error) is
compared with the SVD lower bound for the same noise (:mod:`dpopt.strategy.bound`; the bound
every matrix mechanism obeys, attained for marginals under Gaussian noise). Within
:data:`GAP` times the bound, no strategy could measure the workload much better, and the plan
takes that candidate. Further above the bound — Laplace noise on a wide table, where the L1
sensitivity grows with every residual measured, so measuring the top-order interactions
crowds out the lower orders every table rests on — the plan also weighs the ``lower orders``
candidate, its unmeasured residuals charged at the best unbiased candidate's variance on them,
and takes it when that total is lower; the ``tree`` candidate is weighed the same way, with its
own charge, and the least charged total is taken. ``dpopt check`` prints every candidate's error per table,
the bound and the choice. Nothing here reads data.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from dpopt.errors import DpoptError, ParameterError, QueryError
from dpopt.model.queries import Identity, LinearQuery, Stack, Weighted
from dpopt.model.queries.residual import residual_dimension
from dpopt.privacy.accountant import PrivacyCost
from dpopt.privacy.mechanisms import NoiseLaw, calibrate
from dpopt.strategy.bound import svd_bound
from dpopt.strategy.error import trace_term
from dpopt.strategy.gram import MarginalsGram
from dpopt.strategy.optimize import optimize_kronecker, optimize_pidentity
from dpopt.strategy.residual_planner import design_residuals, residual_variances, table_errors
from dpopt.strategy.tables import Workload

__all__ = ["Candidate", "CandidateComparison", "compare_candidates", "CANDIDATES", "DEFAULT_CANDIDATES", "GAP",
           "IDENTITY_MAX_CELLS"]

#: Every candidate a plan may name (those that do not apply to a workload say why).
CANDIDATES = ("identity", "workload", "residuals", "lower orders", "hdmm", "tree")
#: Candidates compared by default: all but ``tree``, whose charge cannot see the table's size
#: (module notes: on generated networks it wins at small ε and loses at ε = 1 on the same tables).
DEFAULT_CANDIDATES = tuple(c for c in CANDIDATES if c != "tree")
#: Within this factor of the SVD bound the best unbiased candidate is taken outright (module notes).
GAP = 2.0
#: The full histogram is a candidate up to this many cells.
IDENTITY_MAX_CELLS = 1 << 22
#: HDMM's p-Identity template is tried up to this many cells (its Gram is dense).
PIDENTITY_MAX_CELLS = 4096


@dataclass(eq=False)
class Candidate:
    """One strategy and its expected error per workload table.

    Attributes
    ----------
    name : str
    query : LinearQuery or None
        None when the candidate does not apply (``reason`` says why).
    law : NoiseLaw or None
        The noise of measuring ``query`` with the whole budget.
    errors : list of float
        Expected total squared error of each table (unweighted; ``inf``: not supported).
    charged : list of float
        ``errors`` with each unmeasured residual charged at the best unbiased candidate's variance
        (``lower orders`` only; otherwise equal to ``errors``).
    coordinate_variance : dict
        ``{set: variance of each orthonormal coordinate of U_a}`` for strategies in the marginals
        algebra (what the estimate and the charge read), else empty.
    detail : str
    reason : str
    seconds : float
    """

    name: str
    query: LinearQuery | None = None
    law: NoiseLaw | None = None
    errors: list[float] = field(default_factory=list)
    charged: list[float] = field(default_factory=list)
    coordinate_variance: dict = field(default_factory=dict)
    detail: str = ""
    reason: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.charged is None:
            self.charged = list(self.errors)

    @property
    def applies(self) -> bool:
        return self.query is not None

    def total(self, weights: Sequence[float], charged: bool = False) -> float:
        values = self.charged if charged else self.errors
        return float(np.dot(weights, values)) if values else float("inf")

    @property
    def supports(self) -> bool:
        return self.applies and all(np.isfinite(self.errors))


@dataclass(eq=False)
class CandidateComparison:
    """Every candidate, the SVD bound and the choice (what ``dpopt check`` prints)."""

    workload: Workload
    mechanism: str
    candidates: list[Candidate]
    chosen: Candidate
    best_unbiased: Candidate | None
    bound: float
    reason: str
    unit: float = float("nan")

    def frame(self) -> pd.DataFrame:
        """One row per candidate and table: expected total squared error and RMSE per cell."""
        rows = []
        for c in self.candidates:
            for t, err, charged in zip(self.workload.tables, c.errors or [math.nan] * len(self.workload.tables),
                                       c.charged or [math.nan] * len(self.workload.tables)):
                cells = _cells(self.workload, t)
                rows.append({"candidate": c.name, "table": t.label, "weight": t.weight, "expected_error": err,
                             "charged_error": charged, "rmse_per_cell": math.sqrt(charged / cells)
                             if np.isfinite(charged) else math.inf, "chosen": c is self.chosen})
        return pd.DataFrame(rows)

    def lines(self, max_tables: int = 12) -> list[str]:
        """The comparison as text: each candidate's total, the SVD bound and the choice, then every
        applicable candidate's expected error per table (RMSE per cell), beside the SVD bound of the
        table alone (no strategy answers that table better, even spending the whole budget on it)."""
        w = [t.weight for t in self.workload.tables]
        out = [f"what to measure: {self.workload.describe()}, {self.mechanism} noise; expected total squared error "
               "of least-squares answers with the whole budget (RMSE per cell in brackets)"]
        cells = sum(_cells(self.workload, t) * t.weight for t in self.workload.tables)
        for c in self.candidates:
            mark = "*" if c is self.chosen else " "
            if not c.applies:
                out.append(f"  {mark} {c.name:<13} does not apply: {c.reason}")
                continue
            total, charged = c.total(w), c.total(w, charged=True)
            if np.isfinite(total):
                text = f"{total:.6g} [{math.sqrt(total / cells):.4g}]"
            else:
                text = (f"unbiased for part of the workload only; {charged:.6g} [{math.sqrt(charged / cells):.4g}] "
                        "with the unmeasured residuals charged at the best unbiased candidate's variance")
            out.append(f"  {mark} {c.name:<13} {text}  ({c.detail}; {c.seconds:.2f} s)")
        out.append(f"  SVD lower bound for this noise: {self.bound:.6g} [{math.sqrt(self.bound / cells):.4g}]")
        out.append(f"  chosen: {self.chosen.name}: {self.reason}")
        out.extend(self._table_lines(max_tables))
        return out

    def _table_lines(self, max_tables: int) -> list[str]:
        shown = [c for c in self.candidates if c.applies]
        if not shown:
            return []
        heads = [c.name + ("*" if c is self.chosen else "") + ("~" if not c.supports else "") for c in shown]
        width = max(8, *(len(h) for h in heads))
        tables = self.workload.tables[:max_tables]
        label_width = min(44, max(len(t.label) for t in tables))
        out = [f"  expected error per table, RMSE per cell (* chosen; ~ unmeasured residuals charged as above):",
               "    " + "table".ljust(label_width) + "".join(f"  {h:>{width}}" for h in heads)
               + f"  {'bound alone':>{width}}"]
        unit = self.unit
        for i, t in enumerate(tables):
            n = _cells(self.workload, t)
            row = [c.charged[i] for c in shown]
            try:
                alone = svd_bound(self.workload.table_gram(t)) * unit
            except DpoptError:
                alone = float("nan")
            figures = "".join(f"  {math.sqrt(v / n):>{width}.4g}" if np.isfinite(v) else f"  {'-':>{width}}"
                              for v in row + [alone])
            out.append("    " + t.label[:label_width].ljust(label_width) + figures)
        if len(self.workload.tables) > max_tables:
            out.append(f"    ... and {len(self.workload.tables) - max_tables} more tables (CandidateComparison.frame() "
                       "has them all)")
        return out


def _cells(workload: Workload, table) -> int:
    return table.query(workload.domain).num_rows


def noise_constant(cost: PrivacyCost, mechanism: str) -> float:
    """The continuous noise's variance per unit of squared sensitivity: ``2/ε²`` (Laplace) or
    ``1/(2ρ)`` (Gaussian; ρ from the cost, converted from (ε, δ) when needed)."""
    if mechanism == "laplace":
        return 2.0 / float(cost.epsilon) ** 2
    from dpopt.privacy.conversions import approx_dp_to_zcdp

    rho = cost.rho if cost.rho is not None else approx_dp_to_zcdp(cost.epsilon, cost.delta)
    return 1.0 / (2.0 * float(rho))


def compare_candidates(workload: Workload, cost: PrivacyCost, mechanism: str,
                       names: Sequence[str] = DEFAULT_CANDIDATES, seed: int = 0) -> CandidateComparison:
    """Every candidate's expected error per table for the noise ``cost`` buys, and the choice
    by the module's rule. Reads no data."""
    if mechanism not in ("laplace", "gaussian"):
        raise ParameterError(f"mechanism must be 'laplace' or 'gaussian', got {mechanism!r}")
    norm = "l1" if mechanism == "laplace" else "l2"
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ParameterError(f"unknown candidate {unknown[0]!r}; candidates: {list(CANDIDATES)}")
    gram = workload.gram()
    builders: dict[str, Callable[[], Candidate]] = {
        "identity": lambda: _identity(workload, gram, cost, mechanism),
        "workload": lambda: _workload_marginals(workload, gram, cost, mechanism, norm, seed),
        "residuals": lambda: _residuals("residuals", workload, None, cost, mechanism, norm),
        "hdmm": lambda: _hdmm(workload, gram, cost, mechanism, norm, seed),
    }
    candidates = []
    for name in names:
        if name in ("lower orders", "tree"):
            continue
        start = time.perf_counter()
        try:
            cand = builders[name]()
        except DpoptError as exc:
            cand = Candidate(name, reason=str(exc).split("\n")[0])
        cand.seconds = time.perf_counter() - start
        candidates.append(cand)
    weights = [t.weight for t in workload.tables]
    unbiased = [c for c in candidates if c.supports]
    best = min(unbiased, key=lambda c: c.total(weights)) if unbiased else None
    unit = noise_constant(cost, mechanism)
    try:
        bound = svd_bound(gram) * unit
    except DpoptError:
        bound = float("nan")
    if "lower orders" in names:
        start = time.perf_counter()
        lower = _lower_orders(workload, best, cost, mechanism, norm)
        lower.seconds = time.perf_counter() - start
        candidates.append(lower)
    else:
        lower = None
    if "tree" in names:
        start = time.perf_counter()
        tree = _tree(workload, best, cost, mechanism)
        tree.seconds = time.perf_counter() - start
        candidates.append(tree)
    else:
        tree = None
    if best is None:
        usable = [c for c in candidates if c.applies and np.all(np.isfinite(c.charged))]
        if not usable:
            why = "; ".join(f"{c.name}: {c.reason or 'does not support every table'}" for c in candidates)
            raise ParameterError(f"no candidate strategy supports this workload ({why})")
        chosen = min(usable, key=lambda c: c.total(weights, charged=True))
        return CandidateComparison(workload, mechanism, candidates, chosen, None, bound,
                                   "no candidate supports every table; the least charged error", unit)
    total = best.total(weights)
    if np.isfinite(bound) and total <= GAP * bound:
        reason = (f"the best unbiased candidate, within {total / bound:.3g} times the SVD bound (at most {GAP:g}: "
                  "no strategy could measure the workload much better)")
        return CandidateComparison(workload, mechanism, candidates, best, best, bound, reason, unit)
    biased = [c for c in (lower, tree) if c is not None and c.applies and c.total(weights, charged=True) < total]
    if biased:
        pick = min(biased, key=lambda c: c.total(weights, charged=True))
        ratio = f"{total / bound:.3g} times the SVD bound" if np.isfinite(bound) else "with no SVD bound"
        what = ("measuring only the lower orders" if pick is lower else
                "the adaptive tree (MST)")
        reason = (f"the best unbiased candidate ({best.name}) is {ratio}, and {what}, with the unmeasured residuals "
                  f"charged at its variance, expects {pick.total(weights, charged=True):.6g} against its {total:.6g}")
        return CandidateComparison(workload, mechanism, candidates, pick, best, bound, reason, unit)
    reason = "the best unbiased candidate" + (f" ({total / bound:.3g} times the SVD bound)" if np.isfinite(bound) else "")
    return CandidateComparison(workload, mechanism, candidates, best, best, bound, reason, unit)


# ---- the candidates -----------------------------------------------------------------------------------
def _law(query: LinearQuery, cost: PrivacyCost, mechanism: str) -> NoiseLaw:
    return calibrate(query, cost, mechanism)


def _algebra_variances(workload: Workload, strategy_gram: MarginalsGram, variance: float) -> dict:
    """Per-coordinate variance ``v / μ_A(a)`` on each residual of the workload's closure."""
    dom = workload.domain
    mu = strategy_gram.eigenvalues()
    out = {}
    for a in workload.closure():
        m = float(mu[tuple(1 if x in a else 0 for x in dom.attrs)])
        out[a] = variance / m if m > 1e-12 * float(mu.max()) else float("inf")
    return out


def _from_variances(workload: Workload, variances: dict) -> list[float]:
    keys = list(variances)
    return table_errors(workload, keys, np.array([variances[a] for a in keys]))


def _per_table(workload: Workload, strategy, variance: float) -> list[float]:
    out = []
    for t in workload.tables:
        try:
            out.append(variance * trace_term(workload.table_gram(t), strategy))
        except QueryError:
            out.append(float("inf"))
    return out


def _identity(workload: Workload, gram, cost, mechanism) -> Candidate:
    dom = workload.domain
    if dom.size > IDENTITY_MAX_CELLS:
        return Candidate("identity", reason=f"{dom.size:.3g} cells, above the {IDENTITY_MAX_CELLS:.3g} a full histogram "
                         "is considered for")
    query = Identity(dom)
    law = _law(query, cost, mechanism)
    if workload.is_marginal:
        variances = {a: law.variance for a in workload.closure()}
        errors = _from_variances(workload, variances)
    else:  # trace(G_T) = ‖T‖_F², the sum of the squared column norms
        variances = {}
        errors = [law.variance * float(np.sum(np.broadcast_to(t.query(dom).column_norm_powers(2), (dom.size,))))
                  for t in workload.tables]
    return Candidate("identity", query, law, errors, list(errors), variances,
                     detail=f"{dom.size:,} cells, noise s.d. {law.stddev:.3g} per cell")


def _workload_marginals(workload: Workload, gram, cost, mechanism, norm, seed) -> Candidate:
    if not workload.is_marginal or not isinstance(gram, MarginalsGram) or len(workload.domain) > 24:
        return Candidate("workload", reason="applies to marginal workloads (up to 24 attributes)")
    sets = workload.marginal_sets()
    closure = workload.closure()
    incidence = _incidence(workload, sets, closure)
    demand = workload.demand(closure)
    theta = optimize_shares(incidence, demand, norm)
    parts = []
    for t, w in zip(workload.tables, theta):
        if w > 1e-12 * theta.max():
            q = t.query(workload.domain)
            parts.append(q if w == 1.0 else Weighted(q, float(w)))
    query = parts[0] if len(parts) == 1 else Stack(parts)
    law = _law(query, cost, mechanism)
    dims = np.array([residual_dimension(workload.domain, a) for a in closure], dtype=np.float64)
    mu = (incidence @ (theta * theta)) / dims  # the strategy's eigenvalue on each U_a
    variances = {a: (law.variance / m if m > 0 else float("inf")) for a, m in zip(closure, mu)}
    detail = f"{len(parts)} marginal{'s' if len(parts) > 1 else ''}" + (
        f", weights {theta.min() / theta.max():.3g}-1" if len(parts) > 1 else "")
    return Candidate("workload", query, law, _from_variances(workload, variances), None, variances, detail=detail)


def _incidence(workload: Workload, sets, closure):
    """``K[a, S] = dim U_a · prod_{i∉S} n_i`` when ``a ⊆ S``: the eigenvalue of ``M_Sᵀ M_S`` on
    ``U_a`` times its dimension, so that ``Σ_S θ_S² K[a, S]`` is the weighted strategy's share."""
    import scipy.sparse as sp
    from itertools import combinations

    index = {a: i for i, a in enumerate(closure)}
    n = float(workload.domain.size)
    rows, cols, vals = [], [], []
    for j, attrs in enumerate(sets):
        outside = n / float(np.prod([workload.domain.size_of(x) for x in attrs])) if attrs else n
        for r in range(len(attrs) + 1):
            for sub in combinations(attrs, r):
                rows.append(index[sub])
                cols.append(j)
                vals.append(residual_dimension(workload.domain, sub) * outside)
    return sp.csr_matrix((vals, (rows, cols)), shape=(len(closure), len(sets)))


def optimize_shares(incidence, demand: np.ndarray, norm: str, max_iter: int = 500) -> np.ndarray:
    """Weights ``θ_S >= 0`` of the workload's own marginals minimising ``‖A‖² Σ_a D_a / μ_a`` with
    ``μ = K θ²`` (HDMM's OPT_M restricted to the workload's sets; ``‖A‖₁ = Σ θ``, ``‖A‖²₂ = Σ θ²``).
    L-BFGS-B from equal weights; the largest weight is scaled to 1."""
    from scipy.optimize import Bounds, minimize

    m = incidence.shape[1]
    if m == 1:
        return np.ones(1)
    Kt = incidence.T.tocsr()

    def fun(theta):
        mu = incidence @ (theta * theta)
        if np.any(mu[demand > 0] <= 0):
            return np.inf, np.zeros_like(theta)
        ratio = np.where(demand > 0, demand / np.where(mu > 0, mu, 1.0), 0.0)
        total = float(ratio.sum())
        d_total = -2.0 * theta * (Kt @ np.where(demand > 0, ratio / np.where(mu > 0, mu, 1.0), 0.0))
        if norm == "l1":
            sens, d_sens = float(theta.sum()) ** 2, 2.0 * float(theta.sum()) * np.ones(m)
        else:
            sens, d_sens = float(theta @ theta), 2.0 * theta
        return sens * total, d_sens * total + sens * d_total

    start = np.ones(m)
    scale = fun(start)[0]
    res = minimize(lambda t: tuple(np.asarray(v) / scale for v in fun(t)), start, jac=True, method="L-BFGS-B",
                   bounds=Bounds(np.zeros(m), np.full(m, np.inf)),
                   options={"maxiter": max_iter, "ftol": 1e-12, "gtol": 1e-10})
    theta = np.maximum(res.x, 0.0)
    if not np.isfinite(fun(theta)[0]) or fun(theta)[0] > scale:
        theta = start
    return theta / theta.max()


def _residuals(name: str, workload: Workload, sets, cost, mechanism, norm) -> Candidate:
    if not workload.is_marginal:
        return Candidate(name, reason="applies to marginal workloads")
    design = design_residuals(workload, norm, sets)
    query = design.query
    law = _law(query, cost, mechanism)
    s2 = residual_variances(query, law.variance)
    errors = table_errors(workload, design.sets, s2)
    variances = dict(zip(design.sets, s2.tolist()))
    orders = sorted({len(a) for a in design.sets})
    return Candidate(name, query, law, errors, list(errors), variances,
                     detail=f"{len(design.sets)} residual sets of order {orders[0]}-{orders[-1]}, "
                            f"{query.num_rows} rows")


def _lower_orders(workload: Workload, best: Candidate | None, cost, mechanism, norm) -> Candidate:
    name = "lower orders"
    if not workload.is_marginal:
        return Candidate(name, reason="applies to marginal workloads")
    top = set(workload.top_sets())
    sets = [a for a in workload.closure() if a not in top]
    if not sets:
        return Candidate(name, reason="the workload has no lower orders")
    cand = _residuals(name, workload, sets, cost, mechanism, norm)
    if not cand.applies:
        return cand
    if best is None or not best.coordinate_variance:
        cand.detail += "; no unbiased candidate to charge the top order at"
        return cand
    # Charge each unmeasured residual at the best unbiased candidate's variance on it.
    merged = {a: cand.coordinate_variance.get(a, best.coordinate_variance.get(a, float("inf")))
              for a in workload.closure()}
    keys = list(merged)
    cand.charged = table_errors(workload, keys, np.array([merged[a] for a in keys]))
    cand.detail += f"; top order charged at {best.name}'s variance"
    return cand


def _tree(workload: Workload, best: Candidate | None, cost, mechanism) -> Candidate:
    """The adaptive tree (:mod:`dpopt.strategy.tree_selection`), charged as the module notes say.
    Its ``query`` is the first step's (the one-way marginals); the rest is chosen during the run."""
    from dpopt.strategy.tree_selection import plan_tree, tree_charge

    name = "tree"
    if not workload.is_marginal:
        return Candidate(name, reason="applies to marginal workloads")
    if best is None or not best.coordinate_variance:
        return Candidate(name, reason="no unbiased candidate to charge the residuals it may leave out at")
    try:
        plan = plan_tree(workload.domain, cost, mechanism)
    except ParameterError as exc:
        return Candidate(name, reason=str(exc))
    charged, variances = tree_charge(workload, plan, best.coordinate_variance)
    measured = {a: (v if len(a) < 2 else float("inf")) for a, v in variances.items()}
    keys = list(measured)
    errors = table_errors(workload, keys, np.array([measured[a] for a in keys]))
    query = plan.one_way_query()
    return Candidate(name, query, _law(query, plan.one_way, mechanism), errors, charged, variances,
                     detail=f"{plan.describe()}; pairs charged at {best.name}'s variance when the tree leaves them out")


def _hdmm(workload: Workload, gram, cost, mechanism, norm, seed) -> Candidate:
    dom = workload.domain
    if workload.is_marginal:
        return Candidate("hdmm", reason="marginal workloads are measured by the residual and workload candidates")
    try:
        if len(dom) == 1:
            fit = optimize_pidentity(gram, norm=norm, seed=seed)
        else:
            try:
                fit = optimize_kronecker(gram, norm, seed=seed)
            except QueryError:
                if dom.size > PIDENTITY_MAX_CELLS:
                    raise
                fit = optimize_pidentity(gram, norm=norm, seed=seed)
    except QueryError as exc:
        return Candidate("hdmm", reason=str(exc))
    law = _law(fit.query, cost, mechanism)
    from dpopt.strategy.workload import gram_of

    errors = _per_table(workload, gram_of(fit.query), law.variance)
    return Candidate("hdmm", fit.query, law, errors, list(errors), {}, detail=f"template {fit.template}")
