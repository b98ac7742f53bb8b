"""An adaptive plan for the dense table: MST's spanning tree of pairs, chosen privately.

``auto``'s other candidates (:mod:`dpopt.strategy.candidates`) fix what to measure before any
data. This one, after MST (McKenna, Miklau, Sheldon, "Winning the NIST contest: a scalable and
general approach to differentially private synthetic data", JPC 2021, Algorithm 1), spends the
budget where the data's structure is:

1. **One-way marginals** (share :data:`ONE_WAY_SHARE`): every attribute's marginal, one stacked
   measurement (Laplace under pure ε, L1 sensitivity ``d``; discrete Gaussian under zCDP, squared
   L2 sensitivity ``d``). Their noisy counts (negative ones set to 0) give the *selection model*
   of every pair, ``m_ij = n^ p^_i ⊗ p^_j`` with ``n^`` their mean total (post-processing).
2. **A spanning tree** (share :data:`SELECT_SHARE`, ``d − 1`` equal rounds): Kruskal's algorithm
   with each edge drawn by the exponential mechanism (McSherry and Talwar 2007) among the pairs
   joining two different components, with MST's score, the L1 deviation from independence::

       q_ij = || M_ij(x) − m_ij ||_1

   of L1 sensitivity 1 (adding or removing one record moves one cell of ``M_ij(x)`` by one; the
   model reads only step 1's noisy answers).
3. **The tree's pairs** (the rest of the budget): the ``d − 1`` chosen two-way marginals, one
   stacked measurement (sensitivity ``d − 1``).

The fit (:mod:`dpopt.estimate.choice`) then sees the one-way and the tree's residuals only; the
others are completed by the smooth (maximum-entropy) estimate, Private-PGM's graphical-model
completion.

**When it is the plan** (:func:`tree_charge`, read by :func:`dpopt.strategy.candidates.compare_candidates`):
before any data, the plan's expected error per workload table is the variance of each residual
it measures plus, for each residual it may leave unmeasured, the best unbiased candidate's
variance on it (the ``lower orders`` candidate's charge: leaving a residual to the model is taken
to cost what measuring it would). Which pairs the tree holds is not known before data, so each
pair residual counts as measured with the probability ``2/d`` that a spanning tree holds a given
pair (``d − 1`` edges among ``d(d − 1)/2`` pairs). Public quantities only: the domain, the
budget, the noise laws. The tree is weighed only when a plan names it (it is not among
:data:`~dpopt.strategy.candidates.DEFAULT_CANDIDATES`; that module's notes say why).

Measured (``examples/benchmarks/bench_auto.py --adaptive``, 15 seeds, 3-way mean error, pure ε
0.1 / 0.5 / 1): on mildew (6 binary attributes, 70 records) the forced tree gives 0.111 / 0.098 /
0.085 against ``auto``'s 0.101 / 0.051 / 0.029: on 64 cells the histogram measures every pair
better than a third of the budget at sensitivity 5 does.

Privacy. Every step is charged before its draw (measurements through
:func:`~dpopt.privacy.mechanisms.measure`, the rounds through
:func:`~dpopt.privacy.mechanisms.exponential_mechanism`); the whole plan is checked affordable
before the first charge. Under zCDP a round at ``ε`` costs ``ε²/2`` (Bun and Steinke 2016,
Prop. 1.4) with ``ε`` the largest multiple of ``2^-30`` at or below ``sqrt(2 ρ_round)``; what the
rounds leave of their share goes to step 3, so the ledger sums exactly to the budget.

The shares are MST's own (a third each; McKenna et al. 2021, Algorithm 1), not tuned here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations

import numpy as np

from dpopt.errors import BudgetExceededError, ParameterError
from dpopt.privacy.accountant import PrivacyCost
from dpopt.strategy.wide_selection import _stack  # the stacked marginals of one measurement
from dpopt.strategy.wide_selection import selection_probabilities, selection_scores

__all__ = ["TreePlan", "TreeSelection", "plan_tree", "run_tree", "tree_scores", "tree_probabilities",
           "tree_charge", "ONE_WAY_SHARE", "SELECT_SHARE"]

#: Share of the budget for the one-way marginals (MST: a third).
ONE_WAY_SHARE = Fraction(1, 3)
#: Share of the budget for the ``d − 1`` exponential-mechanism rounds (MST: a third).
SELECT_SHARE = Fraction(1, 3)
#: Denominator of the dyadic epsilon of a zCDP round (the exact sampler's arithmetic stays in int64).
_EPS_DENOMINATOR = 2**30


@dataclass(frozen=True, eq=False)
class TreePlan:
    """The data-independent part (module notes): the three steps' costs.

    Attributes
    ----------
    domain : Domain
    accounting : {"pure", "zcdp"}
    mechanism : {"laplace", "gaussian"}
    one_way : PrivacyCost
        Step 1.
    round_epsilon : Fraction
        Each of the ``d − 1`` exponential-mechanism rounds (charged as pure ε; ``ε²/2`` under zCDP).
    pairs : PrivacyCost
        Step 3 (what is left: the three steps sum exactly to the budget).
    """

    domain: object
    accounting: str
    mechanism: str
    one_way: PrivacyCost
    round_epsilon: Fraction
    pairs: PrivacyCost

    @property
    def rounds(self) -> int:
        return len(self.domain.attrs) - 1

    def total(self) -> PrivacyCost:
        """The whole plan's cost in the accounting's currency."""
        if self.accounting == "zcdp":
            return PrivacyCost.zcdp(self.one_way.rho + self.rounds * self.round_epsilon ** 2 / 2 + self.pairs.rho)
        return PrivacyCost.pure(self.one_way.epsilon + self.rounds * self.round_epsilon + self.pairs.epsilon)

    def one_way_query(self):
        return _stack(self.domain, [(a,) for a in self.domain.attrs])

    def pairs_law(self):
        """The law of step 3 (any ``d − 1`` pairs: the sensitivity counts marginals, not cells)."""
        from dpopt.privacy.mechanisms import calibrate

        attrs = self.domain.attrs
        return calibrate(_stack(self.domain, list(zip(attrs[:-1], attrs[1:]))), self.pairs, self.mechanism)

    def steps(self) -> list:
        """The plan's spending steps (:class:`~dpopt.algorithms.base.PlannedMeasure`), shares exact."""
        from dpopt.algorithms.base import PlannedMeasure
        from dpopt.privacy.mechanisms import calibrate

        whole = self.total()
        part = (lambda c: c.rho / whole.rho) if self.accounting == "zcdp" else (lambda c: c.epsilon / whole.epsilon)  # noqa: E731
        ones = self.one_way_query()
        select = (PrivacyCost.zcdp(self.rounds * self.round_epsilon ** 2 / 2) if self.accounting == "zcdp"
                  else PrivacyCost.pure(self.rounds * self.round_epsilon))
        return [PlannedMeasure("tree: one-way marginals", ones, self.mechanism, part(self.one_way), self.one_way,
                               calibrate(ones, self.one_way, self.mechanism),
                               what=f"{len(self.domain.attrs)} one-way marginals", answers=ones.num_rows),
                PlannedMeasure("tree: spanning tree", None, "exponential", part(select), select,
                               what=f"{self.rounds} exponential-mechanism rounds (epsilon {self.round_epsilon} each) "
                                    "on the L1 deviation from independence"),
                PlannedMeasure("tree: pairs", None, self.mechanism, part(self.pairs), self.pairs,
                               self.pairs_law(), what=f"the tree's {self.rounds} two-way marginals")]

    def describe(self) -> str:
        return (f"one-way marginals, then a spanning tree of {self.rounds} pairs chosen by the exponential mechanism "
                f"(epsilon {self.round_epsilon} per round), then those pairs (MST)")


def plan_tree(domain, total: PrivacyCost, mechanism: str) -> TreePlan:
    """The plan of the module notes, before any data.

    Parameters
    ----------
    domain : Domain
        Two attributes or more.
    total : PrivacyCost
        The whole budget of the plan: pure ``epsilon`` or ``rho`` (zCDP); (ε, δ) is refused.
    mechanism : {"laplace", "gaussian"}
    """
    if len(domain.attrs) < 2:
        raise ParameterError("the tree plan needs two attributes or more")
    if total.rho is not None and not total.epsilon:
        accounting = "zcdp"
    elif total.rho is None and total.delta == 0:
        accounting = "pure"
    else:
        raise ParameterError("the tree plan runs under pure epsilon or zCDP accounting, not (epsilon, delta)")
    rounds = len(domain.attrs) - 1
    if accounting == "zcdp":
        rho = Fraction(total.rho)
        rho_round = rho * SELECT_SHARE / rounds
        eps = Fraction(math.isqrt(math.floor(2 * rho_round * _EPS_DENOMINATOR ** 2)), _EPS_DENOMINATOR)
        if eps <= 0:
            raise ParameterError("the tree plan: the budget is too small for a selection round")
        one_way = PrivacyCost.zcdp(rho * ONE_WAY_SHARE)
        pairs = PrivacyCost.zcdp(rho - rho * ONE_WAY_SHARE - rounds * eps * eps / 2)
    else:
        epsilon = Fraction(total.epsilon)
        eps = epsilon * SELECT_SHARE / rounds
        one_way = PrivacyCost.pure(epsilon * ONE_WAY_SHARE)
        pairs = PrivacyCost.pure(epsilon - epsilon * ONE_WAY_SHARE - rounds * eps)
    return TreePlan(domain, accounting, mechanism, one_way, eps, pairs)


# ---- selection ---------------------------------------------------------------------------------------
def tree_scores(pair_counts: list, one_way: dict, pairs: list) -> np.ndarray:
    """MST's scores ``||M_ij(x) − n^ p^_i ⊗ p^_j||_1`` (module notes, step 2): wide selection's
    :func:`~dpopt.strategy.wide_selection.selection_scores` against the independence model, no penalty.

    Parameters
    ----------
    pair_counts : list of ndarray
        The true two-way marginals ``M_ij(x)`` of ``pairs`` (flat, domain order).
    one_way : dict
        ``{attr: noisy one-way counts}``: step 1's answers (the model reads nothing else).
    pairs : list of (str, str)
    """
    laws = {a: np.maximum(np.asarray(v, dtype=np.float64), 0.0) for a, v in one_way.items()}
    total = max(float(np.mean([v.sum() for v in one_way.values()])), 1.0)
    laws = {a: (p / p.sum() if p.sum() > 0 else np.full(p.size, 1.0 / p.size)) for a, p in laws.items()}
    model = [total * np.outer(laws[i], laws[j]).ravel() for i, j in pairs]
    return selection_scores([np.asarray(c, dtype=np.float64) for c in pair_counts], model, np.zeros(len(pairs)))


def tree_probabilities(scores, epsilon) -> np.ndarray:
    """The exponential mechanism's law over pairs of ``scores`` (sensitivity 1), in closed form:
    ``exp(ε q / 2) / Σ exp(ε q' / 2)`` -- the same law as wide selection's rounds."""
    return selection_probabilities(scores, epsilon)


@dataclass
class TreeSelection:
    """What :func:`run_tree` measured: the two stacked measurements and the tree's edges, in order."""

    measurements: list
    edges: list

    def info(self) -> dict:
        return {"edges": [list(e) for e in self.edges]}


def run_tree(plan: TreePlan, data, accountant, rng) -> TreeSelection:
    """Measure as the module notes say; the whole plan is checked affordable before the first
    charge (:class:`~dpopt.errors.BudgetExceededError`, nothing drawn), and each step is charged
    before its draw."""
    from dpopt.privacy.mechanisms import calibrate, exponential_mechanism, measure

    if not accountant.can_afford(plan.total()):
        raise BudgetExceededError(f"the tree plan needs {plan.total()}; the accountant has {accountant.remaining} left")
    domain = plan.domain
    attrs = domain.attrs
    ones_query = plan.one_way_query()
    ones = measure(ones_query, data, calibrate(ones_query, plan.one_way, plan.mechanism), accountant, rng,
                   label="tree: one-way marginals")
    sizes = [domain.size_of(a) for a in attrs]
    one_way = dict(zip(attrs, np.split(np.asarray(ones.values, dtype=np.float64), np.cumsum(sizes)[:-1])))
    pairs = list(combinations(attrs, 2))
    counts = [data.marginal(list(p)) for p in pairs]
    scores = tree_scores(counts, one_way, pairs)
    component = {a: i for i, a in enumerate(attrs)}
    edges = []
    for r in range(plan.rounds):
        open_ = np.flatnonzero([component[i] != component[j] for i, j in pairs])
        pick = int(open_[exponential_mechanism(scores[open_], plan.round_epsilon, accountant, rng, sensitivity=1.0,
                                               label=f"tree: edge {r + 1}")])
        i, j = pairs[pick]
        edges.append((i, j))
        old, new = component[j], component[i]
        for a in attrs:
            if component[a] == old:
                component[a] = new
    pairs_query = _stack(domain, edges)
    law = calibrate(pairs_query, plan.pairs, plan.mechanism)
    known = dict(zip(pairs, counts))
    answers = np.concatenate([known[e] for e in edges]).astype(np.float64)
    tree = measure(pairs_query, data, law, accountant, rng, label="tree: pairs", answers=answers)
    return TreeSelection([ones, tree], edges)


# ---- expected error before data ----------------------------------------------------------------------
def tree_charge(workload, plan: TreePlan, best_variance: dict) -> tuple[list[float], dict]:
    """Per workload table, the plan's charged expected error (module notes), and the per-coordinate
    variances it used (``{set: variance}`` over the workload's closure).

    ``best_variance``: the best unbiased candidate's per-coordinate variance on each residual of
    the closure (:attr:`dpopt.strategy.candidates.Candidate.coordinate_variance`)."""
    from dpopt.privacy.mechanisms import calibrate
    from dpopt.strategy.residual_planner import table_errors

    domain = plan.domain
    n = float(domain.size)
    d = len(domain.attrs)
    v1 = calibrate(plan.one_way_query(), plan.one_way, plan.mechanism).variance
    vp = plan.pairs_law().variance
    held = 2.0 / d  # the chance that a spanning tree holds a given pair
    size = {a: float(domain.size_of(a)) for a in domain.attrs}
    # Precision (inverse variance) of each coordinate of U_() and U_i from the one-ways and the pairs.
    prec_total = sum(n / size[a] for a in domain.attrs) / v1 + held * sum(
        n / (size[i] * size[j]) for i, j in combinations(domain.attrs, 2)) / vp
    out = {}
    for a in workload.closure():
        if len(a) == 0:
            out[a] = 1.0 / prec_total
        elif len(a) == 1:
            i = a[0]
            out[a] = 1.0 / (n / size[i] / v1 + held * sum(n / (size[i] * size[j]) for j in domain.attrs if j != i) / vp)
        elif len(a) == 2:
            measured = vp / (n / (size[a[0]] * size[a[1]]))
            out[a] = held * measured + (1.0 - held) * best_variance.get(a, float("inf"))
        else:
            out[a] = best_variance.get(a, float("inf"))
    keys = list(out)
    return table_errors(workload, keys, np.array([out[a] for a in keys])), out
