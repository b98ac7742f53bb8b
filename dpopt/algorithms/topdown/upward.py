"""The upward pass: every unit's answers estimated from its own measurements and its subtree's.

Top-down fits each level against its parent, so a parent's table should be estimated as well
as the data allow: from its own noisy answers *and* from everything measured below it. Hay,
Rastogi, Miklau and Suciu (VLDB 2010, "Boosting the accuracy of differentially private histograms
through consistency") do this for a tree of single counts in two passes; the upward
pass computes, leaves first,

    z_v = (y_v / σ_v² + s_v / τ_v²) / (1 / σ_v² + 1 / τ_v²),    s_v = Σ_{c child of v} z_c,
    τ_v² = Σ_c Var(z_c),    Var(z_v) = 1 / (1 / σ_v² + 1 / τ_v²),

the inverse-variance combination of the unit's own answer ``y_v`` with the sum of its
children's estimates (the children's answers of a query, summed, answer the parent's same query
with the summed variance). Here each unit has a *table* and each level asks a set of linear
queries of it (the detailed table, marginals, the total), each with noise of a known variance.
The recursion runs once per distinct query (:func:`estimates`): for every unit and every query
asked on its level or below, the answers and their variance per unit. The parent's table is
then fitted (:mod:`~dpopt.algorithms.topdown.solve`) to all its queries' combined answers at
once — generalised least squares with weights ``1/Var`` — which is where the queries inform
each other. Per query the recursion is the exact best linear unbiased estimate of each unit's
answers from that query's measurements in its subtree, in any tree (each row of a query is a
tree of single counts, Hay et al.'s case). Across queries it is the exact GLS estimate of each
unit from every measurement in its subtree when the subtrees of a level are alike (as many
descendants below every unit of a level: by symmetry the estimate then depends on a level's
answers only through their sums); otherwise it is unbiased with the stated variances and a
little above the GLS variance, which Cumings-Menon and Zhuravlev (2024, "Least squares
estimation for hierarchical data", arXiv:2404.13164, the Census Bureau's estimator for the 2020
noisy measurements) compute exactly with full covariance blocks per unit.

The children's problem then uses each child's combined answers too (the downward half: the
children are fitted to their subtree estimates, under the parent's table). Everything here is
post-processing of noisy answers: no data, no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpopt.model.geography import Geography
from dpopt.model.queries.base import LinearQuery

__all__ = ["QueryEstimate", "estimates", "query_key", "identity_key"]


@dataclass(frozen=True, eq=False)
class QueryEstimate:
    """Answers to one query for every unit of a level, with their noise variance per unit.

    Attributes
    ----------
    label : str
        The query's label (on the level that measures it, or the nearest level below that does).
    query : LinearQuery
        Over the characteristics.
    values : ndarray, shape (units, rows)
    variance : ndarray, shape (units,)
        Noise variance of each of a unit's answers.
    scale : ndarray, shape (units,)
        The noise law's scale (Laplace ``b``, Gaussian ``σ``); the standard deviation for a combination.
    noise : str
        The noise family of the measurement, or ``"derived"`` for a combination.
    own : bool
        True when the values are the level's own noisy answers, unchanged.
    """

    label: str
    query: LinearQuery
    values: np.ndarray
    variance: np.ndarray
    scale: np.ndarray
    noise: str
    own: bool = True


def query_key(query: LinearQuery) -> bytes:
    """Identical matrices, identical keys: the same query asked on different levels (whatever its label)."""
    m = sp.csr_matrix(query.to_sparse(), dtype=np.float64)
    m.sort_indices()
    return b"|".join([np.asarray(m.shape, dtype=np.int64).tobytes(), m.indptr.astype(np.int64).tobytes(),
                      m.indices.astype(np.int64).tobytes(), m.data.tobytes()])


def identity_key(chars) -> bytes:
    """:func:`query_key` of the detailed table (the identity over the characteristics)."""
    from dpopt.model.queries.basic import Identity

    return query_key(Identity(chars))


def _own(q, values: np.ndarray, units: int) -> QueryEstimate:
    return QueryEstimate(q.label, q.query, values, np.full(units, float(q.law.variance)),
                         np.full(units, float(q.law.scale)), q.law.family, True)


def _combine(a: QueryEstimate | None, b: QueryEstimate) -> QueryEstimate:
    """Inverse-variance combination of two estimates of the same answers, unit by unit."""
    if a is None:
        return b
    var = 1.0 / (1.0 / a.variance + 1.0 / b.variance)
    mixed = var[:, None] * (a.values / a.variance[:, None] + b.values / b.variance[:, None])
    return QueryEstimate(a.label, a.query, mixed, var, np.sqrt(var), "derived", False)


def estimates(geography: Geography, queries: list, noisy: list[dict], *, upward: bool = True
              ) -> list[list[QueryEstimate]]:
    """Per level (root first), the answers every unit's fit uses: one :class:`QueryEstimate` per query.

    Parameters
    ----------
    geography : Geography
    queries : list of LevelQuery
        Every level's queries with their noise laws (the plan's).
    noisy : list of dict
        Per level, the noisy answers by query label (units × rows).
    upward : bool
        Combine each unit's answers with its children's summed estimates (see the module notes);
        False: each level's own answers only (the top-down of Abowd et al. 2022 as first built).

    Returns
    -------
    list of list of QueryEstimate
        Queries in the order the levels ask them, then queries asked only below (deepest last).
    """
    depth = geography.depth
    if not upward:  # each level's own answers, query by query, as measured
        return [[_own(q, noisy[k][q.label], geography.sizes[k]) for q in queries if q.level == k]
                for k in range(depth)]
    out: list[list[QueryEstimate]] = [[] for _ in range(depth)]
    below: dict[bytes, QueryEstimate] = {}
    order: list[bytes] = []
    for k in range(depth - 1, -1, -1):
        here: dict[bytes, QueryEstimate] = {}
        mine: list[bytes] = []
        units = geography.sizes[k]
        for q in (q for q in queries if q.level == k):
            key = query_key(q.query)
            here[key] = _combine(here.get(key), _own(q, noisy[k][q.label], units))
            if key not in mine:
                mine.append(key)
        if k < depth - 1:
            parents = geography.parents[k + 1]
            n = parents.size
            summing = sp.csr_matrix((np.ones(n), (parents, np.arange(n))), shape=(units, n))
            for key in order:
                child = below[key]
                variance = np.asarray(summing @ child.variance).ravel()
                sums = QueryEstimate(child.label, child.query, np.asarray(summing @ child.values), variance,
                                     np.sqrt(variance), "derived", False)
                here[key] = _combine(here.get(key), sums)
        order = mine + [key for key in order if key not in mine]
        out[k] = [here[key] for key in order]
        below = here
    return out
